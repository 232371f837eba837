"""docs/config.md, the config reference, generated from the schema (``schemas/config.schema.yaml``).

The schema is the one place a key is documented (its type, default and description); this module renders
it as a page: a hand-written preamble (``PREAMBLE``: which files make a config, overrides, where errors
point) and then one table per top-level section, in the schema's order, one row per key:

| schema construct                                  | row(s)                                               |
|--------------------------------------------|-----------------------------------------------------------|
| ``properties``                             | the key, then its children as dotted paths                |
| ``additionalProperties: {schema}`` (a map) | the map, then ``map.<placeholder>.*`` (``PLACEHOLDERS``)  |
| ``type: array`` with object ``items``      | the list, then ``list[].*`` for an entry's keys           |
| ``$ref`` / ``allOf`` / ``oneOf``           | the definition merged in (the key's own words win)        |

Regenerate: ``make config-doc`` (``python -m workflow_scripts.runtime.config_doc``); ``--check`` exits 1
when docs/config.md differs from the schema (tests/runtime/test_config_doc.py does the same), and
``--undocumented`` lists the keys whose schema entry has no description.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workflow_scripts.runtime.config import load_schema

DOC_PATH = Path(__file__).resolve().parents[2] / "docs" / "config.md"
REGENERATE = "make config-doc  (or: .venv/bin/python -m workflow_scripts.runtime.config_doc)"
# The name a map's entries get in a dotted path; any other map's entries are <name>.
PLACEHOLDERS = {
    "precisions": "<arm>",
    "data.tasks": "<task>",
    "data.sft_mix": "<family>",
    "model.tiny.stop.floors": "<family>",
}
NO_DESCRIPTION = "(no description in the schema)"
RANGES = (("minimum", ">="), ("exclusiveMinimum", ">"), ("maximum", "<="), ("exclusiveMaximum", "<"))

PREAMBLE = """\
# Config reference

Every key of an experiment config: its dotted path, type, default and meaning, generated from
`workflow_scripts/schemas/config.schema.yaml` (the schema is the only place a key or a default is
written; validation fills the defaults in). Do not edit this page by hand: edit the schema's
`description`, then run `make config-doc`; `tests/runtime/test_config_doc.py` fails while the two differ.

## Which files make the config

- **`config.yaml`** is the default experiment (the tiny CPU miniature): `snakemake --cores 2` reads it.
- **`--configfile X`** reads X *instead* of config.yaml: the Snakefile declares no `configfile:`, so
  nothing of config.yaml leaks in unless X says so. Several `--configfile` files merge in the order given.
- **Experiment files** (`config.controls.yaml`, `config.factorial.yaml`, `config.one-node.yaml`, ...) start
  with `extends: <file>` (a path relative to their own folder; the extended file may extend another) and
  hold only what differs. The loader (`workflow_scripts/runtime/config_files.py`) reads the chain, the
  most basic file first, and merges each file over the one it extends: mappings merge key by key,
  recursively; a list or a scalar replaces the value it meets. So a mapping such as `precisions` *adds*
  the experiment's arms to the extended file's; `replace: [precisions]` (dotted keys the same file sets)
  drops the extended value first, so the experiment's own stands alone. `extends` and `replace` are
  loader directives, not config keys (they are not in the tables below).
- **`--config key=value`** overrides apply last, on top of the files. Values are YAML, typed as the schema
  wants them: `--config 'seeds=[1,2,3]' 'train={max_steps: 24, learning_rate: 1.0e-5}'`; a nested key takes
  a mapping, and its other keys keep their values.

Snakemake itself merges `--configfile` files as written (`extends` unread, `replace` merged instead of
replaced), so `rules/common.smk` rebuilds the config from the same files and `--config` pairs through
`workflow_scripts.runtime.config.workflow_config`, and validates it, before any job is planned.

## Where a problem is reported

Validation (`workflow_scripts/runtime/config.py`: this schema plus the rules between keys that a schema
cannot state) reports every problem at once, one line each, naming the file and the dotted key:
`invalid config: config.<experiment>.yaml: train.gradient_accumulation_steps: ...`. A key is blamed on
the last file of the `extends` chain (or `--config`) that sets it, so a clash between an experiment file
and the file it extends names both. A YAML syntax error names `<file>:<line>:<col>`; a missing or cyclic
`extends`, or a bad `replace`, names the file that says it. `python -c "from workflow_scripts.runtime.config
import load_config; load_config('config.<experiment>.yaml')"` checks a file without Snakemake.

## Reading the tables

`<arm>`, `<task>`, `<family>`, `<name>`: a key you choose (an entry of a map); `[]`: an entry of a list.
Type `a | b`: either; `one of ...`: the values allowed. Default `-`: none (the key is optional unless
marked required, and a key without a default stays absent).
"""


@dataclass(frozen=True)
class Row:
    """One key of the page: its dotted path and what the schema says of it."""

    path: str
    type: str
    default: str
    meaning: str
    documented: bool


def resolve(node: Mapping, definitions: Mapping) -> dict:
    """``node`` with its ``$ref`` and ``allOf`` definitions merged in; the node's own keys win, and its
    ``properties`` merge key by key over the definition's (train.vllm's own default over vllm_engine's)."""
    node = dict(node)
    parts = []
    if "$ref" in node:
        parts.append(definitions[node.pop("$ref").rpartition("/")[2]])
    for sub in node.pop("allOf", []):
        parts.append(sub)
    merged: dict = {}
    for part in [*(resolve(p, definitions) for p in parts), node]:
        properties = {**merged.get("properties", {})}
        for key, sub in part.get("properties", {}).items():
            properties[key] = {**properties.get(key, {}), **sub}
        merged.update(part)
        if properties:
            merged["properties"] = properties
    return merged


