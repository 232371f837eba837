"""Stochastic rounding into bf16 and update noise (``optimizers``): the rules, and what they do to AdamW.

The constant-gradient check (design.md): 48 AdamW steps of lr 3e-5 on a fixed gradient from bf16
weights of size ~0.05. The fp32 trajectory from the same start is the reference; round-to-nearest bf16
masters stall (most updates are below half the bf16 spacing), stochastic rounding tracks the fp32 move
in expectation. Measured here: fp32 mean move 1.440e-3 along -sign(g), stochastic 1.436e-3, nearest
1.754e-4 (12.5% of weights changed).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from workflow_scripts.training.optimizers import (
    StochasticRoundAdamW,
    add_update_noise,
    bf16_spacing,
    optimizer_cls_and_kwargs,
    step_generator,
    stochastic_round_bf16,
)
from workflow_scripts.training.precision import PrecisionMode

STEPS, LR = 48, 3e-5


def constant_gradient_run(optimizer_cls, dtype, **kwargs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(start, end, gradient) of STEPS AdamW steps on a fixed gradient."""
    torch.manual_seed(0)
    start = (torch.randn(128, 128) * 0.05).to(torch.bfloat16)
    grad = torch.randn(128, 128) * 1e-2
    p = torch.nn.Parameter(start.to(dtype).clone())
    optimizer = optimizer_cls([p], lr=LR, weight_decay=0.0, **kwargs)
    for _ in range(STEPS):
        p.grad = grad.to(dtype)
        optimizer.step()
    return start.float(), p.detach().float(), grad


def test_stochastic_rounding_is_unbiased_and_lands_on_a_neighbour():
    x = torch.full((200_000,), 1.0 + 2**-10)  # a quarter of the way from 1 to the next bf16 (1 + 2^-7)
    r = stochastic_round_bf16(x, step_generator(0, 0, "test")).float()
    assert set(r.unique().tolist()) == {1.0, 1.0 + 2**-7}
    se = float(r.std()) / math.sqrt(r.numel())
    assert abs(float(r.mean()) - (1.0 + 2**-10)) < 4 * se
    exact = torch.tensor([0.5, -3.0, 0.0, float("inf"), -0.15625])  # values already in bf16 stay
    assert torch.equal(stochastic_round_bf16(exact, step_generator(0, 0, "t")).float(), exact)
    negative = stochastic_round_bf16(-x, step_generator(0, 1, "test")).float()
    assert abs(float(negative.mean()) + (1.0 + 2**-10)) < 4 * se  # symmetric in the sign


def test_bf16_spacing_is_the_gap_between_neighbouring_bf16_numbers():
    w = torch.tensor([1.0, 0.75, 0.05, -3.0, 2.0**-20])
    here = w.abs().to(torch.bfloat16)
    up = (here.view(torch.int16) + 1).view(torch.bfloat16)  # the next bf16 number up
    assert torch.equal(bf16_spacing(w), up.float() - here.float())
    assert float(bf16_spacing(torch.tensor([0.0]))) == 0.0


def test_on_a_constant_gradient_stochastic_rounding_tracks_fp32_where_nearest_stalls():
    start, fp32, grad = constant_gradient_run(torch.optim.AdamW, torch.float32)
    _, nearest, _ = constant_gradient_run(torch.optim.AdamW, torch.bfloat16)
    _, stochastic, _ = constant_gradient_run(StochasticRoundAdamW, torch.bfloat16, seed=1)
    move = {k: float(((v - start) * -grad.sign()).mean()) for k, v in
            (("fp32", fp32), ("nearest", nearest), ("stochastic", stochastic))}  # fmt: skip
    # every weight moves by ~lr per step in fp32; the mean of 16384 stochastic moves is within 2%
    assert move["fp32"] == pytest.approx(STEPS * LR, rel=0.01)
    assert move["stochastic"] == pytest.approx(move["fp32"], rel=0.02), move
    assert move["nearest"] < 0.25 * move["fp32"], move  # the stall
    assert (
        float((stochastic != start).double().mean()) > 0.9 > 0.25 > float((nearest != start).double().mean())
    )


