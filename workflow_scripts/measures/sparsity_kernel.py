"""Counting changed and bit-equal elements of one tensor pair: the exact eta rule and its fast path.

The semantics (float64 eta rule, non-finite rules, bitwise columns) are documented in
``workflow_scripts.sparsity``; this module implements them on flat chunks. For float32/bf16/fp16 data
and ``FAST_ETA_MIN <= eta <= FAST_ETA_MAX`` a float32 ratio decides every element more than ~2^-20
relative away from eta; the few inside that band are recomputed in float64, so the counts equal the
float64 rule's. ~25 vectorised numpy passes per cache-sized chunk, in preallocated buffers.
"""

import contextlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

DEFAULT_CHUNK_ELEMS = 1 << 17  # elements per vectorised step: the working set stays in cache
FAST_ETA_MIN, FAST_ETA_MAX = 1e-30, 0.25  # range in which the float32 fast path is exact (see docstring)
_BAND = 2.0**-20  # relative half-width of the band re-decided in float64
_FAST_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class EtaPlan:
    """Thresholds for the float32 fast path: r > hi is surely changed, r <= lo surely not."""

    etas: tuple[float, ...]
    lo: tuple[np.float32, ...]
    hi: tuple[np.float32, ...]
    fast: bool

    @classmethod
    def make(cls, etas: Sequence[float]) -> "EtaPlan":
        etas = tuple(float(e) for e in etas)
        if not etas or any(not (e > 0 and math.isfinite(e)) for e in etas):
            raise ValueError(f"etas must be positive and finite, got {list(etas)}")
        lo, hi = [], []
        for eta in etas:
            down, up = np.float32(eta * (1 - _BAND)), np.float32(eta * (1 + _BAND))
            if float(down) > eta * (1 - _BAND):
                down = np.nextafter(down, np.float32(0))
            if float(up) < eta * (1 + _BAND):
                up = np.nextafter(up, np.float32(np.inf))
            lo.append(down)
            hi.append(up)
        fast = all(FAST_ETA_MIN <= e <= FAST_ETA_MAX for e in etas)
        return cls(etas, tuple(lo), tuple(hi), fast)


