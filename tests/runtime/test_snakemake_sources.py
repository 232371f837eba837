"""The config loader's one dependency on Snakemake internals (``config_files.snakemake_sources``): the
--configfile list and the --config pairs, read from ``workflow.config_settings`` because no public API
has them. These tests fail, naming the pinned version, when a Snakemake upgrade moves them."""

from __future__ import annotations

import dataclasses
import json
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest
import snakemake
import snakemake.api  # before snakemake.workflow, which imports only after the api (a cycle)
import snakemake_server
from conftest import SNAKEMAKE
from snakemake.settings.types import ConfigSettings
from snakemake.workflow import Workflow

from workflow_scripts.runtime.config_files import SNAKEMAKE_PIN, ConfigError, snakemake_sources

REPO = Path(__file__).resolve().parents[2]
MOVED = (
    f"rules/common.smk reads workflow.config_settings (.configfiles, .config), Snakemake internals of "
    f"{SNAKEMAKE_PIN}: check snakemake/workflow.py and settings/types.py of the new version and update "
    f"workflow_scripts/runtime/config_files.py (snakemake_sources), SNAKEMAKE_PIN and pyproject.toml"
)


def test_the_pin_in_the_loader_is_pyprojects_and_the_installed_snakemake():
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    pins = [d for d in pyproject["project"]["dependencies"] if d.startswith("snakemake==")]
    assert pins == [SNAKEMAKE_PIN], MOVED
    assert f"snakemake=={snakemake.__version__}" == SNAKEMAKE_PIN, MOVED


def test_config_settings_keeps_its_shape():
    assert "config_settings" in Workflow.__annotations__, MOVED
    fields = {f.name for f in dataclasses.fields(ConfigSettings)}
    assert {"config", "configfiles"} <= fields, MOVED
    files, pairs = snakemake_sources(
        SimpleNamespace(config_settings=ConfigSettings(config={"seeds": "[1]"}, configfiles=[]))
    )
    assert (files, pairs) == ([], {"seeds": "[1]"}), MOVED


def test_a_snakemake_without_them_is_refused_naming_the_pin():
    with pytest.raises(ConfigError, match=SNAKEMAKE_PIN.replace(".", r"\.")):
        snakemake_sources(SimpleNamespace())
    with pytest.raises(ConfigError, match="configfiles str"):
        snakemake_sources(SimpleNamespace(config_settings=SimpleNamespace(configfiles="a.yaml", config={})))


PROBE = """
import json
from workflow_scripts.runtime.config_files import snakemake_sources
files, pairs = snakemake_sources(workflow)
with open("seen.json", "w") as fh:
    json.dump({"files": [str(f) for f in files], "pairs": pairs, "merged": dict(config)}, fh)

rule all:
    default_target: True
"""


def _seen(tmp_path: Path, *args: str) -> dict:
    (tmp_path / "Snakefile").write_text(PROBE, encoding="utf-8")
    cmd = [SNAKEMAKE, "-n", "--cores", "1", "--snakefile", "Snakefile", *args]
    proc = snakemake_server.run(cmd, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:] + "\n" + MOVED
    return json.loads((tmp_path / "seen.json").read_text(encoding="utf-8"))


@pytest.mark.slow  # a real snakemake process
def test_a_real_snakemake_run_hands_over_the_files_in_order_and_the_pairs_alone(tmp_path):
    (tmp_path / "a.yaml").write_text("seeds: [1]\ntrain: {max_steps: 3}\n", encoding="utf-8")
    (tmp_path / "b.yaml").write_text("seeds: [2]\n", encoding="utf-8")
    seen = _seen(tmp_path, "--configfile", "a.yaml", "b.yaml", "--config", "eval={n_samples: 2}", "seeds=3")
    assert seen["files"] == [str(tmp_path / "a.yaml"), str(tmp_path / "b.yaml")], MOVED
    assert seen["pairs"] == {"eval": {"n_samples": "2"}, "seeds": 3}, (
        MOVED
    )  # the pairs alone, no file in them
    assert seen["merged"]["train"] == {"max_steps": 3} and seen["merged"]["seeds"] == 3  # Snakemake's merge
    alone = _seen(tmp_path)  # no --configfile: the case where config.yaml is read
    assert (alone["files"], alone["pairs"]) == ([], {}), MOVED
