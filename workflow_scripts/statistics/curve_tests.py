"""When do the arms' held-out learning curves part: per-step tests against the reference arm, the first
step that differs, and its uncertainty.

Input: the heldout_curves table (run x step x task: J, dJ, eval_noise_var; the learning_curves stage).
Repeats are left out; the unit of replication is the training seed; step 0 is every seed's starting
weights. For each arm other than the reference (the first of the precisions), at each measured step
t > 0:

| question           | unit, per seed                | test (p)                   | effect and interval      |
| ------------------ | ----------------------------- | -------------------------- | ------------------------ |
| on-task means      | c(t) = J(t) - J(0) of the     | paired t by seed number    | difference of the arms'  |
|                    | seed, mean over on-task tasks | (Welch: < 2 shared seeds)  | mean dJ, t interval      |
| off-task variances | the seed's row of off-task dJ | permutation of seed rows   | ratio of noise-corrected |
|                    | (one value per task)          | between the arms (each     | pooled variances, seed-  |
|                    |                               | centred), abs log ratio of | bootstrap percentile     |
|                    |                               | the pooled variances       | interval (whole rows)    |

Choices, and why:

- Means: mean c(t) equals mean dJ(t) (dJ subtracts the arm's mean step-0 J), but c's variance also holds
  the step-0 eval noise that dJ's offset carries into every later step, so the t-test is not too liberal.
  Seeds are paired by number (shared data order and init; ``stat_tests.paired``'s rule); a seed only one
  arm has is left out of the comparison.
- Variances: the pooled variance is each task's variance across seeds averaged over the off-task tasks
  (``stat_tests.pooled_var``, the final-step analysis' unit). The test reads raw variances: exchangeable
  seed rows give it its level whatever their shape, and the arms' eval noise is near equal at similar J.
  The effect subtracts each arm's mean eval_noise_var, floored at ``VAR_FLOOR`` x that noise (two arms
  whose spread is all noise then have a ratio near 1, not 0/0); its bootstrap resamples whole seed rows,
  so a seed keeps its task vector and the correlation between tasks stays (jointly for both arms when
  paired; seeded: ``analysis.seed``).
- Multiplicity: Bonferroni over the K steps > 0: a step differs when p < alpha / K, and every interval is
  at level 1 - alpha / K (the means interval excludes 0 exactly when its test rejects). Arms are separate
  questions, not corrected against each other.
- The first step that differs: the first tested step whose test rejects; null = "they do not differ at any
  measured step". Its resolution is the grid: the curves parted in (previous step, step]. Its seed
  bootstrap resamples seeds, reruns every step's decision and keeps the first; the percentile interval
  counts "never" as later than the last step (an upper end null: at least alpha/2 of the resamples never
  differ), with the share of resamples per step. Duplicated seeds make each resampled test somewhat
  liberal, so the interval shows how the first step moves with the seeds drawn, not a calibrated CI.
- Noise check at step 0: every seed of an arm starts from the same weights, so the across-seed variance
  at step 0 is eval noise alone: the ratio variance / mean eval_noise_var should be about 1 (0: the seeds
  share one sampling seed; well above 1: they did not start alike, or the noise is underestimated).

Pure: numpy, scipy, pandas; no file I/O.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats as st

from workflow_scripts.statistics.noise_floor import without_repeats
from workflow_scripts.statistics.stat_tests import MIN_SEEDS_VAR, json_safe, pooled_var, rng_for, skip

SCHEMA_VERSION = 1
ROLES = ("on_task", "off_task")
VAR_FLOOR = 0.05  # the corrected variance never drops below this fraction of the arm's eval noise
TINY = 1e-12  # the floor when the noise is 0
FIRST_STEP_RESAMPLES = 200  # seed resamples behind the first-step interval (each reruns every step's test)
REQUIRED = ("precision", "seed", "step", "task", "role", "J", "dJ", "eval_noise_var")


@dataclass(frozen=True)
class ArmCurves:
    """One arm's first runs as arrays: seeds (n,), J and eval-noise variance (n seeds, steps, tasks)."""

    seeds: np.ndarray
    J: np.ndarray
    noise: np.ndarray

    def take(self, idx: np.ndarray | Sequence[int]) -> ArmCurves:
        idx = np.asarray(idx, dtype=int)
        return ArmCurves(self.seeds[idx], self.J[idx], self.noise[idx])


