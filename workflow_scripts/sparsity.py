"""bf16-aware update sparsity: which weights did RL fine-tuning actually move?

Compares a base and a fine-tuned checkpoint tensor by tensor, streaming (never both models, nor even
one whole large tensor, in memory), and counts per tensor how many elements changed under three
criteria, because "changed" depends on the precision you look with:

| column              | an element counts when                        | what it shows                      |
| ------------------- | --------------------------------------------- | ---------------------------------- |
| ``changed_eta_{e}`` | ``|w'-w| > e * max(|w|, |w'|)`` (float64)     | relative update above ``e``: the   |
|                     |                                               | precision-independent "it moved"   |
| ``equal_bf16``      | ``bf16(w)``, ``bf16(w')`` have identical bits | updates bf16 cannot represent      |
|                     |                                               | (Gate III: below the bf16 spacing) |
| ``equal_stored``    | ``w``, ``w'`` have identical bits in the      | the literal "untouched" count a    |
|                     | wider of the two stored dtypes                | bitwise checkpoint diff sees       |

``changed_*`` counts changed elements; ``equal_*`` count equal ones (``numel - equal`` = changed).

Exact semantics (tested in tests/test_sparsity.py):

- eta criterion, in float64: both sides are widened exactly to float64, then an element is changed
  iff ``fl64(|w'-w|) > fl64(eta * max(|w|, |w'|))``. At the tolerance boundary (equality) it is NOT
  changed; both-zero pairs are not changed (0 > 0 is false). For float32/bf16/fp16 data and
  ``1e-30 <= eta <= 0.25`` a float32 fast path computes ``r = |w'-w| / max`` and decides every element
  whose ``r`` is more than ~2^-20 relative away from ``eta``; the few inside that band are recomputed
  in float64, so the result is identical to the float64 rule (the float32 difference is exact by
  Sterbenz wherever ``r`` can be near ``eta``).
- Non-finite values: for a pair where either side is NaN or +-inf, changed iff the values differ,
  NaN counting as equal to NaN: NaN->NaN and inf->inf (same sign) are unchanged; finite<->NaN,
  finite<->inf and inf->-inf are changed, at every eta. ``nonfinite_base``/``nonfinite_final`` count
  the NaN/inf elements of each side (a diverged run shows up there).
- Bitwise columns compare bit patterns: NaN->NaN with the same payload is equal, and -0.0 vs 0.0 is
  NOT bitwise equal although it is numerically unchanged for every eta. torch's cast to bf16
  canonicalises NaN, so any NaN->NaN pair is bf16-equal.
- Mixed dtypes (e.g. fp32 base vs bf16 final): ``equal_stored`` compares after casting both to
  ``torch.promote_types`` of the two (exact), and both dtypes are recorded; ``equal_bf16`` casts each
  side to bf16 (round to nearest even); the eta rule widens both to float64.
- Integer/bool tensors go through the same rules after an exact cast to float64 (|x| < 2^53).
- Tied weights: ``lm_head.weight`` is usually absent from a tied checkpoint; then only the stored
  embedding is reported. If it is stored on only one side, the other side's embedding stands in for
  it and the row has ``tied=True``.

Outputs (``main``): a per-tensor parquet, one row per tensor, columns ``[precision, seed,] tensor,
module, layer, numel, base_dtype, final_dtype, tied, equal_stored, equal_bf16, nonfinite_base,
nonfinite_final, changed_eta_1e-03, ...`` (``eta_column``; ``to_long`` melts it into a tidy
``eta, changed`` form), and ``<out stem>.summary.json`` with whole-model, per-module-type and
per-layer aggregates (``summarize``).

Memory: each side is read through ``safe_open`` row windows of ``window_bytes`` (dim-0 slices, so a
huge tensor never loads whole); the handle is reopened once that much of the file has been touched,
because pages of a safetensors mmap stay in RSS while the handle lives. Peak RSS is the interpreter
plus ~2 windows plus a few cache-sized chunk buffers (bench: 431 MB for a 1 GB pair).

Speed: ~25 vectorised numpy passes per cache-sized chunk, single-threaded by default (``threads``
splits windows over worker threads). bench/bench_sparsity.py measures it against the I/O floor.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from safetensors import safe_open

from workflow_scripts.atomic import write_json, write_parquet

DEFAULT_ETAS: tuple[float, ...] = (1e-3, 1e-4, 1e-5)
DEFAULT_WINDOW_BYTES = 64 << 20  # touched bytes per side before the mmap handle is reopened
DEFAULT_CHUNK_ELEMS = 1 << 17  # elements per vectorised step: the working set stays in cache
FAST_ETA_MIN, FAST_ETA_MAX = 1e-30, 0.25  # range in which the float32 fast path is exact (see docstring)
_BAND = 2.0**-20  # relative half-width of the band re-decided in float64
_FAST_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

MODULE_TYPES = (
    "attn_q", "attn_k", "attn_v", "attn_o", "mlp_gate", "mlp_up", "mlp_down",
    "norm", "embedding", "lm_head", "other",
)  # fmt: skip
_MODULE_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (module, re.compile(pattern))
    for module, pattern in (
        ("norm", r"(^|\.)[^.]*(norm|ln_\w*)(\.|$)"),
        ("lm_head", r"(^|\.)lm_head(\.|$)"),
        ("embedding", r"(^|\.)(embed_tokens|wte|word_embeddings|embeddings?)(\.|$)"),
        ("attn_q", r"(^|\.)q_proj(\.|$)"),
        ("attn_k", r"(^|\.)k_proj(\.|$)"),
        ("attn_v", r"(^|\.)v_proj(\.|$)"),
        ("attn_o", r"(^|\.)o_proj(\.|$)"),
        ("mlp_gate", r"(^|\.)gate_proj(\.|$)"),
        ("mlp_up", r"(^|\.)up_proj(\.|$)"),
        ("mlp_down", r"(^|\.)down_proj(\.|$)"),
    )
)
_LAYER_RE = re.compile(r"(?:^|\.)(?:layers|layer|h|blocks)\.(\d+)(?:\.|$)")
LM_HEAD = "lm_head.weight"
TIED_EMBEDDINGS = ("model.embed_tokens.weight", "embed_tokens.weight", "transformer.wte.weight")

_ST_DTYPES = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
    "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
    "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool",
}  # fmt: skip


class TensorMismatchError(ValueError):
    """The two checkpoints do not hold the same tensors; the message names the tensor and both files."""


# --------------------------------------------------------------------------------------------- naming


def module_type(name: str) -> str:
    """Module type of a Llama/Qwen-style parameter name, one of MODULE_TYPES."""
    for module, pattern in _MODULE_PATTERNS:
        if pattern.search(name):
            return module
    return "other"


def layer_index(name: str) -> int:
    """Decoder layer index from e.g. ``model.layers.3.mlp.up_proj.weight``; -1 outside the layers."""
    match = _LAYER_RE.search(name)
    return int(match.group(1)) if match else -1


def eta_label(eta: float) -> str:
    """Shortest lossless scientific label: 1e-3 -> '1e-03', 2.5e-4 -> '2.5e-04'."""
    return np.format_float_scientific(eta, trim="-", exp_digits=2)


def eta_column(eta: float) -> str:
    return f"changed_eta_{eta_label(eta)}"


# ---------------------------------------------------------------------------------- checkpoint layout


@dataclass(frozen=True)
class TensorInfo:
    name: str
    file: Path
    shape: tuple[int, ...]
    dtype: str  # torch-style name, e.g. "bfloat16"

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def checkpoint_files(path: str | os.PathLike) -> tuple[dict[str, Path], str]:
    """Map tensor name -> safetensors file for a model folder, an index json or a single file.

    Returns the map and a description (the index or file) for error messages.
    """
    path = Path(path)
    if path.is_dir():
        index = path / "model.safetensors.index.json"
        single = path / "model.safetensors"
        if index.exists():
            path = index
        elif single.exists():
            path = single
        else:
            found = sorted(path.glob("*.safetensors"))
            if len(found) != 1:
                raise FileNotFoundError(
                    f"{path}: no model.safetensors or model.safetensors.index.json "
                    f"(and {len(found)} other *.safetensors files)"
                )
            path = found[0]
    if not path.exists():
        raise FileNotFoundError(f"{path}: checkpoint not found")
    if path.suffix == ".json":
        with open(path, encoding="utf-8") as fh:
            weight_map = json.load(fh).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ValueError(f"{path}: index json has no 'weight_map'")
        files = {name: path.parent / shard for name, shard in weight_map.items()}
        for shard in sorted(set(files.values())):
            if not shard.exists():
                raise FileNotFoundError(f"{path}: shard {shard.name} listed in the index does not exist")
        return files, str(path)
    with safe_open(path, framework="pt") as handle:
        return dict.fromkeys(handle.keys(), path), str(path)


def checkpoint_tensors(path: str | os.PathLike) -> tuple[dict[str, TensorInfo], str]:
    """Name -> TensorInfo (file, shape, dtype) read from the headers only; ordered by file and offset."""
    files, desc = checkpoint_files(path)
    by_file: dict[Path, list[str]] = {}
    for name, file in files.items():
        by_file.setdefault(file, []).append(name)
    infos: dict[str, TensorInfo] = {}
    for file in sorted(by_file):
        wanted = set(by_file[file])
        with safe_open(file, framework="pt") as handle:
            present = handle.offset_keys()
            missing = wanted - set(present)
            if missing:
                raise ValueError(f"{desc}: tensor {sorted(missing)[0]!r} is listed for {file} but not in it")
            for name in present:
                if name in wanted:
                    sl = handle.get_slice(name)
                    dtype = sl.get_dtype()
                    infos[name] = TensorInfo(name, file, tuple(sl.get_shape()), _ST_DTYPES.get(dtype, dtype))
    return infos, desc


@dataclass(frozen=True)
class TensorPair:
    name: str
    base: TensorInfo
    final: TensorInfo
    tied: bool = False


def pair_tensors(
    base: Mapping[str, TensorInfo], final: Mapping[str, TensorInfo], base_desc: str, final_desc: str
) -> list[TensorPair]:
    """Match tensors by name (tied lm_head aliased, see module docstring); raise on any mismatch."""
    base, final = dict(base), dict(final)
    tied: set[str] = set()
    for side, other in ((base, final), (final, base)):
        if LM_HEAD in other and LM_HEAD not in side:
            embedding = next((e for e in TIED_EMBEDDINGS if e in side), None)
            if embedding is not None:
                side[LM_HEAD] = side[embedding]
                tied.add(LM_HEAD)
    for name in base:
        if name not in final:
            raise TensorMismatchError(
                f"tensor {name!r} is in {base[name].file} (base) but missing from {final_desc} (final)"
            )
    for name in final:
        if name not in base:
            raise TensorMismatchError(
                f"tensor {name!r} is in {final[name].file} (final) but missing from {base_desc} (base)"
            )
    pairs = []
    for name, a in base.items():
        b = final[name]
        if a.shape != b.shape:
            raise TensorMismatchError(
                f"tensor {name!r} has shape {list(a.shape)} in {a.file} (base) "
                f"but {list(b.shape)} in {b.file} (final)"
            )
        pairs.append(TensorPair(name, a, b, name in tied))
    return pairs


class WindowReader:
    """Row windows of tensors via safe_open, reopening the handle once ``budget`` bytes were touched.

    A tensor sliced from safe_open is a view of the file's mmap, and touched pages stay resident until
    the mapping goes; reopening bounds that to ~budget per side.
    """

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.file: Path | None = None
        self.handle = None
        self.touched = 0

    def rows(self, info: TensorInfo, start: int, stop: int) -> torch.Tensor:
        if self.handle is None or self.file != info.file or self.touched >= self.budget:
            self.handle = None  # drop the old mapping before opening the next
            self.handle = safe_open(info.file, framework="pt")
            self.file, self.touched = info.file, 0
        if not info.shape:
            out = self.handle.get_tensor(info.name)
        else:
            out = self.handle.get_slice(info.name)[start:stop]
        self.touched += out.numel() * out.element_size()
        return out.reshape(-1)

    def close(self) -> None:
        self.handle, self.file = None, None


def row_windows(shape: Sequence[int], window_elems: int) -> Iterator[tuple[int, int]]:
    """Dim-0 row ranges holding about ``window_elems`` elements (at least one row each)."""
    if not shape:
        yield 0, 1
        return
    row = math.prod(shape[1:])
    if row == 0 or shape[0] == 0:
        return
    step = max(1, window_elems // row)
    for start in range(0, shape[0], step):
        yield start, min(start + step, shape[0])


# ---------------------------------------------------------------------------------------- the kernel


@dataclass(frozen=True)
class EtaPlan:
    """Thresholds for the float32 fast path: r > hi is surely changed, r <= lo surely not."""

    etas: tuple[float, ...]
    lo: tuple[np.float32, ...]
    hi: tuple[np.float32, ...]
    fast: bool

    @classmethod
    def make(cls, etas: Sequence[float]) -> EtaPlan:
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

    def add(self, other: TensorCounts) -> None:
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


def iter_windows(
    pair: TensorPair, ra: WindowReader, rb: WindowReader, window_elems: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Aligned flat (base, final) row windows of one tensor pair."""
    for start, stop in row_windows(pair.base.shape, window_elems):
        yield ra.rows(pair.base, start, stop), rb.rows(pair.final, start, stop)


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


