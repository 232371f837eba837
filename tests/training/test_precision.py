"""Precision modes and the config -> GRPOConfig mapping (fast: no training here; see test_train.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from workflow_scripts.models.modeling import load_model
from workflow_scripts.runtime.config import ConfigError, load_config
from workflow_scripts.training.grpo_config import generation_period, grpo_config, reward_functions, save_steps
from workflow_scripts.training.precision import (
    AutocastProbe,
    PrecisionError,
    PrecisionMode,
    apply_determinism,
    autocast_context,
    check_param_dtypes,
    check_saved_dtypes,
    check_supported,
    enable_cpu_fp16,
    load_policy,
    mode_from_config,
    saved_dtypes,
    trainer_precision_args,
)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def default_config() -> dict:
    return load_config(REPO / "config.yaml", check_files=False)


def test_modes_from_default_config(default_config):
    fp32 = mode_from_config(default_config, "fp32")
    bf16 = mode_from_config(default_config, "bf16")
    bundle = mode_from_config(default_config, "bf16_drop")
    assert (fp32.param_dtype, fp32.autocast, fp32.deterministic, fp32.dropout) == ("float32", None, True, 0.0)
    bf16_factors = (bf16.param_dtype, bf16.autocast, bf16.deterministic, bf16.dropout)
    assert bf16_factors == ("bfloat16", None, True, 0.0)
    assert (bundle.param_dtype, bundle.dropout, bundle.rounding) == ("bfloat16", 0.1, "nearest")
    assert mode_from_config(default_config, "bf16_sr").rounding == "stochastic"
    assert fp32.torch_param_dtype is torch.float32 and bf16.torch_param_dtype is torch.bfloat16
    with pytest.raises(PrecisionError, match="unknown precision"):
        mode_from_config(default_config, "fp8")


@pytest.mark.parametrize(
    ("entry", "match"),
    [
        ({"param_dtype": "float32", "autocast": "float32"}, "only lowers precision"),
        ({"param_dtype": "bfloat16", "autocast": "bfloat16"}, "no-op"),
        ({"param_dtype": "bfloat16", "autocast": "float16"}, "float32 masters only"),
    ],
)
def test_impossible_modes_are_rejected(entry, match):
    with pytest.raises(ConfigError, match=match):
        PrecisionMode.from_config("x", entry)


@pytest.mark.parametrize(
    ("entry", "key", "match"),
    [
        ({"param_dtype": "float32", "rounding": "stochastic"}, "rounding", "into bfloat16 masters"),
        (
            {"param_dtype": "bfloat16", "lm_head_dtype": "float16"},
            "lm_head_dtype",
            "param_dtype .* or float32",
        ),
    ],
)
def test_arm_fields_that_cannot_be_honoured_are_config_errors_naming_the_key(entry, key, match):
    with pytest.raises(ConfigError, match=rf"precisions\.x\.{key}: .*{match}"):
        PrecisionMode.from_config("x", entry)


def test_a_shipped_config_with_a_bad_arm_field_names_the_file_and_the_key(tmp_path):
    import yaml

    config = yaml.safe_load((REPO / "config.yaml").read_text())
    config["precisions"]["bf16"]["bf16_matmul"] = "fast"
    config["precisions"]["fp32"]["rounding"] = "stochastic"
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(ConfigError, match=rf"{path}: precisions\.bf16\.bf16_matmul: 'fast' is not one of"):
        load_config(path, check_files=False)
    config["precisions"]["bf16"]["bf16_matmul"] = "emulated"
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(ConfigError, match=rf"{path}: precisions\.fp32\.rounding: stochastic rounding"):
        load_config(path, check_files=False)


def test_new_arm_fields_default_to_the_unchanged_arm(default_config):
    mode = mode_from_config(default_config, "bf16")
    assert (mode.bf16_matmul, mode.rounding, mode.update_noise, mode.control) == (
        "auto",
        "nearest",
        None,
        None,
    )
    assert (mode.lm_head_dtype, mode.head_dtype, mode.seed_offset) == (None, "bfloat16", 0)
    assert mode.computes_bf16 and not mode_from_config(default_config, "fp32").computes_bf16


def test_trainer_args_always_set_bf16_and_fp16_explicitly():
    # GRPOConfig would otherwise turn bf16 autocast ON by default
    assert trainer_precision_args(PrecisionMode("fp32", "float32")) == {
        "bf16": False,
        "fp16": False,
        "disable_dropout": False,
        "full_determinism": False,
        "cast_lm_head_to_fp32": False,
    }
    head32 = trainer_precision_args(PrecisionMode("bf16h", "bfloat16", lm_head_dtype="float32"))
    assert head32["cast_lm_head_to_fp32"] is True  # TRL's fp32 LM head
    assert trainer_precision_args(PrecisionMode("bf16", "bfloat16"))["bf16"] is False
    amp = trainer_precision_args(PrecisionMode("amp", "float32", autocast="bfloat16"))
    assert amp["bf16"] is True and amp["fp16"] is False
    assert trainer_precision_args(PrecisionMode("amp16", "float32", autocast="float16"))["fp16"] is True


def test_fp16_autocast_runs_on_cuda_and_cpu_and_is_refused_elsewhere_with_a_clear_error():
    mode = PrecisionMode("fp16_amp", "float32", autocast="float16")
    check_supported(mode, "cpu")  # torch's CPU autocast and GradScaler (enable_cpu_fp16)
    with autocast_context(mode, "cpu"):
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.float16
    with pytest.raises(PrecisionError, match="runs on CUDA or CPU"):
        check_supported(mode, "mps")
    check_supported(PrecisionMode("amp", "float32", autocast="bfloat16"), "cpu")  # fine on CPU


def test_accelerate_silently_skips_fp16_on_cpu_and_enable_cpu_fp16_switches_autocast_and_a_scaler_on():
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state()  # the process-wide state (as the Trainer does before its own)
    try:
        accelerator = Accelerator(mixed_precision="fp16", cpu=True)
        assert accelerator.scaler is None and accelerator.native_amp is False  # accelerate 1.15 on CPU: fp32
        assert enable_cpu_fp16(accelerator) is True
        assert isinstance(accelerator.scaler, torch.amp.GradScaler) and accelerator.native_amp
        with accelerator.autocast():
            assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.float16
        assert enable_cpu_fp16(accelerator) is False  # once
    finally:
        AcceleratorState._reset_state()


def test_determinism_switch_is_set_and_unset():
    try:
        on = apply_determinism(PrecisionMode("a", "float32", deterministic=True))
        assert on["use_deterministic_algorithms"] and torch.are_deterministic_algorithms_enabled()
        assert on["cublas_workspace_config"] and on["tf32"] is False
        assert not torch.backends.cuda.matmul.allow_tf32
        off = apply_determinism(PrecisionMode("b", "float32", deterministic=False))
        assert not off["use_deterministic_algorithms"] and not torch.are_deterministic_algorithms_enabled()
    finally:
        torch.use_deterministic_algorithms(False)


def test_grpo_config_mapping_default(default_config):
    train = default_config["train"]
    mode = mode_from_config(default_config, "fp32")
    args = grpo_config(train, mode, seed=3, out_dir="/tmp/unused", world_size=1)
    # DAPO: token-level loss, clip-higher, no KL term
    assert (args.loss_type, args.epsilon, args.epsilon_high, args.beta) == ("dapo", 0.2, 0.28, 0.0)
    # precision: no autocast in the fp32 arm (GRPOConfig's default would be bf16=True)
    assert args.bf16 is False and args.fp16 is False
    assert args.activation_checkpointing is False and args.gradient_checkpointing is False
    on = grpo_config({**train, "activation_checkpointing": True}, mode, 3, "/tmp/unused", world_size=1)
    assert on.activation_checkpointing is True
    assert args.disable_dropout is False
    # batch geometry: 16 prompts x 8 generations per optimizer step, 4 optimizer steps per rollout
    assert args.per_device_train_batch_size == 16 * 8
    assert args.steps_per_generation == 4 > args.gradient_accumulation_steps == 1  # clipping can act
    assert args.generation_batch_size == 16 * 8 * 4 and args.num_generations == 8
    assert (args.temperature, args.top_p, args.top_k) == (1.0, 1.0, 0)
    assert (args.max_steps, args.learning_rate, args.max_completion_length) == (48, 6e-5, 8)
    assert args.seed == 3 and args.logging_steps == 1 and args.save_steps == 24 and args.save_total_limit == 1
    assert args.use_vllm is False and args.reward_weights is None and args.mask_truncated_completions is False
    assert len(reward_functions(train, "integer")) == 1


def test_grpo_config_autocast_arm_and_world_size(default_config):
    train = dict(default_config["train"], gradient_accumulation_steps=2, steps_per_generation=4)
    mode = PrecisionMode("amp", "float32", autocast="bfloat16")
    args = grpo_config(train, mode, seed=1, out_dir="/tmp/unused", world_size=4)
    assert args.bf16 is True and args.fp16 is False
    assert args.per_device_train_batch_size == 16 * 8 // (2 * 4)


def test_checkpoints_fall_on_generation_rounds():
    base = {"steps_per_generation": 4, "num_iterations": 1, "gradient_accumulation_steps": 1}
    assert generation_period(base) == 4
    assert save_steps(dict(base, checkpoint_every=100)) == 100
    assert save_steps(dict(base, checkpoint_every=3)) == 4
    assert save_steps(dict(base, checkpoint_every=5, num_iterations=2)) == 8
    assert generation_period(dict(base, gradient_accumulation_steps=2)) == 2


def test_overlong_punishment_uses_trl_helper(default_config):
    train = dict(
        default_config["train"], overlong_buffer=4, overlong_penalty=0.5, mask_truncated_completions=True
    )
    args = grpo_config(train, mode_from_config(default_config, "fp32"), seed=1, out_dir="/tmp/unused")
    assert args.reward_weights == [1.0, 0.5] and args.mask_truncated_completions is True
    funcs = reward_functions(train, "integer")
    assert [f.__name__ for f in funcs] == ["integer_reward", "soft_overlong_punishment_reward"]
    assert funcs[1](completion_ids=[[1] * 3, [1] * 6, [1] * 8]) == [0.0, -0.5, -1.0]


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ({"steps_per_generation": 3, "gradient_accumulation_steps": 2}, "train.steps_per_generation"),
        (
            {"prompts_per_step": 3, "num_generations": 3, "gradient_accumulation_steps": 2},
            "train.gradient_accumulation_steps",
        ),
        ({"overlong_buffer": 8}, "train.overlong_buffer"),
        ({"epsilon_high": 0.1}, "train.epsilon_high"),
    ],
)
def test_grpo_config_rejects_inconsistent_train_sections(default_config, override, key):
    train = dict(default_config["train"], **override)
    with pytest.raises(ConfigError, match=key):
        grpo_config(train, mode_from_config(default_config, "fp32"), seed=1, out_dir="/tmp/unused")


def test_use_vllm_without_vllm_is_a_clear_error(default_config, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a)
    )
    train = dict(default_config["train"], use_vllm=True)
    with pytest.raises(ConfigError, match=r"vllm is not installed.*pip install '\.\[gpu\]'"):
        grpo_config(train, mode_from_config(default_config, "fp32"), seed=1, out_dir="/tmp/unused")


def test_paper_config_validates_and_maps():
    config = load_config(REPO / "config.paper.yaml", check_files=False)
    assert config["model"]["source"] == "Qwen/Qwen2.5-Math-7B"
    train = config["train"]
    assert train["learning_rate"] == 1e-6 and train["num_generations"] == 16 and train["max_steps"] == 300
    modes = {name: mode_from_config(config, name) for name in config["precisions"]}
    args = grpo_config(
        dict(train, use_vllm=False), modes["bf16"], seed=1, out_dir="/tmp/unused", world_size=8
    )
    assert (
        args.per_device_train_batch_size * 8 * args.gradient_accumulation_steps
        == train["prompts_per_step"] * 16
    )
    assert args.steps_per_generation > args.gradient_accumulation_steps


def test_load_policy_dtypes_and_dropout(tiny_base):
    base = tiny_base["base_dir"]
    fp32 = load_policy(base, PrecisionMode("fp32", "float32"))
    assert {p.dtype for p in fp32.parameters()} == {torch.float32}
    bf16 = load_policy(base, PrecisionMode("bf16", "bfloat16", dropout=0.1))
    assert {p.dtype for p in bf16.parameters()} == {torch.bfloat16}
    assert bf16.config.attention_dropout == 0.1
    # the check fails loudly, naming the offending tensor
    fp32.model.norm.weight.data = fp32.model.norm.weight.data.to(torch.bfloat16)
    with pytest.raises(PrecisionError, match=r"1/\d+ trainable tensors are not float32: model\.norm\.weight"):
        check_param_dtypes(fp32, PrecisionMode("fp32", "float32"))
    assert set(saved_dtypes(base).values()) == {"float32"}


def test_autocast_probe_observes_what_runs(tiny_base):
    model = load_model(tiny_base["base_dir"], "float32")
    ids = torch.tensor([[5, 6, 7]])
    plain = AutocastProbe(model)
    with torch.no_grad():
        model(ids)  # no-grad forwards (generation) are ignored
    assert plain.record is None
    model(ids)
    assert plain.record["enabled"] is False and plain.record["layer_output_dtype"] == "float32"
    amp = AutocastProbe(model)
    with autocast_context(PrecisionMode("amp", "float32", autocast="bfloat16"), "cpu"):
        model(ids)
    assert amp.record["enabled"] is True and amp.record["dtype"] == "bfloat16"
    assert amp.record["layer_output_dtype"] == "bfloat16"


def test_saved_dtypes_are_checked_against_the_arm(tiny_base, tmp_path):
    base = tiny_base["base_dir"]
    assert set(check_saved_dtypes(base, PrecisionMode("fp32", "float32")).values()) == {"float32"}
    with pytest.raises(PrecisionError, match=rf"{base}: saved tensors not in bfloat16"):
        check_saved_dtypes(base, PrecisionMode("bf16", "bfloat16"))
