"""Multi-process training (train.distributed): the launch command, the config checks, the FSDP precision
policy per arm, and real 2-process gloo runs on CPU (through Snakemake; a second run, killed and resumed,
that must end bit-identical to an uninterrupted one, both with DAPO's dynamic sampling on).

FSDP runs here too: accelerate turns an FSDP plugin into FSDP only on accelerators, so the train stage sets
that state on CPU processes (``ranks.fsdp_on_cpu``) and torch's FSDP2 shards over gloo; two 2-process
FSDP runs check the arms' contracts on every rank.

A launch's cost is mostly its three processes' start-up (the launcher and two ranks import torch,
transformers and TRL: ~10-15 s a launch against ~0.1-0.3 s a tiny step), so the module launches as few
runs as its claims need (seven) and tests read their outputs rather than launch their own.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from accelerate.commands.launch import launch_command_parser
from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin
from conftest import base_evaluated, bit_identical, copy_workflow, load_test_config, run_snakemake, set_key
from safetensors.torch import load_file

from workflow_scripts.runtime.config import ConfigError, validate_config
from workflow_scripts.train import job_from_config
from workflow_scripts.training.checkpoints import is_complete_checkpoint
from workflow_scripts.training.grpo_config import grpo_config
from workflow_scripts.training.launch import (
    LaunchError,
    accelerate_command,
    launch_env,
    launch_training,
    resolve_processes,
)
from workflow_scripts.training.metrics_log import read_metrics
from workflow_scripts.training.precision import PrecisionMode
from workflow_scripts.training.ranks import check_distribution

ARMS = {
    "fp32": {"param_dtype": "float32", "autocast": None},
    "bf16": {"param_dtype": "bfloat16", "autocast": None},
    "bf16_autocast": {"param_dtype": "float32", "autocast": "bfloat16"},
}


# ------------------------------------------------------------------------------- the launch command


def test_null_processes_mean_one_per_gpu_and_one_without_gpu():
    assert resolve_processes({"processes": None}, gpus=4) == 4
    assert resolve_processes({"processes": None}, gpus=0) == 1
    assert resolve_processes({}, gpus=2) == 2
    assert resolve_processes({"processes": 2}, gpus=0) == 2
    assert resolve_processes({"processes": 1}, gpus=8) == 1


def test_launch_command_is_what_accelerate_parses_as_n_processes_of_the_train_module():
    cmd = accelerate_command(2, ["--job", "spec.json", "--threads", "1"], threads_per_process=3)
    assert cmd[:3] == [sys.executable, "-m", "accelerate.commands.launch"]
    assert "--cpu" not in cmd  # accelerate's --cpu launcher starts ONE process without mpirun
    args = launch_command_parser().parse_args(cmd[3:])  # accelerate 1.15's own parser
    assert args.multi_gpu and args.num_processes == 2 and args.num_machines == 1
    assert args.mixed_precision == "no" and args.dynamo_backend == "no"
    assert args.main_process_port == 0  # accelerate picks a free port
    assert args.num_cpu_threads_per_process == 3
    assert args.module and args.training_script == "workflow_scripts.train"
    assert args.training_script_args == ["--job", "spec.json", "--threads", "1"]


def test_one_process_is_never_launched():
    with pytest.raises(ValueError, match="not launched"):
        accelerate_command(1, [])


@pytest.mark.slow
def test_a_failed_launch_raises_with_the_log_and_every_rank_output_is_in_it(tmp_path):
    log = tmp_path / "logs" / "train.log"
    config = validate_config(load_test_config(), check_files=False)
    # a missing data folder: both ranks fail after the imports
    job = job_from_config(config, "fp32", 1, *(tmp_path / d for d in ("no_data", "no_base", "out", "ckpt")))
    with pytest.raises(LaunchError, match=r"exited with status [1-9]") as err:
        launch_training(job, processes=2, threads=2, log_path=log)
    assert str(log) in str(err.value)
    text = log.read_text()
    assert "launching 2 training processes" in text and "no_data" in text
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------- config checks


def _problems(distributed: dict, gpus: int = 0, **train) -> str:
    config = load_test_config()
    config["train"].update(train, distributed=distributed)
    config["resources"] = {"train": {"gpus": gpus}}
    with pytest.raises(ConfigError) as err:
        validate_config(config, source="mine.yaml", check_files=False)
    return str(err.value)


def test_processes_that_do_not_divide_a_micro_batch_are_refused_naming_file_and_key():
    # 4 prompts x 4 generations / 1 accumulation step = 16 completions per micro-batch
    message = _problems({"processes": 3})
    assert "mine.yaml: train.distributed.processes: 3 processes must divide" in message
    assert "= 16 / 1 = 16" in message


def test_more_processes_than_gpus_are_refused():
    assert "mine.yaml: train.distributed.processes: 4 processes, but the train job has 2 GPUs" in (
        _problems({"processes": 4}, gpus=2)
    )


def test_fsdp_in_one_process_is_refused_and_on_cpu_processes_it_plans():
    assert "mine.yaml: train.distributed.strategy: fsdp shards over processes and this run has 1" in (
        _problems({"strategy": "fsdp"})
    )
    assert "fsdp shards over processes and this run has 1" in _problems({"strategy": "fsdp"}, gpus=1)
    config = load_test_config()  # two gloo processes (ranks.fsdp_on_cpu)
    config["train"]["distributed"] = {"strategy": "fsdp", "processes": 2}
    validate_config(config, source="mine.yaml", check_files=False)


def test_valid_distributed_settings_pass():
    config = load_test_config()
    config["train"]["distributed"] = {"processes": None, "strategy": "fsdp"}
    config["resources"] = {"train": {"gpus": 4}}
    validate_config(config, source="mine.yaml", check_files=False)
    config = load_test_config()
    validate_config(config, check_files=False)
    assert config["train"]["distributed"] == {  # schema defaults
        "processes": None, "strategy": "ddp", "gradient_sync": "every_micro_batch"}  # fmt: skip


# ------------------------------------------------------------------------ FSDP: the policy per arm


def _fsdp_plugin(arm: str, tmp_path) -> tuple[FullyShardedDataParallelPlugin, object]:
    train = validate_config(load_test_config(), check_files=False)["train"]
    train["distributed"] = {"processes": 2, "strategy": "fsdp"}
    mode = PrecisionMode.from_config(arm, ARMS[arm])
    args = grpo_config(train, mode, 1, tmp_path, world_size=2)
    plugin = FullyShardedDataParallelPlugin(**args.fsdp_plugin_args)  # as the Trainer builds it
    if args.bf16:  # what AcceleratorState does with the Trainer's mixed precision
        plugin.set_mixed_precision("bf16")
    return plugin, args


@pytest.mark.parametrize("arm", sorted(ARMS))
def test_fsdp_casts_nothing_so_each_arm_keeps_its_dtypes(arm, tmp_path):
    plugin, args = _fsdp_plugin(arm, tmp_path)
    assert plugin.fsdp_version == 2 and plugin.reshard_after_forward is True  # full sharding
    assert plugin.state_dict_type.name == "FULL_STATE_DICT"
    policy = plugin.mixed_precision_policy
    assert (policy.param_dtype, policy.reduce_dtype, policy.output_dtype) == (None, None, None)
    assert args.bf16 == (ARMS[arm]["autocast"] == "bfloat16") and args.fp16 is False  # autocast unchanged


def test_without_the_policy_accelerate_would_gather_and_reduce_in_bf16(tmp_path):
    _, args = _fsdp_plugin("bf16_autocast", tmp_path)
    plain = {k: v for k, v in args.fsdp_plugin_args.items() if k != "mixed_precision_policy"}
    plugin = FullyShardedDataParallelPlugin(**plain)
    plugin.set_mixed_precision("bf16")
    assert plugin.mixed_precision_policy.reduce_dtype == torch.bfloat16  # what the policy prevents


def test_fsdp_needs_two_processes_at_run_time(tmp_path):
    train = validate_config(load_test_config(), check_files=False)["train"]
    train["distributed"] = {"processes": 2, "strategy": "fsdp"}
    with pytest.raises(ConfigError, match=r"train\.distributed\.strategy: fsdp shards over processes"):
        grpo_config(train, PrecisionMode.from_config("fp32", ARMS["fp32"]), 1, tmp_path, world_size=1)


def test_a_strategy_accelerate_did_not_set_up_is_an_error():
    fsdp = {"distributed": {"strategy": "fsdp"}}
    cpu = SimpleNamespace(num_processes=2, distributed_type=DistributedType.MULTI_CPU)
    with pytest.raises(RuntimeError, match="fsdp, but accelerate runs MULTI_CPU"):
        check_distribution(cpu, fsdp, 2)
    check_distribution(SimpleNamespace(num_processes=2, distributed_type=DistributedType.FSDP), fsdp, 2)
    check_distribution(cpu, {"distributed": {"strategy": "ddp"}}, 2)
    with pytest.raises(RuntimeError, match="WORLD_SIZE is 4"):
        check_distribution(cpu, {}, 4)


# ------------------------------------------------------------------------ real 2-process CPU runs


def _assert_two_rank_run(out, steps: int) -> dict:
    run = json.loads((out / "run.json").read_text())
    assert run["world_size"] == 2 and run["strategy"] == "ddp"
    assert run["distributed_type"] == "MULTI_CPU"  # gloo processes, not one process
    assert [r["rank"] for r in run["ranks"]] == [0, 1]
    for rank in run["ranks"]:
        assert rank["dtypes_start"] == rank["dtypes_end"] == {"float32": run["trainable_tensors"]}
        assert rank["autocast_observed"]["enabled"] is False
    assert run["trainer"]["per_device_train_batch_size"] == 16 // 2  # the batch is split, not doubled
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == list(range(1, steps + 1))
    return run


@pytest.mark.slow
def test_two_gloo_processes_through_snakemake_write_the_usual_outputs(tmp_path, tmp_path_factory):
    # the session's data and base model (conftest.base_evaluated, shared with tests/test_evaluate.py and
    # tests/workflow/test_workflow_foundation.py) and its fork server: the train job is the only job this
    # run adds
    workdir = copy_workflow(base_evaluated(tmp_path_factory), tmp_path / "wf")
    train = {**load_test_config()["train"], "max_steps": 4, "checkpoint_every": 2, "kl_every": 2}
    set_key(workdir / "config.yaml", "train", {**train, "distributed": {"processes": 2}})
    set_key(workdir / "config.yaml", "seeds", [1])
    target = "results/train/fp32/seed1/run.json"
    proc = run_snakemake(workdir, target, timeout=400)  # its own run: the only 2-process train job
    log = workdir / "logs" / "train" / "fp32" / "seed1.log"
    assert proc.returncode == 0, proc.stderr[-3000:] + (log.read_text()[-3000:] if log.exists() else "")
    out = workdir / "results" / "train" / "fp32" / "seed1"
    _assert_two_rank_run(out, 4)
    # only rank 0 wrote, and only the declared outputs
    assert sorted(p.name for p in out.iterdir()) == ["heldout.jsonl", "metrics.jsonl", "model", "run.json"]
    assert (out / "model" / "model.safetensors").exists()
    assert not (workdir / "results" / "checkpoints" / "fp32" / "seed1").exists()
    text = log.read_text()
    assert "launching 2 training processes" in text and "--num_processes 2" in text
    assert "step 4/4" in text  # the ranks' own output, not only the launcher's


# A kill right after the first checkpoint (step 2) leaves 6 steps (seconds) for the launcher to stop the
# ranks (it gets SIGTERM ~0.2 s after the parent dies); 8 steps cross the first epoch's end (step 6).
STEPS = 8


def _job(tiny_base, name: str) -> dict:
    """The 2-process DDP run of the deterministic fp32 arm, with dynamic sampling: every rank joins every
    refill draw (collectives), so the resumed run must restore the draws' state on both ranks too."""
    root = tiny_base["root"] / "distributed" / name
    config = json.loads(json.dumps(tiny_base["config"]))
    config["train"].update(max_steps=STEPS, checkpoint_every=2, kl_every=6, learning_rate=1e-3)
    config["train"].update(dynamic_sampling=True, dynamic_sampling_max_rounds=8)
    config["train"]["distributed"] = {"processes": 2, "strategy": "ddp"}
    data, base = tiny_base["data_dir"], tiny_base["base_dir"]
    return job_from_config(config, "fp32", 1, data, base, root / "out", root / "ckpt")  # deterministic arm


