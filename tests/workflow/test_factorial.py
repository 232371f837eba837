"""The factorial config runs end to end: six arms that separate storage dtype, compute dtype and dropout.

A few-step version of config.factorial.yaml (its arms, the test config's tiny data, model and training)
runs through snakemake, and every arm's run.json shows the factor levels it claims. It starts from a copy
of the session's data and base model (conftest.base_evaluated: the factorial changes neither), so the run
is the arms' own jobs: training, evaluation, sparsity, overlap and the analysis.
"""

import json

import pytest
import torch
import yaml
from conftest import REPO, base_evaluated, copy_workflow, load_test_config, planned_jobs, run_snakemake

from workflow_scripts.runtime.config import load_config
from workflow_scripts.runtime.numerics import path_label

pytestmark = pytest.mark.slow


def experiment(name: str) -> dict:
    """A shipped experiment config as the workflow reads it: config.yaml with the file merged over it."""
    return load_config(REPO / name, check_files=False)


def few_step_factorial() -> dict:
    factorial = experiment("config.factorial.yaml")
    config = load_test_config()
    config["precisions"] = factorial["precisions"]
    config["seeds"] = [1]  # one run per arm: the arms' contracts are per run; the many-arm analysis of
    # two seeds: test_stats.py's and test_report.py's zero-spread tests (six arms, two seeds each)
    config["data"]["tasks"] = {k: v for k, v in config["data"]["tasks"].items() if k == "add_sub"}
    config["train"]["max_steps"] = 4
    config["train"]["checkpoint_every"] = 4
    config["train"]["kl_every"] = 4
    return config


def test_the_factorial_config_has_six_arms_crossing_storage_compute_and_dropout():
    every = experiment("config.factorial.yaml")["precisions"]
    arms = {k: a for k, a in every.items() if a.get("rounding", "nearest") == "nearest"}
    levels = {(a["param_dtype"], a["autocast"], a["dropout"]) for a in arms.values()}
    assert len(arms) == 6 and len(levels) == 6
    assert {a["deterministic"] for a in arms.values()} == {True}  # held fixed: not a fourth factor
    storage = {(p, c) for p, c, _ in levels}
    assert storage == {("float32", None), ("bfloat16", None), ("float32", "bfloat16")}
    assert {d for *_, d in levels} == {0.0, 0.1}


def test_the_controls_config_has_a_reference_a_negative_twin_and_a_noisy_positive_control():
    controls_config = experiment("config.controls.yaml")
    arms = controls_config["precisions"]
    controls = {name: arm.get("control") for name, arm in arms.items()}
    assert sorted(controls.values(), key=str) == sorted([None, "negative", "positive"], key=str)
    reference = next(arm for arm in arms.values() if arm.get("control") is None)
    twin = next(arm for arm in arms.values() if arm.get("control") == "negative")
    noisy = next(arm for arm in arms.values() if arm.get("control") == "positive")

    def but(arm: dict, *keys: str) -> dict:
        return {k: v for k, v in arm.items() if k not in ("control", *keys)}

    assert but(twin, "seed_offset") == but(reference, "seed_offset")
    assert twin["seed_offset"] > max(controls_config["seeds"])
    assert noisy["update_noise"] > 0
    assert but(noisy, "update_noise") == but(reference, "update_noise")


def test_the_factorial_config_adds_a_stochastic_rounding_twin_of_the_bf16_arm():
    every = experiment("config.factorial.yaml")["precisions"]
    sr = {k: a for k, a in every.items() if a.get("rounding") == "stochastic"}
    assert list(sr) == ["bf16_sr"]
    assert {**sr["bf16_sr"], "rounding": "nearest"} == {**every["bf16"], "rounding": "nearest"}


def test_a_few_step_factorial_runs_end_to_end_and_each_arm_is_what_it_names(tmp_path, tmp_path_factory):
    config = few_step_factorial()
    wf = copy_workflow(base_evaluated(tmp_path_factory), tmp_path / "wf")
    with open(wf / "config.yaml", "w", encoding="utf-8") as fh:
        yaml.safe_dump(config, fh, sort_keys=False)
    arms = len(config["precisions"])
    stages = ("prepare_train", "prepare_eval", "base_model", "train", "evaluate")
    jobs = planned_jobs(wf)  # data, base model and its evaluation are the session's; + base-bfloat16's
    assert [jobs.get(k, 0) for k in stages] == [0, 0, 0, arms, arms + 1], jobs
    proc = run_snakemake(wf, timeout=1500)  # the only run on the factorial's arms
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for name, arm in config["precisions"].items():
        for seed in config["seeds"]:
            run = json.loads((wf / "results" / "train" / name / f"seed{seed}" / "run.json").read_text())
            assert set(run["dtypes_saved"]) == {arm["param_dtype"]}, (name, run["dtypes_saved"])
            assert run["autocast"]["requested"] == arm["autocast"], name
            assert set(run["dropout"].values()) == {arm["dropout"]}, (name, run["dropout"])
            assert run["mode"]["rounding"] == arm.get("rounding", "nearest"), name
            stochastic = arm.get("rounding") == "stochastic"
            assert run["optimizer"]["class"] == ("StochasticRoundAdamW" if stochastic else "AdamW"), name
            expected, observed = run["precision_contract"]["expected"], run["precision_contract"]["observed"]
            assert {k: observed[k] for k in expected} == expected, name
            # numerics provenance: the path this machine's kernels take (the jobs ran here)
            assert run["numerics"]["cpu_capability"] == torch.backends.cpu.get_cpu_capability(), name
            assert run["numerics"]["torch"] == torch.__version__ and run["numerics"]["threads"]["intra_op"]
    stats = json.loads((wf / "results" / "analysis" / "stats.json").read_text())
    assert set(stats["verdicts"]) == {"H1", "H2", "H3"}
    report = (wf / "results" / "analysis" / "report.md").read_text()
    base = json.loads((wf / "results" / "models" / "base.json").read_text())
    assert "## Numerics provenance" in report and path_label(base["numerics"]) in report
    assert path_label(run["numerics"]) == path_label(base["numerics"])  # one machine: one path, no warning
    assert "numerics paths** in one analysis" not in report
