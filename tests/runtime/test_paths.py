"""Run names and the results layout have one owner (workflow_scripts.runtime.paths)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import load_test_config

from workflow_scripts.runtime import paths
from workflow_scripts.runtime.config import validate_config


def test_run_names_are_the_base_runs_then_every_arm_and_seed():
    cfg = validate_config(load_test_config())  # model float32; arms fp32, bf16; seeds 1, 2
    assert paths.run_names(cfg) == ["base", "base-bfloat16", "fp32-s1", "fp32-s2", "bf16-s1", "bf16-s2"]
    cfg["precisions"]["amp"] = {"param_dtype": "float32", "autocast": "bfloat16"}
    assert paths.base_runs(validate_config(cfg)) == ["base", "base-bfloat16"]  # one per distinct dtype


def test_parse_run_inverts_the_naming():
    parsed = paths.parse_run("bf16_autocast-s12")
    assert parsed == paths.Run("bf16_autocast-s12", "bf16_autocast", 12, repeat=1)
    assert paths.parse_run("base") == paths.Run("base")
    assert paths.parse_run("base-bfloat16").dtype == "bfloat16"
    assert paths.parse_run("base-s1").precision == "base"  # only dtypes make a base run
    with pytest.raises(ValueError, match="not a run name"):
        paths.parse_run("fp32")


def test_each_trained_run_is_compared_with_the_base_in_its_arms_dtype():
    cfg = validate_config(load_test_config())
    assert paths.reference_run(cfg, "bf16-s2") == "base-bfloat16"
    assert paths.reference_run(cfg, "fp32-s1") == "base"
    assert paths.reference_run(cfg, "base-bfloat16") == "base-bfloat16"


def test_model_folders_and_patterns_come_from_one_mapping():
    assert paths.model_dir("bf16-s3") == Path("results/train/bf16/seed3/model")
    assert paths.model_dir("base") == paths.model_dir("base-bfloat16") == Path("results/models/base")
    assert str(paths.train_dir("{precision}", "{seed}")) == "results/train/{precision}/seed{seed}"
    assert paths.eval_summary("fp32-s1", "mul", "out") == Path("out/eval/fp32-s1/mul.json")
    assert paths.checkpoint_dir("fp32", 1) == Path("results/checkpoints/fp32/seed1")


def test_a_repeat_is_named_after_its_arm_seed_and_repeat_and_round_trips():
    assert paths.run_name("bf16", 1, 2) == "bf16-s1-r2" and paths.run_name("bf16", 1, 1) == "bf16-s1"
    assert paths.parse_run("bf16-s1-r2") == paths.Run("bf16-s1-r2", "bf16", 1, repeat=2)
    assert paths.stream_run("bf16-s1-r2") == "bf16-s1" == paths.stream_run("bf16-s1")
    assert paths.stream_run("base-bfloat16") == "base-bfloat16"
    for name in ("bf16-s1-r1", "bf16-s1-r0"):  # the first run has no suffix: one name per run
        with pytest.raises(ValueError, match="k >= 2"):
            paths.parse_run(name)


def test_repeats_get_their_own_train_checkpoint_and_eval_folders():
    assert paths.model_dir("bf16-s3-r2") == Path("results/train/bf16/seed3-r2/model")
    assert paths.checkpoint_dir("bf16", 3, repeat=2) == Path("results/checkpoints/bf16/seed3-r2")
    assert paths.eval_dir("bf16-s3-r2") == Path("results/eval/bf16-s3-r2")
    pattern = paths.train_dir("{precision}", "{seed}", repeat="{repeat}")
    assert str(pattern) == "results/train/{precision}/seed{seed}-r{repeat}"


def test_config_repeats_add_runs_after_every_arm_and_seed():
    cfg = load_test_config()
    cfg["repeats"] = [{"precision": "bf16", "seed": 2, "copies": 2}, {"precision": "fp32", "seed": 1}]
    cfg = validate_config(cfg)
    assert paths.repeats(cfg) == [("bf16", 2, 2), ("bf16", 2, 3), ("fp32", 1, 2)]
    assert paths.run_names(cfg)[-3:] == ["bf16-s2-r2", "bf16-s2-r3", "fp32-s1-r2"]
    assert paths.reference_run(cfg, "bf16-s2-r3") == "base-bfloat16"
