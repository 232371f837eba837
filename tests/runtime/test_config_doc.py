"""docs/config.md is generated from the config schema: it must be what the generator makes of the schema as
it is now, and the generator must render every kind of key the schema uses."""

from __future__ import annotations

from workflow_scripts.runtime import config_doc
from workflow_scripts.runtime.config import load_schema


def test_docs_config_md_is_what_the_schema_generates():
    page = config_doc.DOC_PATH.read_text(encoding="utf-8") if config_doc.DOC_PATH.exists() else ""
    assert page == config_doc.render(), (
        f"{config_doc.DOC_PATH.name} differs from workflow_scripts/schemas/config.schema.yaml; "
        f"regenerate it: {config_doc.REGENERATE}"
    )


def test_every_section_of_the_schema_is_on_the_page_in_the_schemas_order():
    schema = load_schema()
    page = config_doc.render(schema)
    headings = [line[3:] for line in page.splitlines() if line.startswith("## ")]
    assert [h for h in headings if h in schema["properties"]] == list(schema["properties"])


def test_refs_maps_and_lists_become_dotted_rows_with_type_default_and_meaning():
    schema = {
        "definitions": {
            "engine": {
                "type": "object",
                "description": "an engine",
                "properties": {"share": {"type": "number", "maximum": 1, "default": 0.9, "description": "s"}},
            }
        },
        "required": ["arms"],
        "properties": {
            "arms": {
                "type": "object",
                "description": "the arms",
                "additionalProperties": {
                    "type": "object",
                    "required": ["dtype"],
                    "properties": {"dtype": {"enum": ["a", "b"], "description": "masters | compute"}},
                },
            },
            "train": {
                "type": "object",
                "description": "training",
                "properties": {
                    "engine": {
                        "allOf": [{"$ref": "#/definitions/engine"}],
                        "properties": {"share": {"default": 0.3}},
                    },
                    "phases": {
                        "type": "array",
                        "default": [],
                        "description": "phases",
                        "items": {"type": "object", "properties": {"steps": {"type": "integer"}}},
                    },
                },
            },
        },
    }
    rows = {row.path: row for _, section in config_doc.sections(schema) for row in section}
    assert list(rows) == [
        "arms",
        "arms.<name>",
        "arms.<name>.dtype",
        "train",
        "train.engine",
        "train.engine.share",
        "train.phases",
        "train.phases[].steps",
    ]
    assert rows["arms"].meaning == "the arms; **required**"
    assert rows["arms.<name>"].meaning == "an entry of `arms`" and rows["arms.<name>"].documented
    assert rows["arms.<name>.dtype"].type == 'one of `"a"`, `"b"`'
    assert rows["arms.<name>.dtype"].meaning == "masters \\| compute; **required**"
    share = rows["train.engine.share"]  # the definition's words, the key's own default
    assert (share.type, share.default, share.meaning) == ("number (<= 1)", "`0.3`", "s")
    assert rows["train.phases"].type == "list of object"
    assert not rows["train.phases[].steps"].documented
    assert config_doc.undocumented(schema) == ["train.phases[].steps"]
    assert config_doc.NO_DESCRIPTION in config_doc.render(schema)


def test_check_exits_1_and_names_the_command_when_the_page_is_stale(tmp_path, capsys):
    stale = tmp_path / "config.md"
    stale.write_text("old\n", encoding="utf-8")
    assert config_doc.main(["--check", "--output", str(stale)]) == 1
    assert "make config-doc" in capsys.readouterr().err
    assert config_doc.main(["--output", str(stale)]) == 0
    assert config_doc.main(["--check", "--output", str(stale)]) == 0
