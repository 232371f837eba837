"""Config validation: every malformed config fails before any job runs, naming its key."""

from __future__ import annotations

import copy

import pytest
import yaml
from conftest import REPO, load_test_config, make_workflow_dir, run_snakemake

from workflow_scripts.config import ConfigError, load_config, parse_run, run_names, validate_config


def _set(path: str, value):
    def mutate(cfg: dict) -> None:
        *parents, leaf = path.split(".")
        node = cfg
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value

    return mutate


def _delete(path: str):
    def mutate(cfg: dict) -> None:
        *parents, leaf = path.split(".")
        node = cfg
        for key in parents:
            node = node[key]
        del node[leaf]

    return mutate


# (mutation, text the error must contain: the dotted key or the file)
MALFORMED = {
    "unknown top-level key": (_set("trian", {"max_steps": 3}), "trian: unknown key"),
    "unknown nested key": (_set("train.max_step", 3), "train.max_step: unknown key"),
    "seed not an int": (_set("seeds", [1, "two"]), "seeds.1"),
    "seed float": (_set("seeds", [1, 2.5]), "seeds.1"),
    "data seed string": (_set("data.seed", "abc"), "data.seed"),
    "unknown param dtype": (_set("precisions.bf16.param_dtype", "bfloat8"), "precisions.bf16.param_dtype"),
    "unknown autocast dtype": (_set("precisions.fp32.autocast", "half"), "precisions.fp32.autocast"),
    "unknown task kind": (_set("data.tasks.mul.kind", "regex"), "data.tasks.mul.kind"),
    "unknown task source": (_set("data.tasks.mul.source", "mnist"), "data.tasks.mul.source"),
    "missing local dataset": (
        _set(
            "data.tasks.gsm", {"source": "gsm8k", "kind": "gsm8k", "role": "off_task", "path": "nope.jsonl"}
        ),
        "data.tasks.gsm.path",
    ),
    "missing required precisions": (_delete("precisions"), "precisions: required key is missing"),
    "negative learning rate": (_set("train.learning_rate", -1.0), "train.learning_rate"),
    "dropout above one": (_set("precisions.bf16.dropout", 1.5), "precisions.bf16.dropout"),
    "synthetic task without family": (_delete("data.tasks.mul.family"), "data.tasks.mul.family"),
    "duplicate seeds": (_set("seeds", [1, 1]), "seeds"),
    "eta not a number": (_set("sparsity", {"etas": ["small"]}), "sparsity.etas.0"),
    "bad precision name": (_set("precisions.1bad", {"param_dtype": "float32"}), "precisions.1bad"),
    "epsilon_high below epsilon": (_set("train.epsilon_high", 0.1), "train.epsilon_high"),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_config_names_its_key(name):
    mutate, expected = MALFORMED[name]
    cfg = load_test_config()
    mutate(cfg)
    with pytest.raises(ConfigError) as err:
        validate_config(cfg, source="my.yaml")
    assert expected in str(err.value)
    assert "my.yaml" in str(err.value)


def test_valid_configs_fill_defaults():
    cfg = load_config(REPO / "config.yaml")
    assert cfg["train"]["loss_type"] == "dapo"
    assert cfg["eval"]["backend"] == "hf"
    assert cfg["model"]["trust_remote_code"] is False
    small = validate_config(load_test_config())
    assert small["sparsity"]["etas"] == [1e-3, 1e-4, 1e-5]
    assert small["data"]["tasks"]["mul"]["path"] is None


def test_third_precision_arm_is_config_only():
    cfg = load_test_config()
    cfg["precisions"]["bf16_autocast"] = {"param_dtype": "float32", "autocast": "bfloat16"}
    validate_config(cfg)
    assert run_names(cfg)[-1] == "bf16_autocast-s2"
    assert parse_run("bf16_autocast-s2") == ("bf16_autocast", 2)
    assert parse_run("base") is None


def test_unreadable_config_file(tmp_path):
    bad = tmp_path / "c.yaml"
    bad.write_text("data: [unclosed\n")
    with pytest.raises(ConfigError, match=r"c\.yaml: not valid YAML"):
        load_config(bad)
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "missing.yaml")


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_snakemake_refuses_malformed_config_before_any_job(tmp_path, name):
    mutate, expected = MALFORMED[name]
    cfg = copy.deepcopy(load_test_config())
    mutate(cfg)
    wf = make_workflow_dir(tmp_path / "wf", cfg)
    proc = run_snakemake(wf, "--dry-run", timeout=120)
    assert proc.returncode != 0
    assert expected in proc.stdout + proc.stderr
    assert "config.yaml" in proc.stdout + proc.stderr
    assert not (wf / "results").exists()
    assert yaml.safe_load((wf / "config.yaml").read_text())  # untouched
