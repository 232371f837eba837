"""The optimizer an arm trains with: TRL's AdamW, or AdamW with the arm's ``rounding`` / ``update_noise``.

| precision fields                         | optimizer                                                     |
|------------------------------------------|---------------------------------------------------------------|
| rounding nearest, update_noise null      | ``None``: the Trainer's own ``adamw_torch`` (unchanged runs)   |
| rounding stochastic (bfloat16 masters)   | ``StochasticRoundAdamW``: AdamW's update computed in fp32 from |
|                                          | the bf16 weight and states, the new weight written to bf16 by |
|                                          | stochastic rounding (``stochastic_round_bf16``); exp_avg and  |
|                                          | exp_avg_sq stay bf16 (rounded to nearest), no fp32 copy kept  |
| update_noise X (any arm)                 | after every step each trained weight gets Gaussian noise of   |
|                                          | std X times the bf16 spacing at that weight (``bf16_spacing``)|
|                                          | (the positive control: noise of a stated size on every update)|

Why stochastic rounding: with round-to-nearest bf16 masters an update smaller than half the bf16
spacing is lost (at lr 3e-5 ~80% of the tiny model's weights never move: a bias, not noise).
Stochastic rounding rounds up with probability (x - down) / (up - down), so the stored weight equals the
fp32 trajectory in expectation (design.md: torchao's ``_AdamW(bf16_stochastic_round=True)`` moved bf16
weights by exactly the fp32 amount; it torch.compiles every step, 18 s for the first one on these CPUs,
so the same rule is implemented here in eager torch: add 16 random bits below the bf16 mantissa of the
fp32 bit pattern, truncate).

Random numbers: drawn from a generator seeded by (run seed, optimizer step, purpose) at every step, so
a run is reproducible and a resumed run draws what an uninterrupted one does (the step count lives in
the optimizer state, which checkpoints save).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping

import torch

_LOW16 = -65536  # int32 0xFFFF0000: keeps sign, exponent and the 7 bf16 mantissa bits


def step_generator(seed: int, step: int, purpose: str) -> torch.Generator:
    """A CPU generator for (run seed, step, purpose): independent streams, stateless across resumes."""
    digest = hashlib.sha256(f"{seed}/{step}/{purpose}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & (2**63 - 1))


def stochastic_round_bf16(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """fp32 ``x`` -> bf16, rounding each magnitude up with probability equal to its distance from the
    value below over the bf16 spacing (E[result] = x). Values already in bf16 are unchanged."""
    x = x.to(torch.float32).contiguous()
    noise = torch.randint(0, 1 << 16, x.shape, dtype=torch.int32, generator=generator).to(x.device)
    bits = (x.view(torch.int32) + noise) & _LOW16
    out = bits.view(torch.float32).to(torch.bfloat16)  # exact: the low 16 bits are zero
    return torch.where(torch.isfinite(x), out, x.to(torch.bfloat16))


def bf16_spacing(w: torch.Tensor) -> torch.Tensor:
    """fp32 tensor: the gap between consecutive bf16 numbers at each |w| (8 significant bits: 2^(e-8) for
    |w| = m 2^e, m in [0.5, 1)); 0 where w is 0 (no scale to take the noise from)."""
    _, exponent = torch.frexp(w.detach().to(torch.float32))
    spacing = torch.ldexp(torch.ones_like(w, dtype=torch.float32), exponent - 8)
    return torch.where(w == 0, torch.zeros_like(spacing), spacing)


def _step_count(optimizer: torch.optim.Optimizer) -> int:
    """The optimizer's step count (AdamW keeps it per parameter; all equal)."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            step = optimizer.state.get(p, {}).get("step")
            if step is not None:
                return int(step)
    return 0


def add_update_noise(optimizer: torch.optim.Optimizer, scale: float, seed: int) -> None:
    """After every ``optimizer.step()``: w += scale * bf16_spacing(w) * N(0, 1) on each stepped weight."""

    def hook(opt, args, kwargs) -> None:
        generator = step_generator(seed, _step_count(opt), "update_noise")
        with torch.no_grad():
            for group in opt.param_groups:
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    z = torch.randn(p.shape, generator=generator, dtype=torch.float32).to(p.device)
                    p.add_((scale * bf16_spacing(p) * z).to(p.dtype))

    optimizer.register_step_post_hook(hook)


class StochasticRoundAdamW(torch.optim.Optimizer):
    """AdamW (torch.optim.AdamW's rule: decoupled weight decay, bias-corrected moments, no amsgrad) with
    the arithmetic in fp32 and bf16 weights written by stochastic rounding; states in the weight's dtype.
    Non-bf16 weights are written by ordinary rounding (the rule then is plain AdamW)."""

    def __init__(
        self,
        params: Iterable,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.01,
        seed: int = 0,
    ) -> None:
        defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay}
        super().__init__(params, defaults)
        self.seed = int(seed)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        generator = None
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            lr, eps, decay = group["lr"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = torch.tensor(0.0)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                step = int(state["step"])
                if generator is None:
                    generator = step_generator(self.seed, step, "stochastic_round")
                g = p.grad.to(torch.float32)
                m = state["exp_avg"].to(torch.float32).lerp_(g, 1 - beta1)
                v = state["exp_avg_sq"].to(torch.float32).mul_(beta2).addcmul_(g, g, value=1 - beta2)
                state["exp_avg"].copy_(m)
                state["exp_avg_sq"].copy_(v)
                bias1 = 1 - beta1**step
                denom = (v.sqrt() / math.sqrt(1 - beta2**step)).add_(eps)
                w = p.to(torch.float32).mul_(1 - lr * decay).addcdiv_(m, denom, value=-lr / bias1)
                p.copy_(stochastic_round_bf16(w, generator) if p.dtype == torch.bfloat16 else w)
        return loss


def optimizer_cls_and_kwargs(mode, args, seed: int) -> tuple[type, dict] | None:
    """The Trainer's ``optimizer_cls_and_kwargs`` for the arm (None: its default ``adamw_torch``).

    ``mode``: the PrecisionMode; ``args``: the run's GRPOConfig (learning rate, betas, eps, decay)."""
    rounding, noise = mode.rounding, mode.update_noise
    if rounding == "nearest" and noise is None:
        return None
    kwargs: dict = {
        "lr": args.learning_rate,
        "betas": (args.adam_beta1, args.adam_beta2),
        "eps": args.adam_epsilon,
    }  # what the Trainer's adamw_torch gets; weight decay comes with its parameter groups
    base = StochasticRoundAdamW if rounding == "stochastic" else torch.optim.AdamW
    if rounding == "stochastic":
        kwargs["seed"] = seed

    class ArmAdamW(base):  # the arm's rule; update noise hooked onto every step
        def __init__(self, params, **kw) -> None:
            super().__init__(params, **kw)
            if noise is not None:
                add_update_noise(self, float(noise), seed)

    ArmAdamW.__name__ = ArmAdamW.__qualname__ = f"{base.__name__}{'+noise' if noise is not None else ''}"
    return ArmAdamW, kwargs


def optimizer_record(optimizer: torch.optim.Optimizer, mode) -> Mapping:
    """run.json's optimizer entry: the class that ran, the rounding and the noise scale."""
    inner = getattr(optimizer, "optimizer", optimizer)  # accelerate's AcceleratedOptimizer wraps it
    return {
        "class": type(inner).__name__,
        "rounding": mode.rounding,
        "update_noise": mode.update_noise,
    }
