"""bf16 matrix products at fp32 speed on CPUs without bf16 hardware (precision field ``bf16_matmul``).

A bf16 GEMM on a GPU or an AMX/AVX512 CPU takes bf16 operands, accumulates in fp32 and rounds the
result to bf16 once. On a CPU where oneDNN has no bf16 kernel (e.g. an AVX2-only AMD EPYC) torch falls
back to a scalar loop that is ~10x slower than fp32 (measured: a (2048 x 128) x (128 x 512) product 60.6 ms
in bf16 vs 5.8 ms in fp32; bf16 train jobs 4x the fp32 ones). The emulated path keeps the contract and
uses the fast fp32 GEMM: operands upcast to fp32 (exact: every bf16 is an fp32), one fp32 GEMM, the
result rounded to bf16 (round to nearest even, as the native kernel's store). Only the summation order
inside the fp32 accumulation differs from the native kernel's, which is within the native path's own
rounding (tests/training/test_bf16_matmul.py compares both against a float64 reference).

| choice   | path                                                                                  |
|----------|---------------------------------------------------------------------------------------|
| auto     | emulated where torch reports a CPU without bf16 GEMM kernels (``native_bf16_gemm``),  |
|          | native elsewhere (CUDA, AMX / AVX512 CPUs)                                            |
| native   | torch's own bf16 kernels                                                              |
| emulated | always the upcast -> fp32 GEMM -> round route (on any device)                         |

What is intercepted (``EmulatedBF16``, a ``TorchFunctionMode``, only while its context is open):
``F.linear`` (nn.Linear; a custom autograd Function, so the backward's two GEMMs, grad_input and
grad_weight, also run in fp32 and are rounded to bf16 like a native bf16 backward), ``mm`` /
``matmul`` / ``bmm`` / ``@`` with equal-rank operands (TRL's fused log-prob head calls ``torch.mm(...,
out=)``), and ``F.scaled_dot_product_attention`` (as a bf16 flash kernel computes it: fp32 scores and
softmax, bf16 probabilities times v in fp32, a bf16 output; on the slow path the native bf16 attention
took 11% of a training step). Under CPU bf16 autocast (fp32 masters) the operands are first rounded to
bf16, as autocast would, so an autocast arm is emulated too. Parameters, gradients and optimizer states
keep their dtypes; the only fp32 copies are of the weights, reused until a weight changes
(``_WeightCache``: the upcast is otherwise a sixth of the emulated step).
"""

from __future__ import annotations

import contextlib
import math
import weakref
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

CHOICES: tuple[str, ...] = ("auto", "native", "emulated")
BF16 = torch.bfloat16


def native_bf16_gemm(device_type: str = "cpu") -> bool:
    """Whether torch has hardware-backed bf16 GEMM kernels here (CPU: oneDNN's bf16 path, which needs
    AVX512 (BF16/AMX for full speed); an AVX2-only CPU gets torch's scalar fallback)."""
    if device_type == "cuda":
        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    if device_type != "cpu":
        return True
    mkldnn = torch.backends.mkldnn
    return bool(mkldnn.is_available() and mkldnn.enabled and torch.ops.mkldnn._is_mkldnn_bf16_supported())


def resolve(choice: str, device_type: str = "cpu") -> str:
    """``auto`` / ``native`` / ``emulated`` -> the path that runs ("native" or "emulated")."""
    if choice not in CHOICES:
        raise ValueError(f"bf16_matmul: unknown choice {choice!r}; known: {CHOICES}")
    if choice == "auto":
        return "native" if native_bf16_gemm(device_type) else "emulated"
    return choice


def record(choice: str, device_type: str, computes_bf16: bool) -> dict:
    """What run.json / an eval summary records: the choice, the path that ran and why."""
    return {
        "requested": choice,
        "path": resolve(choice, device_type) if computes_bf16 else None,  # None: no bf16 product
        "native_bf16_gemm": native_bf16_gemm(device_type),  # the machine: numerics.numerics_provenance
        "device": device_type,
    }


def _fp32(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.float32)


