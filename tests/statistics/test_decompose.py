"""The decomposition of a bundle arm's mean effects into the single-factor arms' main effects and their
interaction, on tables with planted effects."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats as st

from workflow_scripts.statistics import arms as am
from workflow_scripts.statistics import decompose as dc

FP32 = {"param_dtype": "float32", "deterministic": True, "dropout": 0.0}
SPECS = {
    "fp32": FP32,
    "bf16_drop": {**FP32, "param_dtype": "bfloat16", "dropout": 0.1},
    "bf16": {**FP32, "param_dtype": "bfloat16"},
    "fp32_drop": {**FP32, "dropout": 0.1},
    "bf16_sr": {**FP32, "param_dtype": "bfloat16", "rounding": "stochastic"},
    "fp32_twin": {**FP32, "seed_offset": 1000, "control": "negative"},
}
TASKS = {"on_task": ["add"], "off_task": ["mul", "chain"]}
STALL, DROPOUT = -0.09, -0.08


def table(interaction: float = 0.0, n_seeds: int = 10, sd: float = 0.01, seed: int = 0) -> pd.DataFrame:
    """Runs x tasks with a seed effect shared by the arms (paired seeds), planted arm effects on dJ and a
    multiplicative effect on KL (the bundle drifts a tenth as far)."""
    rng = np.random.default_rng(seed)
    effect = {"fp32": 0.0, "bf16": STALL, "fp32_drop": DROPOUT, "bf16_sr": 0.0, "fp32_twin": 0.0,
              "bf16_drop": STALL + DROPOUT + interaction}  # fmt: skip
    kl_factor = {"bf16_drop": 0.1, "bf16": 0.3, "fp32_drop": 0.5}
    rows = []
    for s in range(1, n_seeds + 1):
        shared = rng.normal(0, 0.05)
        for arm in SPECS:
            for role, tasks in TASKS.items():
                for task in tasks:
                    rows.append({
                        "run": f"{arm}-s{s}", "precision": arm, "seed": s, "task": task, "role": role,
                        "dJ": 0.3 + shared + effect[arm] + rng.normal(0, sd), "noise": 1e-5,
                        "kl": 0.3 * kl_factor.get(arm, 1.0) * np.exp(rng.normal(0, 0.1)), "kl_var": 1e-6,
                    })  # fmt: skip
    return pd.DataFrame(rows)


def decomposed(t: pd.DataFrame) -> dict:
    return dc.decompose(t, TASKS, am.arms_block(SPECS, list(SPECS)), 0.05)


def test_an_additive_bundle_splits_into_its_parts_with_no_interaction():
    out = decomposed(table())
    b = out["bundles"]["bf16_drop"]
    assert b["status"] == "ok" and b["parts"] == {"masters": "bf16", "dropout": "fp32_drop"}
    q = b["on_task_dJ"]
    assert q["bundle"]["ci"][0] < STALL + DROPOUT < q["bundle"]["ci"][1]
    assert q["parts"]["bf16"]["ci"][0] < STALL < q["parts"]["bf16"]["ci"][1]
    assert q["parts"]["fp32_drop"]["ci"][0] < DROPOUT < q["parts"]["fp32_drop"]["ci"][1]
    assert q["interaction"]["ci"][0] < 0 < q["interaction"]["ci"][1]
    assert q["largest_part"] == "bf16"
    # log KL: the bundle drifts a tenth as far, the stall 0.3x: multiplicative effects add on this scale
    kl = b["off_task_log_kl"]
    assert kl["bundle"]["ci"][0] < np.log(0.1) < kl["bundle"]["ci"][1]
    assert kl["parts"]["bf16"]["ci"][0] < np.log(0.3) < kl["parts"]["bf16"]["ci"][1]
    main = out["main_effects"]
    assert set(main) == {"bf16", "fp32_drop", "bf16_sr"}  # the twin and the bundle are no main effects
    assert main["bf16_sr"]["on_task_dJ"]["ci"][0] < 0 < main["bf16_sr"]["on_task_dJ"]["ci"][1]


def test_a_planted_interaction_is_found():
    q = decomposed(table(interaction=0.06))["bundles"]["bf16_drop"]["on_task_dJ"]
    assert q["interaction"]["p"] < 0.01 and q["interaction"]["ci"][0] > 0.03


@pytest.mark.parametrize("n_tables", [40, pytest.param(80, marks=pytest.mark.extended)])
def test_the_interaction_interval_misses_zero_at_most_at_alpha(n_tables: int):
    """Coverage of the t interval with no interaction planted: tables of 6 seeds (~85 ms each); at alpha
    0.05 the 0.999 one-sided binomial bound on misses is 7 of the default tier's 40 tables, 11 of 80."""
    misses = 0
    for s in range(n_tables):
        q = decomposed(table(n_seeds=6, sd=0.02, seed=100 + s))["bundles"]["bf16_drop"]["on_task_dJ"]
        misses += not (q["interaction"]["ci"][0] < 0 < q["interaction"]["ci"][1])
    assert misses <= st.binom.ppf(0.999, n_tables, 0.05), misses


