"""A reference with more seeds than the other arms (the default: fp32 at 16, the others at 8, seeds 1-8
paired): the run list, the config rules and the analysis take unequal seeds (paths.arm_seeds)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import REPO

from workflow_scripts import stats
from workflow_scripts.runtime import paths
from workflow_scripts.runtime.config import load_config
from workflow_scripts.statistics import simulation


def test_the_default_trains_16_reference_seeds_and_8_of_every_other_arm_paired_on_1_to_8():
    config = load_config(REPO / "config.yaml", check_files=False)
    assert "fp32_twin" not in config["precisions"]  # the separately seeded twin: config.controls.yaml only
    assert paths.arm_seeds(config, "fp32") == list(range(1, 17))
    others = [a for a in config["precisions"] if a != "fp32"]
    assert others and all(paths.arm_seeds(config, a) == list(range(1, 9)) for a in others)
    runs = paths.trained_runs(config)
    assert len(runs) == 16 + 8 * len(others) == len(set(runs))
    assert "fp32-s16" in runs and "bf16-s9" not in runs
    assert paths.overlap_seeds(config, "fp32") == list(range(1, 9))  # the same seed pairs in every arm
    controls = load_config(REPO / "config.controls.yaml", check_files=False)
    assert controls["precisions"]["fp32_twin"]["control"] == "negative"
    assert paths.arm_seeds(controls, "fp32") == list(range(1, 9))


def test_a_repeat_must_name_one_of_its_arms_own_seeds():
    import copy

    from workflow_scripts.runtime.config import ConfigError, validate_config

    config = load_config(REPO / "config.yaml", check_files=False)
    ok = {**copy.deepcopy(config), "repeats": [{"precision": "fp32", "seed": 12}]}
    validate_config(ok, check_files=False)
    with pytest.raises(ConfigError, match=r"repeats\.0\.seed.*arm's seeds"):
        validate_config({**ok, "repeats": [{"precision": "bf16", "seed": 12}]}, check_files=False)


def test_the_analysis_compares_every_arm_with_all_reference_seeds_and_pairs_the_shared_ones():
    table = simulation.simulate_table(np.random.default_rng(5), n_seeds=16, arms=("fp32", "bf16", "bf16_sr"))
    table = table[~((table["precision"] != "fp32") & (table["seed"] > 8))]
    # the power search still runs, on 5 simulations (nothing here reads it; 10 took 1.5x the time)
    fast = {"bootstrap": 100, "power_simulations": 5, "max_seeds": 16, "null_splits": 20}
    out = stats.analyze(table, fast, precisions=["fp32", "bf16", "bf16_sr"])
    assert out["n"]["seeds"] == {"fp32": 16, "bf16": 8, "bf16_sr": 8}
    off = out["by_task_type"]["off_task"]
    assert off["arms"]["fp32"]["n_seeds"] == 16
    for arm in ("bf16", "bf16_sr"):
        comp = off["comparisons"][arm]
        assert comp["n_seeds"] == [8, 16] and comp["paired"]
        assert comp["dJ_mean"]["design"] == "paired"
        assert comp["dJ_model"]["status"] == "ok"
    assert set(out["verdicts"]) >= {"H1", "H2", "H3"}
