"""Benchmark: the train stage's step time against a bare GRPOTrainer script with the same settings.

Both run the same GRPOConfig (``train.grpo_config`` of the config's train section, ``--steps`` steps,
same seed, same base model and prompts, one thread) in fresh subprocesses, alternating, ``--reps``
times each; the fastest repetition of each is compared (the least disturbed by other load). The
stage's time is ``trainer.train()`` inside ``train_run`` (per-step metrics lines, the autocast probe,
the epoch-aware sampler, the KL log at its steps and at the last step); the bare script is
GRPOTrainer with TRL's default callbacks and nothing else. Model loading and saving are excluded from
both. Prints e.g. ``overhead_ratio=1.03 (target <= 1.05)``.

Base model: ``--base`` (default results/models/base when it exists), else a small one is built in a
temporary folder (the config's tiny architecture, a short warm start).

    python bench/bench_train.py [--config config.yaml] [--steps 40] [--reps 2] [--precision fp32]
"""

from __future__ import annotations

import argparse
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


def worker(kind: str, spec: dict) -> dict:
    import torch

    from workflow_scripts.train import gate_vllm

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

    from workflow_scripts.modeling import load_model, load_tokenizer
    from workflow_scripts.precision import apply_determinism, mode_from_config
    from workflow_scripts.rows import read_rows
    from workflow_scripts.train import _train_dataset, grpo_config, reward_functions

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
    parser.add_argument("--worker", choices=["stage", "bare"], help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(
            "RESULT " + json.dumps(worker(args.worker, json.loads(Path(args.spec).read_text()))), flush=True
        )
        return 0

    from workflow_scripts.config import load_config

    config = load_config(args.config, check_files=False)
    with tempfile.TemporaryDirectory(prefix="bench_train_") as tmpdir:
        tmp = Path(tmpdir)
        data, base = ensure_base(config, args.base, args.data, tmp)
        times: dict[str, list[float]] = {"bare": [], "stage": []}
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
