"""What the test suite's warm snakemake server (tests/snakemake_server.py) saves on a dry run.

The suite starts ~70 snakemake invocations that run no job (dry runs, --summary, --touch, --lint); each
used to be a fresh process importing snakemake and its plugins. This times a dry run of the test
workflow (tests/config.test.yaml) both ways, alternating so both see the same machine load: a fresh
``snakemake -n`` process, and the same command forked from the server (started once, before timing).
Prints the median wall seconds of each over ``--repeats`` and their ratio; the outputs must agree
(same job stats).

    .venv/bin/python bench/bench_dry_runs.py --repeats 7
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
import snakemake_server  # noqa: E402
from conftest import SNAKEMAKE, load_test_config, make_workflow_dir  # noqa: E402


def job_stats(stdout: str) -> str:
    """The plan's job counts: the table after "Job stats:" (the jobs' listing order follows each
    process's string-hash seed, so two fresh processes differ there too)."""
    return stdout[stdout.index("Job stats:") :].split("\n\n", 1)[0] if "Job stats:" in stdout else stdout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        wf = make_workflow_dir(Path(tmp) / "wf", load_test_config())
        cmd = [
            SNAKEMAKE,
            "--dry-run",
            "--cores",
            "2",
            "--directory",
            str(wf),
            "--snakefile",
            str(wf / "Snakefile"),
        ]
        snakemake_server.run(cmd, cwd=wf, timeout=300)  # the server's start-up, not timed
        times: dict[str, list[float]] = {"fresh": [], "served": []}
        for _ in range(args.repeats):
            started = time.monotonic()
            fresh = subprocess.run(cmd, cwd=wf, capture_output=True, text=True, timeout=300)
            times["fresh"].append(time.monotonic() - started)
            started = time.monotonic()
            served = snakemake_server.run(cmd, cwd=wf, timeout=300)
            times["served"].append(time.monotonic() - started)
            assert fresh.returncode == served.returncode == 0, fresh.stderr[-2000:] + served.stderr[-2000:]
            assert job_stats(fresh.stdout) == job_stats(served.stdout)
    fresh_s, served_s = (statistics.median(times[k]) for k in ("fresh", "served"))
    print(f"dry run of the test workflow, median of {args.repeats} (alternating):")
    ratio = fresh_s / served_s
    print(f"  fresh process {fresh_s:.2f} s   forked from the server {served_s:.2f} s   ratio {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
