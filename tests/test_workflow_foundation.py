"""The DAG's first stages through snakemake as a subprocess: outputs, caching, what reruns when."""

from __future__ import annotations

import json

import pytest
from conftest import planned_jobs, run_snakemake, set_key

from workflow_scripts.rows import read_rows

pytestmark = pytest.mark.slow
BASE = "results/models/base.json"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    from conftest import load_test_config, make_workflow_dir

    wf = make_workflow_dir(tmp_path_factory.mktemp("foundation") / "wf", load_test_config())
    proc = run_snakemake(wf, BASE, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return wf


def test_outputs_of_data_and_base_model(built):
    summary = json.loads((built / "results/data/prepare.json").read_text())
    assert summary["eval"] == {"add_sub": 40, "mul": 30, "mcq": 30}
    assert len(read_rows(built / "results/data/train.jsonl")) == summary["train"]["rows"] > 0
    model_dir = built / "results/models/base"
    assert (model_dir / "model.safetensors").exists() and (model_dir / "tokenizer.json").exists()
    record = json.loads((built / BASE).read_text())
    assert 0.0 <= record["on_task"]["greedy_accuracy"] <= 1.0 and record["on_task"]["n"] == 40
    assert record["sft"]["steps"] == 60 and record["parameters"] > 0
    for rule in ("prepare_data", "base_model"):
        assert (built / f"logs/{rule}/{rule}.log").exists()
        assert (built / f"benchmarks/{rule}/{rule}.tsv").exists()


def test_second_run_has_nothing_to_do(built):
    assert planned_jobs(built, BASE) == {}


def test_eval_and_analysis_settings_do_not_rerun_data_or_base_model(built):
    config = built / "config.yaml"
    original = config.read_text()
    try:
        set_key(config, "eval.n_samples", 7)
        set_key(config, "analysis.alpha", 0.01)
        set_key(config, "sparsity.etas", [1e-2])
        assert planned_jobs(built, BASE) == {}
    finally:
        config.write_text(original)


def test_data_seed_reruns_data_and_base_model(built):
    config = built / "config.yaml"
    original = config.read_text()
    try:
        set_key(config, "data.seed", 8)
        jobs = planned_jobs(built, BASE)
        assert jobs.get("prepare_data") == 1 and jobs.get("base_model") == 1
    finally:
        config.write_text(original)


def test_model_setting_reruns_base_model_only(built):
    config = built / "config.yaml"
    original = config.read_text()
    try:
        set_key(config, "model.tiny.sft_steps", 61)
        jobs = planned_jobs(built, BASE)
        assert jobs.get("base_model") == 1 and "prepare_data" not in jobs
    finally:
        config.write_text(original)


def test_snakemake_lint_is_clean(built):
    proc = run_snakemake(built, "--lint", timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
