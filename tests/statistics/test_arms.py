"""What each arm is: factors, names of the differences from the reference, and one meaning per arm name
across the shipped configs."""

from __future__ import annotations

from pathlib import Path

import pytest

from workflow_scripts.runtime.config import load_config
from workflow_scripts.statistics import arms

REPO = Path(__file__).resolve().parents[2]
SHIPPED = sorted(REPO.glob("config*.yaml"))
FP32 = {"param_dtype": "float32", "deterministic": True, "dropout": 0.0}
BF16 = {"param_dtype": "bfloat16", "deterministic": True, "dropout": 0.0}


def test_an_arm_name_means_the_same_factors_in_every_shipped_config():
    configs = {p.name: load_config(p, check_files=False)["precisions"] for p in SHIPPED}
    assert len(configs) >= 6 and "config.yaml" in configs
    assert arms.name_conflicts(configs) == []
    # the bf16 arm of the default and of the GPU configs is the rounding stall alone, no dropout
    for name in ("config.yaml", "config.paper.yaml", "config.one-node.yaml", "config.gpu-smoke.yaml"):
        assert arms.factors(configs[name]["bf16"]) == arms.factors(BF16), name


def test_a_conflicting_name_is_reported_with_the_factor_that_differs():
    configs = {"a.yaml": {"bf16": BF16}, "b.yaml": {"bf16": {**BF16, "dropout": 0.1}}}
    (line,) = arms.name_conflicts(configs)
    assert "'bf16'" in line and "a.yaml" in line and "b.yaml" in line and "'dropout': (0.0, 0.1)" in line
    twin = {"a.yaml": {"fp32": FP32}, "b.yaml": {"fp32": {**FP32, "seed_offset": 1000}}}
    assert arms.name_conflicts(twin)  # a twin and the reference under one name are two things


def test_the_default_takes_the_bf16_bundle_apart_into_single_factor_arms():
    config = load_config(REPO / "config.yaml", check_files=False)
    block = arms.arms_block(config["precisions"], list(config["precisions"]))
    kinds = {a: b["kind"] for a, b in block.items()}
    assert kinds == {
        "fp32": "reference",
        "bf16_drop": "bundle",
        "bf16": "single factor",
        "fp32_drop": "single factor",
        "bf16_sr": "single factor",
    }  # the separately seeded twin: config.controls.yaml only (the default's null: its 16-seed reference)
    assert block["bf16_drop"]["effects"] == ["rounding stall (bf16 masters, round-to-nearest)", "dropout 0.1"]
    assert block["bf16"]["effects"] == ["rounding stall (bf16 masters, round-to-nearest)"]
    assert block["bf16_sr"]["effects"] == ["precision noise (bf16 masters, stochastic rounding)"]
    controls = load_config(REPO / "config.controls.yaml", check_files=False)
    twin = arms.arms_block(controls["precisions"], list(controls["precisions"]))["fp32_twin"]
    assert twin["kind"] == "null twin"
    assert twin["description"]["seeds"] == "s + 1000"
    assert twin["description"]["control"] == "negative"


@pytest.mark.parametrize(
    ("entry", "cells"),
    [
        (FP32, {"masters": "fp32", "compute": "fp32", "sampler": "fp32, eval mode", "dropout": "0"}),
        (
            {**BF16, "dropout": 0.1},
            {"masters": "bf16 round-to-nearest", "compute": "bf16", "dropout": "0.1 (loss forward only)"},
        ),
        ({**FP32, "autocast": "bfloat16"}, {"masters": "fp32", "compute": "bf16 (autocast)"}),
        ({**BF16, "rounding": "stochastic"}, {"masters": "bf16 stochastic rounding"}),
    ],
)
def test_the_arm_table_says_what_an_arm_stores_computes_and_samples_in(entry, cells):
    d = arms.describe(entry)
    assert {k: d[k] for k in cells} == cells
    assert d["optimizer"].startswith("AdamW, states in " + d["masters"][:4])


def test_compute_and_head_are_factors_only_where_they_differ_from_the_masters():
    assert arms.differences(BF16, FP32) == {"masters": ["fp32", "bf16 round-to-nearest"]}
    autocast = {**FP32, "autocast": "bfloat16"}
    assert arms.differences(autocast, FP32) == {"compute": ["as masters", "bf16 autocast"]}
    assert arms.effect_name("compute", ["as masters", "bf16 autocast"]) == "bf16 autocast compute"
    head = {**BF16, "lm_head_dtype": "float32"}
    assert set(arms.differences(head, FP32)) == {"masters", "lm_head"}
    assert arms.twin_of({**FP32, "seed_offset": 7, "control": "negative"}, FP32)


def test_arms_without_config_entries_are_not_described():
    assert arms.arms_block({"fp32": {}, "bf16": {"control": "negative"}}, ["fp32", "bf16"]) == {}
    block = arms.arms_block({"fp32": FP32}, ["fp32", "other"])
    assert block["other"]["kind"] == "unknown"
