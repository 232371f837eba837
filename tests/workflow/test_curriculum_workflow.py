"""A two-phase curriculum through the workflow: prepare_train writes each phase's prompts, the run trains on
phase 0 (add_sub_small) for 4 steps and on data.train's prompts for 4, and metrics.jsonl shows the switch
both as scheduled (``phase``) and as drawn (``phase_drawn``: the phase of the rows the rollouts came from).
"""

from __future__ import annotations

import json

import pytest
from conftest import load_test_config, make_workflow_dir, run_snakemake

from workflow_scripts.tasks.rows import read_rows
from workflow_scripts.training.metrics_log import read_metrics

pytestmark = pytest.mark.slow

PHASES = [{"family": "add_sub_small", "n": 100, "steps": 4}, {"source": "train", "steps": 4}]


def test_two_phase_curriculum_switches_in_metrics(tmp_path):
    config = load_test_config()
    config["precisions"] = {"fp32": config["precisions"]["fp32"]}
    config["seeds"] = [1]
    # the switch is in the data and the schedule, not in what the model learns: a 10-step warm start and
    # the on-task held-out set alone (the test config's 60 steps and three tasks add nothing it checks)
    config["model"]["tiny"]["sft_steps"] = 10
    config["data"]["tasks"] = {"add_sub": config["data"]["tasks"]["add_sub"]}
    config["train"].update(max_steps=8, checkpoint_every=100, kl_every=100, eval_every=4, curriculum=PHASES)
    work = make_workflow_dir(tmp_path / "wf", config, shared_code=True)  # the session's fork server
    proc = run_snakemake(work, "results/train/fp32/seed1/run.json")  # its own run: the only curriculum config
    assert proc.returncode == 0, proc.stderr[-4000:]

    small = read_rows(work / "results/data/curriculum/phase0.jsonl")
    assert len(small) == 100
    assert all(max(int(x) for x in r["prompt"][:-1].replace("-", "+").split("+")) <= 19 for r in small)
    train = read_rows(work / "results/data/train.jsonl")
    assert [r["prompt"] for r in read_rows(work / "results/data/curriculum/phase1.jsonl")] == [
        r["prompt"] for r in train
    ]
    prepared = json.loads((work / "results/data/prepare.json").read_text())
    assert prepared["curriculum"] == [100, len(train)]

    metrics = read_metrics(work / "results/train/fp32/seed1/metrics.jsonl")
    assert [r["phase"] for r in metrics] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [r["phase_name"] for r in metrics] == ["add_sub_small"] * 4 + ["train"] * 4
    assert [r["phase_drawn"] for r in metrics] == [0, 0, 0, 0, 1, 1, 1, 1]  # what the sampler really fed
    heldout = read_metrics(work / "results/train/fp32/seed1/heldout.jsonl")
    assert sorted({(r["step"], r["phase"]) for r in heldout}) == [(0, 0), (4, 0), (8, 1)]
