"""Benchmark: the bf16/fp32 train job-second ratio with the bf16 products native and emulated.

Each job is the train stage (``train.train_run``) of one arm in a fresh subprocess, timed from process
start to exit (imports, model load, training, saving: the job seconds a Snakemake train job costs),
with the config's fp32 and bf16 arms; the bf16 arm is run with ``bf16_matmul`` forced to native and to
emulated. ``--no-bf16-kernels`` also runs every job with oneDNN off (``torch.backends.mkldnn``), which
sends torch's bf16 GEMMs to its scalar fallback: the path of a CPU without bf16 kernels (an AVX2-only
EPYC), so a machine with AMX can show both sides. Jobs alternate, ``--reps`` times each; the fastest
repetition of each is kept (the least disturbed by other load); job CPU seconds are reported beside
the wall seconds (on a shared machine they are the steadier measure). Prints one line per job and the
ratios, e.g. ``bf16 emulated / fp32 = 1.12``; ``--json`` writes them.

    python bench/bench_bf16.py [--config config.yaml] [--steps 12] [--reps 1] [--no-bf16-kernels]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def worker(spec: dict) -> dict:
    """One train job (in this fresh process): the arm, its matmul path, optionally oneDNN off."""
    import torch

    if spec["no_bf16_kernels"]:
        torch.backends.mkldnn.enabled = False
    from workflow_scripts.train import train_run

    config = spec["config"]
    config["train"] = dict(config["train"], max_steps=spec["steps"])
    if spec["bf16_matmul"]:
        config["precisions"][spec["precision"]]["bf16_matmul"] = spec["bf16_matmul"]
    work = Path(spec["work"])
    record = train_run(config, spec["precision"], 1, spec["data"], spec["base"], work / "out", work / "ckpt")
    return {"train_wall_s": record["train_wall_s"], "path": record["bf16_matmul"]["path"]}


def run_job(spec: dict, tmp: Path, name: str) -> dict:
    spec_path = tmp / f"{name}.json"
    spec_path.write_text(json.dumps(spec))
    start, cpu = time.perf_counter(), _children_cpu_s()
    proc = subprocess.run([sys.executable, __file__, "--worker", str(spec_path)], capture_output=True,
                          text=True, cwd=REPO)  # fmt: skip
    job_s, cpu_s = time.perf_counter() - start, _children_cpu_s() - cpu
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode or not lines:
        print(proc.stdout[-3000:], proc.stderr[-3000:], sep="\n")
        raise SystemExit(f"{name}: worker failed (rc={proc.returncode})")
    return {"job_s": job_s, "cpu_s": cpu_s, **json.loads(lines[-1][len("RESULT ") :])}


def _children_cpu_s() -> float:
    """User + system CPU seconds of finished child processes (less disturbed by other load than wall)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", default=str(REPO / "config.yaml"))
    parser.add_argument("--fp32", default="fp32", help="the fp32 arm")
    parser.add_argument("--bf16", default="bf16", help="the bf16 arm")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--no-bf16-kernels", action="store_true", help="oneDNN off: a CPU without bf16 GEMMs")
    parser.add_argument("--base", default=None)
    parser.add_argument("--data", default=None)
    parser.add_argument("--json", default=None, help="write the results here")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print("RESULT " + json.dumps(worker(json.loads(Path(args.worker).read_text()))), flush=True)
        return 0

    from bench_train import ensure_base

    from workflow_scripts.runtime.config import load_config

    config = load_config(args.config, check_files=False)
    jobs = {"fp32": (args.fp32, None), "bf16 native": (args.bf16, "native"),
            "bf16 emulated": (args.bf16, "emulated")}  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        data, base = ensure_base(config, args.base, args.data, tmp)
        best: dict[str, dict] = {}
        for rep in range(args.reps):
            for kind, (arm, path) in jobs.items():
                name = f"{kind}-{rep}".replace(" ", "_")
                spec = {"config": config, "precision": arm, "bf16_matmul": path, "steps": args.steps,
                        "data": str(data), "base": str(base), "work": str(tmp / name),
                        "no_bf16_kernels": args.no_bf16_kernels}  # fmt: skip
                result = run_job(spec, tmp, name)
                job, cpu, train = result["job_s"], result["cpu_s"], result["train_wall_s"]
                print(f"  rep {rep} {kind:14s} job {job:6.1f} s (cpu {cpu:6.1f} s), train {train:6.1f} s, "
                      f"path {result['path']}", flush=True)  # fmt: skip
                if kind not in best or result["job_s"] < best[kind]["job_s"]:
                    best[kind] = result
    load = os.getloadavg()[0]
    kernels = "oneDNN off (no bf16 GEMM kernels)" if args.no_bf16_kernels else "this CPU's kernels"
    print(f"{args.steps} steps, {kernels}, load average {load:.2f} at the end:")
    out = {"steps": args.steps, "no_bf16_kernels": args.no_bf16_kernels, "load": load, "jobs": best}
    for kind in ("bf16 native", "bf16 emulated"):
        ratio = {k: best[kind][k] / best["fp32"][k] for k in ("job_s", "cpu_s", "train_wall_s")}
        out[f"{kind} / fp32"] = {k: round(v, 3) for k, v in ratio.items()}
        print(f"  {kind} / fp32 = {ratio['job_s']:.2f} (job s), {ratio['cpu_s']:.2f} (job CPU s), "
              f"{ratio['train_wall_s']:.2f} (trainer.train() only)")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
