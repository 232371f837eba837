"""Benchmark: the train stage's step time against a bare GRPOTrainer script with the same settings.

Both run the same GRPOConfig (``grpo_config.grpo_config`` of the config's train section, ``--steps`` steps,
same seed, same base model and prompts, one thread) in fresh subprocesses, alternating, ``--reps``
times each; the fastest repetition of each is compared (the least disturbed by other load). The
stage's time is ``trainer.train()`` inside ``train_run`` (per-step metrics lines, the autocast probe,
the epoch-aware sampler, the KL log at its steps and at the last step); the bare script is
GRPOTrainer with TRL's default callbacks and nothing else. Model loading and saving are excluded from
both. Prints e.g. ``overhead_ratio=1.03 (target <= 1.05)``.

Base model: ``--base`` (default results/models/base when it exists), else a small one is built in a
temporary folder (the config's tiny architecture, a short warm start).

    python bench/bench_train.py [--config config.yaml] [--steps 40] [--reps 2] [--precision fp32]

``--profile``: one stage run instead, with wall-clock timers around the parts of a step, printed as
seconds per optimizer step: generation (TRL's generate), old log-probs (no-grad forward), loss forward,
backward, reward (the verifier reward function), the project's callbacks (metrics.jsonl lines, KL log,
health guard) and the rest (optimizer, TRL/Trainer bookkeeping). The one-off set-up (models,
representable-update fraction) is excluded.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def profile(spec: dict) -> dict:
    """One stage run with timers around the parts of a step (see the module docstring)."""
    import accelerate
    import torch
    from trl import GRPOTrainer

    from workflow_scripts.training import metrics_callback, train_health
    from workflow_scripts.training.grpo_config import gate_vllm

    gate_vllm(False)
    timers: dict[str, float] = {}

    def wrap(owner, name: str, label) -> None:
        original = getattr(owner, name)

        @functools.wraps(original)  # train's log-prob head check reads the wrapped method's source
        def timed(*args, **kwargs):
            key = label() if callable(label) else label
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                timers[key] = timers.get(key, 0.0) + time.perf_counter() - start

        setattr(owner, name, timed)

    wrap(GRPOTrainer, "_generate_single_turn", "generation")
    wrap(
        GRPOTrainer,
        "_get_per_token_logps_and_entropies",
        lambda: "loss forward" if torch.is_grad_enabled() else "old log-probs",
    )
    wrap(GRPOTrainer, "_calculate_rewards", "reward")
    wrap(accelerate.Accelerator, "backward", "backward")
    wrap(metrics_callback.MetricsLogger, "on_log", "project: metrics.jsonl line + KL log")
    wrap(metrics_callback.MetricsLogger, "measure_kl", "  of which the KL log")
    wrap(train_health.NonFiniteGuard, "on_step_end", "project: health guard")
    wrap(train_health.NonFiniteGuard, "on_log", "project: health guard")
    from workflow_scripts.train import train_run

    config = spec["config"]
    config["train"] = dict(config["train"], max_steps=spec["steps"])
    work = Path(spec["work"])
    record = train_run(
        config, spec["precision"], spec["seed"], spec["data"], spec["base"], work / "out", work / "ckpt"
    )
    steps = record["steps_this_session"]
    parts = {k: v / steps for k, v in timers.items()}
    counted = sum(v for k, v in parts.items() if not k.startswith(" "))
    parts["rest (optimizer, TRL/Trainer bookkeeping)"] = record["train_wall_s"] / steps - counted
    return {"s_per_step": record["train_wall_s"] / steps, "steps": steps, "parts": parts}


def worker(kind: str, spec: dict) -> dict:
    import torch

    from workflow_scripts.training.grpo_config import gate_vllm

    gate_vllm(False)
    config = spec["config"]
    train_cfg = dict(config["train"], max_steps=spec["steps"])
    config["train"] = train_cfg
    data_dir, base_dir, work = Path(spec["data"]), Path(spec["base"]), Path(spec["work"])
    if kind == "stage":
        from workflow_scripts.train import train_run

        record = train_run(
            config,
            spec["precision"],
            spec["seed"],
            data_dir,
            base_dir,
            work / "out",
            work / "ckpt",
            threads=1,
        )
        return {"train_wall_s": record["train_wall_s"], "steps": record["steps_this_session"]}

    # the bare script: GRPOTrainer, same config and reward, nothing of ours around it
    from trl import GRPOTrainer

    from workflow_scripts.models.modeling import load_model, load_tokenizer
    from workflow_scripts.tasks.rows import read_rows
    from workflow_scripts.train import _train_dataset
    from workflow_scripts.training.grpo_config import grpo_config, reward_functions
    from workflow_scripts.training.precision import apply_determinism, mode_from_config

    torch.set_num_threads(1)
    mode = mode_from_config(config, spec["precision"])
    apply_determinism(mode)
    rows = read_rows(data_dir / "train.jsonl")
    args = grpo_config(train_cfg, mode, spec["seed"], work / "bare")
    model = load_model(base_dir, mode.param_dtype, dropout=mode.dropout)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward_functions(train_cfg, rows[0]["kind"]),
        args=args,
        train_dataset=_train_dataset(rows),
        processing_class=load_tokenizer(base_dir),
    )
    start = time.perf_counter()
    trainer.train()
    return {"train_wall_s": time.perf_counter() - start, "steps": trainer.state.global_step}


def ensure_base(config: dict, base: str | None, data: str | None, tmp: Path) -> tuple[Path, Path]:
    if base and data:
        return Path(data), Path(base)
    default_base, default_data = REPO / "results/models/base", REPO / "results/data"
    if base is None and (default_base / "config.json").exists() and (default_data / "train.jsonl").exists():
        return default_data, default_base
    from workflow_scripts.base_model import build_base
    from workflow_scripts.prepare_data import prepare

    print("building a base model for the benchmark ...", flush=True)
    cfg = json.loads(json.dumps(config))
    cfg["model"]["tiny"]["sft_steps"] = min(cfg["model"]["tiny"]["sft_steps"], 200)
    prepare(cfg["data"], tmp / "data")
    build_base(cfg, tmp / "data", tmp / "base", tmp / "base.json", threads=1)
    return tmp / "data", tmp / "base"


def print_profile(args, config: dict, data: Path, base: Path, tmp: Path) -> int:
    spec = {
        "config": config,
        "precision": args.precision,
        "seed": args.seed,
        "steps": args.steps,
        "data": str(data),
        "base": str(base),
        "work": str(tmp / "profile"),
    }
    spec_path = tmp / "profile.json"
    spec_path.write_text(json.dumps(spec))
    proc = subprocess.run(
        [sys.executable, __file__, "--worker", "profile", "--spec", str(spec_path)],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode or not lines:
        print(proc.stdout[-3000:], proc.stderr[-3000:], sep="\n")
        raise SystemExit(f"profile worker failed (rc={proc.returncode})")
    result = json.loads(lines[-1][len("RESULT ") :])
    print(f"{args.precision}, {result['steps']} steps: {result['s_per_step']:.4f} s/step")
    for name, seconds in result["parts"].items():
        print(f"  {name:45s} {seconds:.4f} s/step  ({100 * seconds / result['s_per_step']:.0f}%)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", default=str(REPO / "config.yaml"))
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--base", default=None)
    parser.add_argument("--data", default=None)
    parser.add_argument("--target", type=float, default=1.05)
    parser.add_argument("--profile", action="store_true", help="time the parts of a step (one stage run)")
    parser.add_argument("--worker", choices=["stage", "bare", "profile"], help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        spec = json.loads(Path(args.spec).read_text())
        result = profile(spec) if args.worker == "profile" else worker(args.worker, spec)
        print("RESULT " + json.dumps(result), flush=True)
        return 0

    from workflow_scripts.runtime.config import load_config

    config = load_config(args.config, check_files=False)
    with tempfile.TemporaryDirectory(prefix="bench_train_") as tmpdir:
        tmp = Path(tmpdir)
        data, base = ensure_base(config, args.base, args.data, tmp)
        times: dict[str, list[float]] = {"bare": [], "stage": []}
        if args.profile:
            return print_profile(args, config, data, base, tmp)
        for rep in range(args.reps):
            for kind in ("bare", "stage") if rep % 2 == 0 else ("stage", "bare"):
                work = tmp / f"{kind}{rep}"
                spec = {
                    "config": config,
                    "precision": args.precision,
                    "seed": args.seed,
                    "steps": args.steps,
                    "data": str(data),
                    "base": str(base),
                    "work": str(work),
                }
                spec_path = tmp / f"{kind}{rep}.json"
                spec_path.write_text(json.dumps(spec))
                proc = subprocess.run(
                    [sys.executable, __file__, "--worker", kind, "--spec", str(spec_path)],
                    capture_output=True,
                    text=True,
                    cwd=REPO,
                )
                lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
                if proc.returncode or not lines:
                    print(proc.stdout[-3000:], proc.stderr[-3000:], sep="\n")
                    raise SystemExit(f"{kind} worker failed (rc={proc.returncode})")
                result = json.loads(lines[-1][len("RESULT ") :])
                per_step = result["train_wall_s"] / result["steps"]
                times[kind].append(per_step)
                print(f"rep {rep} {kind:5s}: {result['steps']} steps, {per_step:.4f} s/step", flush=True)
    bare, stage = min(times["bare"]), min(times["stage"])
    ratio = stage / bare
    print(
        f"bare GRPOTrainer {bare:.4f} s/step, train stage {stage:.4f} s/step "
        f"({args.precision}, {args.steps} steps, "
        f"best of {args.reps})"
    )
    print(f"overhead_ratio={ratio:.2f} (target <= {args.target:.2f})")
    return 0 if ratio <= args.target else 1


if __name__ == "__main__":
    sys.exit(main())
