"""Benchmark of the statistics step (workflow_scripts.stats.analyze) at the study's intended scale.

Simulates 2 precisions x 10 seeds x 8 tasks x 500 problems x 16 samples of 0/1 correctness (plus the base
model), builds the tidy metrics table from the samples the way the aggregate step does (J per run x task,
dJ paired by problem with its SE, eval noise from the per-problem counts), runs ``analyze`` with the
schema's default ``analysis`` settings (the gate, the mixed model of the whole seed variance with its
2000-draw parametric bootstrap per comparison, 200 power simulations per power estimate, the classical
tests per role and per task) and prints the time, the peak memory and the verdicts. Target: under 60 s.

    .venv/bin/python bench/bench_analysis.py [--seeds 10] [--tasks 8] [--problems 500] [--samples 16]
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time

import numpy as np
import pandas as pd
from scipy.special import expit, logit

from workflow_scripts.stats import analyze, sampling_noise_var

PRECISIONS = ("fp32", "bf16")
ROLES = ("on_task", "off_task")
# Planted truth: seed sd of the logit shift shared by a role's tasks per (precision, role); bf16 off-task is
# 2x (variance 4x). KL is drawn per run x task: a seed x task effect, 9x the variance in bf16.
SEED_SD = {
    ("fp32", "on_task"): 0.10,
    ("bf16", "on_task"): 0.10,
    ("fp32", "off_task"): 0.10,
    ("bf16", "off_task"): 0.20,
}
KL_SD = {"fp32": 0.01, "bf16": 0.03}


def simulate(n_seeds: int, n_tasks: int, n_problems: int, n_samples: int, seed: int = 0) -> pd.DataFrame:
    """The tidy metrics table (one row per run x task) from simulated per-sample correctness."""
    rng = np.random.default_rng(seed)
    n_on = max(1, n_tasks // 4)
    roles = {f"task{k}": "on_task" if k < n_on else "off_task" for k in range(n_tasks)}
    base_p = {t: rng.beta(2, 3, n_problems) for t in roles}
    base_c = {t: (rng.random((n_problems, n_samples)) < base_p[t][:, None]).sum(axis=1) for t in roles}
    rows = []
    for t, role in roles.items():
        c = base_c[t]
        rows.append(_row("base", None, np.nan, t, role, c, c, n_samples, 0.0, 0.0))
    for prec in PRECISIONS:
        for s in range(1, n_seeds + 1):
            run_shift = {r: rng.normal(0.3 if r == "on_task" else 0.0, SEED_SD[prec, r]) for r in ROLES}
            for t, role in roles.items():
                shift = run_shift[role] + rng.normal(0, 0.05) + rng.normal(0, 0.2, n_problems)
                p = expit(logit(np.clip(base_p[t], 1e-4, 1 - 1e-4)) + shift)
                c = (rng.random((n_problems, n_samples)) < p[:, None]).sum(axis=1)
                kl = abs(rng.normal(0.02 if role == "on_task" else 0.05, KL_SD[prec]))
                rows.append(_row(f"{prec}-s{s}", prec, s, t, role, c, base_c[t], n_samples, kl, 0.1 * kl))
    return pd.DataFrame(rows)


def _row(
    run: str,
    prec: str | None,
    seed: float,
    task: str,
    role: str,
    c: np.ndarray,
    c_base: np.ndarray,
    n: int,
    kl: float,
    kl_se: float,
) -> dict:
    p, pb = c / n, c_base / n
    d = p - pb
    return {
        "run": run,
        "precision": prec,
        "seed": seed,
        "task": task,
        "role": role,
        "J": p.mean(),
        "J_se": p.std(ddof=1) / np.sqrt(p.size),
        "dJ": d.mean(),
        "dJ_se": d.std(ddof=1) / np.sqrt(p.size),
        "n_problems": p.size,
        "n_samples": n,
        "eval_noise_var": sampling_noise_var(c, n),
        "kl_k1": kl,
        "kl_rb": kl,
        "kl_rb_se": kl_se,
        "kl_rb_mc_var": kl_se**2,  # the Monte-Carlo noise the analysis holds out (here: all of the SE)
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--tasks", type=int, default=8)
    ap.add_argument("--problems", type=int, default=500)
    ap.add_argument("--samples", type=int, default=16)
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    table = simulate(args.seeds, args.tasks, args.problems, args.samples)
    t1 = time.perf_counter()
    cfg: dict = {}  # the schema defaults
    out = analyze(table, cfg, precisions=PRECISIONS)
    t2 = time.perf_counter()
    json.dumps(out, allow_nan=False)
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    print(
        f"table: {len(table)} rows from {2 * args.seeds * args.tasks * args.problems * args.samples:,} "
        f"samples (+ base) in {t1 - t0:.2f} s"
    )
    print(f"analyze: {t2 - t1:.2f} s; total {t2 - t0:.2f} s; peak RSS {rss_mb:.0f} MiB")
    for h, v in out["verdicts"].items():
        print(f"{h}: {v['verdict']} - {v['reason']}")
    print(f"gate: {out['gate']['reason']}; warnings: {len(out['warnings'])}")
    for w in out["warnings"]:
        print(f"  - {w}")
    return 0 if t2 - t0 < 60 else 1


if __name__ == "__main__":
    sys.exit(main())
