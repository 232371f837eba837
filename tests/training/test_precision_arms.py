"""An arm's numerics as config data, trained for real on the tiny model: bf16 products on the emulated
path, stochastic rounding, update noise, the fp32 LM head, and the precision contract in run.json.

Runs are tiny (the test config's model, 2 optimizer steps of 4 prompts x 4 completions), one per arm,
shared through a module fixture.
"""

from __future__ import annotations

import json

import pytest
import torch
from conftest import bit_identical
from safetensors.torch import load_file

from workflow_scripts.train import train_run
from workflow_scripts.training.precision import PrecisionError

STEPS = 2
ARMS = {
    "bf16_emulated": {"param_dtype": "bfloat16", "bf16_matmul": "emulated", "dropout": 0.1},
    "bf16_native": {"param_dtype": "bfloat16", "bf16_matmul": "native", "dropout": 0.1},
    "bf16_sr": {"param_dtype": "bfloat16", "rounding": "stochastic", "bf16_matmul": "emulated"},
    "bf16_head32": {"param_dtype": "bfloat16", "lm_head_dtype": "float32", "bf16_matmul": "emulated"},
    "fp32_noisy": {"param_dtype": "float32", "update_noise": 1.0, "control": "positive"},
    "fp32_twin": {"seed_offset": 1000, "control": "negative"},  # + the fp32 arm's entry (arm_config)
    "autocast_emulated": {"param_dtype": "float32", "autocast": "bfloat16", "bf16_matmul": "emulated"},
}


def arm_config(tiny_base) -> dict:
    config = json.loads(json.dumps(tiny_base["config"]))
    config["train"].update(
        max_steps=STEPS, checkpoint_every=STEPS, kl_every=STEPS, kl_prompts=2, kl_samples=1
    )
    config["precisions"].update(ARMS)
    config["precisions"]["fp32_twin"] = {**config["precisions"]["fp32"], **ARMS["fp32_twin"]}
    return config


def train(tiny_base, precision: str, seed: int = 1, tag: str = "") -> dict:
    root = tiny_base["root"] / "arm_runs" / f"{precision}{tag}-s{seed}"
    train_run(arm_config(tiny_base), precision, seed, tiny_base["data_dir"], tiny_base["base_dir"],
              root / "out", root / "ckpt", threads=1)  # fmt: skip
    return {
        "run": json.loads((root / "out" / "run.json").read_text()),
        "weights": load_file(root / "out" / "model" / "model.safetensors"),
    }


@pytest.fixture(scope="module")
def arm_runs(tiny_base) -> dict:
    return {name: train(tiny_base, name) for name in (*ARMS, "fp32")}


@pytest.mark.slow
def test_every_arm_records_a_contract_that_held_at_the_first_optimizer_step(arm_runs):
    for name, result in arm_runs.items():
        contract = result["run"]["precision_contract"]
        assert contract["checked"] is True, name
        observed = contract["observed"]
        assert {k: observed[k] for k in contract["expected"]} == contract["expected"], name


@pytest.mark.slow
def test_bf16_arms_run_the_products_on_the_path_they_ask_for(arm_runs):
    assert arm_runs["bf16_emulated"]["run"]["bf16_matmul"]["path"] == "emulated"
    assert arm_runs["bf16_native"]["run"]["bf16_matmul"]["path"] == "native"
    assert arm_runs["autocast_emulated"]["run"]["precision_contract"]["observed"]["bf16_matmul"] == "emulated"
    assert arm_runs["fp32"]["run"]["bf16_matmul"]["path"] is None  # fp32 computes no bf16 product
    for name in ("bf16_emulated", "bf16_native"):
        run = arm_runs[name]["run"]
        assert (
            run["dtypes_start"]
            == run["dtypes_end"]
            == run["dtypes_saved"]
            == {"bfloat16": run["trainable_tensors"]}
        )
        assert run["precision_contract"]["observed"]["optimizer_state_body"] == "bfloat16"


@pytest.mark.slow
def test_stochastic_rounding_arm_keeps_bf16_masters_and_states_and_moves_more_weights(arm_runs, tiny_base):
    sr, nearest = arm_runs["bf16_sr"], arm_runs["bf16_emulated"]
    assert sr["run"]["optimizer"] == {
        "class": "StochasticRoundAdamW",
        "rounding": "stochastic",
        "update_noise": None,
    }
    assert sr["run"]["precision_contract"]["observed"]["optimizer_state_body"] == "bfloat16"
    assert {t.dtype for t in sr["weights"].values()} == {torch.bfloat16}
    base = {
        k: v.to(torch.bfloat16) for k, v in load_file(tiny_base["base_dir"] / "model.safetensors").items()
    }

    def changed(weights: dict) -> float:
        return sum(int((weights[k] != base[k]).sum()) for k in base) / sum(v.numel() for v in base.values())

    assert changed(sr["weights"]) > changed(nearest["weights"])
    rep, rep_nearest = sr["run"]["representable_update"], nearest["run"]["representable_update"]
    assert rep["rounding"] == "stochastic" and rep["whole_model"] > rep_nearest["whole_model"]
    again = train(tiny_base, "bf16_sr", tag="-again")  # seeded from the run seed: reproducible
    assert bit_identical(sr["weights"], again["weights"])


@pytest.mark.slow
def test_the_noisy_fp32_arm_trains_with_update_noise_and_differs_from_fp32(arm_runs):
    noisy, clean = arm_runs["fp32_noisy"], arm_runs["fp32"]
    assert (
        noisy["run"]["optimizer"]["class"] == "AdamW+noise" and noisy["run"]["mode"]["control"] == "positive"
    )
    assert clean["run"]["optimizer"]["class"] == "AdamW"
    assert not bit_identical(noisy["weights"], clean["weights"])
    assert {t.dtype for t in noisy["weights"].values()} == {torch.float32}


