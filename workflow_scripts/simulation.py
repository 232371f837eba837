"""Simulated metrics tables with known truth: seed variances per arm and role, binomial eval noise at known p.

The calibration tests (tests/test_stats.py) and bench/bench_analysis.py draw tables here, so the truth
the statistics are checked against is stated in one place. A table has the columns ``stats.analyze``
reads (the aggregate step's metrics.parquet, base rows included): for run (arm, seed) and task t

    p[t]    = base pass rate of task t (fixed)
    dp      = gain[role] + u[arm, seed, role] + e[arm, seed, t],   u ~ N(0, seed_var[arm, role])
    J       = Binomial(n_problems * n_samples, clip(p[t] + dp)) / (n_problems * n_samples)
    dJ      = J - J_base[t]       (J_base drawn once per task, shared by every run: the base's noise)
    eval_noise_var = J (1 - J) / (n_problems * n_samples)

so the eval noise enters dJ exactly as in the experiment (the problems are i.i.d. here, so the
binomial variance is the exact sampling variance). KL k3 per run x task is kl_mean[role] + a seed
shift with variance ``kl_seed_var[arm, role]`` + task noise + its known SE.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

ARMS = ("fp32", "bf16")


def simulate_table(
    rng: np.random.Generator,
    n_seeds: int = 10,
    n_on: int = 1,
    n_off: int = 4,
    seed_var: Mapping[tuple[str, str], float] | None = None,
    task_var: float = 1e-4,
    gain: Mapping[str, float] | None = None,
    base_p: Sequence[float] | None = None,
    n_problems: int = 500,
    n_samples: int = 16,
    arms: Sequence[str] = ARMS,
    kl_seed_var: Mapping[tuple[str, str], float] | None = None,
) -> pd.DataFrame:
    """One tidy table; ``seed_var[(arm, role)]`` defaults to 4e-4 (sd 0.02) for every arm and role."""
    seed_var = dict(seed_var or {})
    kl_seed_var = dict(kl_seed_var or {})
    gain = {"on_task": 0.08, "off_task": 0.0, **dict(gain or {})}
    roles = {**{f"on{k}": "on_task" for k in range(n_on)}, **{f"off{k}": "off_task" for k in range(n_off)}}
    tasks = list(roles)
    p = np.asarray(base_p if base_p is not None else np.linspace(0.2, 0.6, len(tasks)), dtype=float)
    n = n_problems * n_samples
    j_base = rng.binomial(n, p) / n
    rows = [
        _row("base", None, None, t, roles[t], j_base[i], 0.0, n_problems, n_samples, 0.0, 0.0)
        for i, t in enumerate(tasks)
    ]
    for arm in arms:
        for s in range(1, n_seeds + 1):
            u = {r: rng.normal(0, np.sqrt(seed_var.get((arm, r), 4e-4))) for r in ("on_task", "off_task")}
            ukl = {
                r: rng.normal(0, np.sqrt(kl_seed_var.get((arm, r), 1e-4))) for r in ("on_task", "off_task")
            }
            for i, t in enumerate(tasks):
                r = roles[t]
                q = np.clip(p[i] + gain[r] + u[r] + rng.normal(0, np.sqrt(task_var)), 1e-3, 1 - 1e-3)
                j = rng.binomial(n, q) / n
                kl_se = 0.002
                kl = 0.05 + ukl[r] + rng.normal(0, 0.003) + rng.normal(0, kl_se)
                rows.append(
                    _row(f"{arm}-s{s}", arm, s, t, r, j, j - j_base[i], n_problems, n_samples, kl, kl_se)
                )
    return pd.DataFrame(rows)


def _row(
    run: str,
    arm: str | None,
    seed: int | None,
    task: str,
    role: str,
    j: float,
    dj: float,
    n_problems: int,
    n_samples: int,
    kl: float,
    kl_se: float,
) -> dict:
    return {
        "run": run,
        "precision": arm,
        "seed": seed,
        "task": task,
        "role": role,
        "J": j,
        "dJ": dj,
        "eval_noise_var": j * (1 - j) / (n_problems * n_samples),
        "n_problems": n_problems,
        "n_samples": n_samples,
        "kl_k3": kl,
        "kl_k3_se": kl_se,
        "diverged": False,
    }
