"""A long job's attempts follow from its estimate and its partition's time limit (runtime/retries.py): each
attempt asks at most the limit, and the rule gets the retries that let it finish by resuming."""

from __future__ import annotations

import math
import shutil

import pytest
import yaml
from conftest import REPO, load_test_config, make_workflow_dir, run_snakemake

from workflow_scripts.runtime import resources, retries
from workflow_scripts.runtime.config import load_config, validate_config

PROFILE = REPO / "profiles" / "slurm"


def _profile(tmp_path, **partitions) -> str:
    """A copy of profiles/slurm whose partitions.yaml is ``partitions``."""
    folder = tmp_path / "slurm"
    shutil.copytree(PROFILE, folder)
    (folder / "partitions.yaml").write_text(yaml.safe_dump({"partitions": partitions}))
    return str(folder)


def test_attempts_cover_the_estimate_with_what_each_resumed_attempt_redoes():
    assert retries.attempts_needed(100, 120, 30) == 1
    assert retries.attempts_needed(100, None, 30) == 1  # no limit: one attempt
    # 300 min on 120-minute attempts that each redo 20: 120, then 100 new minutes an attempt -> 1 + 2
    assert retries.attempts_needed(300, 120, 20) == 3
    assert retries.attempts_needed(321, 120, 20) == 4
    for estimate, limit, lost in [(300, 120, 20), (9000, 2880, 610), (2, 1, 0.5)]:
        n = retries.attempts_needed(estimate, limit, lost)
        assert limit + (n - 1) * (limit - lost) >= estimate > limit + (n - 2) * (limit - lost)
    with pytest.raises(ValueError, match="cannot progress"):
        retries.attempts_needed(300, 20, 20)


def test_partition_runtimes_are_read_in_minutes_in_slurms_forms():
    forms = {
        2880: 2880.0,
        "90": 90.0,
        "2-00:00:00": 2880.0,
        "1:30:00": 90.0,
        "05:30": 5.5,
        "1-12": 2160.0,
        "1-2:30": 1590.0,
    }
    for value, minutes in forms.items():
        assert retries.parse_minutes(value) == minutes, value
    for unlimited in (None, "infinite", "UNLIMITED", math.inf):
        assert retries.parse_minutes(unlimited) is None


def test_the_slurm_profile_on_the_command_line_gives_partition_limits_and_its_retries(tmp_path):
    profile = retries.slurm_profile(["snakemake", "--profile", str(PROFILE), "-n"], environ={})
    settings = yaml.safe_load((PROFILE / "config.yaml").read_text())
    assert profile.retries == settings["retries"]
    assert profile.partitions == {"cpu": (0, 2880.0), "gpu": (8, 2880.0)}
    assert retries.slurm_profile(["snakemake", f"--profile={PROFILE}", "--retries", "5"], {}).retries == 5
    assert retries.slurm_profile(["snakemake"], {"SNAKEMAKE_PROFILE": str(PROFILE)}) == profile
    # a local run, and the job step a SLURM job runs on its node, get no limits
    assert retries.slurm_profile(["snakemake", "--cores", "2"], environ={}) is None
    assert retries.slurm_profile(["snakemake", "--profile", str(PROFILE), "-e", "slurm-jobstep"], {}) is None
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump({"partitions": {"gpu": {"max_gpu": 4, "max_runtime": "1-00:00:00"}}}))
    given = retries.slurm_profile(
        ["snakemake", "--profile", str(PROFILE), "--slurm-partition-config", str(other)], {}
    )
    assert given.partitions == {"gpu": (4, 1440.0)}


def test_a_job_gets_the_highest_limit_of_the_partitions_it_can_go_to():
    profile = retries.SlurmProfile({"cpu": (0, 600.0), "short": (8, 60.0), "long": (4, 2880.0)})
    assert profile.limit(0) == 600
    assert profile.limit(4) == 2880
    assert profile.limit(8) == 60  # only `short` has 8 GPUs
    assert retries.SlurmProfile({"gpu": (8, 60.0)}).limit(0) == 60  # no CPU partition: any
    assert retries.SlurmProfile({"cpu": (0, None), "gpu": (8, 60.0)}).limit(0) is None


