"""Classical across-seed tests: means (t, TOST) of one value per run, variances (BF, Pitman-Morgan, bootstrap)
of the per-task across-seed variance pooled over tasks.

Pure functions. They complement the mixed model (``variance_model``) and test the same thing: the
variance unit is each task's variance across seeds, pooled over the scope's tasks (a seed's shift shared
by the tasks and its task-specific effects both count), so they are the fallback when a model fit fails;
with one task (the per-task tables) it is that task's variance across seeds. Means use one mean over the
scope's tasks per run. Also here: the eval-sampling noise of J and the JSON conversion shared by the
analysis modules.
"""

from __future__ import annotations

import math
import warnings
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats as st

# BF needs 3 seeds per arm to be defined (with 2, |x - median| is equal within an arm); with 3 per arm
# its F cannot exceed 4 < F(0.95; 1, 4) = 7.7, so it never rejects.
MIN_SEEDS_VAR = 3
Pairs = tuple[np.ndarray, np.ndarray]


def json_safe(obj: Any) -> Any:
    """Plain JSON types only; NaN/inf become None (stats.json is written with allow_nan=False)."""
    if isinstance(obj, Mapping):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, np.ndarray):
        return json_safe(obj.tolist())
    if isinstance(obj, list | tuple | set):
        return [json_safe(v) for v in obj]
    if isinstance(obj, bool | np.bool_):
        return bool(obj)
    if isinstance(obj, int | np.integer):
        return int(obj)
    if isinstance(obj, float | np.floating):
        return float(obj) if math.isfinite(obj) else None
    if obj is None or isinstance(obj, str):
        return obj
    if obj is pd.NA or obj is pd.NaT:
        return None
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def num(x: Any) -> float | None:
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def skip(reason: str) -> dict:
    return {"status": "skipped", "reason": reason}


def rng_for(seed: int, key: str) -> np.random.Generator:
    """A stream per (seed, key): results for one scope do not shift when another scope is added."""
    return np.random.default_rng([int(seed), zlib.crc32(key.encode())])


# ----------------------------------------------------------------------------- evaluation noise


def sampling_noise_var(correct: Sequence[float] | np.ndarray, n_samples: int) -> float:
    """Variance of J = mean_i c_i/n that comes from drawing n samples per problem (problems held fixed).

    Var(J | p) = sum_i p_i(1-p_i)/n / P^2, and p^(1-p^)/(n-1) is unbiased for p(1-p)/n. With n = 1 that is
    not estimable and J(1-J)/P, an upper bound, is returned. Shared with the aggregate step.
    """
    p = np.asarray(correct, dtype=float) / n_samples
    n_problems = p.size
    if n_problems == 0:
        return float("nan")
    if n_samples < 2:
        j = p.mean()
        return float(j * (1 - j) / n_problems)
    return float(np.sum(p * (1 - p)) / (n_samples - 1) / n_problems**2)


def eval_noise(rows: pd.DataFrame) -> tuple[pd.Series, str]:
    """Per-row eval-noise variance and where it came from ('column', 'upper_bound_from_J', 'none')."""
    bound = pd.Series(np.nan, index=rows.index)
    if {"J", "n_samples", "n_problems"} <= set(rows.columns):
        j = rows["J"].astype(float)
        bound = j * (1 - j) / (rows["n_samples"].astype(float) * rows["n_problems"].astype(float))
    if "eval_noise_var" in rows.columns:
        col = pd.to_numeric(rows["eval_noise_var"], errors="coerce")
        if col.notna().all():
            return col.astype(float), "column"
        filled = col.fillna(bound)
        if filled.notna().all():
            return filled.astype(float), "column+upper_bound_from_J"
    if bound.notna().all():
        return bound.astype(float), "upper_bound_from_J"
    return pd.Series(0.0, index=rows.index), "none"


# ----------------------------------------------------------------------------- single-arm summaries


def describe(x: np.ndarray, alpha: float) -> dict:
    """Mean with a t-based (1-alpha) CI across seeds; spread is the raw sample variance (ddof=1)."""
    x = np.asarray(x, dtype=float)
    n = x.size
    out: dict[str, Any] = {"n": n, "mean": x.mean() if n else None}
    if n < 2:
        return {**out, "sd": None, "var": None, "se": None, "ci_low": None, "ci_high": None}
    sd = x.std(ddof=1)
    se = sd / math.sqrt(n)
    lo, hi = st.t.interval(1 - alpha, n - 1, loc=x.mean(), scale=se) if se > 0 else (x.mean(), x.mean())
    return {**out, "sd": sd, "var": sd**2, "se": se, "ci_low": lo, "ci_high": hi}


