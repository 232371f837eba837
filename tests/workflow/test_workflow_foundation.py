"""The DAG's first stages through snakemake as a subprocess: outputs, caching, what reruns when."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys

import pytest
from conftest import REPO, planned_jobs, run_snakemake, set_key

from workflow_scripts.tasks.rows import read_rows

pytestmark = pytest.mark.slow
BASE = "results/models/base.json"
EVAL_SETS = [f"results/data/eval/{task}.jsonl" for task in ("add_sub", "mul", "mcq")]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """BASE and EVAL_SETS made: a copy of the session's run of them (with the base model's evaluation,
    tests/test_evaluate.py's start: conftest.base_evaluated); this module edits its config.yaml."""
    from conftest import base_evaluated, copy_workflow

    return copy_workflow(base_evaluated(tmp_path_factory), tmp_path_factory.mktemp("foundation") / "wf")


@pytest.mark.quick  # `make test-quick`'s end-to-end run: data, base model and its evaluation via snakemake
def test_outputs_of_data_and_base_model(built):
    summary = json.loads((built / "results/data/prepare.json").read_text())
    counts = {t: len(read_rows(built / f"results/data/eval/{t}.jsonl")) for t in ("add_sub", "mul", "mcq")}
    assert counts == {"add_sub": 40, "mul": 30, "mcq": 30}
    assert summary["eval"] == {}  # the training side depends on real eval sets only; these are synthetic
    assert len(read_rows(built / "results/data/train.jsonl")) == summary["train"]["rows"] > 0
    model_dir = built / "results/models/base"
    assert (model_dir / "model.safetensors").exists() and (model_dir / "tokenizer.json").exists()
    record = json.loads((built / BASE).read_text())
    assert 0.0 <= record["on_task"]["greedy_accuracy"] <= 1.0 and record["on_task"]["n"] == 40
    assert record["sft"]["steps"] == 60 and record["parameters"] > 0
    for rule in ("prepare_train", "base_model"):
        assert (built / f"logs/{rule}/{rule}.log").exists()
        assert (built / f"benchmarks/{rule}/{rule}.tsv").exists()
    assert (built / "logs/prepare_eval/mul.log").exists()


def test_second_run_has_nothing_to_do(built):
    assert planned_jobs(built, BASE) == {}


@contextlib.contextmanager
def changed_config(workdir, **changes):
    """config.yaml with dotted keys (``eval__n_samples`` = eval.n_samples) changed, restored after."""
    config = workdir / "config.yaml"
    original = config.read_text()
    try:
        for key, value in changes.items():
            set_key(config, key.replace("__", "."), value)
        yield
    finally:
        config.write_text(original)


def test_eval_and_analysis_settings_do_not_rerun_data_or_base_model(built):
    with changed_config(built, eval__n_samples=7, analysis__alpha=0.01, sparsity__etas=[1e-2]):
        assert planned_jobs(built, BASE) == {}


def test_data_seed_reruns_data_and_base_model(built):
    with changed_config(built, data__seed=8):
        jobs = planned_jobs(built, BASE)
    assert jobs == {"prepare_train": 1, "prepare_eval": 1, "base_model": 1}  # the on-task set only
    with changed_config(built, data__seed=8):
        assert planned_jobs(built, *EVAL_SETS) == {"prepare_eval": 3}


def test_model_setting_reruns_base_model_only(built):
    with changed_config(built, model__tiny__sft_steps=61):
        jobs = planned_jobs(built, BASE)
    assert jobs == {"base_model": 1}


def test_an_off_task_setting_reruns_only_that_tasks_data(built):
    with changed_config(built, data__tasks__mul__n=31):
        jobs = planned_jobs(built, BASE, "results/data/eval/mul.jsonl")
    assert jobs == {"prepare_eval": 1}