def arm_curves(rows: pd.DataFrame, arm: str, steps: Sequence[int], tasks: Sequence[str]) -> ArmCurves:
    """The arm's seeds x steps x tasks cube; a hole (a seed without some step x task) is a ValueError."""
    sel = rows[rows["precision"] == arm].set_index(["seed", "step", "task"])
    cols = pd.MultiIndex.from_product([list(steps), list(tasks)], names=["step", "task"])
    cubes = []
    for column in ("J", "eval_noise_var"):
        wide = sel[column].astype(float).unstack(["step", "task"]).reindex(columns=cols).sort_index()
        if wide.isna().to_numpy().any():
            raise ValueError(f"arm {arm}: some seed lacks a step x task value of {column}")
        cubes.append(wide.to_numpy().reshape(len(wide), len(steps), len(tasks)))
    return ArmCurves(wide.index.to_numpy(), *cubes)


def align(a: ArmCurves, r: ArmCurves) -> tuple[ArmCurves, ArmCurves, bool]:
    """Both arms restricted to their shared seeds, in seed order, when >= 2 are shared (paired); else
    unchanged (unpaired)."""
    common = sorted(set(a.seeds.tolist()) & set(r.seeds.tolist()))
    if len(common) < 2:
        return a, r, False
    ia, ir = ({s: i for i, s in enumerate(c.seeds.tolist())} for c in (a, r))
    return a.take([ia[s] for s in common]), r.take([ir[s] for s in common]), True


def first_step(steps: Sequence[int], differs: Sequence[bool]) -> int | None:
    """The first of ``steps`` that differs; None when none does."""
    return next((int(s) for s, d in zip(steps, differs, strict=True) if d), None)


# ----------------------------------------------------------------------------- on-task means


def on_task_change(arm: ArmCurves, on: Sequence[int]) -> np.ndarray:
    """(seeds, steps): each seed's on-task J change from its own step 0, averaged over the on-task tasks."""
    x = arm.J[:, :, list(on)].mean(axis=2)
    return x - x[:, :1]


def _t_test(a: np.ndarray, r: np.ndarray, paired: bool):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return st.ttest_1samp(a - r, 0.0) if paired else st.ttest_ind(a, r, equal_var=False)


def mean_pvalues(a: ArmCurves, r: ArmCurves, on: Sequence[int], paired: bool) -> np.ndarray:
    """p of the means test at every step > 0 (NaN where undefined: no spread)."""
    ca, cr = on_task_change(a, on), on_task_change(r, on)
    return np.array([float(_t_test(ca[:, k], cr[:, k], paired).pvalue) for k in range(1, ca.shape[1])])


def mean_step(ca: np.ndarray, cr: np.ndarray, paired: bool, level: float) -> dict[str, Any]:
    """One step's difference of mean dJ (arm - reference) with its t interval at ``1 - level`` and p."""
    res = _t_test(ca, cr, paired)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        ci = res.confidence_interval(1 - level)
    p = float(res.pvalue)
    diff = float(ca.mean() - cr.mean())
    return {"diff": diff, "ci_low": ci.low, "ci_high": ci.high, "p": p, "differs": bool(p < level)}


# ----------------------------------------------------------------------------- off-task variances


def permutation_masks(n_a: int, n_r: int, n_perm: int, rng: np.random.Generator) -> np.ndarray:
    """(n_perm, n_a + n_r) 0/1 rows: random reassignments of the pooled seed rows, n_a to the arm."""
    order = np.argsort(rng.random((n_perm, n_a + n_r)), axis=1)
    mask = np.zeros((n_perm, n_a + n_r))
    np.put_along_axis(mask, order[:, :n_a], 1.0, axis=1)
    return mask