def test_stochastic_rounding_adamw_keeps_bf16_states_and_reproduces_from_its_seed():
    def run(seed):
        torch.manual_seed(0)
        p = torch.nn.Parameter(torch.randn(64, 64).to(torch.bfloat16))
        optimizer = StochasticRoundAdamW([p], lr=1e-4, seed=seed)
        for _ in range(3):
            p.grad = torch.randn_like(p)
            optimizer.step()
        return p.detach(), optimizer

    a, optimizer = run(7)
    assert a.dtype == torch.bfloat16
    assert {
        t.dtype for k, t in optimizer.state[optimizer.param_groups[0]["params"][0]].items() if k != "step"
    } == {torch.bfloat16}
    assert torch.equal(a, run(7)[0]) and not torch.equal(a, run(8)[0])


def test_stochastic_rounding_adamw_with_fp32_weights_is_adamw():
    torch.manual_seed(0)
    p, q = (torch.nn.Parameter(torch.randn(32, 32)) for _ in range(2))
    q.data.copy_(p.data)
    ours, torch_adamw = (
        StochasticRoundAdamW([p], lr=1e-3, weight_decay=0.1),
        torch.optim.AdamW([q], lr=1e-3, weight_decay=0.1),
    )
    for _ in range(5):
        g = torch.randn(32, 32)
        p.grad, q.grad = g.clone(), g.clone()
        ours.step()
        torch_adamw.step()
    assert torch.allclose(p, q, rtol=1e-6, atol=1e-8)


def test_update_noise_has_the_stated_size_per_weight_and_its_own_stream():
    p = torch.nn.Parameter(torch.full((100_000,), 0.05))
    optimizer = torch.optim.SGD([p], lr=0.0)  # no update of its own: only the noise moves the weight
    add_update_noise(optimizer, scale=2.0, seed=3)
    p.grad = torch.zeros_like(p)
    optimizer.step()
    noise = (p.detach() - 0.05) / bf16_spacing(torch.tensor(0.05))
    assert float(noise.std()) == pytest.approx(2.0, rel=0.02)
    assert abs(float(noise.mean())) < 0.02


def test_the_arm_fields_choose_the_optimizer():
    args = SimpleNamespace(learning_rate=1e-5, adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8)
    assert optimizer_cls_and_kwargs(PrecisionMode("bf16", "bfloat16"), args, seed=1) is None  # TRL's own
    cls, kwargs = optimizer_cls_and_kwargs(PrecisionMode("sr", "bfloat16", rounding="stochastic"), args, 4)
    assert issubclass(cls, StochasticRoundAdamW) and kwargs["seed"] == 4 and kwargs["lr"] == 1e-5
    cls, kwargs = optimizer_cls_and_kwargs(PrecisionMode("n", "float32", update_noise=0.5), args, 4)
    assert issubclass(cls, torch.optim.AdamW) and not issubclass(cls, StochasticRoundAdamW)
    assert cls.__name__ == "AdamW+noise" and "seed" not in kwargs


@pytest.mark.parametrize("arm", ["stochastic", "noise"])
def test_a_resumed_optimizer_draws_what_an_uninterrupted_one_does(arm):
    """The random streams come from (seed, step): a checkpointed optimizer state resumes them exactly."""
    args = SimpleNamespace(learning_rate=1e-3, adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8)
    fields = {"rounding": "stochastic"} if arm == "stochastic" else {"update_noise": 1.0}
    cls, kwargs = optimizer_cls_and_kwargs(PrecisionMode("a", "bfloat16", **fields), args, seed=5)
    grads = [torch.randn(16, 16, generator=torch.Generator().manual_seed(i)) for i in range(4)]

    def make(weights):
        p = torch.nn.Parameter(weights.clone())
        return p, cls([p], **kwargs)

    start = (torch.randn(16, 16, generator=torch.Generator().manual_seed(9)) * 0.05).to(torch.bfloat16)
    p, optimizer = make(start)
    for g in grads:
        p.grad = g.to(torch.bfloat16)
        optimizer.step()
    q, first = make(start)
    for g in grads[:2]:
        q.grad = g.to(torch.bfloat16)
        first.step()
    r, resumed = make(q.detach())  # a new process: weights and optimizer state from the checkpoint
    resumed.load_state_dict(first.state_dict())
    for g in grads[2:]:
        r.grad = g.to(torch.bfloat16)
        resumed.step()
    assert torch.equal(r, p)