def test_each_attempt_asks_at_most_the_partitions_limit():
    config = validate_config(load_test_config())
    config["resources"]["train"]["runtime_min"] = 100
    runtime = resources.snakemake_resources(config, "train", limit=250)["runtime"]
    assert [runtime(None, attempt) for attempt in (1, 2, 3)] == [100, 200, 250]
    config["resources"]["train"].update(runtime_min=None, estimate_min=400)
    assert resources.snakemake_resources(config, "train", limit=250)["runtime"](None, 1) == 250
    assert resources.snakemake_resources(config, "train")["runtime"](None, 1) == 400  # no limit: the estimate
    config["resources"]["train"]["estimate_min"] = None  # the plan's estimate (retries.train_plan), if any
    assert resources.snakemake_resources(config, "train", limit=250, estimate=120)["runtime"](None, 3) == 250
    # a rule with no runtime of its own: the profile's 60 min x attempt, capped
    assert resources.snakemake_resources(config, "sparsity", limit=90)["runtime"](None, 2) == 90
    assert "runtime" not in resources.snakemake_resources(config, "sparsity")


def test_the_paper_runs_fp32_estimate_gets_the_attempts_a_48_hour_partition_needs():
    paper = load_config(REPO / "config.paper.yaml", check_files=False)
    profile = retries.slurm_profile(["snakemake", "--profile", str(PROFILE)], environ={})
    plans = {plan.rule: plan for plan in retries.plans(paper, profile, results="absent")}
    train = plans["train"]
    assert train.estimate > 140 * 60 and train.limit == 2880  # the cluster plan's slow end for fp32
    assert train.attempts == 4 and retries.rule_retries(train, profile) == 3 + profile.retries
    assert train.limit + (train.attempts - 1) * (train.limit - train.lost) >= train.estimate
    assert (
        plans["evaluate"].attempts == 1
        and retries.rule_retries(plans["evaluate"], profile) == profile.retries
    )
    assert retries.rule_retries(train, None) is None  # locally: no time limit, the profile's retries
    text = retries.table(list(plans.values()), profile)
    assert "train" in text and " 4 " in text


def test_estimate_min_replaces_the_plans_estimate_and_a_limit_too_short_for_one_checkpoint_is_refused():
    config = validate_config(load_test_config())
    config["resources"]["train"].update(estimate_min=600, startup_min=5)
    config["train"].update(max_steps=60, checkpoint_every=6)  # a checkpoint every 60 min of the estimate
    plan = retries.train_plan(config, limit=125)
    assert (plan.estimate, plan.lost) == (600, 65)
    assert plan.attempts == 1 + math.ceil((600 - 125) / (125 - 65))
    short = retries.train_plan(config, limit=60)  # redoes 65 min an attempt: resubmitting cannot finish it
    assert short.attempts is None and short.problem.startswith("train: a 60-minute attempt cannot progress")
    assert retries.rule_retries(short, retries.SlurmProfile({}, retries=2)) is None  # the profile's
    assert "warning: train: a 60-minute attempt" in retries.table([short], None)


def test_rules_take_their_retries_from_the_plan():
    for path in ("train", "evaluate", "base_model"):
        assert f'retries: job_retries("{path}")' in (REPO / "rules" / f"{path}.smk").read_text()


@pytest.mark.slow
def test_a_dry_run_through_a_slurm_profile_prints_each_long_rules_attempts(tmp_path):
    config = load_test_config()
    config["resources"] = {"train": {"gpus": 1, "estimate_min": 200, "startup_min": 5}}
    wf = make_workflow_dir(tmp_path / "wf", config)
    profile = _profile(tmp_path, cpu={}, gpu={"max_gpu": 2, "max_runtime": 60})
    proc = run_snakemake(wf, "--dry-run", "--profile", profile, "--workflow-profile", "none")
    out = proc.stdout + proc.stderr
    # 200 min, 60-minute attempts, each resumed one redoing 5 + 200 x 3/6 = 105 min: more than it gets
    assert proc.returncode == 0 and "warning: train: a 60-minute attempt cannot progress" in out, out[-3000:]
    config["train"].update(max_steps=60, checkpoint_every=3)  # lost: 5 + 10 = 15 min an attempt
    (wf / "config.yaml").write_text(yaml.safe_dump(config))
    proc = run_snakemake(wf, "--dry-run", "--profile", profile, "--workflow-profile", "none")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    row = next(line for line in out.splitlines() if line.startswith("train ") and " min " in line)
    # 1 + ceil((200 - 60) / (60 - 15)) = 5 attempts, retries 4 + the profile's 2
    assert row.split()[-2:] == ["5", "6"], row
    train = next(b for b in out.split("rule ")[1:] if b.startswith("train:"))
    assert "runtime=60" in train


def test_the_base_model_chunk_is_the_stages_own():
    from workflow_scripts import base_model

    assert retries.BASE_MODEL_CHUNK == base_model.HEADROOM_CHUNK
