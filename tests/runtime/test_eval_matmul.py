"""Which ``bf16_matmul`` an evaluate job runs with (``runtime.eval_matmul``): its run's training path."""

import pytest

from workflow_scripts.runtime import eval_matmul

BF16 = {"param_dtype": "bfloat16"}
AMP = {"param_dtype": "float32", "autocast": "bfloat16"}  # bf16 products over fp32 masters


def _config(**arms: dict) -> dict:
    return {"model": {"dtype": "float32"}, "precisions": {"fp32": {"param_dtype": "float32"}, **arms}}


def test_a_trained_run_and_its_repeats_are_evaluated_with_their_arms_setting():
    config = _config(bf16={**BF16, "bf16_matmul": "emulated"}, amp={**AMP, "bf16_matmul": "native"})
    assert eval_matmul.bf16_matmul(config, "bf16-s1") == "emulated"
    assert eval_matmul.bf16_matmul(config, "bf16-s1-r2") == "emulated"
    assert eval_matmul.bf16_matmul(config, "amp-s3") == "native"
    assert eval_matmul.bf16_matmul(config, "fp32-s1") == "auto"  # the schema's default


def test_the_bf16_base_run_takes_the_setting_its_arms_share_and_other_bases_take_none():
    config = _config(
        bf16={**BF16, "bf16_matmul": "native"},
        bf16_sr={**BF16, "bf16_matmul": "native", "rounding": "stochastic"},
        amp={**AMP, "bf16_matmul": "emulated"},
    )
    assert eval_matmul.bf16_matmul(config, "base-bfloat16") == "native"
    assert eval_matmul.bf16_matmul(config, "base") == "auto"  # float32: no bf16 product, amp's is moot
    assert list(eval_matmul.problems(config)) == []
    config["model"]["dtype"] = "bfloat16"  # the base as saved is then the bf16 arms' reference
    assert eval_matmul.bf16_matmul(config, "base") == "native"
    assert eval_matmul.bf16_matmul(config, "base-float32") == "auto"


def test_bf16_arms_that_disagree_are_a_problem_naming_each_arms_key():
    config = _config(bf16=BF16, bf16_emulated={**BF16, "bf16_matmul": "emulated"})
    found = dict(eval_matmul.problems(config))
    assert set(found) == {"precisions.bf16.bf16_matmul", "precisions.bf16_emulated.bf16_matmul"}
    assert "bf16: auto, bf16_emulated: emulated" in found["precisions.bf16.bf16_matmul"]
    assert "base-bfloat16" in found["precisions.bf16.bf16_matmul"]
    with pytest.raises(ValueError, match=r"precisions\.bf16\.bf16_matmul"):
        eval_matmul.bf16_matmul(config, "base-bfloat16")
    assert eval_matmul.bf16_matmul(config, "bf16_emulated-s1") == "emulated"  # trained runs: unambiguous
