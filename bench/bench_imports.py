"""Start-up cost per stage: ``python -X importtime -c "import workflow_scripts.<stage>"``, summarised.

For each stage module prints the wall time of the import (cumulative microseconds of the stage module in
importtime's report) and which heavy third-party packages it pulled in, with their cumulative times:
a compute stage should not import trl (except train), vllm (unless enabled), or plotting/statistics
libraries (seaborn, matplotlib, statsmodels). Each stage is imported in a fresh interpreter; the
minimum over ``--repeats`` is reported (the machine is shared).

Usage: .venv/bin/python bench/bench_imports.py [--stages evaluate train ...] [--repeats 3] [--baseline DIR]
``--baseline`` also imports the package from another checkout (e.g. a worktree of a8ce4c0), alternating
with this one stage by stage, so both columns see the same machine load.

``--gc`` measures instead what ``workflow_scripts/runtime/startup.py`` saves: per stage, the import and the
interpreter-exit seconds of a job process (the collector paused during imports, objects frozen before
exit) against a plain process (Python's default collector), alternating, median of ``--repeats``.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STAGES = ("prepare_data", "base_model", "train", "evaluate", "sparsity", "overlap", "aggregate", "stats",
          "learning_curves", "figures", "report")  # fmt: skip
HEAVY = ("torch", "transformers", "trl", "vllm", "datasets", "pandas", "pyarrow", "sympy", "math_verify",
         "matplotlib", "seaborn", "statsmodels", "scipy", "sklearn", "accelerate", "peft")  # fmt: skip
LINE = re.compile(r"import time:\s+(\d+)\s+\|\s+(\d+)\s+\|(\s+)(\S+)")


def import_profile(stage: str, root: Path) -> tuple[float, dict[str, float]]:
    """(seconds to import the stage, {heavy package: cumulative seconds}) in a fresh interpreter."""
    env = {**os.environ, "PYTHONPATH": str(root), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", f"import workflow_scripts.{stage}"],
                          capture_output=True, text=True, cwd=root, env=env, check=False)  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"import workflow_scripts.{stage} failed in {root}:\n{proc.stderr[-2000:]}")
    total, heavy = 0.0, {}
    for match in LINE.finditer(proc.stderr):
        cumulative, name = int(match.group(2)) / 1e6, match.group(4)
        if name == f"workflow_scripts.{stage}":
            total = cumulative
        if name in HEAVY:
            heavy[name] = max(heavy.get(name, 0.0), cumulative)
    return total, heavy


def best(stage: str, root: Path, repeats: int) -> tuple[float, dict[str, float]] | None:
    if not (root / "workflow_scripts" / f"{stage}.py").exists():
        return None
    return min((import_profile(stage, root) for _ in range(repeats)), key=lambda r: r[0])


def _shown(heavy: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.1f}" for k, v in sorted(heavy.items(), key=lambda kv: -kv[1]) if v >= 0.05)


GC_PROBE = """
import time; t0 = time.perf_counter()
{define}
import workflow_scripts.{stage}
from workflow_scripts.runtime import startup
startup.imports_done()
t1 = time.perf_counter()
startup.before_exit()
print(t1 - t0, time.time(), flush=True)
"""


def gc_profile(stage: str, job: bool) -> tuple[float, float]:
    """(import s, exit s) of a fresh process; ``job``: __main__ defines ``snakemake`` as a rule's does."""
    code = GC_PROBE.format(define="snakemake = None" if job else "", stage=stage)
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=env,
                          check=True)  # fmt: skip
    exited = time.time()
    import_s, printed = (float(x) for x in proc.stdout.split()[-2:])
    return import_s, exited - printed


def bench_gc(stages: list[str], repeats: int) -> int:
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs; median of {repeats}")
    print("| stage | import s: default / paused | exit s: default / frozen | saved per job s |")
    print("|---|---|---|---|")
    for stage in stages:
        runs: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
        for _ in range(repeats):
            for job in (False, True):
                runs[job].append(gc_profile(stage, job))
        (imp0, ex0), (imp1, ex1) = (
            tuple(statistics.median(r[i] for r in runs[job]) for i in (0, 1)) for job in (False, True)
        )
        saved = imp0 + ex0 - imp1 - ex1
        print(f"| {stage} | {imp0:.2f} / {imp1:.2f} | {ex0:.2f} / {ex1:.2f} | {saved:.2f} |", flush=True)
    print(f"load average after {os.getloadavg()[0]:.2f}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stages", nargs="+", default=list(STAGES))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--root", type=Path, default=REPO)
    parser.add_argument("--baseline", type=Path, help="another checkout, measured alternately (before)")
    parser.add_argument("--gc", action="store_true", help="job process (startup.py) vs plain process")
    args = parser.parse_args(argv)
    if args.gc:
        return bench_gc(args.stages, args.repeats)
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs; min of {args.repeats}")
    before = "| before s " if args.baseline else ""
    print(f"| stage {before}| import s | heavy packages imported (cumulative s) |")
    print("|---" * (4 if args.baseline else 3) + "|")
    for stage in args.stages:
        old = best(stage, args.baseline, args.repeats) if args.baseline else None
        new = best(stage, args.root, args.repeats)
        if new is None and old is None:
            continue
        cells = [stage]
        if args.baseline:
            cells.append("-" if old is None else f"{old[0]:.2f}")
        cells.append("-" if new is None else f"{new[0]:.2f}")
        cells.append(_shown(new[1]) if new else "")
        print("| " + " | ".join(cells) + " |", flush=True)
    print(f"load average after {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
