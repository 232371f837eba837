"""Power of the seed-variance decisions, by simulation of the statistic they use: MDE and seeds needed.

A verdict of "inconclusive" is only useful with what it would have taken. The decisions compare the
whole seed variance V = shared + seed x task (``variance_model``); for one comparison (arm vs
reference, one role) the fitted null is held fixed (the common V of the null fit, each arm's own
shared fraction rho = shared / V, the known eval noise per task; V is the reference arm's own fitted
whole variance when it is above 0: the MDE is a ratio to the reference) and seed scatter matrices are drawn
from the model (``variance_model.draw_scatter``), as many as ``power_simulations``, then profiled
over V exactly as the data were:

- detection (H2, H3): P(the arm's V is larger and the (1-2 alpha) profile CI of the ratio excludes 1,
  i.e. the one-sided alpha test of the verdict rejects) at a true ratio R of V (the arm's shared
  fraction kept, so both parts scale by R);
  the minimal detectable ratio (MDE) is the smallest R of ``RATIOS`` with power >= ``power_target``
  at the seeds in hand, and seeds needed is the smallest seeds per arm (``SEED_GRID`` up to
  ``max_seeds``) that reach it at R = r0.
- equivalence (H1): P(the (1-2 alpha) profile CI lies inside (1/r0, r0)) at a true ratio 1.

What power depends on besides the seeds: the shared fraction (a shared seed effect is seen through
S - 1 degrees of freedom whatever the number of tasks; a seed x task effect through T (S - 1)) and the
eval-noise share (known noise is held out, but it still adds scatter). Both come from the fit.

The bootstrap p-value of the verdict is not simulated (one bootstrap per simulated table would cost
n_boot times more); both halves of the rule are one-sided alpha tests of the same likelihood ratio (the
CI bound by its chi-square calibration, p by the bootstrap), so power is that of the CI condition.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from scipy import stats as st

from workflow_scripts.statistics import variance_model as vm

NULL_BASIS = "whole seed variance under the null fit (common to both arms), each arm's shared fraction"
RATIOS = (1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 9.0, 16.0, 32.0, 64.0)
SEED_GRID = (3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 48, 64, 96, 128, 192, 256)


def _simulate(
    null: vm.NullFit,
    ratio: float,
    fa: vm.ArmFit,
    fr: vm.ArmFit,
    n_seeds: int,
    sims: int,
    rng: np.random.Generator,
    floor: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Whole-variance profiles (sims, G) of both arms for tables of ``n_seeds`` seeds per arm."""
    assert fa.data is not None and fr.data is not None
    va, vr = fa.data.v, fr.data.v
    grid = vm.Grid.coarse(max(null.whole_var * max(ratio, 1.0), float(va.mean()), float(vr.mean())))
    out = []
    for v, whole, rho in ((va, null.whole_var * ratio, null.rho_arm), (vr, null.whole_var, null.rho_ref)):
        w = vm.draw_scatter(vm.whole_covariance(whole, rho, v), n_seeds - 1, sims, rng)
        out.append(vm.whole_profiles(w, n_seeds - 1, v, grid, floor))
    return out[0], out[1]


def detect_power(
    null: vm.NullFit,
    ratio: float,
    fa: vm.ArmFit,
    fr: vm.ArmFit,
    n_seeds: int,
    alpha: float,
    sims: int,
    rng: np.random.Generator,
    floor: float,
) -> float:
    pa, pr = _simulate(null, ratio, fa, fr, n_seeds, sims, rng, floor)
    lam, up = vm.lrt_stats(pa, pr)
    return float(np.mean(up & (lam > st.chi2.ppf(1 - 2 * alpha, 1))))


def equivalence_power(
    null: vm.NullFit,
    fa: vm.ArmFit,
    fr: vm.ArmFit,
    n_seeds: int,
    alpha: float,
    r0: float,
    sims: int,
    rng: np.random.Generator,
    floor: float,
) -> float:
    pa, pr = _simulate(null, 1.0, fa, fr, n_seeds, sims, rng, floor)
    k0 = max(1, math.floor(math.log(r0) / vm.COARSE_STEP + 1e-9))
    full = pa.max(axis=-1) + pr.max(axis=-1)
    return float(np.mean(2 * (full - vm.outside_max(pa, pr, k0)) > st.chi2.ppf(1 - 2 * alpha, 1)))


