"""The seed-permutation check of the H2/H3 rule: its scatter matrices, and what it guards against."""

from __future__ import annotations

import numpy as np

from workflow_scripts.statistics import variance_model as vm
from workflow_scripts.statistics import verdicts

ALPHA = 0.05
CFG = {"alpha": ALPHA, "variance_ratio_margin": 2.0}


def compare(ya: np.ndarray, yr: np.ndarray, noise: float = 1e-6, seed: int = 0) -> dict:
    """The analysis's comparison of arm ``ya`` with reference ``yr`` (seeds x tasks)."""
    da, dr = vm.arm_data(ya, np.full(ya.shape, noise)), vm.arm_data(yr, np.full(yr.shape, noise))
    scale = vm.scale_of(da, dr)
    grid, floor = vm.Grid.around(scale), scale * 1e-12
    fa, fr = vm.fit_arm(da, grid, floor), vm.fit_arm(dr, grid, floor)
    return vm.compare_arms(fa, fr, grid, ALPHA, 999, np.random.default_rng(seed), floor)


def test_permuted_scatters_are_the_arms_own_when_no_row_moves_and_keep_the_total():
    rng = np.random.default_rng(3)
    ra, rr = rng.normal(size=(8, 4)), rng.normal(size=(6, 4))
    ra, rr = ra - ra.mean(axis=0), rr - rr.mean(axis=0)
    wa, wr = vm.permuted_scatters(ra, rr, 50, rng)
    assert wa.shape == wr.shape == (50, 4, 4)
    pooled = np.vstack([ra, rr])
    total = pooled.T @ pooled  # scatter about 0: each permuted group's scatter + its mean's part
    for k in range(50):
        assert np.all(np.linalg.eigvalsh(wa[k]) > -1e-9) and np.all(np.linalg.eigvalsh(wr[k]) > -1e-9)
        assert np.trace(wa[k] + wr[k]) <= np.trace(total) + 1e-9
    # an assignment that leaves every row in its arm gives back the arms' own scatters
    ident = np.zeros((1, 14))
    ident[0, :8] = 1.0
    outer = (pooled[:, :, None] * pooled[:, None, :]).reshape(14, -1)
    w_own = (ident @ outer).reshape(4, 4) - np.outer(ident @ pooled, ident @ pooled) / 8
    assert np.allclose(w_own, ra.T @ ra)


def test_one_outlying_seed_fools_the_bootstrap_but_not_the_permutation():
    """One arm's runs are the reference's distribution except one seed 7 SDs out on one task (a twin seed
    of the default sat 3.5 SDs out on chain): the bootstrap-only rule says supported, the rule must not."""
    rng = np.random.default_rng(11)
    sd = 0.006
    yr = rng.normal(0.1, sd, (8, 4))
    ya = rng.normal(0.1, sd, (8, 4))
    ya[0, 1] -= 7 * sd
    comp = compare(ya, yr)
    alone = {k: v for k, v in comp.items() if k != "permutation"}  # the rule before the check
    assert verdicts.verdict_variance(alone, {}, None, CFG, "off-task dJ")[0] == "supported"
    assert comp["permutation"]["status"] == "ok" and comp["permutation"]["p"] >= ALPHA
    verdict, why = verdicts.verdict_variance(comp, {}, None, CFG, "off-task dJ")
    assert verdict != "supported" and "seed permutation does not" in why


def test_a_larger_spread_in_every_seed_is_supported_by_both():
    rng = np.random.default_rng(12)
    yr = rng.normal(0.1, 0.006, (8, 4))
    ya = rng.normal(0.1, 0.006 * 4, (8, 4))  # 16x the variance, spread over all seeds
    comp = compare(ya, yr)
    assert comp["bootstrap"]["p"] < ALPHA and comp["permutation"]["p"] < ALPHA
    verdict, why = verdicts.verdict_variance(comp, {}, None, CFG, "off-task dJ")
    assert verdict == "supported" and "seed permutation p=" in why
