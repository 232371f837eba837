"""Per-call wall time of the code verifier on a passing HumanEval-style case: today's vs a8ce4c0's.

Wall time is the acceptance measure; CPU time (the call's own process plus its sandboxes) is printed
too, since on a loaded machine the two-process verdict's round trips wait for the scheduler.
The old path (test appended to the candidate's program, one sandboxed process) is measured from a
copy of commit a8ce4c0's ``workflow_scripts`` (``git archive a8ce4c0 workflow_scripts | tar -x -C
DIR``; the repository's HEAD is not touched). Old and new run in alternating rounds, each in its own
subprocess, so that load from other processes on the machine hits both alike.

    .venv/bin/python bench/bench_code_verdict.py [--rounds 5] [--calls 10] [--old-tree DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OLD_COMMIT = "a8ce4c0"

_WORKER = r"""
import json, resource, sys, time
sys.path.insert(0, sys.argv[1])
from workflow_scripts.verify.verifiers import verify_one
row = json.loads(open(sys.argv[2]).readline())
meta = {"test": row["test"], "entry_point": row["entry_point"]}
args = ("code", row["canonical_solution"], "", meta)
assert verify_one(*args, prompt=row["prompt"]).correct  # warm-up (sandbox probe) and sanity check
def cpu():
    return sum(getattr(resource.getrusage(who), f) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
               for f in ("ru_utime", "ru_stime"))
times, cpus = [], []
for _ in range(int(sys.argv[3])):
    t0, c0 = time.perf_counter(), cpu()
    verdict = verify_one(*args, prompt=row["prompt"])
    times.append(time.perf_counter() - t0)
    cpus.append(cpu() - c0)
    assert verdict.correct, verdict
print(json.dumps([times, cpus]))
"""


def old_tree(path: Path | None) -> Path:
    """A directory holding a8ce4c0's workflow_scripts (extracted read-only with git archive)."""
    if path is not None:
        return path
    out = Path(tempfile.gettempdir()) / f"h-trust-{OLD_COMMIT}"
    if not (out / "workflow_scripts" / "verifiers.py").exists():
        out.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(
            ["git", "-C", str(REPO), "archive", OLD_COMMIT, "workflow_scripts"],
            check=True,
            capture_output=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(out)], input=archive, check=True)
    return out


def measure(tree: Path, calls: int) -> tuple[list[float], list[float]]:
    fixture = REPO / "data" / "fixtures" / "humaneval.jsonl"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    out = subprocess.run(
        [sys.executable, "-c", _WORKER, str(tree), str(fixture), str(calls)],
        check=True,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    ).stdout
    times, cpus = json.loads(out.strip().splitlines()[-1])
    return times, cpus


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--old-tree", type=Path, default=None)
    args = parser.parse_args(argv)
    trees = {"old (a8ce4c0)": old_tree(args.old_tree), "new (working tree)": REPO}
    times: dict[str, list[float]] = {name: [] for name in trees}
    cpus: dict[str, list[float]] = {name: [] for name in trees}
    for _ in range(args.rounds):
        for name, tree in trees.items():
            wall, cpu = measure(tree, args.calls)
            times[name] += wall
            cpus[name] += cpu
    medians = {name: statistics.median(ts) for name, ts in times.items()}
    for name, ts in times.items():
        q = statistics.quantiles(ts, n=4)
        spread = f"q1 {q[0] * 1e3:.1f}, q3 {q[2] * 1e3:.1f}, n={len(ts)}"
        cpu = statistics.median(cpus[name]) * 1e3
        print(f"{name:20s} wall median {medians[name] * 1e3:7.1f} ms ({spread}); CPU {cpu:.1f} ms/call")
    old, new = medians.values()
    old_cpu, new_cpu = (statistics.median(c) for c in cpus.values())
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"ratio new/old: wall {new / old:.2f}x (acceptance: <= 2x), CPU {new_cpu / old_cpu:.2f}x")
    return 0 if new / old <= 2.0 else 1


if __name__ == "__main__":
    sys.exit(main())