def _group_var(mask: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Pooled variance (per task across the group's rows, mean over tasks) of each mask's group."""
    k = mask.sum(axis=1, keepdims=True)
    s, ss = mask @ x, mask @ (x * x)
    return ((ss - s * s / k) / (k - 1)).mean(axis=1)


def _abs_log_ratio(va: np.ndarray | float, vr: np.ndarray | float) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.abs(np.log(np.asarray(va, dtype=float) / np.asarray(vr, dtype=float)))
    return np.where(np.isnan(out), 0.0, out)  # 0/0: no evidence either way


def variance_pvalue(xa: np.ndarray, xr: np.ndarray, masks: np.ndarray) -> float:
    """Permutation p of |log(pooled var xa / pooled var xr)| (seeds x tasks), each arm centred first."""
    pooled = np.vstack([xa - xa.mean(axis=0), xr - xr.mean(axis=0)])
    obs = float(_abs_log_ratio(pooled_var(xa), pooled_var(xr)))
    if obs == 0.0:
        return 1.0
    sims = _abs_log_ratio(_group_var(masks, pooled), _group_var(1.0 - masks, pooled))
    return float((1 + np.sum(sims >= obs * (1 - 1e-9))) / (len(masks) + 1))


def variance_pvalues(a: ArmCurves, r: ArmCurves, off: Sequence[int], masks: np.ndarray) -> np.ndarray:
    """p of the variance test at every step > 0 (dJ and J differ by a constant: J is used)."""
    off = list(off)
    return np.array([variance_pvalue(a.J[:, k, off], r.J[:, k, off], masks) for k in range(1, a.J.shape[1])])


def corrected_var(var: np.ndarray | float, noise: np.ndarray | float) -> np.ndarray:
    """Variance minus the eval noise, floored at VAR_FLOOR x noise (TINY when the noise is 0)."""
    var, noise = np.asarray(var, dtype=float), np.asarray(noise, dtype=float)
    return np.maximum(var - noise, np.maximum(VAR_FLOOR * noise, TINY))


def variance_step(
    a: tuple[np.ndarray, np.ndarray],
    r: tuple[np.ndarray, np.ndarray],
    p: float,
    paired: bool,
    level: float,
    n_boot: int,
    rng: np.random.Generator,
) -> dict[str, Any]:
    """One step's pooled variances (raw, noise, corrected), the corrected ratio with its seed-bootstrap
    percentile interval at ``1 - level``, and the test's p. ``a``, ``r``: (values, noise), seeds x tasks."""
    (xa, na), (xr, nr) = a, r
    var_a, var_r = float(pooled_var(xa)), float(pooled_var(xr))
    noise_a, noise_r = float(na.mean()), float(nr.mean())
    cor_a, cor_r = float(corrected_var(var_a, noise_a)), float(corrected_var(var_r, noise_r))
    ia = rng.integers(0, len(xa), (n_boot, len(xa)))
    ir = ia if paired else rng.integers(0, len(xr), (n_boot, len(xr)))
    ratios = corrected_var(pooled_var(xa[ia]), na[ia].mean(axis=(1, 2))) / corrected_var(
        pooled_var(xr[ir]), nr[ir].mean(axis=(1, 2))
    )
    lo, hi = np.quantile(ratios, [level / 2, 1 - level / 2])
    return {
        "var": var_a,
        "var_ref": var_r,
        "noise": noise_a,
        "noise_ref": noise_r,
        "var_corrected": cor_a,
        "var_corrected_ref": cor_r,
        "ratio": cor_a / cor_r,
        "ratio_ci_low": float(lo),
        "ratio_ci_high": float(hi),
        "ratio_raw": var_a / var_r if var_r > 0 else math.inf,
        "p": p,
        "differs": bool(p < level),
    }


# ----------------------------------------------------------------------------- the first step


Decide = Callable[[ArmCurves, ArmCurves], np.ndarray]


def resampled_firsts(
    a: ArmCurves, r: ArmCurves, paired: bool, decide: Decide, steps: Sequence[int], level: float,
    n: int, rng: np.random.Generator,
) -> list[int | None]:  # fmt: skip
    """The first differing step of ``n`` seed resamples (jointly for both arms when paired)."""
    out = []
    for _ in range(n):
        ia = rng.integers(0, len(a.seeds), len(a.seeds))
        ir = ia if paired else rng.integers(0, len(r.seeds), len(r.seeds))
        out.append(first_step(steps, decide(a.take(ia), r.take(ir)) < level))
    return out


def first_differ(
    steps: Sequence[int], all_steps: Sequence[int], p: np.ndarray, level: float,
    firsts: Sequence[int | None], alpha: float,
) -> dict[str, Any]:  # fmt: skip
    """The first step whose p < level (null: none), the step measured before it, and the bootstrap of the
    first step: percentile interval at 1 - alpha ("never" ranks after the last step; an end that falls on
    it is null) and the share of resamples per step."""
    step = first_step(steps, p < level)
    after = all_steps[list(all_steps).index(step) - 1] if step is not None else None
    never = len(steps)
    ranks = np.array([list(steps).index(f) if f is not None else never for f in firsts])
    block: dict[str, Any] = {"n": len(ranks)}
    if len(ranks):
        lo, hi = np.quantile(ranks, [alpha / 2, 1 - alpha / 2], method="inverted_cdf")
        share = {str(s): float(np.mean(ranks == i)) for i, s in enumerate(steps)}
        block.update(
            level=1 - alpha,
            ci_low=steps[int(lo)] if lo < never else None,
            ci_high=steps[int(hi)] if hi < never else None,
            never_share=float(np.mean(ranks == never)),
            share=share,
        )
    return {
        "step": step,
        "after_step": after,
        "p": float(p[list(steps).index(step)]) if step is not None else None,
        "bootstrap": block,
    }


# ----------------------------------------------------------------------------- descriptive spread


def spread_by_step(table: pd.DataFrame, arms: Sequence[str] = ()) -> pd.DataFrame:
    """Per arm, role and step (repeats left out): mean dJ over seeds and the role's tasks, the across-seed
    variance of dJ pooled over the role's tasks (``var``), the mean eval-noise variance (``noise``), the
    corrected variance and the seeds. What the variance figure draws and learning_curves.json lists."""
    columns = ["precision", "role", "step", "mean_dJ", "var", "noise", "var_corrected", "n_seeds"]
    rows = without_repeats(table)
    if rows.empty:
        return pd.DataFrame(columns=columns)
    per_task = (
        rows.groupby(["precision", "role", "step", "task"])
        .agg(
            mean=("dJ", "mean"),
            var=("dJ", lambda s: s.var(ddof=1)),
            noise=("eval_noise_var", "mean"),
            n=("seed", "nunique"),
        )
        .reset_index()
    )
    out = (
        per_task.groupby(["precision", "role", "step"])
        .agg(mean_dJ=("mean", "mean"), var=("var", "mean"), noise=("noise", "mean"), n_seeds=("n", "min"))
        .reset_index()
    )
    out["var_corrected"] = corrected_var(out["var"].to_numpy(), out["noise"].to_numpy())
    out.loc[out["var"].isna(), "var_corrected"] = np.nan
    order = list(arms) + sorted(set(out["precision"]) - set(arms))
    role_rank = {r: i for i, r in enumerate(ROLES)}
    out = out.assign(
        _a=out["precision"].map({a: i for i, a in enumerate(order)}),
        _r=out["role"].map(lambda r: role_rank.get(r, len(ROLES))),
    )
    return out.sort_values(["_a", "_r", "step"]).drop(columns=["_a", "_r"])[columns].reset_index(drop=True)


def _spread_blocks(spread: pd.DataFrame, arms: Sequence[str]) -> list[dict[str, Any]]:
    out = []
    for step, at in spread.groupby("step", sort=True):
        by_arm: dict[str, Any] = {}
        for arm in arms:
            sel = at[at["precision"] == arm]
            by_arm[arm] = {
                r["role"]: {k: r[k] for k in ("mean_dJ", "var", "noise", "var_corrected", "n_seeds")}
                for _, r in sel.iterrows()
            }
        out.append({"step": int(step), "arms": by_arm})
    return out


def noise_check(spread: pd.DataFrame, arms: Sequence[str]) -> dict[str, Any]:
    """Per arm and role, the step-0 across-seed variance beside the eval noise, and their ratio (~1)."""
    first = spread[spread["step"] == spread["step"].min()] if len(spread) else spread
    out: dict[str, Any] = {}
    for arm in arms:
        sel = first[first["precision"] == arm]
        out[arm] = {
            r["role"]: {
                "var": r["var"],
                "noise": r["noise"],
                "ratio": r["var"] / r["noise"] if r["noise"] and r["noise"] > 0 else None,
            }
            for _, r in sel.iterrows()
        }
    return out


# ----------------------------------------------------------------------------- the comparison


def _means_block(
    a: ArmCurves, r: ArmCurves, on: Sequence[int], paired: bool, steps: Sequence[int], level: float,
    cfg: Mapping[str, Any], key: str,
) -> dict[str, Any]:  # fmt: skip
    if not on:
        return skip("no on-task task")
    if min(len(a.seeds), len(r.seeds)) < 2:
        return skip(f"needs >= 2 seeds per arm (have {len(a.seeds)} and {len(r.seeds)})")
    ca, cr = on_task_change(a, on), on_task_change(r, on)
    by_step = [{"step": s, **mean_step(ca[:, k], cr[:, k], paired, level)} for k, s in enumerate(steps, 1)]
    p = np.array([b["p"] for b in by_step])

    def decide(x: ArmCurves, y: ArmCurves) -> np.ndarray:
        return mean_pvalues(x, y, on, paired)

    rng = rng_for(int(cfg["seed"]), key)
    firsts = resampled_firsts(a, r, paired, decide, steps, level, int(cfg["first_step_resamples"]), rng)
    return {
        "status": "ok",
        "test": "paired t across seeds" if paired else "Welch t across seeds",
        "unit": "each seed's on-task J change from its own step 0 (mean over the on-task tasks)",
        "n_tasks": len(on),
        "ci_level": 1 - level,
        "by_step": by_step,
        "first_differ": first_differ(steps, [0, *steps], p, level, firsts, float(cfg["alpha"])),
    }


def _variances_block(
    a: ArmCurves, r: ArmCurves, off: Sequence[int], paired: bool, steps: Sequence[int], level: float,
    cfg: Mapping[str, Any], key: str,
) -> dict[str, Any]:  # fmt: skip
    if not off:
        return skip("no off-task task")
    if min(len(a.seeds), len(r.seeds)) < MIN_SEEDS_VAR:
        return skip(f"needs >= {MIN_SEEDS_VAR} seeds per arm (have {len(a.seeds)} and {len(r.seeds)})")
    rng = rng_for(int(cfg["seed"]), key)
    masks = permutation_masks(len(a.seeds), len(r.seeds), int(cfg["bootstrap"]), rng)
    p = variance_pvalues(a, r, off, masks)
    off = list(off)
    by_step = [
        {
            "step": s,
            **variance_step(
                (a.J[:, k, off], a.noise[:, k, off]),
                (r.J[:, k, off], r.noise[:, k, off]),
                float(p[k - 1]),
                paired,
                level,
                int(cfg["bootstrap"]),
                rng,
            ),
        }
        for k, s in enumerate(steps, 1)
    ]

    def decide(x: ArmCurves, y: ArmCurves) -> np.ndarray:
        return variance_pvalues(x, y, off, masks)

    firsts = resampled_firsts(a, r, paired, decide, steps, level, int(cfg["first_step_resamples"]), rng)
    return {
        "status": "ok",
        "test": "permutation of seed rows between the arms (each arm centred), |log pooled var ratio|",
        "unit": f"per-task variance of dJ across seeds, pooled over {len(off)} off-task task(s)",
        "n_tasks": len(off),
        "n_permutations": len(masks),
        "ci_level": 1 - level,
        "by_step": by_step,
        "first_differ": first_differ(steps, [0, *steps], p, level, firsts, float(cfg["alpha"])),
    }


def _arm_order(present: Sequence[str], precisions: Sequence[str]) -> list[str]:
    return [p for p in precisions if p in present] + [p for p in present if p not in precisions]


def analyze_curves(
    table: pd.DataFrame, cfg: Mapping[str, Any], precisions: Sequence[str] = ()
) -> dict[str, Any]:
    """learning_curves.json's content (JSON-safe, no NaN); ``cfg``: alpha, bootstrap (permutations and
    ratio resamples), seed, and optionally first_step_resamples (default FIRST_STEP_RESAMPLES; 0 skips
    the first-step bootstrap). A table without step 0, with a hole in an arm's seeds x steps x tasks or
    lacking a required column raises ValueError."""
    missing = [c for c in REQUIRED if c not in table.columns]
    if missing:
        raise ValueError(f"heldout curves table lacks column(s) {missing}")
    cfg = {"first_step_resamples": FIRST_STEP_RESAMPLES, **dict(cfg)}
    alpha = float(cfg["alpha"])
    rows = without_repeats(table).assign(precision=lambda f: f["precision"].astype(str))
    warn: list[str] = []
    arms = _arm_order(list(dict.fromkeys(rows["precision"])), list(precisions))
    steps = sorted(int(s) for s in rows["step"].unique())
    if steps and steps[0] != 0:
        raise ValueError(f"heldout curves table has no step 0 (first step {steps[0]})")
    tested = steps[1:]
    level = alpha / len(tested) if tested else alpha
    tasks = list(dict.fromkeys(rows["task"]))
    role_of = rows.drop_duplicates("task").set_index("task")["role"].to_dict()
    by_role = {role: [t for t in tasks if role_of[t] == role] for role in dict.fromkeys(role_of.values())}
    spread = spread_by_step(rows, arms)
    ref = arms[0] if arms else None
    curves = {arm: arm_curves(rows, arm, steps, tasks) for arm in arms}
    if len(arms) < 2:
        warn.append(f"only {len(arms)} precision arm(s): nothing to compare")
    if not tested:
        warn.append("only step 0 was measured: no step to compare")
    on = [tasks.index(t) for t in by_role.get("on_task", [])]
    off = [tasks.index(t) for t in by_role.get("off_task", [])]
    comparisons: dict[str, Any] = {}
    for arm in arms[1:] if tested else []:
        a, r, paired = align(curves[arm], curves[ref])
        if paired and (len(a.seeds) < len(curves[arm].seeds) or len(r.seeds) < len(curves[ref].seeds)):
            warn.append(f"{arm} vs {ref}: seeds only one arm has are left out of the paired comparison")
        comparisons[arm] = {
            "design": "paired" if paired else "unpaired",
            "n_seeds": len(a.seeds),
            "n_seeds_ref": len(r.seeds),
            "on_task_mean": _means_block(a, r, on, paired, tested, level, cfg, f"curves/{arm}/mean"),
            "off_task_variance": _variances_block(a, r, off, paired, tested, level, cfg, f"curves/{arm}/var"),
        }
    out = {
        "schema_version": SCHEMA_VERSION,
        "reference": ref,
        "precisions": arms,
        "steps": steps,
        "tested_steps": tested,
        "alpha": alpha,
        "level_per_step": level,
        "correction": f"Bonferroni over the {len(tested)} step(s) > 0",
        "tasks": by_role,
        "n_seeds": {arm: len(c.seeds) for arm, c in curves.items()},
        "noise_check": noise_check(spread, arms),
        "by_step": _spread_blocks(spread, arms),
        "comparisons": comparisons,
        "warnings": warn,
    }
    return json_safe(out)
