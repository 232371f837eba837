"""The train stage end to end on a tiny model: precision arms, metrics, determinism, kill-and-resume.

Runs are tiny (hidden 32, 14 optimizer steps of 4 prompts x 4 completions) and shared between tests
through a module-scoped fixture; the kill/resume test launches one training subprocess (the job killed
after its last checkpoint dies in this process instead, in a 6-step run).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from conftest import REPO, bit_identical, load_test_config, make_workflow_dir, run_snakemake
from safetensors.torch import load_file

from workflow_scripts import train as train_stage
from workflow_scripts.train import job_from_config, train_run
from workflow_scripts.training.checkpoints import latest_complete_checkpoint
from workflow_scripts.training.heldout import LINE_KEYS
from workflow_scripts.training.metrics_log import KL_KEYS, ROLLOUT_KEYS, read_metrics

STEPS = 14  # epochs of 6 optimizer steps (24 prompts / 4 per round): runs cross epoch boundaries
CKPT_EVERY = 8  # the first (and only) checkpoint is in the second epoch
EXTRA_ARM = {"param_dtype": "float32", "autocast": "bfloat16", "deterministic": False, "dropout": 0.0}


def run_config(tiny_base) -> dict:
    config = json.loads(json.dumps(tiny_base["config"]))
    config["train"].update(
        max_steps=STEPS,
        checkpoint_every=CKPT_EVERY,
        kl_every=5,
        kl_prompts=4,
        kl_samples=2,
        learning_rate=1e-3,
    )
    config["precisions"]["bf16_autocast"] = dict(EXTRA_ARM)  # the third arm: a config entry, no code
    return config


def train(tiny_base, name: str, precision: str, seed: int) -> dict:
    root = tiny_base["root"] / "runs" / name
    record = train_run(
        run_config(tiny_base),
        precision,
        seed,
        tiny_base["data_dir"],
        tiny_base["base_dir"],
        root / "out",
        root / "ckpt",
        threads=1,
    )
    return {
        "record": record,
        "out": root / "out",
        "ckpt": root / "ckpt",
        "run": json.loads((root / "out" / "run.json").read_text()),
        "metrics": read_metrics(root / "out" / "metrics.jsonl"),
    }


@pytest.fixture(scope="module")
def runs(tiny_base) -> dict:
    assert sys.modules.get("vllm") is None  # never imported (gate_vllm may have marked it absent: None)
    return {
        "fp32": train(tiny_base, "fp32-s1", "fp32", 1),
        "fp32_again": train(tiny_base, "fp32-s1-again", "fp32", 1),
        "fp32_seed2": train(tiny_base, "fp32-s2", "fp32", 2),
        "bf16": train(tiny_base, "bf16-s1", "bf16", 1),
        "bf16_autocast": train(tiny_base, "bf16_autocast-s1", "bf16_autocast", 1),
    }


def weights(run: dict) -> dict[str, torch.Tensor]:
    return load_file(run["out"] / "model" / "model.safetensors")


@pytest.mark.slow
def test_fp32_arm_is_float32_without_autocast(runs):
    run = runs["fp32"]["run"]
    assert (
        run["dtypes_start"]
        == run["dtypes_end"]
        == run["dtypes_saved"]
        == {"float32": run["trainable_tensors"]}
    )
    assert run["autocast"]["requested"] is None
    assert run["autocast"]["observed"]["enabled"] is False
    assert run["autocast"]["observed"]["layer_output_dtype"] == "float32"
    assert run["trainer"]["bf16"] is False and run["trainer"]["fp16"] is False
    assert run["determinism"]["use_deterministic_algorithms"] is True
    assert run["dropout"] == {"attention_dropout": 0.0}
    assert run["versions"]["trl"] and run["config_hash"] and run["device"] == "cpu"
    assert run["resumed"] is False and run["steps"] == STEPS


@pytest.mark.slow
def test_bf16_arm_is_bfloat16(runs):
    run = runs["bf16"]["run"]
    assert (
        run["dtypes_start"]
        == run["dtypes_end"]
        == run["dtypes_saved"]
        == {"bfloat16": run["trainable_tensors"]}
    )
    assert run["autocast"]["observed"]["enabled"] is False
    assert run["autocast"]["observed"]["layer_output_dtype"] == "bfloat16"
    assert run["determinism"]["use_deterministic_algorithms"] is False
    assert run["dropout"] == {"attention_dropout": 0.1}
    assert {t.dtype for t in weights(runs["bf16"]).values()} == {torch.bfloat16}


@pytest.mark.slow
def test_extra_arm_from_config_only(runs):
    run = runs["bf16_autocast"]["run"]
    assert {k: run["mode"][k] for k in ("name", *EXTRA_ARM)} == {"name": "bf16_autocast", **EXTRA_ARM}
    assert run["dtypes_start"] == run["dtypes_saved"] == {"float32": run["trainable_tensors"]}
    observed = run["autocast"]["observed"]
    assert observed["enabled"] is True and observed["dtype"] == "bfloat16"
    assert observed["layer_output_dtype"] == "bfloat16"
    assert run["trainer"]["bf16"] is True


@pytest.mark.slow
def test_metrics_one_line_per_step(runs):
    for name, run in runs.items():
        metrics = run["metrics"]
        assert [r["step"] for r in metrics] == list(range(1, STEPS + 1)), name
        keys = set(metrics[0])
        assert all(set(r) == keys for r in metrics), name
        assert (
            set(ROLLOUT_KEYS)
            | set(KL_KEYS)
            | {
                "clip_low",
                "clip_high",
                "clip_region",
                "entropy",
                "grad_norm",
                "learning_rate",
                "generation_step",
                "wall_time_s",
            }
            <= keys
        )
        # 2 optimizer steps per rollout: rollout statistics are fresh on odd steps, carried on even ones
        assert [r["generation_step"] for r in metrics] == [s % 2 == 1 for s in range(1, STEPS + 1)], name
        assert all(r["reward"] is not None and 0 <= r["informative_frac"] <= 1 for r in metrics), name
        assert all(metrics[i]["reward"] == metrics[i - 1]["reward"] for i in range(1, STEPS, 2)), name
        assert all(r["entropy"] is not None and r["grad_norm"] is not None for r in metrics), name
        kl_steps = [r["step"] for r in metrics if r["kl_k3"] is not None]
        assert kl_steps == [5, 10, 14], name
        assert all(r["kl_k3"] >= 0 for r in metrics if r["kl_k3"] is not None), name
        assert run["run"]["rewards"]["rollouts"] == STEPS // 2
    # steps_per_generation > gradient_accumulation_steps: the ratio differs from 1 and clipping acts
    assert any(r["clip_region"] > 0 for r in runs["fp32"]["metrics"])
    assert runs["fp32"]["run"]["rewards"]["steps_with_clipping"] > 0


HELDOUT_STEPS = [0, 3, 6, 9, 12, 14]  # eval_every 3 (the test config) and the last step
TIMING = ("generate_s", "score_s")


def heldout(run: dict) -> list[dict]:
    return [
        {k: v for k, v in r.items() if k not in TIMING} for r in read_metrics(run["out"] / "heldout.jsonl")
    ]


@pytest.mark.slow
def test_heldout_curve_every_task_at_step_0_every_n_and_the_last(tiny_base, runs):
    tasks = list(tiny_base["config"]["data"]["tasks"])
    for name, run in runs.items():
        lines = heldout(run)
        assert [(r["step"], r["task"]) for r in lines] == [(s, t) for s in HELDOUT_STEPS for t in tasks], name
        assert all(set(r) == set(LINE_KEYS) - set(TIMING) for r in lines), name
        assert all(r["n_problems"] == 8 and r["n_samples"] == 4 and r["backend"] == "hf" for r in lines), name
        assert all(sum(r["correct_counts"]) / 32 == r["pass_at_1"] for r in lines), name
        assert all(r["eval_noise_var"] is not None and r["phase"] is None for r in lines), name
        assert run["run"]["heldout"]["steps"] == HELDOUT_STEPS
    assert {r["dtype"] for r in heldout(runs["bf16"])} == {"bfloat16"}
    assert heldout(runs["fp32"]) == heldout(runs["fp32_again"])  # reproducible
    other = heldout(runs["fp32_seed2"])  # same weights at step 0, but its own sampling stream
    assert [r["sampling_seed"] for r in other] != [r["sampling_seed"] for r in heldout(runs["fp32"])]
    assert [r["problem_ids"] for r in other] == [r["problem_ids"] for r in heldout(runs["fp32"])]


@pytest.mark.slow
@pytest.mark.parametrize("arm,dtype", [("bf16", "bfloat16"), ("bf16_autocast", "float32")])
def test_heldout_last_point_is_the_saved_policy_as_evaluated(tiny_base, tmp_path, arm, dtype):
    """A run's last point must equal sampling its saved model as the evaluate stage does: in eval mode, in
    the saved dtype without autocast, with the same slice, seed and product path. The bf16 arm trains
    with dropout 0.1: sampling it in train mode differs. The autocast arm trains its fp32 masters under
    bf16 autocast: sampling them under autocast differs. The slices are one-digit sums, where the tiny
    model is right about a fifth of the time (on the test config's own eval sets it scores 0, which
    could not tell the variants apart)."""
    import shutil

    from conftest import _one_digit_rows

    from workflow_scripts.measures.eval_summary import score, summarize
    from workflow_scripts.models.modeling import load_model, load_tokenizer
    from workflow_scripts.tasks.rows import write_rows
    from workflow_scripts.training.bf16_matmul import bf16_matmul
    from workflow_scripts.training.heldout import heldout_slices
    from workflow_scripts.training.heldout_spec import heldout_spec

    data = tmp_path / "data"
    shutil.copytree(tiny_base["data_dir"], data)
    config = run_config(tiny_base)
    # points at step 0 and the last only (eval_every past the end): the measurement leaves the trajectory
    # unchanged (test_heldout_measurement_leaves_the_trajectory_unchanged), so the last point is the one
    # a curve every 3 steps ends with, at a third of the points' cost (each samples 3 x 20 x 8 times)
    config["train"].update(eval_problems=20, eval_samples=8, eval_every=100)
    for task in config["data"]["tasks"]:
        config["data"]["tasks"][task].update(kind="integer", max_new_tokens=4)
        write_rows(data / "eval" / f"{task}.jsonl", [dict(r, task=task) for r in _one_digit_rows()])
    record = train_run(config, arm, 1, data, tiny_base["base_dir"], tmp_path / "out", tmp_path / "ckpt")
    spec = heldout_spec(config)
    lines = read_metrics(tmp_path / "out" / "heldout.jsonl")
    assert sorted({r["step"] for r in lines}) == [0, STEPS]
    last = {r["task"]: r for r in lines if r["step"] == STEPS}
    model = load_model(tmp_path / "out" / "model", dtype)
    tokenizer = load_tokenizer(tmp_path / "out" / "model")
    path = record["bf16_matmul"]["path"] or "native"

    def counts(rows: list[dict], task: str, variant=contextlib.nullcontext, sample=None) -> list[int]:
        with bf16_matmul(path), variant():
            completions = (sample or _sample)(model, tokenizer, rows, spec, last[task]["sampling_seed"])
        return summarize(score(rows, completions, "integer", spec), spec["samples"])["correct_counts"]

    for task, rows in heldout_slices(spec, data).items():
        assert 0 < last[task]["pass_at_1"] < 1, task  # the comparison can tell something apart
        assert last[task]["dtype"] == dtype
        assert counts(rows, task) == last[task]["correct_counts"], task
    task, rows = next(iter(heldout_slices(spec, data).items()))
    if arm == "bf16":
        assert counts(rows, task, sample=_sample_in_train_mode) != last[task]["correct_counts"]  # dropout
    else:
        autocast = functools.partial(torch.autocast, "cpu", dtype=torch.bfloat16)
        assert counts(rows, task, variant=autocast) != last[task]["correct_counts"]  # the rollouts' numerics


def _sample(model, tokenizer, rows, spec, seed):
    from workflow_scripts.models.generation import sample_completions

    return sample_completions(model, tokenizer, [r["prompt"] for r in rows], n_samples=spec["samples"],
                              temperature=spec["temperature"], top_p=spec["top_p"], max_new_tokens=4,
                              batch_size=spec["batch_size"], seed=seed)  # fmt: skip


def _sample_in_train_mode(model, tokenizer, rows, spec, seed):
    """``_sample`` with dropout on (sample_completions sets eval mode itself: the forward turns it back)."""
    forward = model.forward

    def train_forward(*args, **kwargs):
        model.train(True)
        return forward(*args, **kwargs)

    model.forward = train_forward
    try:
        return _sample(model, tokenizer, rows, spec, seed)
    finally:
        model.forward = forward
        model.eval()


@pytest.mark.slow
def test_heldout_measurement_leaves_the_trajectory_unchanged(tiny_base, runs, tmp_path):
    job = job_from_config(run_config(tiny_base), "bf16", 1, tiny_base["data_dir"], tiny_base["base_dir"],
                          tmp_path / "out", tmp_path / "ckpt")  # fmt: skip
    job["heldout"] = None  # no curve
    train_stage.run(**job, threads=1)
    assert not (tmp_path / "out" / "heldout.jsonl").exists()
    assert bit_identical(load_file(tmp_path / "out" / "model" / "model.safetensors"), weights(runs["bf16"]))


@pytest.mark.slow
def test_checkpoints_deleted_after_success(runs):
    assert not runs["fp32"]["ckpt"].exists()


@pytest.mark.slow
def test_same_seed_bit_identical_other_seed_differs(tiny_base, runs):
    a, b, c = weights(runs["fp32"]), weights(runs["fp32_again"]), weights(runs["fp32_seed2"])
    assert bit_identical(a, b)
    assert not bit_identical(a, c)
    base = load_file(tiny_base["base_dir"] / "model.safetensors")
    assert not bit_identical(a, base)  # training really changed the weights
    drop = ("wall_time_s", "step_time_s")
    strip = [{k: v for k, v in r.items() if k not in drop} for r in runs["fp32"]["metrics"]]
    assert strip == [{k: v for k, v in r.items() if k not in drop} for r in runs["fp32_again"]["metrics"]]


_CHILD = """
import json, sys, time
from transformers import TrainerCallback
from workflow_scripts.train import job_from_config, run, train_run
from workflow_scripts.training.heldout import LINE_KEYS

