"""The dtype tables: config dtype names, safetensors header codes, sizes; torch only when asked.

Torch-free at import (config validation and planning use it), so ``torch_dtype`` imports torch lazily.
"""

from __future__ import annotations

from typing import Any

# the config's dtypes (schema enum: precisions.*.param_dtype / autocast, model.dtype)
CONFIG_DTYPES: tuple[str, ...] = ("float32", "bfloat16", "float16")
FLOAT_DTYPES: tuple[str, ...] = ("float64", *CONFIG_DTYPES)

# safetensors header dtype code -> torch/numpy-style name
SAFETENSORS: dict[str, str] = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
    "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
    "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool",
}  # fmt: skip

ITEMSIZE: dict[str, int] = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1,
}  # fmt: skip


def from_safetensors(code: str) -> str:
    """``"BF16"`` -> ``"bfloat16"`` (an unknown code is returned as is)."""
    return SAFETENSORS.get(code, code)


def itemsize(name: str) -> int:
    """Bytes per element of a dtype name (8 for an unknown one: the safe side for memory bounds)."""
    return ITEMSIZE.get(name, 8)


def dtype_name(dtype: Any) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"`` (also accepts a name)."""
    return str(dtype).removeprefix("torch.")


def torch_dtype(name: str) -> Any:
    """``"bfloat16"`` -> ``torch.bfloat16``; ValueError naming the known ones otherwise."""
    import torch

    dtype = getattr(torch, name, None) if name in ITEMSIZE else None
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}; known: {sorted(ITEMSIZE)}")
    return dtype
