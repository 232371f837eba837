"""The null yardstick (random halvings of a 16-seed reference) and the profile p of 'smaller'."""

from __future__ import annotations

import numpy as np
import pytest

from workflow_scripts.statistics import variance_model as vm
from workflow_scripts.statistics import yardstick as ys


def _grid(y: np.ndarray, v: np.ndarray) -> tuple[vm.Grid, float]:
    scale = vm.scale_of(vm.arm_data(y, v))
    return vm.Grid.around(scale), scale * 1e-12


def test_halves_of_one_arm_give_ratios_around_1_and_a_4x_arm_sits_in_their_tail():
    rng = np.random.default_rng(0)
    y, v = rng.normal(size=(16, 4)), np.full((16, 4), 0.1)
    grid, floor = _grid(y, v)
    block = ys.null_block(y, v, 8, 60, grid, floor, np.random.default_rng(1))
    assert block["status"] == "ok" and block["splits"] == 60
    assert block["q05"] < 1 < block["q95"] and 0.5 < block["median"] < 2
    far = ys.place(50.0, block)
    assert far["direction"] == "larger" and far["share_as_extreme"] == 0.0
    assert ys.place(block["median"], block)["share_as_extreme"] == pytest.approx(0.5, abs=0.1)
    assert ys.place(1 / 50, block)["direction"] == "smaller"


def test_too_few_reference_seeds_give_no_yardstick_and_say_why():
    y, v = np.zeros((12, 2)), np.full((12, 2), 0.1)
    grid, floor = _grid(y + np.arange(12)[:, None], v)
    block = ys.null_block(y, v, 8, 10, grid, floor, np.random.default_rng(0))
    assert block["status"] == "skipped" and "fewer than twice the arm's 8" in block["reason"]
    assert ys.place(3.0, block) == {"status": "skipped", "reason": block["reason"]}


def test_the_p_of_smaller_matches_the_profile_interval():
    """p_below(1) < alpha exactly where the (1-alpha) interval ends below 1; 1 for a ratio above."""
    rng = np.random.default_rng(3)
    v = np.full((12, 3), 0.01)
    small, big = rng.normal(0, 0.3, (12, 3)), rng.normal(0, 1.5, (12, 3))
    grid, floor = _grid(big, v)
    fa, fr = (vm.fit_arm(vm.arm_data(x, v), grid, floor) for x in (small, big))
    comp = vm.compare_arms(fa, fr, grid, 0.05, 0, np.random.default_rng(0), floor)
    p = vm.p_below(fa, fr, grid, 1.0)
    assert (p < 0.05) == (comp["ratio_ci"][1] < 1) and p < 0.05
    assert vm.p_below(fr, fa, grid, 1.0) == 1.0
    assert vm.p_below(fa, fr, grid, 2.0) <= p
