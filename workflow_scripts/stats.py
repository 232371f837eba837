"""Statistics for H1-H3 over the tidy metrics table: ``analyze(metrics, cfg)`` -> stats.json content.

Pure functions (no file I/O). The unit of replication is the training seed: within a run, dJ and KL (k3)
are averaged over the tasks of one role ("task type": on_task / off_task), so each run gives one number
per task type, and the tests compare those numbers across seeds. ``by_task`` repeats the same tests on
single tasks; it is descriptive (no multiplicity correction). Every non-reference precision arm is compared
with the reference arm (the first precision). A mixed model over all (run, task) rows adds evidence that
uses every task at once; the verdicts rest on the per-task-type tests, whose calibration is tested.

| hypothesis | quantity (arm vs reference, across seeds) | tests | verdict |
| --- | --- | --- | --- |
| H1 on-task insensitive | mean and Var of on-task dJ | t (paired if same seeds, else Welch), TOST, BF | R1 |
| H2 off-task sensitive | Var of off-task dJ | BF; Pitman-Morgan; bootstrap CI; mixed-model LRT | R2 |
| H3 off-task KL drifts more | Var of off-task KL k3 (mean KL t-tests too) | as H2, on kl_k3 | R2 |

BF = Brown-Forsythe (Levene, median-centred); bootstrap = BCa CI of log(Var arm / Var ref), seeds resampled
(jointly when paired); LRT = likelihood ratio of per-precision vs pooled seed variance (evidence only).
- R1 supported: TOST p < alpha (mean dJ within +-tost_margin) and BF p >= alpha; contradicted: BF p < alpha,
  or t p < alpha while TOST p >= alpha; else inconclusive.
- R2 supported: BF p < alpha and Var arm > Var ref; contradicted: BF p < alpha and Var arm < Var ref, or the
  bootstrap CI of the ratio lies below variance_ratio_margin (default 2); else inconclusive.

With several non-reference arms the overall verdict is the per-arm verdict when all arms agree, else
inconclusive. BF decides H2/H3 because it is robust to an outlying seed and holds its level at 10 seeds
(the BCa bootstrap covers ~91% for a nominal 95% there), and ``power`` simulates exactly that decision.
Its limits, measured: with 3 seeds per arm BF cannot reject at all (F <= 4 < F crit 7.7); with 10 it
detects a 9x ratio ~65% of the time, a 4x ~35%. Verdicts use raw variances: eval noise, about equal in
both arms, only pulls the ratio towards 1; noise-corrected variances and ratios are reported.
Output keys: schema_version, config, reference, precisions, n, tasks, eval_noise_source, by_task_type,
by_task, power, mixed_model, verdicts, warnings (see ``analyze``).

Input columns: required ``run, precision, seed, task, role, dJ`` (base rows, precision null or run
'base', are ignored: dJ is already relative to base). Optional: ``eval_noise_var`` (variance of the run's J
from finite eval sampling; the base's sampling noise is shared by all seeds, so it does not enter the
across-seed variance), else ``J, n_samples, n_problems`` give the upper bound J(1-J)/(n_samples*n_problems);
``kl_k3`` (+ ``kl_k3_se``) for H3. Noise-corrected variance = max(raw variance - mean eval noise, 0).
"""

from __future__ import annotations

import math
import re
import warnings
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats as st

SCHEMA_VERSION = 1
ROLES = ("on_task", "off_task")
REQUIRED_COLUMNS = ("run", "precision", "seed", "task", "role", "dJ")
DEFAULTS: dict[str, Any] = {
    "alpha": 0.05,
    "tost_margin": 0.05,
    "bootstrap": 2000,
    "power_simulations": 200,
    "seed": 0,
    # Not in the config schema; callers may override them in ``cfg``.
    "variance_ratio_margin": 2.0,  # a ratio CI entirely below this contradicts H2/H3
    "power_ratios": [2.0, 4.0],
    "power_target": 0.8,
    "max_seeds": 128,
    "mixed_model": True,
}
# BF needs 3 seeds per arm to be defined (with 2, |x - median| is equal within an arm); note that with 3
# per arm its F cannot exceed 4 < F(0.95; 1, 4) = 7.7, so it never rejects: the power block shows this.
MIN_SEEDS_VAR = 3
Verdict = str  # 'supported' | 'contradicted' | 'inconclusive'


# ----------------------------------------------------------------------------- helpers

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


def _num(x: Any) -> float | None:
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _skip(reason: str) -> dict:
    return {"status": "skipped", "reason": reason}


def _rng(seed: int, key: str) -> np.random.Generator:
    """A stream per (seed, key): results for one scope do not shift when another scope is added."""
    return np.random.default_rng([int(seed), zlib.crc32(key.encode())])


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3g}"


def _sig(block: Mapping | None, key: str, alpha: float) -> bool:
    p = None if block is None else block.get(key)
    return p is not None and p < alpha


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