@pytest.mark.slow
def test_a_negative_control_twin_trains_its_own_seeds_and_is_fp32_there(arm_runs, tiny_base):
    twin = arm_runs["fp32_twin"]
    assert twin["run"]["seed"] == 1 and twin["run"]["train_seed"] == 1001
    assert twin["run"]["mode"]["control"] == "negative"
    assert not bit_identical(twin["weights"], arm_runs["fp32"]["weights"])  # not a copy of fp32 seed 1
    assert bit_identical(twin["weights"], train(tiny_base, "fp32", seed=1001)["weights"])  # fp32 at s+1000


@pytest.mark.slow
def test_an_fp32_lm_head_over_bf16_masters_is_stored_trained_and_saved_in_fp32(arm_runs, tiny_base):
    run = arm_runs["bf16_head32"]["run"]
    observed = run["precision_contract"]["observed"]
    assert (observed["params_lm_head"], observed["grads_lm_head"], observed["optimizer_state_lm_head"]) == (
        "float32", "float32", "float32")  # fmt: skip
    assert observed["params_body"] == "bfloat16"
    weights = arm_runs["bf16_head32"]["weights"]
    assert weights["lm_head.weight"].dtype == torch.float32
    assert {v.dtype for k, v in weights.items() if k != "lm_head.weight"} == {torch.bfloat16}
    # evaluation reads it back as saved: the head's exact fp32 values, fp32 logits over a bf16 body
    from workflow_scripts.models.loading import load_run_model

    model_dir = tiny_base["root"] / "arm_runs" / "bf16_head32-s1" / "out" / "model"
    model, dtype = load_run_model(model_dir, device="cpu")
    assert dtype == "bfloat16" and torch.equal(model.lm_head.weight, weights["lm_head.weight"])
    assert model.model.layers[0].mlp.up_proj.weight.dtype == torch.bfloat16
    with torch.no_grad():
        assert model(torch.tensor([[5, 6, 7]])).logits.dtype == torch.float32


def test_a_contract_mismatch_is_an_error_naming_the_arm_and_the_field():
    from types import SimpleNamespace

    from workflow_scripts.training.precision import PrecisionMode
    from workflow_scripts.training.precision_contract import ContractCheck, expected_contract

    mode = PrecisionMode("fp32x", "float32", lm_head_dtype="float32")
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 3))
    model[0].to(torch.bfloat16)  # the body is not what the arm says; the head is
    model.get_output_embeddings = lambda: model[1]
    probe = SimpleNamespace(record={"enabled": False}, sampling={"layer_output_dtype": "float32"})
    check = ContractCheck(mode, expected_contract(mode, device="cpu", world=1, use_vllm=False), model, probe)
    optimizer = torch.optim.AdamW(model.parameters())
    check.on_train_begin(None, None, None, optimizer=optimizer)
    model[1](model[0](torch.ones(2, 4, dtype=torch.bfloat16)).float()).sum().backward()
    before = model[0].weight.detach().clone()
    with pytest.raises(PrecisionError) as raised:
        optimizer.step()
    assert str(raised.value) == (
        "precision 'fp32x': contract violated: params_body: expected float32, observed bfloat16; "
        "grads_body: expected float32, observed bfloat16"
    )
    assert torch.equal(model[0].weight, before)  # raised before the step changed anything


def test_the_vllm_engine_and_the_fsdp_policy_are_read_into_the_contract():
    """The engine's fields are compared like any other (the real engine is read in
    tests/training/test_vllm_rollouts.py); a fake FSDP2 plugin: the observed reduce dtype."""
    from types import SimpleNamespace

    from workflow_scripts.training.precision import PrecisionMode, fsdp_mixed_precision
    from workflow_scripts.training.precision_contract import (
        differences,
        expected_contract,
        reduce_dtype_of,
        vllm_engine_dtypes,
    )

    mode = PrecisionMode("fp32", "float32")
    expected = expected_contract(mode, device="cuda", world=2, use_vllm=True)
    assert (expected["rollout_dtype"], expected["kv_cache_dtype"], expected["grad_reduce_dtype"]) == (
        "float32", "float32", "float32")  # fmt: skip
    assert expected["sampler_lm_head_dtype"] == "float32"
    engine = {"kv_cache_dtype": "fp8", "sampler_lm_head_dtype": "bfloat16"}
    assert differences(expected, engine) == [
        "kv_cache_dtype: expected float32, observed fp8",
        "sampler_lm_head_dtype: expected float32, observed bfloat16",
    ]
    assert vllm_engine_dtypes(SimpleNamespace(use_vllm=False)) is None
    hf_path = expected_contract(mode, device="cpu", world=1, use_vllm=False)
    assert hf_path["sampler_lm_head_dtype"] is None

    def accelerator(policy):
        return SimpleNamespace(
            state=SimpleNamespace(fsdp_plugin=SimpleNamespace(mixed_precision_policy=policy))
        )

    ours = reduce_dtype_of(accelerator(fsdp_mixed_precision(mode)), world=2)
    assert ours("float32") == "float32"  # no cast of its own: gradients reduced in their dtype
    bf16_reduce = SimpleNamespace(reduce_dtype=torch.bfloat16)  # accelerate's own bf16 policy
    observed = {"grad_reduce_dtype": reduce_dtype_of(accelerator(bf16_reduce), world=2)("float32")}
    assert differences(expected, observed) == ["grad_reduce_dtype: expected float32, observed bfloat16"]
    assert reduce_dtype_of(accelerator(None), world=1)("float32") is None
