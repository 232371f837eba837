"""The numerical noise floor: variance between repeats of one (arm, seed), apart from the seed variance.

A repeat (config ``repeats``; run ``<arm>-s<seed>-r<k>``, ``paths``) trains the same (arm, seed) again:
same data order, same sampling seed, same evaluation streams (``paths.stream_run``). What differs between
repeats is numerics alone (nondeterministic kernels, reduction order), so their spread is the run-to-run
numerical variance that a seed variance should be read against. On CPU with deterministic algorithms the
repeats are bit-identical and the floor is exactly 0.

``without_repeats`` is what the seed-variance analysis (``stats.analyze``) sees: each (arm, seed) once,
its first run. ``noise_floor`` summarises every (arm, seed) that has repeats, for dJ and KL (the
estimator the analysis reads):

- ``pairs[<arm>-s<seed>]``: runs, n, per task the variance between the repeats (ddof 1) and the largest
  absolute difference, and ``identical`` (every repeat gave exactly the same value for every task);
- ``arms[<arm>]``: pooled over that arm's pairs (sum of (n - 1) s^2 / sum of (n - 1)): per task and per
  role (the variance of the run's mean over the role's tasks: the unit of ``by_task_type``'s seed
  variance), with the pooled degrees of freedom.

Pure (pandas only); the input is aggregate's metrics table (columns run, precision, seed, repeat, task,
role, dJ and optionally kl, the KL estimator the analysis reads). Tables without a ``repeat`` column
(older results) have no repeats.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd

QUANTITIES = {"dJ": "dJ", "kl": "kl"}  # stats.json name -> metrics column (kl: the analysis estimator's)


def _repeat(metrics: pd.DataFrame) -> pd.Series:
    if "repeat" not in metrics.columns:
        return pd.Series(1, index=metrics.index)
    return pd.to_numeric(metrics["repeat"], errors="coerce").fillna(1)


def without_repeats(metrics: pd.DataFrame) -> pd.DataFrame:
    """The rows of first runs (and base runs): what the seed-variance analysis uses."""
    return metrics.loc[_repeat(metrics) <= 1]


def _var(values: list[float]) -> float | None:
    values = [v for v in values if v is not None and not math.isnan(v)]
    if len(values) < 2:
        return None
    mean = sum(values) / len(values)
    return sum((v - mean) ** 2 for v in values) / (len(values) - 1)


def _pooled(parts: Iterable[tuple[float | None, int]]) -> dict[str, Any]:
    """Pooled variance of (variance, n) parts (None parts skipped) and its degrees of freedom."""
    parts = [(v, n) for v, n in parts if v is not None and n >= 2]
    df = sum(n - 1 for _, n in parts)
    return {"var": sum(v * (n - 1) for v, n in parts) / df if df else None, "df": df}


def noise_floor(metrics: pd.DataFrame) -> dict[str, Any]:
    """stats.json's ``noise_floor`` (module docstring); ``status`` "none" when the table has no repeats."""
    trained = metrics.loc[metrics["precision"].notna()].copy()
    trained["repeat"] = _repeat(trained).astype(int)
    repeated = trained.groupby(["precision", "seed"])["repeat"].transform("max") > 1
    trained = trained.loc[repeated]
    if trained.empty:
        return {"status": "none", "reason": "no repeats in the config (repeats: [])", "pairs": {}, "arms": {}}
    quantities = {q: c for q, c in QUANTITIES.items() if c in trained.columns}
    pairs: dict[str, Any] = {}
    by_arm: dict[str, list[tuple[pd.DataFrame, str]]] = {}
    for (precision, seed), rows in trained.groupby(["precision", "seed"], sort=True):
        name = f"{precision}-s{int(seed)}"
        runs = sorted(rows["run"].unique(), key=lambda r: int(rows.loc[rows["run"] == r, "repeat"].iloc[0]))
        block: dict[str, Any] = {"runs": runs, "n": len(runs)}
        identical = True
        for q, col in quantities.items():
            table = rows.pivot_table(index="task", columns="run", values=col, aggfunc="first")
            per_task = {}
            for task, values in table.iterrows():
                vals = [float(v) for v in values.tolist()]
                finite = [v for v in vals if not math.isnan(v)]
                spread = max(finite) - min(finite) if finite else None
                identical &= len(set(finite)) <= 1 and len(finite) == len(vals)
                per_task[str(task)] = {"var": _var(vals), "max_abs_diff": spread}
            block[q] = per_task
        block["identical"] = identical
        pairs[name] = block
        by_arm.setdefault(str(precision), []).append((rows, name))
    arms = {}
    for precision, members in by_arm.items():
        arm: dict[str, Any] = {"pairs": [name for _, name in members]}
        for q, col in quantities.items():
            tasks = sorted(set().union(*(pairs[name][q] for _, name in members)))
            arm[q] = {
                "by_task": {
                    t: _pooled(
                        (pairs[name][q].get(t, {}).get("var"), pairs[name]["n"]) for _, name in members
                    )
                    for t in tasks
                },
                "by_role": _by_role(members, col),
            }
        arms[precision] = arm
    return {"status": "ok", "pairs": pairs, "arms": arms}


def _by_role(members: list[tuple[pd.DataFrame, str]], col: str) -> Mapping[str, Any]:
    """Pooled repeat variance of each run's mean over the tasks of a role."""
    parts: dict[str, list[tuple[float | None, int]]] = {}
    for rows, _ in members:
        for role, sub in rows.groupby("role"):
            means = pd.to_numeric(sub[col], errors="coerce").groupby(sub["run"]).mean()
            parts.setdefault(str(role), []).append((_var(means.tolist()), len(means)))
    return {role: _pooled(p) for role, p in parts.items()}
