"""TRL's vLLM importance-sampling correction is a stated train setting, never TRL's silent default."""

from __future__ import annotations

import pytest
import yaml
from conftest import REPO, load_test_config

from workflow_scripts.runtime.config import ConfigError, validate_config
from workflow_scripts.training.grpo_config import grpo_config, importance_sampling_record
from workflow_scripts.training.precision import PrecisionMode

FP32 = PrecisionMode.from_config("fp32", {"param_dtype": "float32", "deterministic": True})


def _config(**sampling) -> dict:
    cfg = load_test_config()
    cfg["train"]["importance_sampling"] = sampling
    return cfg


def test_the_default_turns_trls_correction_off_explicitly(tmp_path):
    from trl import GRPOConfig

    assert GRPOConfig.vllm_importance_sampling_correction is True  # what TRL alone would do
    train = validate_config(load_test_config())["train"]
    args = grpo_config(train, FP32, 1, tmp_path, world_size=1)
    assert args.vllm_importance_sampling_correction is False
    assert importance_sampling_record(args) == {
        "correction": False, "mode": "token_truncate", "clip_min": None, "clip_max": 3.0, "acts": False,
    }  # fmt: skip


def test_every_key_reaches_grpo_config_and_the_record_says_it_acts_only_with_vllm(tmp_path):
    cfg = _config(correction=True, mode="sequence_mask", clip_min=0.5, clip_max=2.0)
    train = validate_config(cfg)["train"]
    args = grpo_config(train, FP32, 1, tmp_path, world_size=1)
    given = [
        getattr(args, f"vllm_importance_sampling_{f}") for f in ("correction", "mode", "clip_min", "clip_max")
    ]
    assert given == [True, "sequence_mask", 0.5, 2.0]
    assert importance_sampling_record(args)["acts"] is False  # use_vllm false: the HF sampler is the policy
    args.use_vllm = True
    assert importance_sampling_record(args)["acts"] is True


@pytest.mark.parametrize(
    ("sampling", "key", "match"),
    [
        ({"correction": True, "clip_max": None}, "train.importance_sampling.clip_max", "needs a bound"),
        ({"clip_min": 3.0, "clip_max": 2.0}, "train.importance_sampling.clip_min", "below clip_max"),
        ({"mode": "token"}, "train.importance_sampling.mode", "token"),
        ({"cap": 3.0}, "train.importance_sampling.cap", "unknown key"),
    ],
)
def test_a_bad_correction_setting_is_a_config_error_naming_file_and_key(sampling, key, match):
    with pytest.raises(ConfigError, match=rf"other\.yaml: {key}: .*{match}"):
        validate_config(_config(**sampling), source="other.yaml")


def test_the_paper_config_states_its_choice_instead_of_inheriting_a_default():
    raw = yaml.safe_load((REPO / "config.paper.yaml").read_text())
    assert set(raw["train"]["importance_sampling"]) == {"correction", "mode", "clip_min", "clip_max"}
    lines = (REPO / "config.paper.yaml").read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip().startswith("importance_sampling:"))
    assert lines[at - 1].strip().startswith("#")  # and says why, right above
