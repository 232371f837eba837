"""Every config that extends config.yaml is named where a reader of config.yaml or the README looks: an
edit of config.yaml changes each of them, and the two lists must agree with the files on disk."""

from __future__ import annotations

import re
from pathlib import Path

from workflow_scripts.runtime.config_files import config_layers

REPO = Path(__file__).resolve().parents[2]
CONFIG_NAME = re.compile(r"(?<![\w/.-])config\.[\w.-]+\.yaml\b")


def overlays() -> set[str]:
    """The shipped configs whose `extends` chain reaches config.yaml (directly or through another file)."""
    out = set()
    for path in REPO.glob("config.*.yaml"):
        chain = [Path(layer[0]).name for layer in config_layers(path, name=str)]
        if chain[0] == "config.yaml":
            out.add(path.name)
    return out


def header(text: str) -> str:
    """config.yaml's opening comment block."""
    return "\n".join(line for line in text.splitlines()[: next(
        i for i, line in enumerate(text.splitlines()) if not line.startswith("#"))])  # fmt: skip


def paragraph(text: str, marker: str) -> str:
    """The README paragraph that holds ``marker``."""
    return next(p for p in text.split("\n\n") if marker in p)


def test_the_overlays_are_found_by_their_extends_chain():
    assert {"config.decisive.yaml", "config.controls.yaml"} <= overlays()
    assert "config.paper.yaml" not in overlays() and "config.one-node.yaml" not in overlays()


def test_config_yaml_names_every_config_that_extends_it():
    named = set(CONFIG_NAME.findall(header((REPO / "config.yaml").read_text()))) - {"config.paper.yaml"}
    assert named == overlays(), f"config.yaml's header names {sorted(named)}, on disk: {sorted(overlays())}"


def test_the_readme_names_every_config_that_extends_config_yaml():
    text = paragraph((REPO / "README.md").read_text(), "An edit of config.yaml changes")
    named = set(CONFIG_NAME.findall(text))
    assert named == overlays(), f"README names {sorted(named)}, on disk: {sorted(overlays())}"
    words = {2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight", 9: "nine"}
    assert f"changes {words.get(len(named), len(named))} other experiments" in text