def _weights(job: dict) -> dict[str, torch.Tensor]:
    return load_file(Path(job["out_dir"]) / "model" / "model.safetensors")


@pytest.fixture(scope="module")
def uninterrupted(tiny_base) -> dict:
    job = _job(tiny_base, "a")
    launch_training(job, processes=2, threads=2, log_path=Path(job["out_dir"]).parent / "train.log")
    _assert_two_rank_run(Path(job["out_dir"]), STEPS)
    return _weights(job)


@pytest.mark.slow
def test_dynamic_sampling_with_two_processes_fills_every_round(tiny_base, uninterrupted):
    """Gloo on CPU: every process joins every refill draw (collectives) and the counts are summed."""
    out = Path(_job(tiny_base, "a")["out_dir"])
    run_record = json.loads((out / "run.json").read_text())
    assert run_record["world_size"] == 2 and run_record["dynamic_sampling"]["enabled"] is True
    fresh = [r for r in read_metrics(out / "metrics.jsonl") if r["generation_step"]]
    assert fresh and all(r["groups_kept"] == 8 and r["groups_zero_spread"] == 0 for r in fresh)
    assert all(r["rollouts_drawn"] >= 8 for r in fresh)


def _descendants(pid: int) -> set[int]:
    """The processes below ``pid`` (children, their children, ...), from /proc."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


_PARENT = "import json, sys; from workflow_scripts.training.launch import launch_training; " + (
    "launch_training(json.loads(sys.argv[1]), 2, 2, sys.argv[2])"
)


@pytest.mark.slow
def test_a_killed_two_process_job_stops_its_workers_and_resumes_bit_identically(tiny_base, uninterrupted):
    """A second run of the deterministic fp32 arm, killed after its first checkpoint and resumed, ends with
    the uninterrupted run's weights bit for bit: two 2-process runs agree, and resuming loses nothing.
    (Its steps 1-2 come from the killed processes, 3-8 from the rerun: a second computation of every
    step.)"""
    assert tiny_base["config"]["precisions"]["fp32"]["deterministic"] is True
    job = _job(tiny_base, "killed")
    out, ckpt = Path(job["out_dir"]), Path(job["ckpt_dir"])
    log = out.parent / "train.log"
    parent = subprocess.Popen([sys.executable, "-c", _PARENT, json.dumps(job), str(log)], env=launch_env())
    deadline = time.time() + 120
    launched: set[int] = set()  # the launcher and the ranks
    while parent.poll() is None and time.time() < deadline:
        if is_complete_checkpoint(ckpt / "checkpoint-2", world=2):  # every rank's part written
            launched = _descendants(parent.pid)
            parent.kill()  # as a scheduler kills the train job's process: no cleanup of its own
            break
        time.sleep(0.02)
    assert parent.wait(timeout=30) == -signal.SIGKILL, log.read_text()[-3000:]
    assert len(launched) >= 3, launched  # the launcher and both ranks were running at the kill
    deadline = time.time() + 60  # orphaned ranks would go on and finish the run (and delete ckpt/)
    while any(_alive(pid) for pid in launched):
        assert time.time() < deadline, "the ranks outlived the killed job"
        time.sleep(0.1)
    assert not (out / "run.json").exists() and ckpt.is_dir()

    launch_training(job, processes=2, threads=2, log_path=log)  # the rerun
    run = _assert_two_rank_run(out, STEPS)
    assert run["resumed"] is True and run["resumed_from_step"] >= 2
    assert bit_identical(uninterrupted, _weights(job))
    base = load_file(tiny_base["base_dir"] / "model.safetensors")
    assert not bit_identical(uninterrupted, base)  # training changed the weights


# --------------------------------------------------------------- FSDP on two gloo processes (CPU)

FSDP_ARMS = {
    "fp32": {"param_dtype": "float32", "autocast": None, "deterministic": True, "dropout": 0.0},
    "bf16_amp": {"param_dtype": "float32", "autocast": "bfloat16", "deterministic": False, "dropout": 0.0},
}


@pytest.mark.slow
@pytest.mark.parametrize("arm", sorted(FSDP_ARMS))
def test_fsdp_on_two_gloo_processes_shards_policy_and_reference_and_keeps_the_contract_on_every_rank(
    tiny_base, arm
):
    """``strategy: fsdp`` on CPU: accelerate runs FSDP2 over gloo (``fsdp_on_cpu``), every rank checks the
    arm's precision contract at its first optimizer step (fp32 masters, fp32 AdamW states, fp32 gradient
    reduction under the autocast arm's mixed-precision policy), the KL log's reference is sharded (each
    rank holds half of it) and measured in lockstep on every rank, and rank 0 saves the whole model."""
    root = tiny_base["root"] / "fsdp" / arm
    config = json.loads(json.dumps(tiny_base["config"]))
    config["precisions"] = dict(FSDP_ARMS)
    config["train"].update(max_steps=4, checkpoint_every=2, kl_every=2, learning_rate=1e-3)
    config["train"]["distributed"] = {"processes": 2, "strategy": "fsdp"}
    data, base = tiny_base["data_dir"], tiny_base["base_dir"]
    job = job_from_config(config, arm, 1, data, base, root / "out", root / "ckpt")
    launch_training(job, processes=2, threads=2, log_path=root / "train.log")
    out = root / "out"
    run = json.loads((out / "run.json").read_text())
    assert (run["world_size"], run["strategy"], run["distributed_type"]) == (2, "fsdp", "FSDP")
    base_weights = load_file(base / "model.safetensors")
    total = sum(t.numel() for t in base_weights.values())
    assert [r["rank"] for r in run["ranks"]] == [0, 1]
    for rank in run["ranks"]:
        contract = rank["precision_contract"]
        assert contract["checked"] is True, contract
        observed = contract["observed"]
        assert observed["params_body"] == observed["optimizer_state_body"] == "float32", observed
        assert observed["grad_reduce_dtype"] == "float32"
        assert observed["autocast"] == FSDP_ARMS[arm]["autocast"]
        assert rank["dtypes_start"] == rank["dtypes_end"] == {"float32": run["trainable_tensors"]}
        assert 0 < rank["kl_reference_elements"] < total  # a shard, not a copy
    assert sum(r["kl_reference_elements"] for r in run["ranks"]) == total
    metrics = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in metrics] == [1, 2, 3, 4]
    assert [r["kl_rb"] is not None for r in metrics] == [False, True, False, True]
    heldout = read_metrics(out / "heldout.jsonl")  # sampled by every rank in lockstep, written by rank 0
    tasks = list(config["data"]["tasks"])
    assert [(r["step"], r["task"]) for r in heldout] == [(s, t) for s in (0, 3, 4) for t in tasks]
    saved = load_file(out / "model" / "model.safetensors")  # gathered: whole tensors, not shards
    assert {k: v.shape for k, v in saved.items()} == {k: v.shape for k, v in base_weights.items()}
    assert {v.dtype for v in saved.values()} == {torch.float32}
    assert not bit_identical(saved, base_weights)
    assert not (root / "ckpt").exists()