def _eval_noise(rows: pd.DataFrame) -> tuple[pd.Series, str]:
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


# ----------------------------------------------------------------------------- two-arm comparisons

Pairs = tuple[np.ndarray, np.ndarray]


def _aligned(x: np.ndarray, sx: np.ndarray, y: np.ndarray, sy: np.ndarray) -> Pairs | None:
    """Values ordered by seed when both arms have exactly the same seeds (then pairing is valid)."""
    if len(sx) != len(sy) or set(sx.tolist()) != set(sy.tolist()) or len(set(sx.tolist())) != len(sx):
        return None
    return x[np.argsort(sx)], y[np.argsort(sy)]


def compare_means(x: np.ndarray, y: np.ndarray, pairs: Pairs | None,
                  alpha: float, margin: float) -> dict:
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
            return _skip(f"needs >= 2 seeds per arm (have {len(x)} and {len(y)})")
        ci = res.confidence_interval(1 - alpha)
        ci_tost = res.confidence_interval(1 - 2 * alpha)
    p_tost = max(p_lo, p_hi) if not (np.isnan(p_lo) or np.isnan(p_hi)) else float("nan")
    return {
        "status": "ok", "design": design, "diff": float(np.mean(x) - np.mean(y)), "se": se, "df": res.df,
        "t": res.statistic, "p": res.pvalue, "ci_low": ci.low, "ci_high": ci.high,
        "tost": {"margin": margin, "p_lower": p_lo, "p_upper": p_hi, "p": p_tost,
                 "ci_low": ci_tost.low, "ci_high": ci_tost.high,
                 "equivalent": bool(np.isfinite(p_tost) and p_tost < alpha)},
    }


def brown_forsythe(x: np.ndarray, y: np.ndarray) -> dict:
    """Levene's test centred at the median: robust to the heavy tails that seed-to-seed dJ can have."""
    if min(len(x), len(y)) < MIN_SEEDS_VAR:
        return _skip(f"needs >= {MIN_SEEDS_VAR} seeds per arm (have {len(x)} and {len(y)})")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        res = st.levene(x, y, center="median")
    if not np.isfinite(res.pvalue):
        return _skip("no spread in either arm")
    return {"status": "ok", "statistic": res.statistic, "p": res.pvalue}


def pitman_morgan(x: np.ndarray, y: np.ndarray) -> dict:
    """Variance equality for paired samples: Var x = Var y iff corr(x + y, x - y) = 0.

    r > 0 means x is the more variable; the Pearson test of r is the Pitman-Morgan t-test (df n-2).
    """
    if len(x) < 3:
        return _skip("needs >= 3 paired seeds")
    s, d = x + y, x - y
    tiny = 1e-12 * max(float(np.abs(x).max()), float(np.abs(y).max()), 1e-300)
    if np.ptp(s) <= tiny or np.ptp(d) <= tiny:
        return _skip("sum or difference is constant")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", st.NearConstantInputWarning)
        res = st.pearsonr(s, d)
    return {"status": "ok", "r": res.statistic, "p": res.pvalue, "n_pairs": len(x)}


