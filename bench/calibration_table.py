"""Print the H2 calibration table of docs/design.md from the normal suite's own simulations.

The rates the calibration tests check (tests/test_stats.py: ``simulations``, ``calibration_rates``,
the null coverage) tabulated at the analysis rule in the code now, so that page's table is the one the
tests see, not a copy from an earlier rule. ``--scale K`` draws K times the suite's tables (K = 5 is
``pytest -m extended``). Also prints issue 22's own cases (one part 9x, the other equal).

Usage: .venv/bin/python bench/calibration_table.py [--scale 1]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

import test_stats as cal  # noqa: E402  the suite's calibration design and helpers

from workflow_scripts.statistics import simulation  # noqa: E402

ISSUE_CASES = {"shared 9x, seed x task 1x": (9.0, 1.0), "shared 1x, seed x task 9x": (1.0, 9.0),
               "both 9x": (9.0, 9.0)}  # fmt: skip


def issue_case(rng: np.random.Generator, shared_x: float, task_x: float) -> dict:
    table = simulation.simulate_table(
        rng,
        n_seeds=cal.CAL_SEEDS,
        n_off=cal.CAL_OFF,
        seed_var={("bf16", "off_task"): shared_x * cal.CAL_SHARED},
        task_var={("bf16", "off_task"): task_x * cal.CAL_TASK},
        shared_default=cal.CAL_SHARED,
        task_default=cal.CAL_TASK,
        **cal.CAL_NOISE,
    )
    return cal._role(table, "off_task")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=int, default=1)
    ap.add_argument("--issue-tables", type=int, default=200)
    args = ap.parse_args(argv)
    start = time.perf_counter()
    n_null, n_alt = args.scale * cal.N_NULL, args.scale * cal.N_ALT
    sims = cal.simulations(n_null, n_alt)
    rates = cal.calibration_rates(sims)
    whole = cal.CAL_SHARED + cal.CAL_TASK
    covered = [
        lo <= whole <= hi for b in sims["null"] for lo, hi in (b["arms"][a]["whole_var_ci"] for a in cal.ARMS)
    ]
    h1 = float(np.mean(cal.h1_verdicts(sims["h1_ratio4"]) == "supported"))
    print("| structure (arm vs reference) | whole | shared part | seed x task part | tables | H2 supported |")
    print("|---|---|---|---|---|---|")
    r = cal.DETECT_RATIO  # the alternatives' whole ratio; shared = seed x task at the reference
    w, p = f"{r:g}x", f"{2 * r - 1:g}x"
    parts = {"null": ("1x", "1x", "1x"), "shared": (w, p, "1x"), "task": (w, "1x", p), "both": (w, w, w)}
    for s in simulation.STRUCTURES:
        n = n_null if s == "null" else n_alt
        print(f"| {s} | {' | '.join(parts[s])} | {n} | {rates[s]:.3f} |")
    print(
        f"whole-variance 95% CI coverage under the null: {np.mean(covered):.3f} of {len(covered)} intervals"
    )
    print(f"H1 supported at a 4x on-task ratio: {h1:.3f} of {len(sims['h1_ratio4'])}")
    rng = np.random.default_rng(22)
    for name, (shared_x, task_x) in ISSUE_CASES.items():
        blocks = [issue_case(rng, shared_x, task_x) for _ in range(args.issue_tables)]
        rate = float(np.mean(cal.h2_verdicts(blocks) == "supported"))
        print(f"issue 22 case {name}: H2 supported {rate:.3f} of {args.issue_tables}")
    print(f"{time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
