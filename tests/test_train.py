"""The train stage end to end on a tiny model: precision arms, metrics, determinism, kill-and-resume.

Runs are tiny (hidden 32, 14 optimizer steps of 4 prompts x 4 completions) and shared between tests
through a module-scoped fixture; the kill/resume test launches one training subprocess.
"""

from __future__ import annotations

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

from workflow_scripts.train import train_run
from workflow_scripts.training.checkpoints import latest_complete_checkpoint
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


def test_extra_arm_from_config_only(runs):
    run = runs["bf16_autocast"]["run"]
    assert {k: run["mode"][k] for k in ("name", *EXTRA_ARM)} == {"name": "bf16_autocast", **EXTRA_ARM}
    assert run["dtypes_start"] == run["dtypes_saved"] == {"float32": run["trainable_tensors"]}
    observed = run["autocast"]["observed"]
    assert observed["enabled"] is True and observed["dtype"] == "bfloat16"
    assert observed["layer_output_dtype"] == "bfloat16"
    assert run["trainer"]["bf16"] is True


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


def test_checkpoints_deleted_after_success(runs):
    assert not runs["fp32"]["ckpt"].exists()


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
from workflow_scripts.train import train_run

class HoldAfterCheckpoint(TrainerCallback):
    # Pause at step 10 (after checkpoint-8 was written and step 9 was logged) so the parent's SIGKILL
    # lands mid-run with metrics lines beyond the checkpoint that a resume must drop.
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 10:
            time.sleep(600)

config, data, base, out, ckpt = json.loads(sys.argv[1])
train_run(config, "fp32", 1, data, base, out, ckpt, threads=1, callbacks=[HoldAfterCheckpoint()])
"""


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


def test_snakemake_dag_has_every_precision_seed_pair(tmp_path):
    workdir = make_workflow_dir(tmp_path / "wf", load_test_config())
    proc = run_snakemake(workdir, "-n", "--quiet", "rules")
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = proc.stdout + proc.stderr
    train_line = next(line for line in table.splitlines() if line.split()[:1] == ["train"])
    assert int(train_line.split()[1]) == 2 * 2
