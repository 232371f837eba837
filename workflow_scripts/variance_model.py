"""The mixed model of seed variance: REML per arm with known eval noise, profile CIs, the equal-variance test.

For one precision arm and one task role, S seeds x T tasks (tasks complete across the arm's runs):

    y[s, t] = mu[t] + u[s] + e[s, t] + eps[s, t]
    u ~ N(0, sigma2)    seed effect: the training-seed variance the hypotheses are about
    e ~ N(0, tau2)      seed x task interaction (what one seed does to one task beyond its shift)
    eps ~ N(0, v[t])    eval sampling noise of J, KNOWN (from the per-problem counts), not estimated

Tasks are fixed effects (mu); sigma2 and tau2 are specific to the arm and role, so every precision
has its own seed variance per role. The arms are fitted separately and combined only through the
likelihood, so the model with a common seed variance (the null of the equal-variance test) is the
sum of two per-arm likelihoods evaluated at the same sigma2.

Why not statsmodels MixedLM: it has one residual variance for every observation and no way to pass
known per-observation variances (no weights), so the eval noise (J(1-J)/(n N), 6x apart between
tasks in the default experiment) ends up pooled in the residual; and on a simulated table with a 9x
off-task ratio it returned an LRT of 0 with "failed to converge" / "Hessian not positive definite"
(measured on main a8ce4c0). This model has two parameters per arm; with v[t] per task (the rows of a
task differ only through J(1-J) across seeds, a second-order effect: the mean over seeds is used) it
is balanced, so the REML likelihood is exactly the Wishart likelihood of the seed-centred scatter
matrix W (df = S - 1):

    l(sigma2, tau2) = -1/2 [df log|Sigma| + tr(Sigma^-1 W)],  Sigma = diag(tau2 + v) + sigma2 11'

which Sherman-Morrison makes O(1) per (sigma2, tau2) once four sums per tau2 are known. It is
evaluated on a log grid (step ``STEP`` in log sigma2, 0 included) and refined by L-BFGS-B. Profile
likelihoods then give the CIs (sigma2 per arm; log ratio of two arms by shifting one profile along
the other), and the grid makes every fit deterministic: a fit "fails" only for stated reasons
(too few seeds, no variation, an estimate at the grid edge), which ``fit_arm`` returns instead of
raising.

The equal-seed-variance test is the one-sided likelihood ratio (arm more variable than the
reference). Its asymptotic law is chi-bar-squared (0.5 chi2_0 + 0.5 chi2_1); the p-value used is
from a seeded parametric bootstrap that draws W from the fitted null model (Wishart), because with
~10 seeds the asymptotics are rough. Positive correlation between paired seeds of two arms (shared
data order and init) is ignored, which makes the ratio's CI conservative, not liberal.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy import optimize
from scipy import stats as st

STEP = 0.05  # log-grid step of sigma2 for estimates and CIs (5% in the ratio; CI ends are interpolated)
COARSE_STEP = 0.1  # for bootstrap and power simulations (vectorised over replicates)
SPAN = (-5.0, 3.0)  # grid range in decades around the data's variance scale
TAU_STEP = 0.25  # the max over tau2 is refined by a parabola through the 3 best grid points
COARSE_SPAN = (-4.0, 3.0)  # simulations: the truth (or the null fit) sets the scale
TINY = 1e-300


@dataclass
class Grid:
    """sigma2 and tau2 grids (0 first, then log-spaced) in absolute units."""

    sig: np.ndarray
    tau: np.ndarray
    step: float

    @classmethod
    def around(
        cls, scale: float, step: float = STEP, tau_step: float = TAU_STEP, span: tuple[float, float] = SPAN
    ) -> Grid:
        lo, hi = (math.log(scale) + d * math.log(10) for d in span)
        logs = np.arange(lo, hi + step / 2, step)
        taus = np.arange(lo, hi + tau_step / 2, tau_step)
        return cls(np.r_[0.0, np.exp(logs)], np.r_[0.0, np.exp(taus)], step)


@dataclass
class ArmData:
    """One arm and role: the scatter matrix of seed-centred values, its df and the known noise per task."""

    W: np.ndarray  # (T, T)
    df: int
    v: np.ndarray  # (T,)
    means: np.ndarray  # (T,) task means over seeds (the fixed effects)
    n_seeds: int


def arm_data(y: np.ndarray, v: np.ndarray) -> ArmData:
    """``y``: seeds x tasks values; ``v``: known noise variances (same shape, or one per task)."""
    y = np.asarray(y, dtype=float)
    v = np.asarray(v, dtype=float)
    v = v.mean(axis=0) if v.ndim == 2 else v
    r = y - y.mean(axis=0)
    return ArmData(r.T @ r, y.shape[0] - 1, np.maximum(np.nan_to_num(v), 0.0), y.mean(axis=0), y.shape[0])


def _tau_sums(W: np.ndarray, v: np.ndarray, tau: np.ndarray, floor: float) -> tuple[np.ndarray, ...]:
    """Per tau2: (sum log d, sum 1/d, sum W_tt/d, w'Ww) with d = tau2 + v; W may be batched (..., T, T)."""
    d = np.maximum(tau[:, None] + v[None, :], floor)  # (G_tau, T)
    w = 1.0 / d
    logdet = np.log(d).sum(axis=1)
    a = w.sum(axis=1)
    diag = np.diagonal(W, axis1=-2, axis2=-1)  # (..., T)
    c = diag @ w.T  # (..., G_tau)
    b = np.einsum("gt,...tu,gu->...g", w, W, w)
    return logdet, a, c, b


def loglik_grid(W: np.ndarray, df: int, v: np.ndarray, grid: Grid, floor: float) -> np.ndarray:
    """REML log-likelihood on the grid: (..., G_sig, G_tau); with one task tau2 is fixed at 0 (G_tau = 1).

    One task cannot separate the seed shift from the seed x task term: sigma2 is then the whole
    seed-level variance of that task beyond its eval noise.
    """
    if v.size == 1:
        grid = Grid(grid.sig, np.zeros(1), grid.step)
    logdet, a, c, b = _tau_sums(W, v, grid.tau, floor)
    sig = grid.sig[:, None]
    q = 1.0 + sig * a[None, :]
    const = -0.5 * df * (logdet[None, :] + np.log(q))  # (G_sig, G_tau): no batch dimension
    shrink = sig / q
    return const - 0.5 * c[..., None, :] + 0.5 * b[..., None, :] * shrink


def max_tau(ll: np.ndarray) -> np.ndarray:
    """Max over the last axis (tau2 grid), refined by the parabola through the best point and its
    neighbours (exact for a log-likelihood quadratic in log tau2, as it is near its maximum)."""
    j = ll.argmax(axis=-1)
    best = np.take_along_axis(ll, j[..., None], -1)[..., 0]
    if ll.shape[-1] < 3:
        return best
    inner = (j > 1) & (j < ll.shape[-1] - 1)  # index 0 is tau2 = 0, not on the log scale
    jm, jp = np.clip(j - 1, 0, None), np.clip(j + 1, None, ll.shape[-1] - 1)
    lm = np.take_along_axis(ll, jm[..., None], -1)[..., 0]
    lp = np.take_along_axis(ll, jp[..., None], -1)[..., 0]
    curv = 2 * best - lm - lp
    with np.errstate(divide="ignore", invalid="ignore"):
        gain = np.where(inner & (curv > 0), (lp - lm) ** 2 / (8 * curv), 0.0)
    return best + np.nan_to_num(gain)


def profiles(W: np.ndarray, df: int, v: np.ndarray, grid: Grid, floor: float, chunk: int = 128) -> np.ndarray:
    """Profile log-likelihood over sigma2 (max over tau2) of many scatter matrices, in chunks (memory)."""
    if W.ndim == 2:
        return max_tau(loglik_grid(W, df, v, grid, floor))
    return np.concatenate(
        [max_tau(loglik_grid(W[i : i + chunk], df, v, grid, floor)) for i in range(0, W.shape[0], chunk)]
    )


def loglik(sig2: float, tau2: float, data: ArmData, floor: float) -> tuple[float, np.ndarray]:
    """Exact REML log-likelihood and its gradient in (sigma2, tau2), for the L-BFGS-B refinement."""
    d = np.maximum(tau2 + data.v, floor)
    w = 1 / d
    a = w.sum()
    q = 1 + sig2 * a
    ww = data.W @ w
    b, c = float(w @ ww), float(np.diag(data.W) @ w)
    ll = -0.5 * (data.df * (np.log(d).sum() + math.log(q)) + c - sig2 * b / q)
    w2 = w * w
    da, dc, db = -w2.sum(), -float(np.diag(data.W) @ w2), -2 * float(w2 @ ww)
    g_sig = -0.5 * (data.df * a / q - b / q**2)
    g_tau = -0.5 * (data.df * (a + sig2 * da / q) + dc - sig2 * (db * q - b * sig2 * da) / q**2)
    return ll, np.array([g_sig, g_tau])


@dataclass
class ArmFit:
    """Fit of one arm and role (status 'ok' or 'failed' with a reason)."""

    status: str
    reason: str | None = None
    sigma2: float = math.nan
    tau2: float = math.nan
    llf: float = math.nan
    profile: np.ndarray = field(default_factory=lambda: np.zeros(0))  # max over tau2 per sigma2 grid point
    tau_at: np.ndarray = field(default_factory=lambda: np.zeros(0))  # argmax tau2 per sigma2 grid point
    data: ArmData | None = None

    def summary(self, grid: Grid, alpha: float, floor: float) -> dict[str, Any]:
        if self.status != "ok":
            return {"status": self.status, "reason": self.reason}
        lo, hi = profile_ci(self.profile, self.llf, grid.sig, alpha)
        assert self.data is not None
        return {
            "status": "ok",
            "seed_var": self.sigma2,
            "seed_var_ci": [lo, hi],
            "task_var": self.tau2,
            "noise_var_mean": float(self.data.v.mean()),
            "n_seeds": self.data.n_seeds,
            "n_tasks": int(self.data.v.size),
            "llf": self.llf,
            "mean": float(self.data.means.mean()),
            "mean_se": float(
                math.sqrt(
                    max(self.sigma2 + (self.tau2 + self.data.v.mean()) / self.data.v.size, 0)
                    / self.data.n_seeds
                )
            ),
        }


def scale_of(*datas: ArmData) -> float:
    """Variance scale for the grid: mean per-cell variance across seeds, else the noise, else 1."""
    tot = [np.trace(d.W) / max(d.df, 1) / d.v.size for d in datas] + [float(d.v.mean()) for d in datas]
    tot = [t for t in tot if t > 0 and math.isfinite(t)]
    return max(tot) if tot else 1.0  # a degenerate table (no spread, no noise): any scale fits


def fit_arm(data: ArmData, grid: Grid, floor: float, refine: bool = True) -> ArmFit:
    """Grid REML then L-BFGS-B refinement; a fit at the grid's upper edge is reported as failed."""
    if data.df < 1:
        return ArmFit("failed", f"needs >= 2 seeds (have {data.n_seeds})")
    if data.v.size == 0:
        return ArmFit("failed", "no task complete across the arm's runs")
    if not np.isfinite(data.W).all():
        return ArmFit("failed", "non-finite values")
    ll = loglik_grid(data.W, data.df, data.v, grid, floor)
    tau_at = ll.argmax(axis=1)
    prof = max_tau(ll)
    i = int(prof.argmax())
    j = int(tau_at[i])
    sig2, tau2, best = float(grid.sig[i]), float(grid.tau[j]), float(prof[i])
    if i == grid.sig.size - 1 or (data.v.size > 1 and j == grid.tau.size - 1):
        return ArmFit("failed", "estimate at the upper edge of the variance grid (data scale off?)")
    if refine:
        s = max(sig2, tau2, float(grid.sig[1]))

        def neg(p: np.ndarray) -> tuple[float, np.ndarray]:
            ll, grad = loglik(p[0] * s, p[1] * s, data, floor)
            return -ll, -grad * s

        res = optimize.minimize(
            neg,
            [sig2 / s, tau2 / s],
            jac=True,
            method="L-BFGS-B",
            bounds=[(0, None), (0, None if data.v.size > 1 else 0)],
        )
        if res.success and -res.fun >= best:
            sig2, tau2, best = float(res.x[0] * s), float(res.x[1] * s), float(-res.fun)
    return ArmFit("ok", None, sig2, tau2, best, prof, tau_at, data)


def profile_ci(prof: np.ndarray, llf: float, values: np.ndarray, alpha: float) -> tuple[float, float]:
    """(1 - alpha) profile-likelihood interval over a grid (values[0] may be 0 = the boundary)."""
    cut = llf - st.chi2.ppf(1 - alpha, 1) / 2
    inside = np.flatnonzero(prof >= cut)
    if inside.size == 0:  # refined maximum between grid points: the interval is within one step
        k = int(prof.argmax())
        return float(values[max(k - 1, 0)]), float(values[min(k + 1, values.size - 1)])
    lo_i, hi_i = int(inside[0]), int(inside[-1])
    lo = 0.0 if lo_i == 0 else _cross(values, prof, lo_i - 1, lo_i, cut)
    hi = math.inf if hi_i == values.size - 1 else _cross(values, prof, hi_i, hi_i + 1, cut)
    return lo, hi


def _cross(values: np.ndarray, prof: np.ndarray, i: int, j: int, cut: float) -> float:
    """Where the profile crosses ``cut`` between grid points i and j (linear in log value)."""
    if values[i] <= 0 or values[j] <= 0 or not math.isfinite(values[j]) or prof[i] == prof[j]:
        return float(values[j] if prof[j] >= cut else values[i])
    f = (cut - prof[i]) / (prof[j] - prof[i])
    return float(math.exp(math.log(values[i]) + f * (math.log(values[j]) - math.log(values[i]))))


# ----------------------------------------------------------------------------- two arms


@functools.cache
def _diagonal_index(g: int) -> tuple[np.ndarray, np.ndarray]:
    j, i = np.meshgrid(np.arange(g), np.arange(g), indexing="ij")
    return j, i - j + g - 1


def shifted_max(pa: np.ndarray, pr: np.ndarray) -> np.ndarray:
    """max_j pr[j] + pa[j + k] for every shift k = -(G-1)..(G-1) over the log part of the grid (batched)."""
    g = pa.shape[-1]
    m = pr[..., :, None] + pa[..., None, :]  # (..., j, i)
    out = np.full((*m.shape[:-2], g, 2 * g - 1), -np.inf)
    j, k = _diagonal_index(g)
    out[..., j, k] = m
    return out.max(axis=-2)


def lrt_stats(pa: np.ndarray, pr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(one-sided LRT statistic, arm > reference) from per-arm profiles on a common grid (batched)."""
    full = pa.max(axis=-1) + pr.max(axis=-1)
    null = (pa + pr).max(axis=-1)
    lam = np.maximum(2 * (full - null), 0.0)
    up = pa.argmax(axis=-1) > pr.argmax(axis=-1)
    return np.where(up, lam, 0.0), up


def outside_max(pa: np.ndarray, pr: np.ndarray, k0: int) -> np.ndarray:
    """Max joint profile over log ratios with |log ratio| >= k0 grid steps (batched; index 0 = variance 0).

    Equivalence is shown when this lies more than the chi2 cutoff below the maximum: the ratio's profile
    interval is then inside (1/r0, r0). Suffix maxima make it O(G) instead of O(G^2).
    """

    def upper(p_hi: np.ndarray, p_lo: np.ndarray) -> np.ndarray:
        # max over j >= 1, i >= j + k0 of p_lo[j] + p_hi[i], plus p_lo at 0 (ratio infinite) with p_hi > 0
        tail = np.flip(np.maximum.accumulate(np.flip(p_hi[..., 1:], -1), axis=-1), -1)  # max p_hi[i:] (i>=1)
        g = tail.shape[-1]
        shifted = np.full(p_lo[..., 1:].shape, -np.inf)
        if k0 < g:
            shifted[..., : g - k0] = tail[..., k0:]
        return np.maximum((p_lo[..., 1:] + shifted).max(axis=-1), p_lo[..., 0] + p_hi[..., 1:].max(axis=-1))

    return np.maximum(upper(pa, pr), upper(pr, pa))


def compare_arms(
    fa: ArmFit, fr: ArmFit, grid: Grid, alpha: float, n_boot: int, rng: np.random.Generator, floor: float
) -> dict[str, Any]:
    """Seed-variance ratio arm / reference: estimate, (1-alpha) and (1-2alpha) profile CIs, one-sided
    LRT with chi-bar-squared and parametric-bootstrap p-values, and the model's mean difference."""
    for name, f in (("arm", fa), ("reference", fr)):
        if f.status != "ok":
            return {"status": "failed", "reason": f"{name} fit failed: {f.reason}"}
    assert fa.data is not None and fr.data is not None
    pa, pr = fa.profile[1:], fr.profile[1:]
    prof = shifted_max(pa, pr)
    g = pa.size
    logr = (np.arange(2 * g - 1) - (g - 1)) * grid.step
    # boundaries: reference variance 0 (ratio +inf), arm variance 0 (ratio 0)
    at_inf = fr.profile[0] + fa.profile.max()
    at_zero = fa.profile[0] + fr.profile.max()
    llf = fa.llf + fr.llf
    ratio = fa.sigma2 / fr.sigma2 if fr.sigma2 > 0 else (math.inf if fa.sigma2 > 0 else math.nan)
    cis = {}
    for name, level in (("ci", alpha), ("ci_equivalence", 2 * alpha)):
        vals = np.r_[-np.inf, logr, np.inf]
        lo, hi = profile_ci(np.r_[at_zero, prof, at_inf], llf, np.exp(vals), level)
        cis[name] = [lo, hi]
    lam_full, up = lrt_stats(fa.profile, fr.profile)
    lam = float(lam_full)
    p_chibar = float(0.5 * st.chi2.sf(lam, 1)) if lam > 0 else 1.0
    boot = (
        bootstrap_lrt(fa, fr, grid, n_boot, rng, floor)
        if n_boot > 0
        else {"status": "skipped", "reason": "bootstrap: 0"}
    )
    da, dr = fa.data, fr.data
    se = math.sqrt(_mean_var(fa) / da.n_seeds + _mean_var(fr) / dr.n_seeds)
    out: dict[str, Any] = {}
    if math.isnan(ratio):  # stays "ok": the CI and the test are still defined (and say: no evidence)
        out["reason"] = "ratio undefined: both fitted seed variances are 0"
    elif math.isinf(ratio):
        out["reason"] = "ratio infinite: the reference's fitted seed variance is 0"
    return {
        "status": "ok",
        **out,
        "ratio": ratio,
        "ratio_ci": cis["ci"],
        "ratio_ci_equivalence": cis["ci_equivalence"],
        "ci_level": 1 - alpha,
        "equivalence_ci_level": 1 - 2 * alpha,
        "lrt": lam,
        "direction_up": bool(up),
        "p_chibar2": p_chibar,
        "bootstrap": boot,
        "p": boot["p"] if boot.get("status") == "ok" else p_chibar,
        "p_source": "parametric bootstrap" if boot.get("status") == "ok" else "chi-bar-squared",
        "mean_diff": float(da.means.mean() - dr.means.mean()),
        "mean_diff_se": se,
    }


def _mean_var(f: ArmFit) -> float:
    assert f.data is not None
    return f.sigma2 + (f.tau2 + float(f.data.v.mean())) / f.data.v.size


def covariance(sig2: float, tau2: float, v: np.ndarray) -> np.ndarray:
    return np.diag(tau2 + v) + sig2


def draw_scatter(cov: np.ndarray, df: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """n Wishart(df, cov) scatter matrices (the seed-centred W of simulated arms)."""
    try:
        chol = np.linalg.cholesky(cov + 1e-300 * np.eye(cov.shape[0]))
    except np.linalg.LinAlgError:  # singular (no eval noise, no task variance: sig2 * ones): a PSD root
        lam, q = np.linalg.eigh(cov)
        chol = q * np.sqrt(np.clip(lam, 0.0, None))
    z = rng.standard_normal((n, df, cov.shape[0])) @ chol.T
    return np.einsum("nst,nsu->ntu", z, z)


def _profiles(W: np.ndarray, data: ArmData, grid: Grid, floor: float) -> np.ndarray:
    return profiles(W, data.df, data.v, grid, floor)


def bootstrap_lrt(
    fa: ArmFit, fr: ArmFit, grid: Grid, n_boot: int, rng: np.random.Generator, floor: float
) -> dict[str, Any]:
    """p of the one-sided LRT from ``n_boot`` tables drawn from the fitted null (common seed variance)."""
    assert fa.data is not None and fr.data is not None
    j = int((fa.profile + fr.profile).argmax())
    s0 = float(grid.sig[j])
    ta, tr = float(grid.tau[fa.tau_at[j]]), float(grid.tau[fr.tau_at[j]])
    coarse = Grid.around(scale_of(fa.data, fr.data), COARSE_STEP, 2 * TAU_STEP, COARSE_SPAN)
    obs, _ = lrt_stats(
        _profiles(fa.data.W, fa.data, coarse, floor), _profiles(fr.data.W, fr.data, coarse, floor)
    )
    wa = draw_scatter(covariance(s0, ta, fa.data.v), fa.data.df, n_boot, rng)
    wr = draw_scatter(covariance(s0, tr, fr.data.v), fr.data.df, n_boot, rng)
    sims, _ = lrt_stats(_profiles(wa, fa.data, coarse, floor), _profiles(wr, fr.data, coarse, floor))
    p = (1 + int((sims >= float(obs) - 1e-9).sum())) / (n_boot + 1) if obs > 0 else 1.0
    return {"status": "ok", "p": p, "n": n_boot, "null_seed_var": s0, "statistic_coarse": float(obs)}