class HoldAfterCheckpoint(TrainerCallback):
    # Pause at step 10 (after checkpoint-8 was written and step 9 was logged) so the parent's SIGKILL
    # lands mid-run with metrics lines beyond the checkpoint that a resume must drop.
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 10:
            time.sleep(600)

config, data, base, out, ckpt = json.loads(sys.argv[1])
train_run(config, "fp32", 1, data, base, out, ckpt, threads=1, callbacks=[HoldAfterCheckpoint()])
"""


@pytest.mark.slow
def test_sigkill_then_resume_isbit_identical(tiny_base, runs, tmp_path):
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    fake = tmp_path / "fake_site" / "vllm"  # importing vllm would crash the child: it must never happen
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise RuntimeError('vllm was imported with use_vllm: false')\n")
    args = json.dumps(
        [run_config(tiny_base), str(tiny_base["data_dir"]), str(tiny_base["base_dir"]), str(out), str(ckpt)]
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(fake.parent), str(REPO)]), "HF_HUB_OFFLINE": "1"}
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, args],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.time() + 300
    live = ckpt / "metrics.jsonl"
    while time.time() < deadline and child.poll() is None:
        if (ckpt / f"checkpoint-{CKPT_EVERY}" / "trainer_state.json").exists() and len(
            read_metrics(live)
        ) > CKPT_EVERY:
            child.send_signal(signal.SIGKILL)
            break
        time.sleep(0.05)
    output = child.communicate(timeout=60)[0]
    assert child.returncode == -signal.SIGKILL, output[-3000:]
    assert "vllm was imported" not in output
    assert not (out / "run.json").exists()
    assert latest_complete_checkpoint(ckpt) == ckpt / f"checkpoint-{CKPT_EVERY}"
    assert len(read_metrics(live)) > CKPT_EVERY  # lines past the checkpoint, to be dropped on resume

    # started again (in this process: the RNG states must come from the checkpoint, not the process)
    torch.manual_seed(12345)
    train_run(
        run_config(tiny_base), "fp32", 1, tiny_base["data_dir"], tiny_base["base_dir"], out, ckpt, threads=1
    )
    run = json.loads((out / "run.json").read_text())
    assert run["resumed"] is True and run["resumed_from_step"] == CKPT_EVERY
    assert run["steps_this_session"] == STEPS - CKPT_EVERY
    metrics = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in metrics] == list(range(1, STEPS + 1))  # no duplicate or missing step
    assert bit_identical(load_file(out / "model" / "model.safetensors"), weights(runs["fp32"]))
    reference = runs["fp32"]["metrics"]
    for key in ("reward", "loss", "grad_norm", "clip_region", "kl_k3"):
        assert [r[key] for r in metrics] == [r[key] for r in reference], key
    assert heldout({"out": out}) == heldout(runs["fp32"])  # the curve resumed: no step lost or repeated
    assert not ckpt.exists()


def test_incomplete_checkpoint_is_ignored_and_removed(tmp_path):
    done, partial = tmp_path / "checkpoint-4", tmp_path / "checkpoint-8"
    for path in (done, partial):
        path.mkdir()
        (path / "model.safetensors").write_bytes(b"x")
    (done / "optimizer.pt").write_bytes(b"x")
    (done / "trainer_state.json").write_text("{}")
    (partial / "trainer_state.json").write_text('{"global_st')  # killed mid-write
    assert latest_complete_checkpoint(tmp_path) == done
    assert not partial.exists()


def test_a_multi_process_checkpoint_needs_every_ranks_whole_rng_state(tmp_path, monkeypatch):
    """Rank 0 writes trainer_state.json with no barrier before rank 1's rng_state_1.pth: a kill between
    them left a checkpoint that looked complete and resumed off the uninterrupted trajectory."""
    import torch

    from workflow_scripts.training.checkpoints import is_complete_checkpoint

    path = tmp_path / "checkpoint-2"
    path.mkdir()
    (path / "model.safetensors").write_bytes(b"x")
    (path / "optimizer.pt").write_bytes(b"x")
    (path / "trainer_state.json").write_text("{}")
    torch.save({"cpu": torch.random.get_rng_state()}, path / "rng_state_0.pth")
    assert is_complete_checkpoint(path, world=1)  # one process: its own order is safe
    assert not is_complete_checkpoint(path, world=2)  # rank 1's state not written yet
    whole = (path / "rng_state_0.pth").read_bytes()
    (path / "rng_state_1.pth").write_bytes(whole[: len(whole) // 2])  # killed mid-write
    assert not is_complete_checkpoint(path, world=2)
    (path / "rng_state_1.pth").write_bytes(whole)
    assert is_complete_checkpoint(path, world=2)
    monkeypatch.setenv("WORLD_SIZE", "3")  # the launcher's world size is the default
    assert not is_complete_checkpoint(path)


@pytest.mark.slow
def test_stale_checkpoints_of_another_config_are_not_resumed(tiny_base, tmp_path):
    config = run_config(tiny_base)
    config["train"].update(max_steps=2, checkpoint_every=2, kl_every=100)
    ckpt = tmp_path / "ckpt"
    (ckpt / "checkpoint-2").mkdir(parents=True)
    (ckpt / "run_key.json").write_text('{"key": "from-another-config"}')
    record = train_run(
        config, "fp32", 1, tiny_base["data_dir"], tiny_base["base_dir"], tmp_path / "out", ckpt
    )
    assert record["resumed"] is False and record["steps_this_session"] == 2


@pytest.mark.slow
def test_snakemake_dag_has_every_precision_seed_pair(tmp_path):
    workdir = make_workflow_dir(tmp_path / "wf", load_test_config())
    proc = run_snakemake(workdir, "-n", "--quiet", "rules")
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = proc.stdout + proc.stderr
    train_line = next(line for line in table.splitlines() if line.split()[:1] == ["train"])
    assert int(train_line.split()[1]) == 2 * 2


SHORT, SHORT_CKPT = 6, 4  # as STEPS and CKPT_EVERY: a periodic checkpoint, then the last step's own save


def short_config(tiny_base) -> dict:
    config = run_config(tiny_base)
    config["train"].update(max_steps=SHORT, checkpoint_every=SHORT_CKPT)
    return config


class _Killed(Exception):
    """Stands for the kill: raised where the job dies, so nothing after it runs."""


@pytest.mark.slow
def test_a_job_killed_after_its_last_checkpoint_starts_again_instead_of_failing_every_retry(
    tiny_base, tmp_path
):
    """The Trainer saves at the last step too (save_total_limit 1 keeps only that one); resumed there it
    trains a step past max_steps, which the stage refuses. A job killed between that save and run.json
    (or ended as TIMEOUT by SLURM just past its limit) must not fail every retry the same way.

    The job dies in this process, by an exception in ``on_train_end`` (after the last step's save, before
    run.json), not by SIGKILL in a subprocess: what the retry sees is the files left behind, asserted
    below before it starts (a subprocess cost ~5 s of imports). A 6-step run: the claim needs a periodic
    checkpoint and the last step's save, not 14 steps."""
    from transformers import TrainerCallback

    class DieAtTheEnd(TrainerCallback):
        def on_train_end(self, args, state, control, **kwargs):
            raise _Killed

    data, base = tiny_base["data_dir"], tiny_base["base_dir"]
    uninterrupted = train_run(short_config(tiny_base), "fp32", 1, data, base, tmp_path / "whole" / "out",
                              tmp_path / "whole" / "ckpt", threads=1)  # fmt: skip
    assert uninterrupted["steps_this_session"] == SHORT
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    with pytest.raises(_Killed):
        train_run(short_config(tiny_base), "fp32", 1, data, base, out, ckpt, threads=1,
                  callbacks=[DieAtTheEnd()])  # fmt: skip
    assert (
        not (out / "run.json").exists() and latest_complete_checkpoint(ckpt) == ckpt / f"checkpoint-{SHORT}"
    )
    torch.manual_seed(12345)  # a retry is a fresh process: nothing may come from this one's RNG state
    train_run(short_config(tiny_base), "fp32", 1, data, base, out, ckpt, threads=1)
    run = json.loads((out / "run.json").read_text())
    assert run["resumed"] is False and run["steps_this_session"] == SHORT
    whole = load_file(tmp_path / "whole" / "out" / "model" / "model.safetensors")
    assert bit_identical(load_file(out / "model" / "model.safetensors"), whole)
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == list(range(1, SHORT + 1))
    assert not ckpt.exists()
