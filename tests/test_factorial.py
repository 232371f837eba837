"""The factorial config runs end to end: six arms that separate storage dtype, compute dtype and dropout.

A few-step version of config.factorial.yaml (its arms, the test config's tiny data, model and training)
runs through snakemake, and every arm's run.json shows the factor levels it claims.
"""

import json

import pytest
import yaml
from conftest import REPO, load_test_config, make_workflow_dir, run_snakemake

pytestmark = pytest.mark.slow


def few_step_factorial() -> dict:
    factorial = yaml.safe_load((REPO / "config.factorial.yaml").read_text())
    config = load_test_config()
    config["precisions"] = factorial["precisions"]
    config["seeds"] = [1, 2]
    config["data"]["tasks"] = {k: v for k, v in config["data"]["tasks"].items() if k in ("add_sub", "mul")}
    config["train"]["max_steps"] = 4
    config["train"]["checkpoint_every"] = 4
    config["train"]["kl_every"] = 4
    return config


def test_the_factorial_config_has_six_arms_crossing_storage_compute_and_dropout():
    arms = yaml.safe_load((REPO / "config.factorial.yaml").read_text())["precisions"]
    levels = {(a["param_dtype"], a["autocast"], a["dropout"]) for a in arms.values()}
    assert len(arms) == 6 and len(levels) == 6
    assert {a["deterministic"] for a in arms.values()} == {True}  # held fixed: not a fourth factor
    storage = {(p, c) for p, c, _ in levels}
    assert storage == {("float32", None), ("bfloat16", None), ("float32", "bfloat16")}
    assert {d for *_, d in levels} == {0.0, 0.1}


def test_a_few_step_factorial_runs_end_to_end_and_each_arm_is_what_it_names(tmp_path):
    config = few_step_factorial()
    wf = make_workflow_dir(tmp_path / "wf", config)
    proc = run_snakemake(wf, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for name, arm in config["precisions"].items():
        for seed in config["seeds"]:
            run = json.loads((wf / "results" / "train" / name / f"seed{seed}" / "run.json").read_text())
            assert set(run["dtypes_saved"]) == {arm["param_dtype"]}, (name, run["dtypes_saved"])
            assert run["autocast"]["requested"] == arm["autocast"], name
            assert set(run["dropout"].values()) == {arm["dropout"]}, (name, run["dropout"])
    stats = json.loads((wf / "results" / "analysis" / "stats.json").read_text())
    assert set(stats["verdicts"]) == {"H1", "H2", "H3"}
    assert (wf / "results" / "analysis" / "report.md").stat().st_size > 0
