"""Time a whole workflow run: `snakemake --cores 2` of a config in a fresh copy, from an empty results/.

Prints the wall time, per-rule totals read from benchmarks/ (jobs, seconds, the slowest job), and the
share of the run spent starting processes: every stage that records it logs one line
``STARTUP {"import_s": .., "load_s": .., "forked": ..}`` (``threads.log_startup``: seconds from process
start to the stage's first line, seconds loading models, whether the fork server ran the job); their
sum is set against the summed job seconds and against cores x wall time. Jobs without such a line are
counted and named by rule, never guessed. The load average before and after is printed: the machine
may be shared, which slows every job.

Do not point it at the full default config casually (it is the experiment: 21.5 min on 2 cores, measured);
a few-step config checks the bench itself, e.g. tests/config.test.yaml.

Usage: .venv/bin/python bench/bench_default.py [--config config.yaml] [--cores 2] [--keep DIR]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORKFLOW_FILES = ("Snakefile", "rules", "workflow_scripts", "scripts", "envs", "report", "profiles", "data")
STARTUP = re.compile(r"STARTUP (\{.*\})")
USAGE = re.compile(r"USAGE (\{.*\})")


def fresh_copy(dest: Path, config: Path) -> Path:
    """The workflow's files and ``config`` as config.yaml in ``dest`` (no results/, no .snakemake/)."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in WORKFLOW_FILES:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
        elif src.exists():
            shutil.copy2(src, dest / name)
    shutil.copy2(config, dest / "config.yaml")
    return dest


def rule_totals(workdir: Path) -> dict[str, dict]:
    """rule -> {jobs, seconds, max_s, slowest} from benchmarks/<rule>/**.tsv (Snakemake's `s` column)."""
    totals: dict[str, dict] = defaultdict(lambda: {"jobs": 0, "seconds": 0.0, "max_s": 0.0, "slowest": ""})
    for tsv in sorted((workdir / "benchmarks").rglob("*.tsv")):
        rule = tsv.relative_to(workdir / "benchmarks").parts[0]
        with open(tsv, encoding="utf-8") as fh:
            rows = list(csv.DictReader(fh, delimiter="\t"))
        seconds = sum(float(r["s"]) for r in rows)
        entry = totals[rule]
        entry["jobs"] += 1
        entry["seconds"] += seconds
        if seconds > entry["max_s"]:
            entry["max_s"], entry["slowest"] = seconds, str(tsv.relative_to(workdir / "benchmarks"))
    return dict(totals)


def startup_records(workdir: Path) -> tuple[dict[str, dict], dict[str, int]]:
    """(rule -> {jobs, import_s, load_s, forked} from STARTUP log lines, rule -> jobs whose log has none).

    ``forked``: jobs that ran in a child of the fork server (workflow_scripts/runtime/forkserver.py)."""
    found: dict[str, dict] = defaultdict(lambda: {"jobs": 0, "import_s": 0.0, "load_s": 0.0, "forked": 0})
    missing: dict[str, int] = defaultdict(int)
    for log in sorted((workdir / "logs").rglob("*.log")):
        rule = log.relative_to(workdir / "logs").parts[0]
        records = [json.loads(m.group(1)) for m in STARTUP.finditer(log.read_text(errors="replace"))]
        if not records:
            missing[rule] += 1
            continue
        last = records[-1]  # a retried job appends to its log: the last attempt counts
        found[rule]["jobs"] += 1
        found[rule]["import_s"] += float(last["import_s"])
        found[rule]["load_s"] += float(last.get("load_s", 0.0))
        found[rule]["forked"] += int(bool(last.get("forked")))
    return dict(found), dict(missing)


def job_cpu_seconds(workdir: Path) -> dict[str, float]:
    """rule -> CPU seconds of its jobs, from their USAGE log lines (``threads.log_usage``: the job's own
    process, also where the fork server ran it and Snakemake's benchmark measured only the client)."""
    cpu: dict[str, float] = defaultdict(float)
    for log in sorted((workdir / "logs").rglob("*.log")):
        records = [json.loads(m.group(1)) for m in USAGE.finditer(log.read_text(errors="replace"))]
        if records:
            cpu[log.relative_to(workdir / "logs").parts[0]] += float(records[-1]["cpu_s"])
    return dict(cpu)