def _log_var_ratio(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log(np.var(x, ddof=1, axis=axis) / np.var(y, ddof=1, axis=axis))


def bootstrap_log_var_ratio(x: np.ndarray, y: np.ndarray, paired: bool, n_resamples: int, alpha: float,
                            rng: np.random.Generator) -> dict:
    """(1-alpha) CI of log(Var x / Var y) resampling seeds (jointly when paired): BCa, else percentile.

    BCa covers better than percentile at ~10 seeds; it breaks when resamples hit zero variance (tiny
    n), hence the fallback.
    """
    if min(len(x), len(y)) < MIN_SEEDS_VAR:
        return _skip(f"needs >= {MIN_SEEDS_VAR} seeds per arm")
    point = float(_log_var_ratio(x, y))
    if not math.isfinite(point):
        return _skip("zero variance in an arm")
    for method in ("BCa", "percentile"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                res = st.bootstrap((x, y), _log_var_ratio, paired=paired, vectorized=True, rng=rng,
                                   n_resamples=n_resamples, confidence_level=1 - alpha, method=method)
            except (ValueError, FloatingPointError):
                continue
        lo, hi = res.confidence_interval
        if np.isfinite(lo) and np.isfinite(hi):
            return {"status": "ok", "method": method, "paired": paired, "n_resamples": n_resamples,
                    "log_ratio": point, "ci_low": lo, "ci_high": hi,
                    "ratio": math.exp(point), "ratio_ci_low": math.exp(lo), "ratio_ci_high": math.exp(hi)}
    return _skip("bootstrap interval not finite (resamples with zero variance)")


def compare_variances(x: np.ndarray, y: np.ndarray, noise_x: float, noise_y: float,
                      pairs: Pairs | None, cfg: Mapping, rng: np.random.Generator) -> dict:
    """Var x vs Var y across seeds: raw and noise-corrected variances, BF, Pitman-Morgan, bootstrap CI."""
    vx = float(np.var(x, ddof=1)) if len(x) > 1 else None
    vy = float(np.var(y, ddof=1)) if len(y) > 1 else None
    cx = max(vx - noise_x, 0.0) if vx is not None else None
    cy = max(vy - noise_y, 0.0) if vy is not None else None
    return {
        "var": vx, "var_ref": vy, "noise_var": noise_x, "noise_var_ref": noise_y,
        "var_corrected": cx, "var_corrected_ref": cy,
        "ratio": vx / vy if vx is not None and vy else None,
        "ratio_corrected": cx / cy if cx is not None and cy else None,
        "brown_forsythe": brown_forsythe(x, y),
        "pitman_morgan": pitman_morgan(*pairs) if pairs is not None else _skip("seeds not paired"),
        "bootstrap": bootstrap_log_var_ratio(*(pairs if pairs is not None else (x, y)), pairs is not None,
                                             int(cfg["bootstrap"]), float(cfg["alpha"]), rng),
    }


# ----------------------------------------------------------------------------- power

def bf_pvalues(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Brown-Forsythe p-values for many simulated experiments at once (rows); equals scipy's levene."""
    zx = np.abs(x - np.median(x, axis=1, keepdims=True))
    zy = np.abs(y - np.median(y, axis=1, keepdims=True))
    n, m = x.shape[1], y.shape[1]
    mx, my = zx.mean(axis=1), zy.mean(axis=1)
    grand = (n * mx + m * my) / (n + m)
    between = n * (mx - grand) ** 2 + m * (my - grand) ** 2
    within = ((zx - mx[:, None]) ** 2).sum(axis=1) + ((zy - my[:, None]) ** 2).sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        f = between / (within / (n + m - 2))
    return st.f.sf(f, 1, n + m - 2)


def _power_curve(ratio: float, seed_var: float, noise_var: float, alpha: float, sims: int,
                 ns: Sequence[int], rng: np.random.Generator) -> dict[int, float]:
    """P(BF rejects and the arm is the more variable) for each n seeds per arm.

    dJ per seed ~ N(0, seed_var + noise) in the reference arm, N(0, ratio*seed_var + noise) in the other;
    the same normal draws serve every n (common random numbers) so the curve is smooth in n.
    """
    top = max(ns)
    zx, zy = rng.standard_normal((2, sims, top))
    sx, sy = math.sqrt(ratio * seed_var + noise_var), math.sqrt(seed_var + noise_var)
    out = {}
    for n in ns:
        x, y = zx[:, :n] * sx, zy[:, :n] * sy
        hit = (bf_pvalues(x, y) < alpha) & (x.var(axis=1) > y.var(axis=1))
        out[int(n)] = float(hit.mean())
    return out


def power_analysis(n_x: int, n_y: int, pooled_var: float, noise_var: float, cfg: Mapping,
                   rng: np.random.Generator) -> dict:
    """Power of the BF verdict with the current seeds, and seeds per arm needed for ``power_target``.

    The planted ratio applies to the training (noise-corrected) seed variance; eval noise is added to
    both arms, as it is in the data. If the corrected variance is 0 the raw one is used (noise and
    training variance then cannot be separated).
    """
    if min(n_x, n_y) < 2 or not pooled_var or pooled_var <= 0:
        return _skip("needs >= 2 seeds per arm and a non-zero variance")
    seed_var, basis = pooled_var - noise_var, "noise_corrected"
    if seed_var <= 0:
        seed_var, noise_var, basis = pooled_var, 0.0, "raw (variance not above eval noise)"
    alpha, sims, target = float(cfg["alpha"]), int(cfg["power_simulations"]), float(cfg["power_target"])
    grid = list(range(MIN_SEEDS_VAR, int(cfg["max_seeds"]) + 1))
    ratios = {}
    for ratio in cfg["power_ratios"]:
        curve = _power_curve(float(ratio), seed_var, noise_var, alpha, sims, grid, rng)
        needed = next((n for n in grid if curve[n] >= target), None)
        if min(n_x, n_y) >= MIN_SEEDS_VAR:
            # unequal arms: simulate the actual sizes
            zx, zy = rng.standard_normal((sims, n_x)), rng.standard_normal((sims, n_y))
            x = zx * math.sqrt(ratio * seed_var + noise_var)
            y = zy * math.sqrt(seed_var + noise_var)
            now = float(((bf_pvalues(x, y) < alpha) & (x.var(axis=1) > y.var(axis=1))).mean())
        else:
            now = 0.0
        ratios[f"{float(ratio):g}"] = {"power_now": now, "seeds_needed": needed,
                                       "power_at_needed": curve[needed] if needed else None}
    return {"status": "ok", "n_seeds": [n_x, n_y], "seed_var": seed_var, "noise_var": noise_var,
            "basis": basis, "simulations": sims, "target": target, "max_seeds": int(cfg["max_seeds"]),
            "ratios": ratios}


# ----------------------------------------------------------------------------- per-scope statistics

def _units(rows: pd.DataFrame, tasks: Sequence[str]) -> pd.DataFrame:
    """One row per run: mean over ``tasks`` of dJ and KL; noise of a mean of T tasks = sum(noise)/T^2."""
    sub = rows[rows["task"].isin(tasks)]
    t = len(tasks)
    g = sub.groupby("run", sort=True)
    return pd.DataFrame({
        "precision": g["precision"].first(), "seed": g["seed"].first(),
        "y": g["dJ"].mean(), "noise": g["noise"].sum() / t**2,
        "kl": g["kl"].sum(min_count=t) / t, "kl_noise": g["kl_var"].sum() / t**2,
    })


def scope_stats(units: pd.DataFrame, arms: Sequence[str], cfg: Mapping, key: str) -> dict:
    """Per-arm summaries and arm-vs-reference comparisons of dJ and KL for one scope (task type or task)."""
    alpha, margin = float(cfg["alpha"]), float(cfg["tost_margin"])
    data = {a: units[units["precision"] == a].sort_values("seed") for a in arms}
    has_kl = bool(units["kl"].notna().all()) and len(units) > 0
    arm_blocks = {}
    for a, d in data.items():
        block = {"n_seeds": len(d), "seeds": d["seed"].tolist(), "dJ": describe(d["y"].to_numpy(), alpha),
                 "eval_noise_var": d["noise"].mean() if len(d) else None}
        v = block["dJ"]["var"]
        block["dJ"]["var_corrected"] = max(v - block["eval_noise_var"], 0.0) if v is not None else None
        if has_kl:
            kl = block["kl_k3"] = describe(d["kl"].to_numpy(), alpha)
            kl["noise_var"] = d["kl_noise"].mean() if len(d) else None
            kl["var_corrected"] = max(kl["var"] - kl["noise_var"], 0.0) if kl["var"] is not None else None
        arm_blocks[a] = block
    ref = arms[0]
    comparisons = {}
    for i, a in enumerate(arms[1:], 1):
        x, y = data[a], data[ref]
        sx, sy = x["seed"].to_numpy(), y["seed"].to_numpy()
        pairs = _aligned(x["y"].to_numpy(), sx, y["y"].to_numpy(), sy)
        rng = _rng(cfg["seed"], f"{key}/{i}")
        comp: dict[str, Any] = {
            "paired": pairs is not None, "n_seeds": [len(x), len(y)],
            "dJ_mean": compare_means(x["y"].to_numpy(), y["y"].to_numpy(), pairs, alpha, margin),
            "dJ_var": compare_variances(x["y"].to_numpy(), y["y"].to_numpy(), float(x["noise"].mean()),
                                        float(y["noise"].mean()), pairs, cfg, rng),
        }
        if has_kl:
            kpairs = _aligned(x["kl"].to_numpy(), sx, y["kl"].to_numpy(), sy)
            comp["kl_mean"] = compare_means(x["kl"].to_numpy(), y["kl"].to_numpy(), kpairs, alpha, margin)
            comp["kl_var"] = compare_variances(x["kl"].to_numpy(), y["kl"].to_numpy(),
                                               float(x["kl_noise"].mean()), float(y["kl_noise"].mean()),
                                               kpairs, cfg, rng)
        else:
            comp["kl_mean"] = comp["kl_var"] = _skip("KL (kl_k3) missing for some runs or tasks")
        comparisons[a] = comp
    return {"reference": ref, "arms": arm_blocks, "comparisons": comparisons}


def _pooled(x: np.ndarray, y: np.ndarray) -> float | None:
    if min(len(x), len(y)) < 2:
        return None
    return float(((len(x) - 1) * x.var(ddof=1) + (len(y) - 1) * y.var(ddof=1)) / (len(x) + len(y) - 2))


# ----------------------------------------------------------------------------- mixed model

def _fit_mixed(y: np.ndarray, exog: pd.DataFrame, groups: np.ndarray, vc: dict[str, np.ndarray],
               reml: bool) -> tuple[Any, list[str], str | None]:
    """Fit MixedLM with one random shift per group for each variance component (``vc``: name -> 0/1 row
    indicator), capturing warnings instead of raising; returns (result or None, messages, error).

    The VCSpec is built directly: from_formula evaluates a formula per group and component, which cost
    more than the fits themselves.
    """
    from statsmodels.regression.mixed_linear_model import MixedLM, VCSpec

    labels = sorted(set(groups))  # MixedLM orders groups this way
    index = {g: np.flatnonzero(groups == g) for g in labels}
    mats = [[col[index[g]][:, None] for g in labels] for col in vc.values()]
    spec = VCSpec(list(vc), [[[name]] * len(labels) for name in vc], mats)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            res = MixedLM(y, exog, groups, exog_vc=spec).fit(reml=reml)
        except (ValueError, np.linalg.LinAlgError, FloatingPointError, ZeroDivisionError) as err:
            return None, [], f"{type(err).__name__}: {err}"
    msgs = sorted({re.sub(r"\s*[,(]?\s*\|grad\|.*$", "", str(w.message).splitlines()[0]) for w in caught
                   if not issubclass(w.category, DeprecationWarning | FutureWarning)
                   and not str(w.message).startswith("Retrying")})
    if not res.converged:
        msgs.append("optimiser did not converge")
    if not np.isfinite(res.llf):
        return None, msgs, "non-finite log-likelihood"
    return res, msgs, None


def mixed_model(rows: pd.DataFrame, arms: Sequence[str]) -> dict:
    """dJ over all (run, task) rows: seed variance per (precision, task type); LRT against a pooled one.

    Fixed: one mean per task plus, for each non-reference arm and task type, the arm's shift (so the
    model is dJ ~ precision * task_type with tasks as fixed effects). Random: each run (group) gets one
    shift per task type whose variance is specific to its precision; the residual holds seed x task and
    eval noise. Tasks are fixed, not a variance component: a random task effect is crossed with runs and
    needs a single all-data group, whose fit cost grows cubically (600 rows took 5-16 s per fit on the
    dev machine); per-run groups keep it linear. For each task type an ML likelihood-ratio test compares
    with one seed variance pooled over precisions (chi2, df = arms - 1). dJ is divided by its sd before
    fitting (optimiser scale) and estimates are scaled back; the LRT is unaffected.
    """
    if len(arms) < 2:
        return _skip("needs two precision arms")
    seeds = rows.groupby("precision")["run"].nunique()
    if any(seeds.get(a, 0) < 2 for a in arms):
        return _skip("needs >= 2 seeds per arm")
    scale = float(rows["dJ"].std(ddof=1))
    if not scale > 0:
        return _skip("no variation in dJ")
    code = {a: f"a{i:02d}" for i, a in enumerate(arms)}
    types = [r for r in ROLES if r in set(rows["role"])] + sorted(set(rows["role"]) - set(ROLES))
    data = pd.DataFrame({"y": rows["dJ"].to_numpy() / scale, "arm": rows["precision"].map(code).to_numpy(),
                         "run": rows["run"].to_numpy(), "task": rows["task"].to_numpy(),
                         "ttype": rows["role"].map({t: f"t{j}" for j, t in enumerate(types)}).to_numpy()})
    shifts, full = {}, {}
    for j, t in enumerate(types):
        in_type = data["ttype"] == f"t{j}"
        data[f"i_t{j}"] = in_type.astype(float)
        for i, a in enumerate(arms):
            col = f"i_{code[a]}_t{j}"
            data[col] = ((data["arm"] == code[a]) & in_type).astype(float)
            full[f"seed|{a}|{t}"] = data[col].to_numpy()
            if i:
                shifts[col] = (a, t)
    exog = pd.concat([pd.get_dummies(data["task"], prefix="task", dtype=float), data[list(shifts)]], axis=1)
    y, groups = data["y"].to_numpy(), data["run"].to_numpy()
    out: dict[str, Any] = {"formula": "dJ ~ 0 + task + precision:task_type (tasks fixed)",
                           "random": "per run: one shift per task type, variance by (precision, task_type)",
                           "n_obs": len(data), "n_groups": data["run"].nunique(),
                           "fit": "REML for estimates, ML for LRTs"}
    reml, msgs, err = _fit_mixed(y, exog, groups, full, reml=True)
    if reml is None:
        return {**out, "status": "failed", "messages": [*msgs, err]}
    vcomp = dict(zip(reml.model.exog_vc.names, np.asarray(reml.vcomp) * scale**2, strict=True))
    effect: dict[str, dict[str, Any]] = {a: {} for a in arms[1:]}
    for col, (a, t) in shifts.items():
        effect[a][t] = {"estimate": reml.fe_params[col] * scale, "se": reml.bse_fe[col] * scale,
                        "p": reml.pvalues[col]}
    seed_var = {a: {t: vcomp.get(f"seed|{a}|{t}") for t in types} for a in arms}
    out.update(precision_effect=effect, seed_var=seed_var, residual_var=float(reml.scale) * scale**2,
               messages=list(msgs))
    ml, ml_msgs, ml_err = _fit_mixed(y, exog, groups, full, reml=False)
    lrt: dict[str, Any] = {}
    for j, t in enumerate(types):
        if ml is None:
            lrt[t] = {"status": "failed", "messages": [*ml_msgs, ml_err]}
            continue
        pooled = {k: v for k, v in full.items() if not (k.startswith("seed|") and k.endswith(f"|{t}"))}
        pooled[f"seed|pooled|{t}"] = data[f"i_t{j}"].to_numpy()
        null, null_msgs, null_err = _fit_mixed(y, exog, groups, pooled, reml=False)
        if null is None:
            lrt[t] = {"status": "failed", "messages": [*null_msgs, null_err]}
            continue
        stat = max(2.0 * (ml.llf - null.llf), 0.0)
        df = len(arms) - 1
        all_msgs = sorted(set(ml_msgs) | set(null_msgs))
        lrt[t] = {"status": "warning" if all_msgs else "ok", "statistic": stat, "df": df,
                  "p": float(st.chi2.sf(stat, df)), "messages": all_msgs,
                  "null": "one seed variance pooled over precisions for this task type"}
    out["lrt"] = lrt
    warned = bool(msgs) or any(v.get("status") != "ok" for v in lrt.values())
    out["status"] = "warning" if warned else "ok"
    return out


# ----------------------------------------------------------------------------- verdicts

def verdict_h1(comp: Mapping, alpha: float) -> tuple[Verdict, str]:
    """On-task. Supported: TOST equivalence of mean dJ (p < alpha) and BF does not reject equal variance.
    Contradicted: BF rejects, or the t-test rejects equal means while TOST fails. Else inconclusive."""
    mean, var = comp["dJ_mean"], comp["dJ_var"]
    bf = var.get("brown_forsythe", {})
    if mean.get("status") != "ok":
        return "inconclusive", f"mean test skipped: {mean.get('reason')}"
    equivalent = mean["tost"]["equivalent"]
    if _sig(bf, "p", alpha):
        return "contradicted", f"on-task Var[dJ] differs (BF p={bf['p']:.3g}, ratio={_fmt(var.get('ratio'))})"
    if _sig(mean, "p", alpha) and not equivalent:
        return "contradicted", f"on-task mean dJ differs by {mean['diff']:.3g} (p={mean['p']:.3g})"
    if equivalent and bf.get("status") == "ok":
        tost = mean["tost"]
        return "supported", f"mean within +-{tost['margin']:g} (TOST p={tost['p']:.3g}); BF p={bf['p']:.3g}"
    if bf.get("status") != "ok":
        return "inconclusive", f"BF skipped: {bf.get('reason')}"
    return "inconclusive", f"TOST p={_fmt(_num(mean['tost']['p']))} >= alpha: equivalence not shown"


def verdict_variance(var: Mapping, alpha: float, margin: float, what: str) -> tuple[Verdict, str]:
    """Supported: BF p < alpha with the arm more variable than the reference (ratio > 1). Contradicted:
    BF p < alpha with ratio < 1, or the bootstrap CI of the ratio lies entirely below
    variance_ratio_margin (any increase is smaller than that). Else inconclusive."""
    if var.get("status") == "skipped":
        return "inconclusive", f"{what}: {var.get('reason')}"
    bf, boot = var.get("brown_forsythe", {}), var.get("bootstrap", {})
    ratio = var.get("ratio")
    if bf.get("status") != "ok":
        return "inconclusive", f"{what}: BF skipped ({bf.get('reason')})"
    if _sig(bf, "p", alpha) and ratio is not None:
        if ratio > 1:
            return "supported", f"{what} variance ratio {ratio:.3g} > 1, BF p={bf['p']:.3g}"
        return "contradicted", f"{what} variance ratio {ratio:.3g} < 1, BF p={bf['p']:.3g}"
    if boot.get("status") == "ok" and boot["ratio_ci_high"] < margin:
        ci = f"[{boot['ratio_ci_low']:.3g}, {boot['ratio_ci_high']:.3g}]"
        return "contradicted", f"{what} variance ratio CI {ci} lies below {margin:g}"
    return "inconclusive", f"{what}: BF p={bf['p']:.3g} >= alpha, ratio={_fmt(ratio)}"


def _overall(per_arm: Mapping[str, Mapping]) -> tuple[Verdict, str]:
    verdicts = {v["verdict"] for v in per_arm.values()}
    if not per_arm:
        return "inconclusive", "no non-reference arm"
    if len(verdicts) == 1:
        only = next(iter(per_arm.values()))
        return only["verdict"], only["reason"] if len(per_arm) == 1 else f"all arms: {only['verdict']}"
    return "inconclusive", "arms disagree: " + ", ".join(f"{a}={v['verdict']}" for a, v in per_arm.items())


RULES = {
    "H1": verdict_h1.__doc__,
    "H2": "Off-task dJ. " + str(verdict_variance.__doc__),
    "H3": "Off-task KL k3. " + str(verdict_variance.__doc__),
}


def verdicts(by_type: Mapping[str, Mapping], arms: Sequence[str], cfg: Mapping) -> dict:
    alpha, margin = float(cfg["alpha"]), float(cfg["variance_ratio_margin"])
    on, off = by_type.get("on_task"), by_type.get("off_task")
    out = {}
    for h in ("H1", "H2", "H3"):
        scope = on if h == "H1" else off
        per_arm = {}
        for a in arms[1:]:
            if scope is None:
                v, why = "inconclusive", f"no {'on' if h == 'H1' else 'off'}-task tasks"
            elif h == "H1":
                v, why = verdict_h1(scope["comparisons"][a], alpha)
            elif h == "H2":
                v, why = verdict_variance(scope["comparisons"][a]["dJ_var"], alpha, margin, "off-task dJ")
            else:
                v, why = verdict_variance(scope["comparisons"][a]["kl_var"], alpha, margin, "off-task KL")
            per_arm[a] = {"verdict": v, "reason": why}
        v, why = _overall(per_arm)
        out[h] = {"verdict": v, "reason": why, "by_arm": per_arm, "rule": " ".join(RULES[h].split())}
    return out


# ----------------------------------------------------------------------------- entry point

def _arm_order(rows: pd.DataFrame, precisions: Sequence[str] | Mapping[str, Any] | None,
               warn: list[str]) -> list[str]:
    present = list(dict.fromkeys(rows["precision"].tolist()))
    if not precisions:
        return present
    order = [p for p in precisions if p in present]
    missing = [p for p in precisions if p not in present]
    extra = [p for p in present if p not in precisions]
    if missing:
        warn.append(f"configured precision(s) without runs: {missing}")
    if extra:
        warn.append(f"precision(s) not in config appended: {extra}")
    return order + extra


def analyze(metrics: pd.DataFrame, cfg: Mapping | None = None, *,
            precisions: Sequence[str] | Mapping[str, Any] | None = None) -> dict:
    """Statistics for H1-H3 (the content of analysis/stats.json; JSON-safe, no NaN).

    ``cfg`` is config ``analysis`` (alpha, tost_margin, bootstrap, power_simulations, seed; see DEFAULTS
    for optional extras). The reference arm is the first of ``precisions`` (names, or the config's
    precisions mapping; else ``cfg['precisions']``), else the first precision in the table.
    Degenerate data (1 seed, constant dJ, no KL) gives 'skipped' blocks and 'inconclusive' verdicts
    with reasons, never an exception; a malformed table (missing columns, duplicate run x task rows)
    raises ValueError.

    ``by_task_type[type]`` and ``by_task[task]`` hold ``arms[p]`` (n_seeds, seeds, dJ {n, mean, sd, var,
    se, ci_low, ci_high, var_corrected}, eval_noise_var, kl_k3) and, per non-reference arm,
    ``comparisons[p]`` (paired; dJ_mean / kl_mean: t-test with tost; dJ_var / kl_var: variances raw and
    corrected, ratio, brown_forsythe, pitman_morgan, bootstrap). ``power[type][p][dJ | kl_k3]``,
    ``mixed_model``, ``verdicts[H1 | H2 | H3]`` = {verdict, reason, rule, by_arm}. A block that cannot be
    computed is {status: 'skipped', reason}.
    """
    cfg = {**DEFAULTS, **dict(cfg or {})}
    warn: list[str] = []
    missing = [c for c in REQUIRED_COLUMNS if c not in metrics.columns]
    if missing:
        raise ValueError(f"metrics table lacks column(s) {missing}")
    if metrics.duplicated(["run", "task"]).any():
        dup = metrics.loc[metrics.duplicated(["run", "task"]), ["run", "task"]].head(3).values.tolist()
        raise ValueError(f"metrics table has duplicate (run, task) rows, e.g. {dup}")
    base = metrics["precision"].isna() | (metrics["run"] == "base")
    rows = metrics.loc[~base].copy()
    rows["dJ"] = pd.to_numeric(rows["dJ"], errors="coerce")
    if rows["dJ"].isna().any():
        warn.append(f"dropped {int(rows['dJ'].isna().sum())} row(s) with missing dJ")
        rows = rows[rows["dJ"].notna()]
    rows["seed"] = pd.to_numeric(rows["seed"], errors="coerce")
    if rows["seed"].notna().all() and (rows["seed"] % 1 == 0).all():
        rows["seed"] = rows["seed"].astype(int)
    rows["precision"] = rows["precision"].astype(str)
    rows["noise"], noise_source = _eval_noise(rows)
    if noise_source != "column":
        warn.append(f"eval_noise_var incomplete: noise source is '{noise_source}'")
    if "kl_k3" in rows.columns:
        rows["kl"] = pd.to_numeric(rows["kl_k3"], errors="coerce")
        se = pd.to_numeric(rows["kl_k3_se"], errors="coerce") if "kl_k3_se" in rows.columns else 0.0
        rows["kl_var"] = (se**2).fillna(0.0) if isinstance(se, pd.Series) else 0.0
        if rows["kl"].isna().any():
            warn.append("kl_k3 missing for some rows: KL tests skipped where it is")
    else:
        rows["kl"], rows["kl_var"] = np.nan, 0.0
        warn.append("no kl_k3 column: H3 not tested")
    arms = _arm_order(rows, precisions or cfg.get("precisions"), warn)
    if len(arms) < 2:
        warn.append(f"only {len(arms)} precision arm(s): nothing to compare")
    runs = rows["run"].unique()
    role_of = rows.groupby("task")["role"].agg(lambda r: r.iloc[0])
    if (rows.groupby("task")["role"].nunique() > 1).any():
        warn.append("a task has several roles; using its first")
    rows["role"] = rows["task"].map(role_of)
    complete = rows.groupby("task")["run"].nunique() == len(runs)
    dropped = sorted(complete.index[~complete])
    if dropped:
        warn.append(f"task(s) missing for some runs, left out of task-type averages: {dropped}")
    types = [r for r in ROLES if r in set(role_of)] + sorted(set(role_of) - set(ROLES))
    tasks_by_type = {t: sorted(k for k in role_of.index[role_of == t] if complete[k]) for t in types}

    by_type, power = {}, {}
    for t, tasks in tasks_by_type.items():
        if not tasks:
            warn.append(f"no task of type {t} is complete across runs")
            continue
        units = _units(rows, tasks)
        by_type[t] = {"tasks": tasks, "n_tasks": len(tasks), **scope_stats(units, arms, cfg, f"type/{t}")}
        power[t] = {}
        for i, a in enumerate(arms[1:], 1):
            x = units.loc[units["precision"] == a]
            y = units.loc[units["precision"] == arms[0]]
            blocks = {"dJ": ("y", "noise")}
            if units["kl"].notna().all():
                blocks["kl_k3"] = ("kl", "kl_noise")
            power[t][a] = {}
            for name, (col, ncol) in blocks.items():
                xs, ys = x[col].to_numpy(), y[col].to_numpy()
                noise = float(pd.concat([x[ncol], y[ncol]]).mean()) if len(x) + len(y) else 0.0
                power[t][a][name] = power_analysis(len(xs), len(ys), _pooled(xs, ys) or 0.0, noise, cfg,
                                                   _rng(cfg["seed"], f"power/{t}/{i}/{name}"))
    by_task = {}
    for task in sorted(role_of.index):
        units = _units(rows, [task])
        by_task[task] = {"role": role_of[task], **scope_stats(units, arms, cfg, f"task/{task}")}

    used = [k for tasks in tasks_by_type.values() for k in tasks]
    mm = mixed_model(rows[rows["task"].isin(used)], arms) if cfg["mixed_model"] else _skip("disabled in cfg")
    if mm.get("status") in ("warning", "failed"):
        msgs = list(mm.get("messages", []))
        msgs += [m for v in mm.get("lrt", {}).values() for m in v.get("messages") or []]
        msgs = sorted(set(filter(None, msgs)))
        warn.append(f"mixed model {mm['status']}: {'; '.join(msgs[:3])}" + (" ..." if len(msgs) > 3 else ""))

    for t, per_arm in power.items():
        for a, blocks in per_arm.items():
            p = blocks.get("dJ", {})
            if p.get("status") == "ok" and p["ratios"].get("2", {}).get("power_now", 1) < cfg["power_target"]:
                r2 = p["ratios"]["2"]
                need = r2["seeds_needed"] or f"> {cfg['max_seeds']}"
                warn.append(f"{t} {a} vs {arms[0]}: {min(p['n_seeds'])} seeds per arm give power "
                            f"{r2['power_now']:.2f} to detect a 2x variance ratio (need {need} for "
                            f"{cfg['power_target']:.0%})")
    for t, block in by_type.items():
        for a, comp in block["comparisons"].items():
            if not comp["paired"]:
                warn.append(f"{t}: seeds of {a} and {arms[0]} differ: unpaired (Welch) comparisons")

    n_seeds = rows.groupby("precision")["run"].nunique()
    out = {
        "schema_version": SCHEMA_VERSION,
        "config": {k: cfg[k] for k in DEFAULTS},
        "reference": arms[0] if arms else None,
        "precisions": arms,
        "n": {"runs": len(runs), "seeds": {a: int(n_seeds.get(a, 0)) for a in arms},
              "tasks": {t: len(v) for t, v in tasks_by_type.items()}, "rows": len(rows)},
        "tasks": tasks_by_type,
        "eval_noise_source": noise_source,
        "by_task_type": by_type,
        "by_task": by_task,
        "power": power,
        "mixed_model": mm,
        "verdicts": verdicts(by_type, arms, cfg),
        "warnings": warn,
    }
    return json_safe(out)
