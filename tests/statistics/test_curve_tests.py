"""The learning-curve statistics (``curve_tests``): a mean that parts at step 24 is found there, identical
arms never differ, a growing off-task variance is found, and under the null the false "differs" rate over
all steps stays at about alpha (Bonferroni over the steps)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd
import pytest

from workflow_scripts.statistics import curve_tests as ct

STEPS = (0, 12, 24, 36, 48)
ROLES = {"add_sub": "on_task", "mul": "off_task", "chain": "off_task", "mcq": "off_task", "word": "off_task"}
CFG = {"alpha": 0.05, "bootstrap": 400, "seed": 0, "first_step_resamples": 60}
NOISE = 1e-4  # eval-noise variance of one J (SD 0.01)


def curve_table(
    rng: np.random.Generator,
    arms: tuple[str, ...] = ("fp32", "bf16"),
    seeds: int = 12,
    mean: Callable[[str, str, int], float] = lambda arm, task, step: 0.3 + 0.002 * step,
    sd: Callable[[str, str, int], float] = lambda arm, task, step: 0.0 if step == 0 else 0.02,
) -> pd.DataFrame:
    """A heldout_curves table: J = mean + a seed effect of SD sd (per task) + eval noise of variance NOISE.
    Step 0 has no seed effect (shared weights): its spread is eval noise only."""
    rows = []
    for arm in arms:
        for seed in range(1, seeds + 1):
            for step in STEPS:
                for task, role in ROLES.items():
                    j = mean(arm, task, step) + sd(arm, task, step) * rng.standard_normal()
                    j += np.sqrt(NOISE) * rng.standard_normal()
                    rows.append({"run": f"{arm}-s{seed}", "precision": arm, "seed": seed, "repeat": 1,
                                 "step": step, "task": task, "role": role, "J": j,
                                 "eval_noise_var": NOISE})  # fmt: skip
    table = pd.DataFrame(rows)
    start = table[table["step"] == 0].groupby(["precision", "task"])["J"].mean()
    return table.assign(dJ=table["J"] - table.join(start.rename("J0"), on=["precision", "task"])["J0"])


def firsts(result: dict, arm: str = "bf16") -> tuple[int | None, int | None]:
    comp = result["comparisons"][arm]
    return comp["on_task_mean"]["first_differ"]["step"], comp["off_task_variance"]["first_differ"]["step"]


def test_a_mean_that_parts_from_step_24_is_found_at_24():
    def mean(arm, task, step):
        return 0.3 + 0.002 * step + (0.06 if arm == "bf16" and task == "add_sub" and step >= 24 else 0.0)

    result = ct.analyze_curves(curve_table(np.random.default_rng(1), mean=mean), CFG, ["fp32", "bf16"])
    comp = result["comparisons"]["bf16"]["on_task_mean"]
    first = comp["first_differ"]
    assert first["step"] == 24 and first["after_step"] == 12 and first["p"] < result["level_per_step"]
    assert [s["differs"] for s in comp["by_step"]] == [False, True, True, True]
    at24 = comp["by_step"][1]
    assert at24["ci_low"] < 0.06 < at24["ci_high"] and at24["ci_low"] > 0
    boot = first["bootstrap"]
    assert boot["n"] == 60 and boot["ci_low"] <= 24 <= boot["ci_high"] and boot["never_share"] == 0
    assert sum(boot["share"].values()) + boot["never_share"] == pytest.approx(1.0)
    assert result["comparisons"]["bf16"]["design"] == "paired"
    assert result["level_per_step"] == pytest.approx(0.05 / 4)


def test_identical_arms_do_not_differ_at_any_step():
    result = ct.analyze_curves(curve_table(np.random.default_rng(2)), CFG, ["fp32", "bf16"])
    assert firsts(result) == (None, None)
    variance = result["comparisons"]["bf16"]["off_task_variance"]
    assert variance["first_differ"]["after_step"] is None
    assert all(
        0.2 < s["ratio"] < 5 and s["ratio_ci_low"] < 1 < s["ratio_ci_high"] for s in variance["by_step"]
    )


def test_a_variance_growing_over_steps_is_found():
    def sd(arm, task, step):
        if step == 0:
            return 0.0
        grow = {12: 1.0, 24: 1.2, 36: 3.0, 48: 4.0}[step] if arm == "bf16" and task != "add_sub" else 1.0
        return 0.02 * grow

    result = ct.analyze_curves(curve_table(np.random.default_rng(3), sd=sd), CFG, ["fp32", "bf16"])
    mean_first, var_first = firsts(result)
    assert mean_first is None and var_first == 36
    by_step = result["comparisons"]["bf16"]["off_task_variance"]["by_step"]
    assert by_step[3]["ratio"] > 8 and by_step[3]["ratio_ci_low"] > 1 and by_step[3]["p"] < 0.0125
    noise = by_step[3]["noise"]
    assert noise == pytest.approx(NOISE) and by_step[3]["var_corrected"] == pytest.approx(
        by_step[3]["var"] - noise
    )


def test_step_zero_spread_is_eval_noise_and_the_check_says_so():
    result = ct.analyze_curves(curve_table(np.random.default_rng(4), seeds=40), CFG, ["fp32", "bf16"])
    check = result["noise_check"]
    for arm in ("fp32", "bf16"):
        assert set(check[arm]) == {"on_task", "off_task"}
        assert 0.6 < check[arm]["off_task"]["ratio"] < 1.5
    step0 = result["by_step"][0]
    assert step0["step"] == 0 and step0["arms"]["fp32"]["off_task"]["noise"] == pytest.approx(NOISE)
    assert [b["step"] for b in result["by_step"]] == list(STEPS)


def test_spread_floor_and_order():
    table = curve_table(np.random.default_rng(5), sd=lambda a, t, s: 0.0)  # all spread is noise
    spread = ct.spread_by_step(table, ["bf16", "fp32"])
    assert spread["precision"].iloc[0] == "bf16" and list(spread["role"].iloc[:2]) == ["on_task", "on_task"]
    assert (spread["var_corrected"] >= ct.VAR_FLOOR * NOISE - 1e-15).all()


def test_repeats_and_missing_steps():
    table = curve_table(np.random.default_rng(6), seeds=4)
    repeat = table[table["run"] == "bf16-s1"].assign(run="bf16-s1-r2", repeat=2, J=0.9, dJ=0.6)
    result = ct.analyze_curves(pd.concat([table, repeat]), CFG, ["fp32", "bf16"])
    assert result["n_seeds"] == {"fp32": 4, "bf16": 4}  # the repeat is not a seed
    with pytest.raises(ValueError, match="no step 0"):
        ct.analyze_curves(table[table["step"] > 0], CFG, ["fp32", "bf16"])
    with pytest.raises(ValueError, match="lacks column"):
        ct.analyze_curves(table.drop(columns="eval_noise_var"), CFG)


def test_few_seeds_and_one_arm_are_skipped_not_errors():
    two = ct.analyze_curves(curve_table(np.random.default_rng(7), seeds=2), CFG, ["fp32", "bf16"])
    comp = two["comparisons"]["bf16"]
    assert comp["on_task_mean"]["status"] == "ok" and comp["off_task_variance"]["status"] == "skipped"
    one = ct.analyze_curves(curve_table(np.random.default_rng(7), arms=("fp32",)), CFG, ["fp32", "bf16"])
    assert one["comparisons"] == {} and "nothing to compare" in one["warnings"][0]


def test_the_statistics_are_deterministic():
    table = curve_table(np.random.default_rng(8))
    assert ct.analyze_curves(table, CFG, ["fp32", "bf16"]) == ct.analyze_curves(table, CFG, ["fp32", "bf16"])


def test_under_the_null_the_false_differs_rate_is_at_most_alpha():
    """200 tables with one distribution for both arms (seed effects shared by a seed's tasks as well as
    task-specific, heavy-tailed): "differs at some step" must come out in at most ~alpha of them."""
    rng = np.random.default_rng(11)
    n_tables, seeds, tasks = 200, 12, 4
    cfg = {"alpha": 0.05, "bootstrap": 200, "seed": 0}
    tested = len(STEPS) - 1
    level = cfg["alpha"] / tested
    false_mean = false_var = 0
    for i in range(n_tables):
        cube = {}
        for arm in ("fp32", "bf16"):
            shared = rng.standard_t(4, (seeds, len(STEPS), 1)) * 0.02
            own = rng.standard_normal((seeds, len(STEPS), tasks + 1)) * 0.02
            j = 0.3 + shared + own + rng.standard_normal((seeds, len(STEPS), tasks + 1)) * 0.01
            j[:, 0] = 0.3 + rng.standard_normal((seeds, tasks + 1)) * 0.01
            cube[arm] = ct.ArmCurves(np.arange(seeds), j, np.full_like(j, NOISE))
        a, r = cube["bf16"], cube["fp32"]
        false_mean += ct.first_step(STEPS[1:], ct.mean_pvalues(a, r, [0], True) < level) is not None
        masks = ct.permutation_masks(seeds, seeds, cfg["bootstrap"], ct.rng_for(i, "null"))
        false_var += (
            ct.first_step(STEPS[1:], ct.variance_pvalues(a, r, range(1, 5), masks) < level) is not None
        )
    # the binomial SE at alpha = 0.05 over 200 tables is 0.015: 0.08 is two SEs above alpha
    assert false_mean / n_tables <= 0.08, false_mean
    assert false_var / n_tables <= 0.08, false_var