def report(workdir: Path, wall: float, cores: int) -> dict:
    totals = rule_totals(workdir)
    starts, missing = startup_records(workdir)
    job_seconds = sum(t["seconds"] for t in totals.values())
    print("\n| rule | jobs | total s | mean s | slowest job (s) | start-up s (import + load) |")
    print("|---|---|---|---|---|---|")
    for rule, t in sorted(totals.items(), key=lambda kv: -kv[1]["seconds"]):
        s = starts.get(rule)
        shown = (f"{s['import_s']:.1f} + {s['load_s']:.1f} ({s['jobs']} jobs, {s['forked']} forked)"
                 if s else "not recorded")  # fmt: skip
        print(f"| {rule} | {t['jobs']} | {t['seconds']:.1f} | {t['seconds'] / t['jobs']:.1f} | "
              f"{t['slowest']} ({t['max_s']:.1f}) | {shown} |")  # fmt: skip
    startup = sum(s["import_s"] + s["load_s"] for s in starts.values())
    cpu = job_cpu_seconds(workdir)
    summary = {
        "wall_s": round(wall, 1),
        "cores": cores,
        "jobs": sum(t["jobs"] for t in totals.values()),
        "job_seconds": round(job_seconds, 1),
        "startup_s": round(startup, 1),
        "startup_share_of_job_seconds": round(startup / job_seconds, 3) if job_seconds else None,
        "startup_share_of_cores_x_wall": round(startup / (cores * wall), 3) if wall else None,
        "jobs_without_startup_record": missing,
        "forked_jobs": {rule: s["forked"] for rule, s in starts.items()},
        "per_rule_s": {rule: round(t["seconds"], 1) for rule, t in totals.items()},
        "job_cpu_s": round(sum(cpu.values()), 1),
        "per_rule_cpu_s": {rule: round(c, 1) for rule, c in cpu.items()},
        "cpu_share_of_cores_x_wall": round(sum(cpu.values()) / (cores * wall), 3) if wall else None,
    }
    print(f"\nwall {wall:.1f}s on {cores} cores; {summary['jobs']} jobs, {job_seconds:.1f} job-seconds; "
          f"start-up (import + model load) {startup:.1f}s = {summary['startup_share_of_job_seconds']} of "
          f"job-seconds, {summary['startup_share_of_cores_x_wall']} of cores x wall; jobs' own CPU "
          f"{summary['job_cpu_s']}s = {summary['cpu_share_of_cores_x_wall']} of cores x wall")  # fmt: skip
    if missing:
        print(f"jobs without a STARTUP record (not counted): {missing}")
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=REPO / "config.yaml")
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--keep", type=Path, help="run in this (new) folder and keep it")
    parser.add_argument("--timeout", type=int, default=3600, help="seconds before the run is stopped")
    parser.add_argument("--json", type=Path, help="also write the summary here")
    args = parser.parse_args(argv)
    tmp = None
    if args.keep:
        if args.keep.exists():
            raise SystemExit(f"{args.keep}: exists; the bench starts from a fresh copy")
        workdir = fresh_copy(args.keep, args.config)
    else:
        tmp = tempfile.TemporaryDirectory(prefix="bench_default_")
        workdir = fresh_copy(Path(tmp.name), args.config)
    snakemake = str(Path(sys.executable).with_name("snakemake"))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}
    load_before = os.getloadavg()
    print(f"{args.config} in {workdir}; --cores {args.cores}; load average {load_before[0]:.2f} "
          f"on {os.cpu_count()} CPUs", flush=True)  # fmt: skip
    start = time.perf_counter()
    proc = subprocess.run([snakemake, "--cores", str(args.cores), "--directory", str(workdir), "--snakefile",
                           str(workdir / "Snakefile")], cwd=workdir, env=env, capture_output=True, text=True,
                          timeout=args.timeout, check=False)  # fmt: skip
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        print(proc.stdout[-2000:] + proc.stderr[-3000:])
        print(f"SNAKEMAKE FAILED after {wall:.0f}s (exit {proc.returncode}); the totals below are partial")
    summary = report(workdir, wall, args.cores)
    summary["snakemake_exit"] = proc.returncode
    summary["load_average"] = [round(load_before[0], 2), round(os.getloadavg()[0], 2)]
    print(f"load average {summary['load_average'][0]} -> {summary['load_average'][1]}")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1))
    if tmp is not None:
        tmp.cleanup()
    return 0 if proc.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