class _WeightCache:
    """fp32 copies of bf16 parameters, reused until the parameter changes.

    A forward upcasts every weight once per call (a generated token is a call); the weights change
    only at optimizer steps. A copy is valid while the parameter's storage and version counter are the
    same: every in-place update (optimizer steps, checkpoint loads) bumps the counter; only a write
    through ``.data`` would not, and nothing in the training or evaluation loop writes that way.
    Only parameters are cached, never activations."""

    def __init__(self) -> None:
        self._copies: dict[int, tuple[object, int, int, torch.Tensor]] = {}

    def get(self, t: torch.Tensor) -> torch.Tensor:
        if not isinstance(t, torch.nn.Parameter):
            return _fp32(t)
        key = (t.data_ptr(), t._version)
        hit = self._copies.get(id(t))
        if hit is not None and hit[0]() is t and hit[1:3] == key:
            return hit[3]
        copy = _fp32(t.detach())
        if hit is None:  # forget the copy with the parameter
            weakref.finalize(t, self._copies.pop, id(t), None)
        self._copies[id(t)] = (weakref.ref(t), *key, copy)
        return copy


_WEIGHTS = _WeightCache()


class _Linear(torch.autograd.Function):
    """y = round_bf16(x @ w.T + b) with fp32 GEMMs, forward and backward (bf16 in, bf16 out)."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        with torch.autocast(x.device.type, enabled=False):
            out = F.linear(_fp32(x), _WEIGHTS.get(weight), None if bias is None else _WEIGHTS.get(bias))
        return out.to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad
        g = _fp32(grad).reshape(-1, grad.shape[-1])
        gx = gw = gb = None
        with torch.autocast(grad.device.type, enabled=False):
            if need_x:
                gx = (g @ _WEIGHTS.get(weight)).to(x.dtype).reshape(x.shape)
            if need_w:
                gw = (g.T @ _fp32(x).reshape(-1, x.shape[-1])).to(weight.dtype)
            if need_b and ctx.has_bias:
                gb = g.sum(0).to(weight.dtype)
        return gx, gw, gb


class _Matmul(torch.autograd.Function):
    """c = round_bf16(a @ b) for equal-rank operands (>= 2-D, same batch shape), fp32 GEMMs both ways."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        with torch.autocast(a.device.type, enabled=False):
            return torch.matmul(_fp32(a), _fp32(b)).to(a.dtype)

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        g = _fp32(grad)
        ga = gb = None
        with torch.autocast(grad.device.type, enabled=False):
            if ctx.needs_input_grad[0]:
                ga = torch.matmul(g, _fp32(b).mT).to(a.dtype)
            if ctx.needs_input_grad[1]:
                gb = torch.matmul(_fp32(a).mT, g).to(b.dtype)
        return ga, gb


def _attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """SDPA as a bf16 flash kernel computes it: scores and softmax in fp32 from bf16 q, k, v, the
    probabilities rounded to bf16 for the product with v (fp32 accumulation), the output rounded to
    bf16. Differentiable through fp32 ops."""
    dtype = q.dtype
    with torch.autocast(q.device.type, enabled=False):
        q, k, v = _fp32(q), _fp32(k), _fp32(v)
        if enable_gqa and k.shape[-3] != q.shape[-3]:
            repeat = q.shape[-3] // k.shape[-3]
            k, v = k.repeat_interleave(repeat, dim=-3), v.repeat_interleave(repeat, dim=-3)
        scores = (q @ k.mT) * (scale if scale is not None else 1.0 / math.sqrt(q.shape[-1]))
        low = torch.finfo(torch.float32).min  # not -inf: a fully masked (padding) row stays finite
        if is_causal:
            causal = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
            scores = scores.masked_fill(~causal, low)
        if attn_mask is not None:
            if attn_mask.dtype == torch.bool:
                scores = scores.masked_fill(~attn_mask, low)
            else:
                scores = (scores + _fp32(attn_mask)).clamp_min(low)
        probs = torch.softmax(scores, dim=-1).to(dtype)
        if dropout_p > 0.0:
            probs = F.dropout(probs, p=dropout_p)
        return (_fp32(probs) @ v).to(dtype)


