"""GPU smoke check, the resume measurement (``bench/gpu_smoke.py`` wires it into its report).

The deterministic fp32 arm trained again, in a child process (``gpu_smoke.py train-child``) that SIGKILLs
itself right after its first checkpoint is written, then resumed in a second child; the resumed weights
must be bit-identical to the workflow's uninterrupted run, and that run must have moved away from the
base (identical unchanged weights would prove nothing).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from workflow_scripts.runtime import paths
from workflow_scripts.runtime.config import load_config
from workflow_scripts.training.metrics_log import read_metrics

SMOKE = Path(__file__).resolve().with_name("gpu_smoke.py")


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"missing output: {path}") from None


def resume_arm(config: dict) -> str | None:
    return next(
        (a for a, m in config["precisions"].items() if m["deterministic"] and m["param_dtype"] == "float32"),
        None,
    )


def child_command(config_path: Path, res: Path, arm: str, seed: int, out: Path, ckpt: Path) -> list[str]:
    return [
        sys.executable, str(SMOKE), "train-child", "--config", str(config_path),
        "--precision", arm, "--seed", str(seed), "--data", str(paths.data_dir(res)),
        "--base", str(paths.base_model_dir(res)), "--out", str(out), "--ckpt", str(ckpt),
    ]  # fmt: skip


def tensors_identical(a: Path, b: Path) -> bool:
    import torch
    from safetensors.torch import load_file

    x, y = load_file(a), load_file(b)
    return x.keys() == y.keys() and all(
        x[k].dtype == y[k].dtype
        and x[k].shape == y[k].shape
        and torch.equal(x[k].view(torch.uint8), y[k].view(torch.uint8))
        for k in x
    )


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 24), b""):
            digest.update(block)
    return digest.hexdigest()


def resume_check(
    config_path: Path, config: dict, res: Path, scratch: Path, timeout: int
) -> tuple[bool, dict]:
    """Kill a fresh run of the fp32 arm right after its first checkpoint, resume it, compare weights."""
    from workflow_scripts.training.grpo_config import save_steps

    arm = resume_arm(config)
    if arm is None:
        return False, "no deterministic float32 arm in the config"
    seed, steps, first = config["seeds"][0], config["train"]["max_steps"], save_steps(config["train"])
    if first >= steps:
        return False, f"first checkpoint (step {first}) is not before the last step ({steps})"
    folder = scratch / "resume"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    out, ckpt = folder / "out", folder / "ckpt"
    cmd = child_command(config_path, res, arm, seed, out, ckpt)
    value: dict[str, Any] = {"arm": arm, "seed": seed, "killed_after_step": first, "steps": steps}
    with open(folder / "killed.log", "w", encoding="utf-8") as log:
        killed = subprocess.run([*cmd, "--kill-at", str(first)], stdout=log, stderr=subprocess.STDOUT,
                                timeout=timeout, cwd=folder)  # fmt: skip
    value["killed_returncode"] = killed.returncode
    if killed.returncode != -signal.SIGKILL:
        return False, {
            **value,
            "error": f"the first child did not die by SIGKILL; see {folder / 'killed.log'}",
        }
    with open(folder / "resumed.log", "w", encoding="utf-8") as log:
        resumed = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=timeout, cwd=folder)
    value["resumed_returncode"] = resumed.returncode
    if resumed.returncode != 0:
        return False, {**value, "error": f"the resumed child failed; see {folder / 'resumed.log'}"}
    record = read_json(out / "run.json")
    value["resumed_from_step"] = record["resumed_from_step"]
    straight = paths.train_dir(arm, seed, res) / "model" / "model.safetensors"
    again = out / "model" / "model.safetensors"
    base = paths.base_model_dir(res) / "model.safetensors"
    value["file_identical"] = sha256(straight) == sha256(again)
    value["tensors_identical"] = tensors_identical(straight, again)
    value["moved_from_base"] = not tensors_identical(straight, base)
    keys = ("loss", "grad_norm", "reward")
    ours = [[r[k] for k in keys] for r in read_metrics(out / "metrics.jsonl")]
    theirs = [[r[k] for k in keys] for r in read_metrics(paths.train_dir(arm, seed, res) / "metrics.jsonl")]
    value["metrics_identical"] = ours == theirs
    ok = record["resumed"] and record["resumed_from_step"] == first and value["tensors_identical"]
    return bool(ok and value["moved_from_base"]), value


def train_child(args: argparse.Namespace) -> int:
    """One training run of the workflow's train stage (same config, same threads as its job)."""
    from workflow_scripts.runtime.resources import job_threads
    from workflow_scripts.runtime.threads import limit_threads

    config = load_config(args.config)
    threads = job_threads(config, "train")
    limit_threads(threads)
    from transformers import TrainerCallback

    from workflow_scripts.train import train_run

    class KillAfterCheckpoint(TrainerCallback):
        """SIGKILL this process once the checkpoint of step ``at`` is complete (a job killed mid-run)."""

        def __init__(self, at: int) -> None:
            self.at = at

        def on_save(self, args, state, control, **kwargs):
            if state.global_step == self.at:
                os.kill(os.getpid(), signal.SIGKILL)

    callbacks = [KillAfterCheckpoint(args.kill_at)] if args.kill_at else []
    train_run(config, args.precision, args.seed, args.data, args.base, args.out, args.ckpt,
              threads=threads, callbacks=callbacks)  # fmt: skip
    return 0
