"""The null yardstick: what chance alone gives a seed-variance ratio at an arm's seeds, from the reference.

A ratio of 3x between two arms of 8 seeds is read against what two sets of 8 seeds of the same arm give.
Where the reference has at least twice an arm's seeds (the default: fp32 at 16 seeds, the other arms at
8), its runs are split at random into two disjoint sets of the arm's size, each set is fitted by the
mixed model exactly as an arm is (``variance_model.fit_arm``, on the comparison's grid and task scales;
without the final refinement, so a ratio is resolved to the grid's step), and the whole seed-variance
ratio of the two sets is the statistic under the null: the same arm, the same tasks, the same eval noise,
only the seeds differ. Every arm is still compared with all of the reference's seeds; the yardstick is
printed beside its ratio (the 5th and 95th percentiles of the split ratios, and the share of splits at
least as extreme as the arm's ratio, in its direction). With fewer reference seeds there is no yardstick
and the block says so (a separately seeded twin, ``config.controls.yaml``, is then the null to read).

The splits share runs, so the share is a guide, not a p-value: a 16-seed reference has 6435 distinct
halvings, and the splits drawn are a random subset of them (``analysis.null_splits``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from workflow_scripts.statistics import variance_model as vm
from workflow_scripts.statistics.report_tables import fmt

QUANTILES = (0.05, 0.5, 0.95)


def split_ratios(
    y: np.ndarray,
    v: np.ndarray,
    n_arm: int,
    n_splits: int,
    grid: vm.Grid,
    floor: float,
    rng: np.random.Generator,
) -> np.ndarray:
    """Whole seed-variance ratios of random disjoint pairs of ``n_arm``-seed sets of one arm's runs
    (``y``, ``v``: seeds x tasks values and known noise); a pair whose fit fails is left out."""
    out = []
    for _ in range(n_splits):
        idx = rng.permutation(len(y))
        a, b = idx[:n_arm], idx[n_arm : 2 * n_arm]
        fa = vm.fit_arm(vm.arm_data(y[a], v[a]), grid, floor, refine=False)
        fb = vm.fit_arm(vm.arm_data(y[b], v[b]), grid, floor, refine=False)
        if fa.status == "ok" and fb.status == "ok" and fb.whole > 0:
            out.append(fa.whole / fb.whole)
        elif fa.status == "ok" and fb.status == "ok":
            out.append(np.inf if fa.whole > 0 else 1.0)
    return np.asarray(out, dtype=float)


def null_block(
    y: np.ndarray,
    v: np.ndarray,
    n_arm: int,
    n_splits: int,
    grid: vm.Grid,
    floor: float,
    rng: np.random.Generator,
) -> dict[str, Any]:
    """The yardstick for arms of ``n_arm`` seeds against a reference of ``len(y)`` seeds: the split
    ratios' quantiles (and the ratios themselves, to place each arm's ratio), or why there is none."""
    n_ref = len(y)
    if n_arm < 2 or n_ref < 2 * n_arm:
        return {
            "status": "skipped",
            "n_ref_seeds": n_ref,
            "n_arm_seeds": n_arm,
            "reason": f"the reference has {n_ref} seeds, fewer than twice the arm's {n_arm}: no null "
            "yardstick (read the ratio against a null twin or the MDE)",
        }
    ratios = split_ratios(y, v, n_arm, n_splits, grid, floor, rng)
    if ratios.size == 0:
        return {"status": "failed", "n_ref_seeds": n_ref, "n_arm_seeds": n_arm, "reason": "no split fitted"}
    q = np.quantile(ratios, QUANTILES)
    return {
        "status": "ok",
        "statistic": f"whole seed-variance ratio of two disjoint random sets of {n_arm} reference seeds",
        "n_ref_seeds": n_ref,
        "n_arm_seeds": n_arm,
        "splits": int(ratios.size),
        "q05": float(q[0]),
        "median": float(q[1]),
        "q95": float(q[2]),
        "ratios": sorted(float(r) for r in ratios),
    }


def place(ratio: float | None, block: dict[str, Any]) -> dict[str, Any]:
    """An arm's ratio against the yardstick: the percentiles and the share of splits at least as extreme
    in the ratio's direction (>= it when above 1, <= it when below); the block's reason where none."""
    if block.get("status") != "ok":
        return {"status": block.get("status", "skipped"), "reason": block.get("reason")}
    ratios = np.asarray(block["ratios"], dtype=float)
    out = {k: block[k] for k in ("status", "n_ref_seeds", "n_arm_seeds", "splits", "q05", "median", "q95")}
    if ratio is None or np.isnan(ratio):
        return {**out, "share_as_extreme": None, "direction": None}
    up = ratio >= 1
    share = float(np.mean(ratios >= ratio) if up else np.mean(ratios <= ratio))
    return {**out, "share_as_extreme": share, "direction": "larger" if up else "smaller"}


def words(y: Mapping | None) -> str:
    """A ratio's null yardstick in words (``place``'s block): the 5-95% range of the reference's split
    ratios and the share of splits at least as extreme; or why there is none."""
    if not y:
        return "no yardstick"
    if y.get("status") != "ok":
        return "no yardstick: " + str(y.get("reason") or y.get("status")).split(":")[0]
    share = y.get("share_as_extreme")
    tail = f", {fmt(share, 2)} of splits as extreme" if share is not None else ""
    return f"chance [{fmt(y.get('q05'), 2)}, {fmt(y.get('q95'), 2)}]x{tail}"
