"""Where the test suite's time goes: one table per tier (an environment's pytest under a marker expression).

The table: the tier's wall time, the time of each test module (the sum of its tests' durations, setup and
teardown included: a module's shared workflow fixture counts once, in the test that built it), the 15
slowest tests, and the Snakemake invocations the tier started, by kind (``run`` executes jobs; the
others plan or record: dry runs, --touch, --summary, --lint, --rulegraph, --report). The invocations come
from the file that RLVR_WORKFLOW_LOG names: tests/conftest.py's ``log_workflow_run`` appends a line
(test id, how it was started, snakemake's arguments) for every invocation a test starts.

Two modes:

    # run a tier and print its table (pytest -q --durations=0 --junitxml; its exit code is this one's)
    .venv/bin/python bench/suite_times.py run --pytest .venv/bin/pytest -m 'not slow and not vllm' -n 2
    # print the tables of tiers already run (`make test` does this at the end, without rerunning pytest):
    # each XML beside its invocation log, <name>.workflows.tsv
    .venv/bin/python bench/suite_times.py --from-junit .suite-times/main.xml .suite-times/vllm.xml

The table only prints: it never fails for timing reasons (the 600 s budget of `make test` is read by a
person); it fails when its inputs are missing or unreadable.
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

LOG_ENV = "RLVR_WORKFLOW_LOG"
SLOWEST = 15
KINDS = ("run", "dry-run", "touch", "summary", "lint", "rulegraph", "report")


@dataclass
class Tier:
    """One tier's results: tests (id -> seconds, setup + call + teardown), outcomes, wall time."""

    name: str
    wall_s: float
    durations: dict[str, float] = field(default_factory=dict)
    outcomes: Counter = field(default_factory=Counter)
    invocations: list[tuple[str, str, str]] = field(default_factory=list)  # (test id, via, arguments)


def module_of(classname: str) -> str:
    """tests.workflow.test_factorial(.TestClass) -> tests/workflow/test_factorial.py."""
    parts = classname.split(".")
    while len(parts) > 1 and parts[-1][:1].isupper():
        parts.pop()
    return "/".join(parts) + ".py"


def read_junit(path: Path, name: str | None = None) -> Tier:
    """A tier from pytest's --junitxml file (the testsuite's time is the session's wall time)."""
    if not path.is_file():
        raise SystemExit(f"suite_times: no junit xml at {path} (did the tier's pytest run write it?)")
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as err:
        raise SystemExit(f"suite_times: {path} is not junit xml: {err}") from err
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    if not suites:
        raise SystemExit(f"suite_times: {path} holds no <testsuite>")
    tier = Tier(name or path.stem, sum(float(s.get("time", 0)) for s in suites))
    for case in (c for s in suites for c in s.iter("testcase")):
        test = f"{module_of(case.get('classname', ''))}::{case.get('name')}"
        tier.durations[test] = tier.durations.get(test, 0.0) + float(case.get("time", 0))
        tags = {child.tag for child in case}
        outcome = next((t for t in ("failure", "error", "skipped") if t in tags), "passed")
        tier.outcomes[outcome] += 1
    return tier


def read_invocations(path: Path) -> list[tuple[str, str, str]]:
    """The lines of RLVR_WORKFLOW_LOG's file: (test id, how started, snakemake's arguments)."""
    if not path.is_file():
        raise SystemExit(f"suite_times: no workflow log at {path} (the tier ran without {LOG_ENV} set?)")
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            test, via, args = [*line.split("\t"), "", ""][:3]
            rows.append((test, via, args))
    return rows


def kind(args: str) -> str:
    """What a snakemake invocation does: ``run`` executes jobs, every other kind only plans or records."""
    words = args.split()
    if "--dry-run" in words or "-n" in words:
        return "dry-run"
    for flag in KINDS[2:]:
        if f"--{flag}" in words:
            return flag
    return "run"