def window_elems_for(pairs: Sequence[TensorPair], window_bytes: int) -> int:
    widest = max((max(_itemsize(p.base.dtype), _itemsize(p.final.dtype)) for p in pairs), default=4)
    return max(1, window_bytes // widest)


def _itemsize(dtype: str) -> int:
    return getattr(torch, dtype).itemsize if hasattr(torch, dtype) else 8


def diff_checkpoints(
    base: str | os.PathLike,
    final: str | os.PathLike,
    etas: Sequence[float] = DEFAULT_ETAS,
    *,
    window_bytes: int = DEFAULT_WINDOW_BYTES,
    chunk_elems: int = DEFAULT_CHUNK_ELEMS,
    threads: int = 1,
    cast_base_to_final: bool = False,
) -> pd.DataFrame:
    """Per-tensor sparsity table (columns: see module docstring) of ``final`` against ``base``.

    ``cast_base_to_final``: compare against the weights the run really started from. A bf16 arm
    loads an fp32 base as bf16(base); without the cast the eta criterion would count that rounding
    (up to ~2e-3 relative) as an update. Applies only where the final dtype is the narrower float.

    ``base``/``final``: a model folder (single or sharded safetensors), an index json or a file.
    ``threads`` worker threads split each window (numpy and torch release the GIL in the kernels);
    torch's own intra-op threading is switched off meanwhile, as it only adds sync on small chunks.
    """
    plan = EtaPlan.make(etas)
    base_infos, base_desc = checkpoint_tensors(base)
    final_infos, final_desc = checkpoint_tensors(final)
    pairs = pair_tensors(base_infos, final_infos, base_desc, final_desc)
    window = window_elems_for(pairs, window_bytes)
    workspaces = [Workspace(chunk_elems) for _ in range(max(1, threads))]
    ra, rb = WindowReader(window_bytes), WindowReader(window_bytes)
    rows = []
    with torch_threads(1), ThreadPoolExecutor(len(workspaces)) as pool:
        for pair in pairs:
            total = TensorCounts(changed=[0] * len(plan.etas))
            for wa, wb in iter_windows(pair, ra, rb, window):
                if cast_base_to_final and narrower_float(wb.dtype, wa.dtype):
                    wa = wa.to(wb.dtype)
                spans = spans_of(wa.numel(), len(workspaces), chunk_elems)
                if len(spans) == 1:
                    total.add(diff_span(wa, wb, plan, workspaces[0]))
                    continue
                jobs = [
                    pool.submit(diff_span, wa[s:e], wb[s:e], plan, ws)
                    for (s, e), ws in zip(spans, workspaces, strict=False)
                ]
                for job in jobs:
                    total.add(job.result())
            rows.append(_row(pair, total, plan))
    ra.close()
    rb.close()
    return _frame(rows, plan.etas)


def narrower_float(final: torch.dtype, base: torch.dtype) -> bool:
    return final.is_floating_point and base.is_floating_point and final.itemsize < base.itemsize


def _row(pair: TensorPair, c: TensorCounts, plan: EtaPlan) -> dict:
    row = {
        "tensor": pair.name,
        "module": module_type(pair.name),
        "layer": layer_index(pair.name),
        "numel": pair.base.numel,
        "base_dtype": pair.base.dtype,
        "final_dtype": pair.final.dtype,
        "tied": pair.tied,
        "equal_stored": c.equal_stored,
        "equal_bf16": c.equal_bf16,
        "nonfinite_base": c.nonfinite_base,
        "nonfinite_final": c.nonfinite_final,
    }
    row.update({eta_column(eta): n for eta, n in zip(plan.etas, c.changed, strict=True)})
    return row


_INT_COLUMNS = ("layer", "numel", "equal_stored", "equal_bf16", "nonfinite_base", "nonfinite_final")


def _frame(rows: list[dict], etas: Sequence[float]) -> pd.DataFrame:
    columns = ["tensor", "module", "layer", "numel", "base_dtype", "final_dtype", "tied", "equal_stored"]
    columns += ["equal_bf16", "nonfinite_base", "nonfinite_final", *(eta_column(e) for e in etas)]
    frame = pd.DataFrame(rows, columns=columns)
    ints = [*_INT_COLUMNS, *(eta_column(e) for e in etas)]
    return frame.astype(dict.fromkeys(ints, "int64") | {"tied": "bool"})


def etas_of(frame: pd.DataFrame) -> list[float]:
    """The etas of a per-tensor table, from its ``changed_eta_*`` columns."""
    return [float(c.removeprefix("changed_eta_")) for c in frame.columns if c.startswith("changed_eta_")]


def to_long(frame: pd.DataFrame) -> pd.DataFrame:
    """Tidy form: one row per (tensor, eta) with columns ``eta`` and ``changed``."""
    eta_cols = [c for c in frame.columns if c.startswith("changed_eta_")]
    ids = [c for c in frame.columns if c not in eta_cols]
    long = frame.melt(id_vars=ids, value_vars=eta_cols, var_name="eta", value_name="changed")
    long["eta"] = long["eta"].str.removeprefix("changed_eta_").astype(float)
    return long


# ---------------------------------------------------------------------------------------- aggregates


def _aggregate(group: pd.DataFrame, etas: Sequence[float]) -> dict:
    numel = int(group["numel"].sum())
    out: dict = {
        "n_tensors": len(group),
        "numel": numel,
        "equal_stored_fraction": _frac(group["equal_stored"].sum(), numel),
        "equal_bf16_fraction": _frac(group["equal_bf16"].sum(), numel),
        "tensors_bf16_equal": int((group["equal_bf16"] == group["numel"]).sum()),
        "nonfinite_final": int(group["nonfinite_final"].sum()),
        "changed": {},
        "changed_fraction": {},
        "tensors_zero_changed": {},
    }
    for eta in etas:
        col, label = eta_column(eta), eta_label(eta)
        out["changed"][label] = int(group[col].sum())
        out["changed_fraction"][label] = _frac(group[col].sum(), numel)
        out["tensors_zero_changed"][label] = int((group[col] == 0).sum())
    return out


def _frac(num: float, den: int) -> float | None:
    return float(num) / den if den else None


def summarize(frame: pd.DataFrame, etas: Sequence[float] | None = None) -> dict:
    """Whole-model, per-module-type and per-layer aggregates (fractions are element-weighted)."""
    etas = list(etas) if etas is not None else etas_of(frame)
    return {
        "etas": [float(e) for e in etas],
        "eta_labels": [eta_label(e) for e in etas],
        "model": _aggregate(frame, etas),
        "by_module": {str(k): _aggregate(g, etas) for k, g in frame.groupby("module", sort=True)},
        "by_layer": {str(k): _aggregate(g, etas) for k, g in frame.groupby("layer", sort=True)},
    }


def summary_path(out: str | os.PathLike) -> Path:
    """results/sparsity/bf16/seed0.parquet -> results/sparsity/bf16/seed0.summary.json."""
    out = Path(out)
    return out.with_name(out.name.removesuffix(".parquet") + ".summary.json")


# ------------------------------------------------------------------------------------------------ CLI


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m workflow_scripts.sparsity",
        description="Per-tensor update sparsity of a fine-tuned checkpoint against its base.",
    )
    p.add_argument("--base", required=True, help="base model folder, index json or .safetensors file")
    p.add_argument("--final", required=True, help="fine-tuned model folder, index json or .safetensors file")
    p.add_argument(
        "--out", required=True, help="per-tensor parquet (results/sparsity/{precision}/seed{seed}.parquet)"
    )
    p.add_argument("--summary", help="aggregates json (default: <out stem>.summary.json)")
    p.add_argument("--etas", type=float, nargs="+", default=list(DEFAULT_ETAS), help="relative tolerances")
    p.add_argument("--precision", help="if given, added as a constant 'precision' column")
    p.add_argument("--seed", type=int, help="if given, added as a constant 'seed' column")
    p.add_argument("--window-mb", type=int, default=DEFAULT_WINDOW_BYTES >> 20, help="read window per side")
    p.add_argument("--threads", type=int, default=1, help="worker threads (e.g. the rule's {threads})")
    p.add_argument(
        "--cast-base-to-final",
        action="store_true",
        help="compare against the base cast to a narrower final dtype (the run's real start point)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    start = time.perf_counter()
    frame = diff_checkpoints(
        args.base,
        args.final,
        args.etas,
        window_bytes=args.window_mb << 20,
        threads=args.threads,
        cast_base_to_final=args.cast_base_to_final,
    )
    if args.seed is not None:
        frame.insert(0, "seed", args.seed)
    if args.precision is not None:
        frame.insert(0, "precision", args.precision)
    summary = summarize(frame, args.etas)
    summary.update(
        {"base": str(args.base), "final": str(args.final), "base_cast_to_final": args.cast_base_to_final}
    )
    if args.precision is not None:
        summary["precision"] = args.precision
    if args.seed is not None:
        summary["seed"] = args.seed
    write_parquet(args.out, frame)
    write_json(args.summary or summary_path(args.out), summary)
    model = summary["model"]
    fractions = ", ".join(f"eta {k}: {v:.4g}" for k, v in model["changed_fraction"].items())
    print(
        f"sparsity: {model['n_tensors']} tensors, {model['numel']} elements in "
        f"{time.perf_counter() - start:.1f}s; changed fraction {fractions}; "
        f"bf16-equal {model['equal_bf16_fraction']:.4g} -> {args.out}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