_SDPA = {F.scaled_dot_product_attention}
_LINEAR = {F.linear}
_MATMUL = {
    torch.matmul, torch.mm, torch.bmm,
    torch.Tensor.matmul, torch.Tensor.mm, torch.Tensor.bmm, torch.Tensor.__matmul__,
}  # fmt: skip


def _autocast_bf16(device_type: str) -> bool:
    return torch.is_autocast_enabled(device_type) and torch.get_autocast_dtype(device_type) == BF16


def _as_bf16(t, autocast: bool):
    """The operand as the product sees it: bf16 (autocast rounds fp32 operands to bf16 first)."""
    if t is None or t.dtype == BF16:
        return t
    return t.to(BF16) if autocast and t.dtype == torch.float32 else None


class EmulatedBF16(TorchFunctionMode):
    """Routes bf16 matrix products through fp32 GEMMs while active (see the module docstring)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _LINEAR:
            out = self._linear(*args, **kwargs)
        elif func in _MATMUL and len(args) == 2:
            out = self._matmul(func, *args, **kwargs)
        elif func in _SDPA:
            out = self._sdpa(*args, **kwargs)
        else:
            out = NotImplemented
        return func(*args, **kwargs) if out is NotImplemented else out

    @staticmethod
    def _linear(x, weight, bias=None):
        if not (isinstance(x, torch.Tensor) and isinstance(weight, torch.Tensor)):
            return NotImplemented
        autocast = _autocast_bf16(x.device.type)
        xs, ws = _as_bf16(x, autocast), _as_bf16(weight, autocast)
        bs = _as_bf16(bias, autocast) if bias is not None else None
        if xs is None or ws is None or (bias is not None and bs is None) or x.dim() < 1:
            return NotImplemented
        return _Linear.apply(xs, ws, bs)

    @staticmethod
    def _sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if not all(isinstance(t, torch.Tensor) for t in (q, k, v)):
            return NotImplemented
        autocast = _autocast_bf16(q.device.type)
        q_, k_, v_ = (_as_bf16(t, autocast) for t in (q, k, v))
        if q_ is None or k_ is None or v_ is None:
            return NotImplemented
        return _attention(q_, k_, v_, attn_mask, dropout_p, is_causal, scale, enable_gqa)

    @staticmethod
    def _matmul(func, a, b, *, out=None):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return NotImplemented
        autocast = _autocast_bf16(a.device.type)
        a_, b_ = _as_bf16(a, autocast), _as_bf16(b, autocast)
        if a_ is None or b_ is None or a.dim() < 2 or a.dim() != b.dim() or a.shape[:-2] != b.shape[:-2]:
            return NotImplemented
        if out is None:
            return _Matmul.apply(a_, b_)
        if torch.is_grad_enabled() and (a.requires_grad or b.requires_grad):
            return NotImplemented  # out= does not support autograd natively either
        with torch.autocast(a.device.type, enabled=False):
            return out.copy_(torch.matmul(_fp32(a_), _fp32(b_)))


@contextlib.contextmanager
def bf16_matmul(path: str) -> Iterator[None]:
    """Run the enclosed code with bf16 products on ``path`` ("native": unchanged, "emulated")."""
    if path == "native":
        yield
        return
    if path != "emulated":
        raise ValueError(f"bf16_matmul path must be 'native' or 'emulated', got {path!r}")
    with EmulatedBF16():
        yield


@contextlib.contextmanager
def suspended() -> Iterator[None]:
    """Run the enclosed code outside any emulation context open around it (modes above it are lifted
    with it and put back after): for a vLLM engine, which computes with its own kernels, as on a GPU.

    Its repacked CPU weights are replaced in place by the weight sync; under the mode its linear layers
    would run on ``_WeightCache``'s fp32 copies of the old weights (measured: the engine's log-probs then
    drifted from the trainer's to a mean of 0.6 nats after one bf16 step, 0.002 with the mode lifted)."""
    from torch.overrides import _get_current_function_mode_stack, _pop_mode, _push_mode

    stack = _get_current_function_mode_stack()
    depth = next((len(stack) - i for i, m in enumerate(stack) if isinstance(m, EmulatedBF16)), 0)
    lifted = [_pop_mode() for _ in range(depth)]
    try:
        yield
    finally:
        for mode in reversed(lifted):
            _push_mode(mode)
