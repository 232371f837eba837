"""The representable-update fraction against hand-computed bf16 and fp32 cases."""

from __future__ import annotations

import pytest
import torch

from workflow_scripts.measures.representable import (
    changed_counts,
    module_type,
    representable_update,
    stochastic_changed,
)


@pytest.mark.parametrize(
    ("dtype", "w", "lr", "up", "down"),
    [
        # bf16 around 1.0: spacing 2^-7 above, 2^-8 below; half-spacings 0.0039 / 0.00195
        (torch.bfloat16, 1.0, 0.003, 0, 1),  # 1.003 rounds back to 1; 0.997 -> 0.99609375
        (torch.bfloat16, 1.0, 0.004, 1, 1),  # 1.004 -> 1.0078125 (past half of 2^-7)
        (torch.bfloat16, 1.0, 0.001, 0, 0),  # below both half-spacings
        (torch.bfloat16, 0.0, 1e-6, 1, 1),  # 0 +- lr is (nearly) representable
        # fp32 around 1.0: spacing 2^-23 above, 2^-24 below; half-spacings 5.96e-8 / 2.98e-8
        (torch.float32, 1.0, 1e-8, 0, 0),
        (torch.float32, 1.0, 4e-8, 0, 1),
        (torch.float32, 1.0, 1e-7, 1, 1),
    ],
)
def test_changed_counts_hand_cases(dtype, w, lr, up, down):
    assert changed_counts(torch.tensor([w], dtype=dtype), lr) == (up, down)


def test_module_types_of_llama_names():
    names = {
        "model.embed_tokens.weight": "embedding",
        "model.layers.0.self_attn.q_proj.weight": "attention_q",
        "model.layers.0.self_attn.k_proj.weight": "attention_k",
        "model.layers.0.self_attn.v_proj.weight": "attention_v",
        "model.layers.0.self_attn.o_proj.weight": "attention_o",
        "model.layers.0.mlp.gate_proj.weight": "mlp",
        "model.layers.0.input_layernorm.weight": "norm",
        "model.norm.weight": "norm",
        "lm_head.weight": "lm_head",
    }
    assert {n: module_type(n) for n in names} == names


def test_fraction_per_module_type_and_whole_model():
    model = torch.nn.Module()
    model.q_proj = torch.nn.Linear(2, 1, bias=False)  # weights [1, 1]: at lr 0.003 half of the steps count
    model.norm = torch.nn.Linear(2, 1, bias=False)  # weights [1, 0]: 0.5 + 1.0 -> 0.75
    with torch.no_grad():
        model.q_proj.weight.copy_(torch.tensor([[1.0, 1.0]]))
        model.norm.weight.copy_(torch.tensor([[1.0, 0.0]]))
    model.to(torch.bfloat16)
    record = representable_update(model, 0.003)
    assert record["by_module_type"] == {"attention_q": 0.5, "norm": 0.75}
    assert record["whole_model"] == pytest.approx((1 + 1 + 1 + 2) / 8)
    assert record["param_dtype"] == "bfloat16" and record["lr"] == 0.003
    assert representable_update(model.to(torch.float32), 0.003)["whole_model"] == 1.0


@pytest.mark.parametrize(
    ("w", "lr", "up", "down"),
    [
        (1.0, 0.001, 0.001 / 2**-7, 0.001 / 2**-8),  # below both spacings: probability lr / gap
        (1.0, 0.005, 0.005 / 2**-7, 1.0),  # 0.005 > 2^-8, the gap below: always moves down
        (1.0, 0.01, 1.0, 1.0),
    ],
)
def test_under_stochastic_rounding_a_step_moves_a_weight_with_probability_lr_over_the_gap(w, lr, up, down):
    assert stochastic_changed(torch.tensor([w], dtype=torch.bfloat16), lr) == pytest.approx((up, down))


def test_the_stochastic_rounding_arm_reports_the_expected_share_and_its_rounding():
    model = torch.nn.Linear(64, 64).to(torch.bfloat16)
    nearest = representable_update(model, 3e-5)
    stochastic = representable_update(model, 3e-5, "stochastic")
    assert (nearest["rounding"], stochastic["rounding"]) == ("nearest", "stochastic")
    assert 0 < nearest["whole_model"] < stochastic["whole_model"] < 1  # nothing is lost in expectation
    # the expectation by Monte Carlo: how often a stochastically rounded w + lr differs from w
    from workflow_scripts.training.optimizers import step_generator, stochastic_round_bf16

    w = model.weight.detach().float().repeat(50, 1)
    moved = (
        (stochastic_round_bf16(w + 3e-5, step_generator(0, 0, "mc")) != w.to(torch.bfloat16)).double().mean()
    )
    expected = stochastic_changed(model.weight, 3e-5)[0] / model.weight.numel()
    assert float(moved) == pytest.approx(expected, abs=0.01)
