"""Representable-update fraction: how many weights a step of size lr can change at all in a dtype.

In bfloat16 (8 significant bits) a weight w only moves when the step is at least about half the
spacing of bf16 numbers around w; smaller updates round back to w and are lost (no fp32 master copy
exists in a bf16-masters arm). This measures, on the real starting weights, the share that a step of
exactly ``lr`` would change:

    changed_+(w) = [fl_d(w + lr) != w],   changed_-(w) = [fl_d(w - lr) != w]
    fraction     = mean over weights of (changed_+ + changed_-) / 2

where ``fl_d`` rounds to the nearest value of the arm's param dtype ``d`` (ties to even, torch's cast)
and the sum ``w +- lr`` is formed in float64 (exact up to a rounding that cannot move a result across a
``d`` rounding boundary: ``d`` has at most 24 significant bits). Adam's update per weight is about
``lr`` in size early on, so this is the share of weights an Adam step can move; float32 masters give
~100% at lr 3e-5, bf16 ~21-28% (measured on the tiny default base; docs/miniature.md arm table). Reported per
module type (``module_type``) and for the model. Under stochastic rounding into bf16 (``rounding:
stochastic``) every step moves a weight with probability min(1, lr / spacing): the expected share is
reported instead (``stochastic_changed``).
"""

from __future__ import annotations

import re

import torch

from workflow_scripts.models.dtypes import dtype_name

_CHUNK = 1 << 22  # elements per float64 temporary (32 MiB): bounded memory on multi-billion models
_TYPES = (  # (module type, pattern on the parameter name), first match wins
    ("attention_q", r"(q_proj|query)\b"),
    ("attention_k", r"(k_proj|key)\b"),
    ("attention_v", r"(v_proj|value)\b"),
    ("attention_o", r"(o_proj|out_proj|attn\.c_proj)\b"),
    ("mlp", r"(mlp|gate_proj|up_proj|down_proj|fc1|fc2|c_fc)"),
    ("embedding", r"(embed|wte|wpe)"),
    ("norm", r"(norm|ln_)"),
    ("lm_head", r"lm_head"),
)


def module_type(name: str) -> str:
    """The module type of a parameter name (Llama/Qwen/GPT-2 names; 'other' when none matches)."""
    for kind, pattern in _TYPES:
        if re.search(pattern, name):
            return kind
    return "other"


def changed_counts(weights: torch.Tensor, lr: float) -> tuple[int, int]:
    """(weights changed by +lr, weights changed by -lr) in the tensor's own dtype."""
    flat = weights.detach().reshape(-1)
    up = down = 0
    for start in range(0, flat.numel(), _CHUNK):
        w = flat[start : start + _CHUNK]
        wide = w.to(torch.float64)
        up += int(((wide + lr).to(w.dtype) != w).sum())
        down += int(((wide - lr).to(w.dtype) != w).sum())
    return up, down


def stochastic_changed(weights: torch.Tensor, lr: float) -> tuple[float, float]:
    """Expected (weights changed by +lr, by -lr) when w +- lr is stochastically rounded to bf16: the
    stored value moves with probability min(1, lr / gap to the neighbour on that side)."""
    flat = weights.detach().reshape(-1)
    up = down = 0.0
    for start in range(0, flat.numel(), _CHUNK):
        w = flat[start : start + _CHUNK]
        wide = w.to(torch.float64)
        for sign in (1.0, -1.0):
            neighbour = torch.nextafter(w, torch.full_like(w, sign * float("inf"))).to(torch.float64)
            p = (lr / (neighbour - wide).abs()).clamp(max=1.0)
            if sign > 0:
                up += float(p.sum())
            else:
                down += float(p.sum())
    return up, down


def representable_update(model: torch.nn.Module, lr: float, rounding: str = "nearest") -> dict:
    """run.json's ``representable_update``: {lr, param_dtype, rounding, whole_model, by_module_type,
    numel}. ``rounding`` stochastic (bf16 tensors of an arm with ``rounding: stochastic``): the expected
    share a step of lr changes (``stochastic_changed``); other tensors are written by rounding to
    nearest."""
    totals: dict[str, list[float]] = {}
    dtypes = set()
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        dtypes.add(dtype_name(param.dtype))
        if rounding == "stochastic" and param.dtype == torch.bfloat16:
            up, down = stochastic_changed(param, lr)
        else:
            up, down = changed_counts(param, lr)
        entry = totals.setdefault(module_type(name), [0, 0])
        entry[0] += up + down
        entry[1] += 2 * param.numel()
    if not totals:
        raise ValueError("representable_update: the model has no trainable parameters")
    changed = sum(c for c, _ in totals.values())
    count = sum(n for _, n in totals.values())
    return {
        "lr": float(lr),
        "param_dtype": ",".join(sorted(dtypes)),
        "rounding": rounding,
        "whole_model": changed / count,
        "by_module_type": {kind: c / n for kind, (c, n) in sorted(totals.items())},
        "numel": {kind: n // 2 for kind, (_, n) in sorted(totals.items())},
    }