def test_adding_a_synthetic_task_leaves_training_data_and_base_model_alone(built):
    chain = {"source": "synthetic", "family": "chain", "kind": "integer", "role": "off_task", "n": 30}
    with changed_config(built, data__tasks__chain=chain):
        jobs = planned_jobs(built, BASE, "results/data/eval/chain.jsonl")
    assert jobs == {"prepare_eval": 1}


def test_snakemake_lint_is_clean(built):
    proc = run_snakemake(built, "--lint", timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# ------------------------------------------------------------------ the rule calling convention

FOOTER = 'if __name__ == "__main__":\n    main_from(globals())\n'


def _rules_and_scripts() -> dict[str, str]:
    from conftest import rule_stages

    return rule_stages(REPO)


def test_every_rule_runs_its_stage_module_by_one_convention():
    """script: names the stage module itself; the module has run/from_snakemake/main and the footer,
    no `from __future__` (Snakemake prepends its preamble), and the rule passes its code version."""
    import ast

    stages = _rules_and_scripts()
    rules_text = "\n".join(p.read_text() for p in (REPO / "rules").glob("*.smk"))
    all_rules = set(re.findall(r"^rule (\w+):", rules_text, flags=re.M))
    assert set(stages) == all_rules, f"rules without a stage module script: {all_rules - set(stages)}"
    assert not (REPO / "scripts").exists(), "scripts/ is gone: rules point at workflow_scripts/<stage>.py"
    for rule, stage in stages.items():
        source = (REPO / "workflow_scripts" / f"{stage}.py").read_text()
        tree = ast.parse(source)
        functions = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        assert {"run", "from_snakemake", "main"} <= functions, (rule, stage, functions)
        assert source.endswith(FOOTER), (rule, stage)
        assert "from __future__" not in source, (rule, stage)
        block = re.split(r"^rule ", rules_text, flags=re.M)
        body = next(b for b in block if b.startswith(f"{rule}:"))
        assert f'code=code("{stage}")' in body, (rule, "params: code=code(<stage>) is missing")


def test_a_stage_module_is_also_its_command_line():
    proc = subprocess.run(
        [sys.executable, "-m", "workflow_scripts.sparsity", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0 and "--no-cast-base-to-final" in proc.stdout, proc.stderr


def test_sparsity_and_overlap_rules_run_their_stage_modules(tmp_path, tmp_path_factory):
    """The convention end to end on real (tiny) checkpoints: snakemake runs workflow_scripts/sparsity.py
    and overlap.py as scripts (in the session's fork server: the package is linked); the upstream outputs
    are placeholders marked done with --touch."""
    import pandas as pd
    import torch
    from conftest import link_package, mark_done, placeholder_workflow
    from safetensors.torch import save_file

    wf = link_package(placeholder_workflow(tmp_path_factory, tmp_path / "wf"))
    weights = torch.linspace(-1, 1, 64)
    save_file({"model.layers.0.mlp.up_proj.weight": weights}, wf / "results/models/base/model.safetensors")
    for seed in (1, 2):
        final = weights.clone()
        final[seed] += 0.5
        save_file(
            {"model.layers.0.mlp.up_proj.weight": final},
            wf / f"results/train/fp32/seed{seed}/model/model.safetensors",
        )
    mark_done(wf)
    targets = ["results/sparsity/fp32/seed1.parquet", "results/sparsity/fp32/overlap.parquet"]
    for target in targets:
        (wf / target).unlink()  # missing -> only these two jobs (and sparsity fp32 seed1) run
    proc = run_snakemake(wf, *targets, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    table = pd.read_parquet(wf / targets[0])
    assert table["changed_eta_1e-03"].tolist() == [1] and table["precision"].tolist() == ["fp32"]
    overlap = pd.read_parquet(wf / targets[1])
    assert set(overlap.intersection) == {0} and set(overlap.union) == {2}
    assert "overlap fp32 seeds 1,2" in (wf / "logs/overlap/fp32.log").read_text()
