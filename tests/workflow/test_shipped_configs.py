"""Every config the repo ships plans, with the exact command the README gives for it, only its own jobs.

`--configfile X` means X alone, plus the file X names under `extends` (the experiment files extend
config.yaml): the workflow dir also holds the default config.yaml, so a task, an arm or a setting leaking
in from it where X does not ask for it (config.paper.yaml), or an arm of it that X replaces
(config.controls.yaml's `replace: [precisions]`), would show up in the plan. The expected plan is the
loader's config of X (`load_config`, `extends` followed).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
from pathlib import Path

import pytest
import snakemake_server
import yaml
from conftest import REPO, SNAKEMAKE, job_stats, log_workflow_run, make_workflow_dir

from workflow_scripts.runtime import hub_copies, paths
from workflow_scripts.runtime.config import load_config
from workflow_scripts.training.curriculum import data_phases

pytestmark = pytest.mark.slow
SHIPPED = sorted(p.name for p in REPO.glob("config*.yaml"))


def readme_command(config_name: str) -> list[str]:
    """The README's local (non-SLURM) snakemake command for a shipped config, as argv."""
    readme = (REPO / "README.md").read_text()
    if config_name == "config.yaml":
        pattern = r"`(snakemake --cores \d+)`"
    else:
        pattern = rf"`(snakemake [^`]*--configfile {re.escape(config_name)}[^`]*)`"
    commands = [c for c in re.findall(pattern, readme) if "--profile" not in c]
    assert commands, f"README gives no command for {config_name}"
    return shlex.split(commands[0])


def expected_jobs(config: dict) -> dict[str, int]:
    arms, tasks = len(config["precisions"]), len(config["data"]["tasks"])
    trained = sum(len(paths.arm_seeds(config, p)) for p in config["precisions"])  # an arm may have its own
    runs = len(paths.run_names(config))
    assert runs == len(paths.base_runs(config)) + trained
    fetched = hub_copies.hub_datasets(config["data"], data_phases(config["train"]))  # rules/fetch.smk
    hub_model = {"fetch_model": 1} if hub_copies.hub_model(config["model"]) else {}
    ref = next(iter(config["precisions"]))
    snapshots = paths.snapshot_runs(config)  # rules/evaluate.smk, evaluate_snapshot: one job a snapshot
    snap_jobs = (
        {
            "train_snapshots": len(paths.arm_seeds(config, ref)),
            "evaluate_snapshot": len(snapshots),
            "snapshot_metrics": 1,
        }
        if snapshots
        else {}
    )
    return {
        **snap_jobs,
        **({"fetch_dataset": len(fetched)} if fetched else {}),
        **hub_model,
        "prepare_eval": tasks,
        "prepare_train": 1,
        "base_model": 1,
        "train": trained - (len(paths.arm_seeds(config, ref)) if snapshots else 0),
        "evaluate": runs if config["eval"]["jobs"] == "per_run" else runs * tasks,  # one job per run
        "sparsity": trained,
        "overlap": arms,
        "aggregate": 1,
        "stats": 1,
        "learning_curves": 1,
        "figures": 1,
        "report": 1,
        "all": 1,
    }


def dry_run(workdir: Path, argv: list[str]) -> str:
    assert argv[0] == "snakemake"
    cmd = [SNAKEMAKE, "--dry-run", *argv[1:]]
    log_workflow_run(cmd[1:])
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}
    proc = snakemake_server.run(cmd, cwd=workdir, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    """Shipped config -> the stdout of its README command's dry run, each run once for the module."""
    found: dict[str, str] = {}

    def plan(name: str) -> str:
        if name not in found:
            default = yaml.safe_load((REPO / "config.yaml").read_text())  # config.yaml beside it, always
            wf = make_workflow_dir(tmp_path_factory.mktemp("shipped") / "wf", default)
            for shipped in SHIPPED:  # the file and any it extends (config.one-node.yaml: config.paper.yaml)
                if shipped != "config.yaml":
                    shutil.copy2(REPO / shipped, wf / shipped)
            found[name] = dry_run(wf, readme_command(name))
        return found[name]

    return plan


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_config_plans_its_own_jobs_with_the_readme_command(planned, name):
    config = load_config(REPO / name, check_files=False)
    out = planned(name)
    assert job_stats(out) == expected_jobs(config)
    outputs = " ".join(re.findall(r"^\s*output: (.*)$", out, flags=re.M))
    tasks = set(re.findall(r"results/eval/[^/\s]+/(\w+)\.json", outputs))
    arms = set(re.findall(r"results/train/(\w+)/seed\d+/run\.json", outputs))
    runs = set(re.findall(r"results/eval/([^/\s]+)/", outputs))
    assert tasks == set(config["data"]["tasks"])
    assert arms == set(config["precisions"])
    assert runs == set(paths.run_names(config)) | set(paths.snapshot_runs(config))  # snapshots: evaluated too


def test_paper_config_plans_exactly_the_paper_tasks_and_arms(planned):
    """README's paper-scale command (the dry run above shares it): the paper's 7 tasks, 2 arms x 5 seeds,
    nothing of config.yaml."""
    out = planned("config.paper.yaml")
    tasks = set(re.findall(r"results/eval/[^/\s]+/(\w+)\.json", out))
    assert tasks == {"math500", "aime24", "aime25", "amc23", "gsm8k", "mmlu_stem", "humaneval"}
    assert set(re.findall(r"results/train/(\w+)/seed(\d+)/run\.json", out)) == {
        (arm, str(seed)) for arm in ("fp32", "bf16") for seed in range(1, 6)
    }