def test_a_bundle_without_a_single_factor_arm_for_every_part_says_which_is_missing():
    specs = {k: v for k, v in SPECS.items() if k != "fp32_drop"}
    t = table()
    out = dc.decompose(t[t["precision"] != "fp32_drop"], TASKS, am.arms_block(specs, list(specs)), 0.05)
    b = out["bundles"]["bf16_drop"]
    assert b["status"] == "incomplete" and "dropout 0.1" in b["reason"]
    # still: the bundle's whole effect, and dropout's effect given the stall (bf16_drop - bf16)
    whole = b["whole"]["on_task_dJ"]
    assert whole["ci"][0] < STALL + DROPOUT < whole["ci"][1]
    given = b["nested"]["bf16"]
    assert given["factor"] == "dropout"
    assert given["given"] == ["rounding stall (bf16 masters, round-to-nearest)"]
    assert given["on_task_dJ"]["ci"][0] < DROPOUT < given["on_task_dJ"]["ci"][1]
    assert set(b["nested"]) == {"bf16"}  # not bf16_sr (another masters value), not the twin (a control)


def test_each_factor_of_a_complete_bundle_is_also_given_the_other():
    b = decomposed(table())["bundles"]["bf16_drop"]
    assert {o: n["factor"] for o, n in b["nested"].items()} == {"bf16": "dropout", "fp32_drop": "masters"}
    stall = b["nested"]["fp32_drop"]["on_task_dJ"]  # bf16_drop - fp32_drop: the stall given dropout
    assert stall["ci"][0] < STALL < stall["ci"][1]


def test_missing_or_zero_kl_leaves_out_the_log_scale_only():
    t = table()
    t.loc[t.index[t["role"] == "off_task"][0], "kl"] = np.nan
    assert "off_task_log_kl" not in decomposed(t)["bundles"]["bf16_drop"]
    t = table()
    t.loc[(t["role"] == "off_task") & (t["run"] == "bf16-s1"), "kl"] = 0.0
    bundle = decomposed(t)["bundles"]["bf16_drop"]
    assert "off_task_log_kl" not in bundle and "on_task_dJ" in bundle


def test_a_contrast_between_arms_on_different_bases_carries_the_bases_noise():
    """bf16 arms are measured from base-bfloat16: bf16 - fp32 adds both bases' eval noise to its SE; the
    interaction (bf16_drop - bf16 - fp32_drop + fp32) cancels the bases and adds none."""
    t = table()
    base_of = {"bf16_drop": "base-bfloat16", "bf16": "base-bfloat16", "bf16_sr": "base-bfloat16"}
    t["reference_run"] = t["precision"].map(base_of).fillna("base")
    base = pd.DataFrame(
        [
            {"run": b, "task": task, "noise": 4e-4}
            for b in ("base", "base-bfloat16")
            for task in ("add", "mul", "chain")
        ]
    )
    bases = dc.base_noise(t, base, list(SPECS))
    assert bases["bf16"]["base"] == "base-bfloat16" and bases["fp32"]["base"] == "base"
    plain = decomposed(t)["main_effects"]["bf16"]["on_task_dJ"]
    out = dc.decompose(t, TASKS, am.arms_block(SPECS, list(SPECS)), 0.05, bases)
    noisy = out["main_effects"]["bf16"]["on_task_dJ"]
    assert noisy["base_var"] == pytest.approx(8e-4)
    assert noisy["se"] ** 2 == pytest.approx(plain["se"] ** 2 + 8e-4)
    assert "base_var" not in out["main_effects"]["fp32_drop"]["on_task_dJ"]  # same base as fp32
    assert "base_var" not in out["bundles"]["bf16_drop"]["on_task_dJ"]["interaction"]


def test_carries_the_most_needs_the_difference_of_the_two_parts_shown():
    """Stall -0.09 vs dropout -0.08 with a small spread: the difference is shown; with the parts equal
    (-0.09 each, a large noise) it is not, and carries_most says so."""
    q = decomposed(table(sd=0.002))["bundles"]["bf16_drop"]["on_task_dJ"]
    (d,) = q["part_differences"].values()
    assert (d["first"], d["second"]) == ("bf16", "fp32_drop") and d["ci"][0] > 0
    assert q["carries_most"]["supported"] and q["carries_most"]["arm"] == "bf16"
    equal = table(sd=0.03)
    equal.loc[equal["precision"] == "fp32_drop", "dJ"] += STALL - DROPOUT
    q = decomposed(equal)["bundles"]["bf16_drop"]["on_task_dJ"]
    assert not q["carries_most"]["supported"] and "reaches 0" in q["carries_most"]["reason"]


def test_an_off_task_task_training_does_not_move_is_inert_and_a_moved_one_is_not():
    """mcq at chance: dJ only its eval noise, KL a thousandth of the other tasks': inert; mul is not."""
    from workflow_scripts.statistics import scopes as sc

    rng = np.random.default_rng(5)
    t = table()
    mcq = t[t["task"] == "mul"].assign(task="mcq")
    mcq = mcq.assign(dJ=rng.normal(0, np.sqrt(1e-5), len(mcq)), kl=1e-4)
    t = pd.concat([t, mcq], ignore_index=True)
    inert = sc.inert_tasks(t, "fp32", ["mul", "chain", "mcq"], {"mcq": 1e-5}, 0.05)  # base eval noise
    assert list(inert) == ["mcq"] and inert["mcq"]["kl_share_of_largest"] < 0.01
    assert sc.inert_tasks(t, "fp32", ["mul", "chain"], {}, 0.05) == {}