class Workspace:
    """Preallocated chunk buffers: allocating per chunk costs page faults that dominate the runtime."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.fa = torch.empty(n, dtype=torch.float32)
        self.fb = torch.empty(n, dtype=torch.float32)
        self.ba = torch.empty(n, dtype=torch.bfloat16)
        self.bb = torch.empty(n, dtype=torch.bfloat16)
        self.fa_np, self.fb_np = self.fa.numpy(), self.fb.numpy()
        self.r = np.empty(n, np.float32)
        self.m = np.empty(n, np.float32)
        self.t = np.empty(n, np.float32)
        self.mask = np.empty(n, np.bool_)


def _np(x: torch.Tensor) -> np.ndarray:
    return x.numpy()


def _bits(x: torch.Tensor) -> np.ndarray:
    """Bit pattern (or value, for non-floats) of ``x`` as a numpy array, for bitwise equality."""
    if x.dtype.is_floating_point:
        return _np(x.view({2: torch.int16, 4: torch.int32, 8: torch.int64, 1: torch.uint8}[x.element_size()]))
    if x.dtype == torch.bool:
        return _np(x.view(torch.uint8))
    return _np(x)


def _count_equal(x: np.ndarray, y: np.ndarray, mask: np.ndarray) -> int:
    np.equal(x, y, out=mask[: x.size])
    return int(np.count_nonzero(mask[: x.size]))


def _as_f32(x: torch.Tensor, buf: torch.Tensor, buf_np: np.ndarray) -> np.ndarray:
    if x.dtype == torch.float32:
        return _np(x)
    buf[: x.numel()].copy_(x)  # exact: bf16/fp16 are subsets of float32
    return buf_np[: x.numel()]


def _as_bf16_bits(x: torch.Tensor, buf: torch.Tensor) -> np.ndarray:
    if x.dtype == torch.bfloat16:
        return _bits(x)
    out = buf[: x.numel()]
    out.copy_(x)  # round to nearest even
    return _bits(out)


def _ratio32(a32: np.ndarray, b32: np.ndarray, ws: Workspace) -> np.ndarray | None:
    """r = |a-b| / max(|a|,|b|) in float32, or None if a NaN/inf needs the reference path."""
    n = a32.size
    r, m, t = ws.r[:n], ws.m[:n], ws.t[:n]
    with np.errstate(all="ignore"):
        np.abs(a32, out=m)
        np.maximum(m, np.abs(b32, out=t), out=m)
        if not math.isfinite(float(np.maximum.reduce(m))):  # the max propagates NaN and inf
            return None
        np.subtract(a32, b32, out=r)
        np.abs(r, out=r)
        np.divide(r, m, out=r)  # 0/0 -> NaN: both zero, never "> hi", i.e. unchanged
    return r


def changed_reference(a64: np.ndarray, b64: np.ndarray, eta: float) -> np.ndarray:
    """The eta rule in float64 with the non-finite rules; the definition the fast path must match."""
    with np.errstate(all="ignore"):
        d = np.abs(a64 - b64)
        m = np.maximum(np.abs(a64), np.abs(b64))
        finite = np.isfinite(a64) & np.isfinite(b64)
        changed = finite & (d > eta * m)
        if not finite.all():
            differ = ~((a64 == b64) | (np.isnan(a64) & np.isnan(b64)))
            changed |= ~finite & differ
    return changed


def _reference_at(a32: np.ndarray, b32: np.ndarray, idx: np.ndarray, eta: float) -> np.ndarray:
    return changed_reference(a32[idx].astype(np.float64), b32[idx].astype(np.float64), eta)


def _refine(
    r: np.ndarray, a32: np.ndarray, b32: np.ndarray, lo: np.float32, hi: np.float32, eta: float
) -> int:
    """Changed count among elements whose float32 ratio falls in the uncertain band (lo, hi]."""
    with np.errstate(invalid="ignore"):
        idx = np.flatnonzero((r > lo) & (r <= hi))
    if idx.size == 0:
        return 0
    return int(np.count_nonzero(_reference_at(a32, b32, idx, eta)))


def _fast_counts(
    r: np.ndarray, a32: np.ndarray, b32: np.ndarray, plan: EtaPlan, mask: np.ndarray
) -> list[int]:
    mask = mask[: r.size]
    counts = []
    with np.errstate(invalid="ignore"):
        for eta, lo, hi in zip(plan.etas, plan.lo, plan.hi, strict=True):
            sure = int(np.count_nonzero(np.greater(r, hi, out=mask)))
            maybe = int(np.count_nonzero(np.greater(r, lo, out=mask)))
            counts.append(sure if maybe == sure else sure + _refine(r, a32, b32, lo, hi, eta))
    return counts


def changed_masks(a: torch.Tensor, b: torch.Tensor, plan: EtaPlan, ws: Workspace) -> list[np.ndarray]:
    """One boolean changed-mask per eta for two aligned flat chunks (fresh arrays; used by overlap)."""
    if a.dtype in _FAST_DTYPES and b.dtype in _FAST_DTYPES and plan.fast:
        a32 = _as_f32(a, ws.fa, ws.fa_np)
        b32 = _as_f32(b, ws.fb, ws.fb_np)
        r = _ratio32(a32, b32, ws)
        if r is not None:
            masks = []
            with np.errstate(invalid="ignore"):
                for eta, lo, hi in zip(plan.etas, plan.lo, plan.hi, strict=True):
                    mask = r > hi
                    band = np.flatnonzero((r > lo) & ~mask)
                    if band.size:
                        mask[band] = _reference_at(a32, b32, band, eta)
                    masks.append(mask)
            return masks
        a64, b64 = a32.astype(np.float64), b32.astype(np.float64)
    else:
        a64, b64 = _np(a.to(torch.float64)), _np(b.to(torch.float64))
    return [changed_reference(a64, b64, eta) for eta in plan.etas]


@dataclass
class TensorCounts:
    numel: int = 0
    equal_stored: int = 0
    equal_bf16: int = 0
    nonfinite_base: int = 0
    nonfinite_final: int = 0
    changed: list[int] = field(default_factory=list)

    def add(self, other: "TensorCounts") -> None:
        self.numel += other.numel
        self.equal_stored += other.equal_stored
        self.equal_bf16 += other.equal_bf16
        self.nonfinite_base += other.nonfinite_base
        self.nonfinite_final += other.nonfinite_final
        self.changed = [x + y for x, y in zip(self.changed, other.changed, strict=True)]


def diff_chunk(a: torch.Tensor, b: torch.Tensor, plan: EtaPlan, ws: Workspace) -> TensorCounts:
    """All counts for two aligned flat chunks (``a`` base, ``b`` final; at most ``ws.n`` elements)."""
    n = a.numel()
    out = TensorCounts(numel=n, changed=[0] * len(plan.etas))
    if n == 0:
        return out
    if a.dtype in _FAST_DTYPES and b.dtype in _FAST_DTYPES and plan.fast:
        if _diff_fast(a, b, plan, ws, out):
            return out
        a64, b64 = _np(a.to(torch.float64)), _np(b.to(torch.float64))  # a NaN/inf: the reference rules
    else:  # float64, float8, integer or bool data, or etas outside the fast range
        common = torch.promote_types(a.dtype, b.dtype)
        out.equal_stored = _count_equal(_bits(a.to(common)), _bits(b.to(common)), ws.mask)
        out.equal_bf16 = _count_equal(_as_bf16_bits(a, ws.ba), _as_bf16_bits(b, ws.bb), ws.mask)
        a64, b64 = _np(a.to(torch.float64)), _np(b.to(torch.float64))
    out.nonfinite_base = n - int(np.count_nonzero(np.isfinite(a64)))
    out.nonfinite_final = n - int(np.count_nonzero(np.isfinite(b64)))
    out.changed = [int(np.count_nonzero(changed_reference(a64, b64, eta))) for eta in plan.etas]
    return out


def _diff_fast(a: torch.Tensor, b: torch.Tensor, plan: EtaPlan, ws: Workspace, out: TensorCounts) -> bool:
    """Fill ``out`` for float32/bf16/fp16 chunks; False if a NaN/inf needs the reference path."""
    n = a.numel()
    a32, b32 = _as_f32(a, ws.fa, ws.fa_np), _as_f32(b, ws.fb, ws.fb_np)
    if a.dtype == b.dtype:
        xa, xb = _bits(a), _bits(b)
    else:  # the common dtype is float32, and the float32 casts are exact
        xa, xb = a32.view(np.int32), b32.view(np.int32)
    out.equal_stored = _count_equal(xa, xb, ws.mask)
    if a.dtype == b.dtype == torch.bfloat16:
        out.equal_bf16 = out.equal_stored
    else:
        out.equal_bf16 = _count_equal(_as_bf16_bits(a, ws.ba), _as_bf16_bits(b, ws.bb), ws.mask)
    if out.equal_stored == n:  # bitwise identical (e.g. a frozen tensor): unchanged at every eta
        # cheap NaN/inf check (max/min propagate NaN), else the reference path counts them
        return math.isfinite(float(np.maximum.reduce(a32))) and math.isfinite(float(np.minimum.reduce(a32)))
    r = _ratio32(a32, b32, ws)
    if r is None:
        return False
    out.changed = _fast_counts(r, a32, b32, plan, ws.mask)
    return True


@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Run torch ops on ``n`` threads (None: unchanged); per-op OpenMP sync on small chunks costs more
    than it gains (measured: ~8 ms per op on a busy 2-core machine)."""
    if n is None:
        yield
        return
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def diff_span(a: torch.Tensor, b: torch.Tensor, plan: EtaPlan, ws: Workspace) -> TensorCounts:
    """Counts for two aligned flat spans of any length, chunk by chunk through ``ws``."""
    total = TensorCounts(changed=[0] * len(plan.etas))
    for k in range(0, a.numel(), ws.n):
        total.add(diff_chunk(a[k : k + ws.n], b[k : k + ws.n], plan, ws))
    return total


def spans_of(n: int, parts: int, align: int) -> list[tuple[int, int]]:
    """Split range(n) into at most ``parts`` contiguous spans whose starts are multiples of ``align``."""
    step = -(-max(1, -(-n // parts)) // align) * align
    return [(s, min(s + step, n)) for s in range(0, n, step)]


def narrower_float(final: torch.dtype, base: torch.dtype) -> bool:
    return final.is_floating_point and base.is_floating_point and final.itemsize < base.itemsize