def paired(x: np.ndarray, sx: np.ndarray, y: np.ndarray, sy: np.ndarray) -> Pairs | None:
    """Values (one per seed, or rows of seeds x tasks) of the seeds both arms have, in seed order (None if
    fewer than 2 are shared).

    Shared seeds share data order and init, so pairing removes their common part; a seed one arm lost
    (a diverged run) drops out of the pairs only.
    """
    common = sorted(set(sx.tolist()) & set(sy.tolist()))
    if len(common) < 2 or len(set(sx.tolist())) != len(sx) or len(set(sy.tolist())) != len(sy):
        return None
    ix = {s: i for i, s in enumerate(sx.tolist())}
    iy = {s: i for i, s in enumerate(sy.tolist())}
    return x[[ix[s] for s in common]], y[[iy[s] for s in common]]


def compare_means(x: np.ndarray, y: np.ndarray, pairs: Pairs | None, alpha: float, margin: float) -> dict:
    """Difference mean(x) - mean(y): t-test of equality and TOST equivalence within +-margin.

    Paired by seed when ``pairs`` is given (shared seeds share data order and init), else Welch.
    TOST p = max of the two one-sided p-values; equivalent iff it is < alpha (i.e. the 1-2alpha CI
    lies inside +-margin).
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        if pairs is not None and len(pairs[0]) >= 2:
            d = pairs[0] - pairs[1]
            design = "paired"
            res = st.ttest_1samp(d, 0.0)
            p_lo = st.ttest_1samp(d, -margin, alternative="greater").pvalue
            p_hi = st.ttest_1samp(d, margin, alternative="less").pvalue
            se = d.std(ddof=1) / math.sqrt(d.size)
        elif len(x) >= 2 and len(y) >= 2:
            design = "welch"
            res = st.ttest_ind(x, y, equal_var=False)
            p_lo = st.ttest_ind(x, y - margin, equal_var=False, alternative="greater").pvalue
            p_hi = st.ttest_ind(x, y + margin, equal_var=False, alternative="less").pvalue
            se = math.sqrt(x.var(ddof=1) / x.size + y.var(ddof=1) / y.size)
        else:
            return skip(f"needs >= 2 seeds per arm (have {len(x)} and {len(y)})")
        ci = res.confidence_interval(1 - alpha)
        ci_tost = res.confidence_interval(1 - 2 * alpha)
    p_tost = max(p_lo, p_hi) if not (np.isnan(p_lo) or np.isnan(p_hi)) else float("nan")
    return {
        "status": "ok",
        "design": design,
        "diff": float(np.mean(x) - np.mean(y)),
        "se": se,
        "df": res.df,
        "t": res.statistic,
        "p": res.pvalue,
        "ci_low": ci.low,
        "ci_high": ci.high,
        "tost": {
            "margin": margin,
            "p_lower": p_lo,
            "p_upper": p_hi,
            "p": p_tost,
            "ci_low": ci_tost.low,
            "ci_high": ci_tost.high,
            "equivalent": bool(np.isfinite(p_tost) and p_tost < alpha),
        },
    }


def as_matrix(x: np.ndarray) -> np.ndarray:
    """Seeds x tasks (one value per seed becomes one task)."""
    x = np.asarray(x, dtype=float)
    return x[:, None] if x.ndim == 1 else x


def pooled_var(x: np.ndarray) -> np.ndarray:
    """Each task's variance across seeds (ddof 1), averaged over tasks; seeds on axis -2 (batched)."""
    return np.var(x, ddof=1, axis=-2).mean(axis=-1)


def brown_forsythe(x: np.ndarray, y: np.ndarray) -> dict:
    """Brown-Forsythe (Levene centred at the median) on each seed's mean absolute deviation from the task
    medians: robust to the heavy tails that seed-to-seed dJ can have, one value per seed (the unit of
    replication) and larger for either a shared or a task-specific seed effect. One task: classical BF."""
    x, y = as_matrix(x), as_matrix(y)
    if min(len(x), len(y)) < MIN_SEEDS_VAR:
        return skip(f"needs >= {MIN_SEEDS_VAR} seeds per arm (have {len(x)} and {len(y)})")
    zx, zy = (np.abs(m - np.median(m, axis=0)).mean(axis=1) for m in (x, y))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        res = st.f_oneway(zx, zy)
    if not np.isfinite(res.pvalue):
        return skip("no spread in either arm")
    return {"status": "ok", "statistic": float(res.statistic), "p": float(res.pvalue), "n_tasks": x.shape[1]}


