"""Simulated metrics tables with known truth: seed variances per arm and role, binomial eval noise at known p.

The calibration tests (tests/test_stats.py) and bench/bench_analysis.py draw tables here, so the truth
the statistics are checked against is stated in one place. A table has the columns ``stats.analyze``
reads (the aggregate step's metrics.parquet, base rows included): for run (arm, seed) and task t

    p[t]    = base pass rate of task t (fixed)
    dp      = gain[role] + u[arm, seed, role] + e[arm, seed, t]
              u ~ N(0, seed_var[arm, role])    shared by the role's tasks
              e ~ N(0, task_var[arm, role])    seed x task: each task its own way
    J       = Binomial(n_problems * n_samples, clip(p[t] + dp)) / (n_problems * n_samples)
    dJ      = J - J_base[t]       (J_base drawn once per task, shared by every run: the base's noise)
    eval_noise_var = J (1 - J) / (n_problems * n_samples)

so the eval noise enters dJ exactly as in the experiment (the problems are i.i.d. here, so the
binomial variance is the exact sampling variance). KL (rb) per run x task is kl_mean + a seed shift with
variance ``kl_seed_var[arm, role]`` + a seed x task effect with variance ``kl_task_var[arm, role]`` +
its eval noise, as in the experiment (``kl``): every run's KL of a task is measured on the same prompts,
so the task's prompt-set deviation (variance ``KL_PROMPT_SD**2``, drawn once per task like J_base) is
shared by every run, and only the Monte-Carlo part (``KL_MC_SD**2``, the column ``kl_rb_mc_var``)
differs between runs. ``kl_rb_se`` is the prompt-level SE, which covers both
(sqrt(KL_MC_SD**2 + KL_PROMPT_SD**2)).

``STRUCTURES`` name where a larger seed variance sits (the calibration's alternatives): the whole seed
variance of a task, V = seed_var + task_var, is ``ratio`` times the reference's, the increase put in
the shared part only, in the seed x task part only, in both (each part times ``ratio``), or nowhere.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

ARMS = ("fp32", "bf16")
ROLES = ("on_task", "off_task")
SEED_VAR = 4e-4  # default shared seed variance of dJ (sd 0.02)
TASK_VAR = 1e-4  # default seed x task variance of dJ
KL_SEED_VAR = 1e-4
KL_TASK_VAR = 9e-6
KL_MC_SD = 0.002  # Monte-Carlo noise of one run's KL given the prompts
KL_PROMPT_SD = 0.005  # the fixed prompt-set deviation of a task's KL (between-prompt sd / sqrt(P))
STRUCTURES = ("null", "shared", "task", "both")

Cells = Mapping[tuple[str, str], float]


def structure(
    name: str, ratio: float, shared: float, task: float, arm: str = "bf16", role: str = "off_task"
) -> tuple[dict[tuple[str, str], float], dict[tuple[str, str], float]]:
    """(seed_var, task_var) cells for ``arm`` and ``role`` whose whole seed variance is ``ratio`` x the
    reference's (``shared`` + ``task``; 'null': ratio 1), the increase placed as ``name`` says."""
    whole = shared + task
    if name == "null":
        s, t = shared, task
    elif name == "shared":
        s, t = shared + (ratio - 1) * whole, task
    elif name == "task":
        s, t = shared, task + (ratio - 1) * whole
    elif name == "both":
        s, t = ratio * shared, ratio * task
    else:
        raise ValueError(f"unknown structure {name!r} (one of {STRUCTURES})")
    return {(arm, role): s}, {(arm, role): t}


def _cell(cells: Cells | float | None, arm: str, role: str, default: float) -> float:
    if cells is None:
        return default
    if isinstance(cells, Mapping):
        return float(cells.get((arm, role), default))
    return float(cells)


def simulate_table(
    rng: np.random.Generator,
    n_seeds: int = 10,
    n_on: int = 1,
    n_off: int = 4,
    seed_var: Cells | None = None,
    task_var: Cells | float | None = None,
    gain: Mapping[str, float] | None = None,
    base_p: Sequence[float] | None = None,
    n_problems: int = 500,
    n_samples: int = 16,
    arms: Sequence[str] = ARMS,
    kl_seed_var: Cells | None = None,
    kl_task_var: Cells | float | None = None,
    shared_default: float = SEED_VAR,
    task_default: float = TASK_VAR,
) -> pd.DataFrame:
    """One tidy table; a (arm, role) cell missing from ``seed_var`` / ``task_var`` takes
    ``shared_default`` / ``task_default`` (a float ``task_var`` applies to every cell)."""
    gain = {"on_task": 0.08, "off_task": 0.0, **dict(gain or {})}
    roles = {**{f"on{k}": "on_task" for k in range(n_on)}, **{f"off{k}": "off_task" for k in range(n_off)}}
    tasks = list(roles)
    p = np.asarray(base_p if base_p is not None else np.linspace(0.2, 0.6, len(tasks)), dtype=float)
    n = n_problems * n_samples
    j_base = rng.binomial(n, p) / n
    rows = [
        _row("base", None, None, t, roles[t], j_base[i], 0.0, n_problems, n_samples, 0.0, 0.0, 0.0)
        for i, t in enumerate(tasks)
    ]
    kl_se, mc_var = float(np.hypot(KL_MC_SD, KL_PROMPT_SD)), KL_MC_SD**2
    for arm in arms:
        sd = {r: np.sqrt(_cell(seed_var, arm, r, shared_default)) for r in ROLES}
        td = {r: np.sqrt(_cell(task_var, arm, r, task_default)) for r in ROLES}
        kl_sd = {r: np.sqrt(_cell(kl_seed_var, arm, r, KL_SEED_VAR)) for r in ROLES}
        kl_td = {r: np.sqrt(_cell(kl_task_var, arm, r, KL_TASK_VAR)) for r in ROLES}
        for s in range(1, n_seeds + 1):
            u = {r: rng.normal(0, sd[r]) for r in ROLES}
            ukl = {r: rng.normal(0, kl_sd[r]) for r in ROLES}
            for i, t in enumerate(tasks):
                r = roles[t]
                q = np.clip(p[i] + gain[r] + u[r] + rng.normal(0, td[r]), 1e-3, 1 - 1e-3)
                j = rng.binomial(n, q) / n
                kl = 0.05 + ukl[r] + rng.normal(0, kl_td[r]) + rng.normal(0, KL_MC_SD)
                dj = j - j_base[i]
                rows.append(
                    _row(f"{arm}-s{s}", arm, s, t, r, j, dj, n_problems, n_samples, kl, kl_se, mc_var)
                )
    table = pd.DataFrame(rows)
    # drawn last so that every other draw is what it was before the offsets existed
    prompt_dev = dict(zip(tasks, rng.normal(0, KL_PROMPT_SD, len(tasks)), strict=True))
    runs = table["run"] != "base"  # base vs itself: exactly 0
    table.loc[runs, "kl_rb"] += table.loc[runs, "task"].map(prompt_dev)
    return table


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
    kl_mc_var: float,
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
        "kl_rb": kl,
        "kl_rb_se": kl_se,
        "kl_rb_mc_var": kl_mc_var,
        "diverged": False,
    }