def smallest(candidates: Sequence[int], reaches: Callable[[int], bool]) -> int | None:
    """Smallest candidate for which ``reaches`` holds, by bisection (power grows with seeds)."""
    lo, hi = 0, len(candidates) - 1
    if hi < 0 or not reaches(candidates[hi]):
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if reaches(candidates[mid]):
            hi = mid
        else:
            lo = mid + 1
    return candidates[lo]


def reference_basis(fa: vm.ArmFit, fr: vm.ArmFit, null: vm.NullFit) -> tuple[vm.NullFit, str]:
    """The basis the verdicts' MDE uses: the reference arm's own fitted whole variance, each arm's fitted
    shared fraction. The MDE answers "how much more variable than the reference could an arm be and go
    unseen?"; the common null fit would let an arm 100x less variable than the reference drag the basis
    far below the reference, and every simulated power with it. Falls back to ``null`` when the
    reference's fitted whole variance is 0."""
    ref_whole = fr.sigma2 + fr.tau2
    if not (ref_whole > 0 and math.isfinite(ref_whole)):
        return (
            null,
            NULL_BASIS,
        )
    arm_whole = fa.sigma2 + fa.tau2
    rho_arm = fa.sigma2 / arm_whole if arm_whole > 0 and math.isfinite(arm_whole) else null.rho_arm
    basis = vm.NullFit(float(ref_whole), float(rho_arm), float(fr.sigma2 / ref_whole))
    return basis, "the reference's fitted whole seed variance, each arm's fitted shared fraction"


def power_block(
    fa: vm.ArmFit,
    fr: vm.ArmFit,
    null: vm.NullFit,
    cfg: dict[str, Any],
    rng: np.random.Generator,
    floor: float,
    equivalence: bool,
    basis: str | None = None,
) -> dict[str, Any]:
    """Power now, MDE and seeds needed for one comparison at the variance basis ``null`` (see module
    docstring; ``basis`` says what it is, for stats.json)."""
    sims = int(cfg["power_simulations"])
    if sims <= 0:
        return {"status": "skipped", "reason": "power_simulations is 0"}
    if fa.status != "ok" or fr.status != "ok" or fa.data is None or fr.data is None:
        return {"status": "skipped", "reason": "model fit failed"}
    alpha, target, r0 = float(cfg["alpha"]), float(cfg["power_target"]), float(cfg["variance_ratio_margin"])
    n = min(fa.data.n_seeds, fr.data.n_seeds)
    basis = basis or NULL_BASIS
    if not null.whole_var > 0:
        noise = float(max(fr.data.v.mean(), fa.data.v.mean()))
        null = vm.NullFit(noise, 0.5, 0.5)
        basis = (
            "assumed equal to the mean eval-noise variance, half shared, half seed x task (fitted whole "
            "seed variance is 0)"
        )
    if not null.whole_var > 0:
        return {"status": "skipped", "reason": "no seed variance and no eval noise to scale a simulation"}
    max_seeds = int(cfg["max_seeds"])
    grid_n = [s for s in SEED_GRID if s <= max_seeds]

    def detect(r: float, s: int) -> float:
        return detect_power(null, r, fa, fr, s, alpha, sims, rng, floor)

    curve = {f"{r:g}": detect(r, n) for r in RATIOS}
    mde = next((r for r in RATIOS if curve[f"{r:g}"] >= target), None)
    need = smallest(grid_n, lambda s: detect(r0, s) >= target)
    out: dict[str, Any] = {
        "status": "ok",
        "statistic": "whole seed variance (shared + seed x task)",
        "n_seeds": n,
        "simulations": sims,
        "target": target,
        "basis": basis,
        "whole_var_ref": null.whole_var,
        "shared_fraction": [null.rho_arm, null.rho_ref],
        "power_by_ratio": curve,
        "mde_ratio": mde,
        "power_at_r0": curve[f"{r0:g}"] if f"{r0:g}" in curve else detect(r0, n),
        "seeds_needed_r0": need,
        "max_seeds": max_seeds,
        "r0": r0,
    }
    if equivalence:
        out["equivalence_power"] = equivalence_power(null, fa, fr, n, alpha, r0, sims, rng, floor)
        out["seeds_needed_equivalence"] = smallest(
            grid_n, lambda s: equivalence_power(null, fa, fr, s, alpha, r0, sims, rng, floor) >= target
        )
    return out