def pitman_morgan(x: np.ndarray, y: np.ndarray) -> dict:
    """Variance equality for paired samples: Var x = Var y iff corr(x + y, x - y) = 0.

    r > 0 means x is the more variable; the Pearson test of r is the Pitman-Morgan t-test (df n-2).
    Defined for one value per run: with several tasks it is skipped (the pooled unit has no such test).
    """
    x, y = as_matrix(x), as_matrix(y)
    if x.shape[1] > 1:
        return skip("defined for one task (one value per run)")
    x, y = x[:, 0], y[:, 0]
    if len(x) < 3:
        return skip("needs >= 3 paired seeds")
    s, d = x + y, x - y
    tiny = 1e-12 * max(float(np.abs(x).max()), float(np.abs(y).max()), 1e-300)
    if np.ptp(s) <= tiny or np.ptp(d) <= tiny:
        return skip("sum or difference is constant")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", st.NearConstantInputWarning)
        res = st.pearsonr(s, d)
    return {"status": "ok", "r": res.statistic, "p": res.pvalue, "n_pairs": len(x)}


def bootstrap_log_var_ratio(
    x: np.ndarray, y: np.ndarray, paired: bool, n_resamples: int, alpha: float, rng: np.random.Generator
) -> dict:
    """(1-alpha) CI of log(pooled Var x / pooled Var y) resampling seeds (whole rows: a seed keeps its
    tasks; jointly when paired): BCa, else percentile.

    BCa covers better than percentile at ~10 seeds; it breaks when resamples hit zero variance (tiny
    n), hence the fallback.
    """
    x, y = as_matrix(x), as_matrix(y)
    if min(len(x), len(y)) < MIN_SEEDS_VAR:
        return skip(f"needs >= {MIN_SEEDS_VAR} seeds per arm")
    with np.errstate(divide="ignore", invalid="ignore"):
        point = float(np.log(pooled_var(x) / pooled_var(y)))
    if not math.isfinite(point):
        return skip("zero variance in an arm")

    def log_ratio(*idx: np.ndarray, axis: int = -1) -> np.ndarray:
        ix, iy = (idx[0], idx[0]) if paired else idx
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.log(pooled_var(x[ix]) / pooled_var(y[iy]))

    seeds = (np.arange(len(x)),) if paired else (np.arange(len(x)), np.arange(len(y)))
    for method in ("BCa", "percentile"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                res = st.bootstrap(
                    seeds,
                    log_ratio,
                    vectorized=True,
                    rng=rng,
                    n_resamples=n_resamples,
                    confidence_level=1 - alpha,
                    method=method,
                )
            except (ValueError, FloatingPointError):
                continue
        lo, hi = res.confidence_interval
        if np.isfinite(lo) and np.isfinite(hi):
            return {
                "status": "ok",
                "method": method,
                "paired": paired,
                "n_resamples": n_resamples,
                "log_ratio": point,
                "ci_low": lo,
                "ci_high": hi,
                "ratio": math.exp(point),
                "ratio_ci_low": math.exp(lo),
                "ratio_ci_high": math.exp(hi),
            }
    return skip("bootstrap interval not finite (resamples with zero variance)")


def compare_variances(
    x: np.ndarray,
    y: np.ndarray,
    noise_x: float,
    noise_y: float,
    pairs: Pairs | None,
    cfg: Mapping,
    rng: np.random.Generator,
) -> dict:
    """Pooled per-task variance across seeds, x vs y (seeds x tasks; 1-D = one task): raw and
    noise-corrected (``noise_*`` = mean eval-noise variance of one run x task), BF, Pitman-Morgan (one
    task), seed-bootstrap CI of the ratio."""
    x, y = as_matrix(x), as_matrix(y)
    vx = float(pooled_var(x)) if len(x) > 1 else None
    vy = float(pooled_var(y)) if len(y) > 1 else None
    cx = max(vx - noise_x, 0.0) if vx is not None else None
    cy = max(vy - noise_y, 0.0) if vy is not None else None
    return {
        "unit": f"per-task variance across seeds, pooled over {x.shape[1]} task(s)",
        "n_tasks": x.shape[1],
        "var": vx,
        "var_ref": vy,
        "noise_var": noise_x,
        "noise_var_ref": noise_y,
        "var_corrected": cx,
        "var_corrected_ref": cy,
        "ratio": vx / vy if vx is not None and vy else None,
        "ratio_corrected": cx / cy if cx is not None and cy else None,
        "brown_forsythe": brown_forsythe(x, y),
        "pitman_morgan": pitman_morgan(*pairs) if pairs is not None else skip("seeds not paired"),
        "bootstrap": bootstrap_log_var_ratio(
            *(pairs if pairs is not None else (x, y)),
            pairs is not None,
            int(cfg["bootstrap"]),
            float(cfg["alpha"]),
            rng,
        ),
    }
