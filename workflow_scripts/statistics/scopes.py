"""One scope of the analysis (a role's tasks, or a single task) for every arm: the variance model's
whole seed variance and its parts with power (``model_scope``), the classical tests on the model's unit
(``classical_scope``), and the eval-noise share of the across-seed variance (``noise_share``).

``stats.analyze`` calls these per role, quantity and task; they are separate so the calibration tests
can run one scope on simulated tables without the rest of the analysis."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats as st

from workflow_scripts.statistics import power as pw
from workflow_scripts.statistics import variance_model as vm
from workflow_scripts.statistics import verdicts as vd
from workflow_scripts.statistics import yardstick as ys
from workflow_scripts.statistics.stat_tests import (
    compare_means,
    compare_variances,
    describe,
    paired,
    pooled_var,
    rng_for,
    skip,
)

QUANTITIES = {"dJ": ("dJ", "noise"), "kl": ("kl", "kl_var")}
# The matched-drift scales (``stats._prepare`` makes their columns; the mixed model only): an arm that
# drifts less also varies less in absolute terms, so beside the absolute seed variance the verdicts read
# one that does not reward moving less. KL's: the seed variance of log KL (an arm whose every seed drifts
# a tenth as far has the same log-scale spread); dJ's: dJ per unit of drift, dJ / sqrt(the arm's mean KL on
# the task) (dJ scales with the parameter displacement, KL with its square). Eval noise by the delta method.
DRIFT_SCALES = {"dJ": "dJ_drift", "kl": "log_kl"}
MODEL_QUANTITIES = {
    **QUANTITIES,
    "log_kl": ("log_kl", "log_kl_var"),
    "dJ_drift": ("dJ_drift", "dJ_drift_var"),
}
# Quantities the mixed model compares in units of each task's spread: the model has one seed x task
# variance for all of a role's tasks, and KL's scale differs by 1000x between tasks (default run: mcq
# 3e-4 nats, chain 0.36), so in nats the smallest task pins the common variance at 0 (measured: fp32's
# off-task KL whole variance fitted 0 [0, 0] although its across-seed variance was 3.5x its noise).
# Divided by the task's across-seed SD (the root of the mean over the compared arms of each arm's
# variance across seeds), every task has an observed variance near 1, as the common-variance model
# assumes. Both arms' values of a task are divided by the same number, so a ratio keeps its meaning.
RELATIVE = {
    q: "per task, divided by the task's across-seed SD (root mean over the compared arms)"
    for q in ("kl", "log_kl")
}  # dJ_drift is in dJ units (stats._drift_scales), weighted over the tasks as dJ is
SCALE_NAMES = {
    "dJ": "absolute",
    "kl": "absolute",
    "log_kl": "log KL (exploratory)",
    "dJ_drift": "dJ / sqrt(arm's relative KL) (exploratory)",
}
INERT_KL_FRACTION = 0.01  # a task's mean KL below this share of the role's most-moved task's: no drift


def inert_tasks(
    rows: pd.DataFrame, ref: str, tasks: Sequence[str], base_noise: Mapping[str, float], alpha: float
) -> dict[str, dict[str, Any]]:
    """{task: its numbers} for the tasks of a role that training does not move in the reference arm: its
    mean dJ is not different from 0 (t across seeds, the base's eval noise added to the SE), its seed
    variance of dJ is not above its eval noise (chi-square test of the across-seed variance against the
    mean noise) and its mean KL is below ``INERT_KL_FRACTION`` of the role's largest task mean KL (KL
    is >= 0 and its Monte-Carlo noise is tiny, so a noise test would call a 0.001-nat drift moved).
    Such a task (the default's mcq, at chance in every arm) carries no seed variance to compare and
    would weigh fully on the standardised KL scale; it is reported and kept out of the verdicts. Needs
    3 seeds and KL; with one task nothing is left out."""
    sub = rows[(rows["precision"] == ref) & rows["task"].isin(tasks)]
    if len(tasks) < 2 or sub["kl"].isna().any() or sub["run"].nunique() < 3:
        return {}
    kl_means = sub.groupby("task")["kl"].mean()
    top = float(kl_means.max())
    out: dict[str, dict[str, Any]] = {}
    for task in tasks:
        t = sub[sub["task"] == task]
        y, n = t["dJ"].to_numpy(dtype=float), len(t)
        var, noise = float(np.var(y, ddof=1)), float(t["noise"].mean())
        se = float(np.sqrt(var / n + max(base_noise.get(task, 0.0), 0.0)))
        p_mean = float(2 * st.t.sf(abs(y.mean()) / se, n - 1)) if se > 0 else (0.0 if y.mean() else 1.0)
        p_spread = float(st.chi2.sf((n - 1) * var / noise, n - 1)) if noise > 0 else (0.0 if var else 1.0)
        kl_share = float(kl_means[task]) / top if top > 0 else 0.0
        if p_mean >= alpha and p_spread >= alpha and kl_share < INERT_KL_FRACTION:
            out[task] = {
                "mean_dJ": float(y.mean()),
                "p_mean": p_mean,
                "seed_var": var,
                "noise_var": noise,
                "p_spread": p_spread,
                "mean_kl": float(kl_means[task]),
                "kl_share_of_largest": kl_share,
            }
    return out


def task_scales(rows: pd.DataFrame, tasks: Sequence[str], arms: Sequence[str], col: str) -> np.ndarray:
    """Per task, sqrt(mean over ``arms`` of the arm's variance of ``col`` across its runs) (1 where 0)."""
    sub = rows[rows["task"].isin(tasks) & rows["precision"].isin(list(arms))]
    var = sub.groupby(["task", "precision"])[col].var(ddof=1).groupby(level="task").mean()
    out = np.sqrt(np.array([var.get(t, np.nan) for t in tasks], dtype=float))
    return np.where(np.isfinite(out) & (out > 0), out, 1.0)


def units(rows: pd.DataFrame, tasks: Sequence[str]) -> pd.DataFrame:
    """One row per run: mean over ``tasks`` of dJ and KL; noise of a mean of T tasks = sum(noise)/T^2."""
    sub = rows[rows["task"].isin(tasks)]
    t = len(tasks)
    g = sub.groupby("run", sort=True)
    return pd.DataFrame(
        {
            "precision": g["precision"].first(),
            "seed": g["seed"].first(),
            "y": g["dJ"].mean(),
            "noise": g["noise"].sum() / t**2,
            "kl": g["kl"].sum(min_count=t) / t,
            "kl_noise": g["kl_var"].sum() / t**2,
        }
    )


def arm_matrix(
    rows: pd.DataFrame, arm: str, tasks: Sequence[str], col: str, ncol: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(seeds, values, known noise) of one arm: seeds x tasks in seed order (numpy, not pivot: this runs
    per simulated table); a run lacking a task has NaN there."""
    sub = rows[(rows["precision"] == arm) & rows["task"].isin(tasks)]
    r_codes, runs = pd.factorize(sub["run"])
    t_idx = sub["task"].map({t: i for i, t in enumerate(tasks)}).to_numpy()
    y, v = np.full((len(runs), len(tasks)), np.nan), np.zeros((len(runs), len(tasks)))
    y[r_codes, t_idx] = sub[col].to_numpy(dtype=float)
    v[r_codes, t_idx] = sub[ncol].to_numpy(dtype=float)
    seeds = sub["seed"].to_numpy()[np.unique(r_codes, return_index=True)[1]]
    order = np.argsort(seeds, kind="stable")
    return seeds[order], y[order], v[order]


def noise_share(values: np.ndarray, noise: np.ndarray) -> dict[str, Any]:
    """Eval-noise share of the across-seed variance of one arm's run x task values (seeds x tasks): mean
    noise variance / per-task variance across seeds pooled over tasks (what the statistic compares)."""
    if len(values) < 2:
        return {"share": None, "noise_var": float(noise.mean()) if noise.size else None, "observed_var": None}
    observed = float(pooled_var(values))
    mean_noise = float(noise.mean())
    return {
        "share": mean_noise / observed if observed > 0 else None,
        "noise_var": mean_noise,
        "observed_var": observed,
        "df": int(values.shape[1] * (len(values) - 1)),
    }


def classical_scope(
    rows: pd.DataFrame, tasks: Sequence[str], arms: Sequence[str], cfg: Mapping, key: str, margin: float
) -> dict:
    """Per-arm summaries and arm-vs-reference classical comparisons of dJ and KL for one scope: means of
    one mean over the tasks per run, variances of the per-task variance pooled over the tasks."""
    alpha = float(cfg["alpha"])
    has_kl = bool(rows.loc[rows["task"].isin(tasks), "kl"].notna().all()) and len(rows) > 0
    mats = {a: {q: arm_matrix(rows, a, tasks, *cols) for q, cols in QUANTITIES.items()} for a in arms}
    arm_blocks = {}
    for a in arms:
        seeds, y, v = mats[a]["dJ"]
        block = {"n_seeds": len(seeds), "seeds": seeds.tolist(), "dJ": describe_arm(y, v, alpha)}
        if has_kl:
            block["kl"] = describe_arm(*mats[a]["kl"][1:], alpha)
        arm_blocks[a] = block
    comparisons = {}
    for i, a in enumerate(arms[1:], 1):
        rng = rng_for(cfg["seed"], f"{key}/{i}")
        comp: dict[str, Any] = {
            "paired": False,
            "n_seeds": [len(mats[a]["dJ"][0]), len(mats[arms[0]]["dJ"][0])],
        }
        for q in QUANTITIES:
            if q == "kl" and not has_kl:
                comp["kl_mean"] = comp["kl_var"] = skip("KL missing for some runs or tasks")
                continue
            (sx, x, nx), (sy, y, ny) = mats[a][q], mats[arms[0]][q]
            pairs = paired(x, sx, y, sy)
            mean_pairs = (pairs[0].mean(axis=1), pairs[1].mean(axis=1)) if pairs is not None else None
            comp["paired"] = comp["paired"] or pairs is not None
            comp[f"{q}_mean"] = compare_means(x.mean(axis=1), y.mean(axis=1), mean_pairs, alpha, margin)
            comp[f"{q}_var"] = compare_variances(x, y, float(nx.mean()), float(ny.mean()), pairs, cfg, rng)
        comparisons[a] = comp
    return {"reference": arms[0], "arms": arm_blocks, "comparisons": comparisons}


def describe_arm(y: np.ndarray, v: np.ndarray, alpha: float) -> dict[str, Any]:
    """One arm: the mean over tasks per run across seeds (``describe``) and the pooled per-task variance
    across seeds with its eval noise (the variance unit of the tests)."""
    t = max(y.shape[1], 1)
    block = describe(y.mean(axis=1), alpha)
    block["noise_var_of_mean"] = float(v.sum(axis=1).mean()) / t**2 if len(v) else None
    ns = noise_share(y, v)
    block["pooled_var"] = ns["observed_var"]
    block["noise_var"] = ns["noise_var"]
    block["pooled_var_corrected"] = (
        max(ns["observed_var"] - ns["noise_var"], 0.0) if ns["observed_var"] is not None else None
    )
    block["noise_share"] = ns["share"]
    return block


def arm_data_of(
    rows: pd.DataFrame, arm: str, tasks: Sequence[str], col: str, ncol: str, scales: np.ndarray | None = None
) -> vm.ArmData:
    """Seeds x tasks values and known noise of one arm, as the mixed model takes them (each task's values
    divided by ``scales``, its noise by their square, when given)."""
    _, y, v = arm_matrix(rows, arm, tasks, col, ncol)
    if scales is not None:
        y, v = y / scales, v / scales**2
    return vm.arm_data(y, v)


def model_scope(
    rows: pd.DataFrame,
    tasks: Sequence[str],
    arms: Sequence[str],
    quantity: str,
    cfg: Mapping,
    key: str,
    power_for: str | None,
    family: int = 1,
) -> dict[str, Any]:
    """Mixed-model fits of one role and quantity: per-arm components (whole, shared, seed x task) and
    arm-vs-reference comparisons of the whole seed variance, with power.

    ``power_for``: None, 'detect' or 'equivalence' (which power block the verdict of this scope needs);
    ``family``: the arms whose 'larger' Holm corrects together (``verdicts.family_adjusted``).
    """
    col, ncol = MODEL_QUANTITIES[quantity]
    if col not in rows.columns or rows.loc[rows["task"].isin(tasks), col].isna().any():
        return {"status": "failed", "reason": f"{quantity} missing for some runs of these tasks"}
    scales = task_scales(rows, tasks, arms, col) if quantity in RELATIVE else np.ones(len(tasks))
    datas = {a: arm_data_of(rows, a, tasks, col, ncol, scales) for a in arms}
    scale = vm.scale_of(*datas.values())
    if not scale > 0:
        return {"status": "failed", "reason": f"no variation in {quantity} and no eval noise"}
    grid, floor = vm.Grid.around(scale), scale * 1e-12
    alpha = float(cfg["alpha"])
    fits = {a: vm.fit_arm(d, grid, floor) for a, d in datas.items()}
    out: dict[str, Any] = {
        "status": "ok",
        "tasks": list(tasks),
        "units": RELATIVE.get(quantity, "as measured"),
        "task_scales": [float(s) for s in scales],
        "grid_step": grid.step,
        "arms": {a: f.summary(grid, alpha, floor) for a, f in fits.items()},
        "comparisons": {},
    }
    r0 = float(cfg["variance_ratio_margin"])
    nulls: dict[int, dict[str, Any]] = {}  # the null yardstick per arm size (``yardstick``)
    _, ref_y, ref_v = arm_matrix(rows, arms[0], tasks, col, ncol)
    ref_y, ref_v = ref_y / scales, ref_v / scales**2
    for i, a in enumerate(arms[1:], 1):
        rng = rng_for(cfg["seed"], f"model/{key}/{i}")
        comp = vm.compare_arms(fits[a], fits[arms[0]], grid, alpha, int(cfg["bootstrap"]), rng, floor)
        if comp.get("status") == "ok":
            comp["p_smaller"] = vm.p_below(fits[a], fits[arms[0]], grid, 1.0)
            comp["p_below_r0"] = vm.p_below(fits[a], fits[arms[0]], grid, r0)
            n_arm = datas[a].n_seeds
            if n_arm not in nulls:
                splits, null_rng = (
                    int(cfg.get("null_splits", 200)),
                    rng_for(cfg["seed"], f"null/{key}/{n_arm}"),
                )
                nulls[n_arm] = ys.null_block(ref_y, ref_v, n_arm, splits, grid, floor, null_rng)
            comp["yardstick"] = ys.place(comp.get("ratio"), nulls[n_arm])
        if power_for and comp.get("status") == "ok":
            basis, label = pw.reference_basis(
                fits[a], fits[arms[0]], vm.null_fit(fits[a], fits[arms[0]], grid)
            )
            comp["power"] = pw.power_block(
                fits[a],
                fits[arms[0]],
                basis,
                dict(cfg),
                rng_for(cfg["seed"], f"power/{key}/{i}"),
                floor,
                equivalence=power_for == "equivalence",
                basis=label,
                family=family,
            )
        out["comparisons"][a] = comp
    out["yardstick"] = {str(n): {k: x for k, x in b.items() if k != "ratios"} for n, b in nulls.items()}
    failed = [f"{a}: {f.reason}" for a, f in fits.items() if f.status != "ok"]
    if failed:
        out["status"], out["reason"] = "failed", "; ".join(failed)
    return out


NOISE_SHARE_WARN = 0.5  # report.md warns when a verdict rests on an eval-noise share above this


def noise_share_block(by_type: Mapping, arms: Sequence[str], controls: Mapping[str, str]) -> dict[str, Any]:
    """by_role[role][quantity][arm] = {share, noise_var, observed_var} (``noise_share`` of the classical
    arm blocks) and at_risk[hypothesis] = {arm: share} for the arms its verdict compares (the reference
    and the non-control arms) above ``NOISE_SHARE_WARN`` (that verdict rests mostly on measurement noise)."""
    by_role: dict[str, dict] = {}
    for role, scope in by_type.items():
        by_role[role] = {}
        for q, key in (("dJ", "dJ"), ("kl", "kl")):
            blocks = {a: (scope["arms"].get(a) or {}).get(key) for a in arms}
            by_role[role][q] = {
                a: {"share": b["noise_share"], "noise_var": b["noise_var"], "observed_var": b["pooled_var"]}
                for a, b in blocks.items()
                if b
            }
    at_risk = {}
    for h, (role, q) in vd.SCOPES.items():
        shares = by_role.get(role, {}).get(q, {})
        high = {
            a: b["share"]
            for a, b in shares.items()
            if a not in controls and (b["share"] or 0) > NOISE_SHARE_WARN
        }
        if high:
            at_risk[h] = high
    return {"by_role": by_role, "warn_above": NOISE_SHARE_WARN, "at_risk": at_risk}