def table(tier: Tier, slowest: int = SLOWEST) -> str:
    """The tier's table as text."""
    total = sum(tier.durations.values())
    outcomes = ", ".join(f"{k} {tier.outcomes[k]}" for k in ("passed", "skipped", "failure", "error"))
    lines = [
        f"== suite times: {tier.name}",
        f"wall {tier.wall_s:.1f} s   tests {len(tier.durations)} ({outcomes})"
        f"   sum of test times {total:.1f} s",
    ]
    kinds = Counter(kind(args) for _, _, args in tier.invocations)
    counts = ", ".join(f"{k} {kinds[k]}" for k in KINDS if kinds[k])
    runs = [test for test, _, args in tier.invocations if kind(args) == "run"]
    lines.append(f"snakemake invocations {len(tier.invocations)}: {counts or 'none'}")
    lines.append(f"workflow runs (jobs executed) {len(runs)}, by test:")
    for test, n in sorted(Counter(runs).items()):
        lines.append(f"  {n:3d}  {test}")
    modules: dict[str, list[float]] = {}
    for test, seconds in tier.durations.items():
        modules.setdefault(test.split("::")[0], []).append(seconds)
    width = max([len(m) for m in modules] + [len("module")])
    lines += ["", f"{'module':<{width}}  tests  time_s"]
    for module, times in sorted(modules.items(), key=lambda kv: -sum(kv[1])):
        lines.append(f"{module:<{width}}  {len(times):5d}  {sum(times):6.1f}")
    top = sorted(tier.durations.items(), key=lambda kv: -kv[1])[:slowest]
    lines += ["", f"{len(top)} slowest tests  time_s"]
    lines += [f"{seconds:6.1f}  {test}" for test, seconds in top]
    return "\n".join(lines)


def from_junit(xml: Path) -> Tier:
    """A tier from its junit xml and the invocation log beside it (<name>.workflows.tsv)."""
    tier = read_junit(xml)
    tier.invocations = read_invocations(xml.with_suffix(".workflows.tsv"))
    return tier


def run_tier(pytest: str, marker: str, workers: int, junit: Path, extra: list[str]) -> tuple[Tier, int]:
    """pytest on one tier with --durations=0 and a junit xml; the tier and pytest's exit code."""
    log = junit.with_suffix(".workflows.tsv")
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("")
    cmd = [pytest, "-q", "--durations=0", f"--junitxml={junit}", "-m", marker]
    if workers > 0:
        cmd += ["-n", str(workers), "--dist", "loadfile"]
    started = time.monotonic()
    code = subprocess.run([*cmd, *extra], env={**os.environ, LOG_ENV: str(log)}).returncode
    wall = time.monotonic() - started
    tier = from_junit(junit)
    tier.name, tier.wall_s = f"{marker!r} ({workers} workers, {Path(pytest).parent.parent.name})", wall
    return tier, code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--from-junit", nargs="+", type=Path, metavar="XML",
                        help="print the tables of tiers already run: junit xml files, each beside its "
                        "<name>.workflows.tsv")  # fmt: skip
    sub = parser.add_subparsers(dest="mode")
    run = sub.add_parser("run", help="run one tier's pytest and print its table")
    run.add_argument("--pytest", default=str(Path(sys.executable).with_name("pytest")),
                     help="the environment's pytest (default: the one beside this python)")  # fmt: skip
    run.add_argument("-m", "--marker", default="not extended", help="pytest's marker expression")
    run.add_argument("-n", "--workers", type=int, default=2, help="pytest-xdist workers (0: none)")
    run.add_argument("--junit", type=Path, help="where the junit xml goes (default: a temporary folder)")
    run.add_argument("pytest_args", nargs="*", help="more pytest arguments (after --)")
    args = parser.parse_args(argv)
    if args.mode == "run":
        junit = args.junit or Path(tempfile.mkdtemp(prefix="suite-times-")) / "tier.xml"
        tier, code = run_tier(args.pytest, args.marker, args.workers, junit, args.pytest_args)
        print(table(tier))
        return code
    if not args.from_junit:
        parser.error("give --from-junit XML... or the run command")
    for xml in args.from_junit:
        print(table(from_junit(xml)), end="\n\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