def _flow(value: Any) -> str:
    """A value as it is written in a config file (JSON flow style; null, true, false)."""
    return json.dumps(value, ensure_ascii=False)


def type_text(node: Mapping, definitions: Mapping) -> str:
    """``integer >= 1``, ``number | null``, ``one of `a`, `b```, ``list of integer``..."""
    if "oneOf" in node or "anyOf" in node:
        return " | ".join(
            type_text(resolve(s, definitions), definitions) for s in node.get("oneOf", node.get("anyOf"))
        )
    if "enum" in node:
        return "one of " + ", ".join(f"`{_flow(v)}`" for v in node["enum"])
    kinds = node.get("type", "any")
    kinds = [kinds] if isinstance(kinds, str) else list(kinds)
    words = []
    for kind in kinds:
        if kind == "array":
            items = resolve(node.get("items", {}), definitions)
            inner = "object" if "properties" in items else type_text(items, definitions)
            words.append(f"list of {inner}" if inner != "any" else "list")
        elif kind in ("object",) and isinstance(node.get("additionalProperties"), Mapping):
            words.append("mapping")
        else:
            words.append(kind)
    text = " | ".join(words)
    bounds = [f"{sign} {_flow(node[key])}" for key, sign in RANGES if key in node]
    return f"{text} ({', '.join(bounds)})" if bounds else text


def _meaning(node: Mapping, required: bool, entry_of: str = "") -> tuple[str, bool]:
    """(the row's meaning, whether the schema describes the key). A map's entry without words of its own
    is described by its map (``entry_of``) and counts as documented."""
    text = " ".join(str(node.get("description", "")).split())
    documented = bool(text) or bool(entry_of)
    if entry_of:
        text = f"an entry of `{entry_of}`" + (f": {text}" if text else "")
    extra = []
    names = node.get("propertyNames", {})
    if "enum" in names:
        extra.append("keys: " + ", ".join(f"`{n}`" for n in names["enum"]))
    if required:
        extra.append("**required**")
    text = "; ".join([(text or NO_DESCRIPTION).rstrip("."), *extra]) if extra else text or NO_DESCRIPTION
    return text.replace("|", "\\|"), documented


def rows(
    node: Mapping, path: str, definitions: Mapping, required: bool = False, entry_of: str = ""
) -> Iterator[Row]:
    """The key at ``path`` (``node`` its schema), then every key under it, depth first in schema order;
    ``entry_of``: the map whose entries ``path`` stands for."""
    node = resolve(node, definitions)
    meaning, documented = _meaning(node, required, entry_of)
    default = f"`{_flow(node['default'])}`" if "default" in node else "-"
    yield Row(path, type_text(node, definitions).replace("|", "\\|"), default, meaning, documented)
    yield from _children(node, path, definitions)


def _children(node: Mapping, path: str, definitions: Mapping) -> Iterator[Row]:
    needed = set(node.get("required", []))
    for key, sub in node.get("properties", {}).items():
        yield from rows(sub, f"{path}.{key}" if path else key, definitions, key in needed)
    extra = node.get("additionalProperties")
    if isinstance(extra, Mapping):
        yield from rows(extra, f"{path}.{PLACEHOLDERS.get(path, '<name>')}", definitions, entry_of=path)
    items = node.get("items")
    if isinstance(items, Mapping):
        items = resolve(items, definitions)
        if "properties" in items:
            yield from _children(items, f"{path}[]", definitions)


def sections(schema: Mapping) -> list[tuple[str, list[Row]]]:
    """(top-level key, its rows) in the schema's order."""
    definitions = schema.get("definitions", {})
    needed = set(schema.get("required", []))
    return [
        (key, list(rows(sub, key, definitions, key in needed)))
        for key, sub in schema.get("properties", {}).items()
    ]


def undocumented(schema: Mapping) -> list[str]:
    """Dotted paths whose schema entry (with its definition) has no description."""
    return [row.path for _, section in sections(schema) for row in section if not row.documented]


def render(schema: Mapping | None = None) -> str:
    """The whole page for ``schema`` (default: the project's)."""
    schema = load_schema() if schema is None else schema
    parts = [PREAMBLE]
    for key, section in sections(schema):
        top = section[0]
        parts.append(f"\n## {key}\n\n{top.meaning}\n\nType {top.type}; default {top.default}.\n")
        if len(section) > 1:
            lines = ["| key | type | default | meaning |", "|---|---|---|---|"]
            lines += [f"| `{r.path}` | {r.type} | {r.default} | {r.meaning} |" for r in section[1:]]
            parts.append("\n" + "\n".join(lines) + "\n")
    return "".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=DOC_PATH, help="the page to write (docs/config.md)")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if the page is stale")
    parser.add_argument("--undocumented", action="store_true", help="list keys without a description")
    args = parser.parse_args(argv)
    if args.undocumented:
        print("\n".join(undocumented(load_schema())))
        return 0
    page = render()
    if args.check:
        current = args.output.read_text(encoding="utf-8") if args.output.exists() else ""
        if current != page:
            print(f"{args.output} differs from the schema; regenerate: {REGENERATE}", file=sys.stderr)
            return 1
        return 0
    args.output.write_text(page, encoding="utf-8")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
