"""Numerics provenance: which CPU/GPU path, library builds and thread counts computed a result.

Floats differ between machines of one kind (AVX2 vs AVX512/AMX kernels sum in other orders), so a
number is bit-reproducible only on the path that made it; across paths only its distribution is. Every
record that holds a result (run.json, base.json) carries ``numerics_provenance()``, and the report lists
the distinct paths (``path_label``) its runs came from, so a reader can tell which claim applies.

| field            | source                                                                   |
|------------------|--------------------------------------------------------------------------|
| torch, cuda      | ``torch.__version__``, ``torch.version.cuda`` (None: a CPU build)        |
| cpu_capability   | ``torch.backends.cpu.get_cpu_capability()``: the ATen kernels dispatched |
| cpu_model, flags | /proc/cpuinfo "model name" and the bf16/AMX/AVX flags present            |
| cpu_bf16         | oneDNN reports native bf16 (``_is_mkldnn_bf16_supported``)               |
| mkl, onednn      | the build strings in ``torch.__config__.show()``                         |
| threads          | intra-op and inter-op threads, OMP_NUM_THREADS / MKL_NUM_THREADS         |
| cuda_device      | device name, capability, driver and runtime versions, when a GPU is used |
"""

from __future__ import annotations

import os
import platform
import re
from functools import cache
from typing import Any

CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "avx512_fp16")


@cache
def _cpuinfo() -> tuple[str | None, tuple[str, ...]]:
    """(model name, the CPU_FLAGS present) from /proc/cpuinfo; (platform.processor(), ()) elsewhere."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            text = fh.read()
    except OSError:
        return platform.processor() or None, ()
    model = re.search(r"^model name\s*:\s*(.+)$", text, re.M)
    flags = re.search(r"^flags\s*:\s*(.+)$", text, re.M)
    present = set(flags.group(1).split()) if flags else set()
    return (model.group(1).strip() if model else None), tuple(f for f in CPU_FLAGS if f in present)


def _build_version(pattern: str) -> str | None:
    import torch

    found = re.search(pattern, torch.__config__.show())
    return found.group(1) if found else None


def _cuda_device() -> dict[str, Any] | None:
    import torch

    if not torch.cuda.is_available():
        return None
    index = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    try:
        driver = torch._C._cuda_getDriverVersion()  # the CUDA version the driver supports, e.g. 12080
    except (AttributeError, RuntimeError):
        driver = None
    return {
        "name": props.name,
        "capability": f"{props.major}.{props.minor}",
        "count": torch.cuda.device_count(),
        "driver": driver,
        "runtime": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
    }


def _spins() -> bool:
    """Whether this process's OpenMP threads spin while idle (``threads.SPINS``, fixed at its import)."""
    import sys

    threads = sys.modules.get("workflow_scripts.runtime.threads")
    if threads is not None:
        return bool(threads.SPINS)
    return os.environ.get("OMP_WAIT_POLICY", "").upper() != "PASSIVE"


def numerics_provenance() -> dict[str, Any]:
    """The record of the path this process computes on (call it where the work runs: a job, a rank)."""
    import torch

    model, flags = _cpuinfo()
    try:
        bf16 = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        bf16 = None
    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_model": model,
        "cpu_flags": list(flags),
        "cpu_bf16": bf16,
        "machine": platform.machine(),
        "mkl": _build_version(r"Math Kernel Library Version (\S+)"),
        "onednn": _build_version(r"MKL-DNN v(\S+)"),
        "threads": {
            "intra_op": torch.get_num_threads(),
            "inter_op": torch.get_num_interop_threads(),
            **{k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")},
            "omp_wait": "active" if _spins() else "passive",
        },
        "cuda_device": _cuda_device(),
    }


def path_label(record: dict[str, Any] | None) -> str:
    """One line naming the numerics path of a provenance record (the report groups runs by it)."""
    if not record:
        return "not recorded"
    parts = [f"torch {record.get('torch')}"]
    gpu = record.get("cuda_device")
    if gpu:
        parts.append(f"{gpu['name']} (sm {gpu['capability']}, driver {gpu['driver']}, CUDA {gpu['runtime']})")
    parts.append(f"CPU {record.get('cpu_model')} [{record.get('cpu_capability')}"
                 f"{', native bf16' if record.get('cpu_bf16') else ', no native bf16'}]")  # fmt: skip
    parts.append(f"MKL {record.get('mkl')}, oneDNN {record.get('onednn')}")
    return "; ".join(parts)  # thread counts stay in each record: jobs of one path may use different ones


def provenance_section(records: dict[str, dict[str, Any] | None]) -> str:
    """report.md's "Numerics provenance": the distinct paths (``path_label``) and which records used each.

    ``records``: record name (``base``, ``fp32-s1``, ...) -> its ``numerics`` entry (None: not recorded)."""
    if not records:
        return ""
    by_path: dict[str, list[str]] = {}
    for name, record in records.items():
        by_path.setdefault(path_label(record), []).append(name)
    lines = [
        "## Numerics provenance",
        "",
        "Reruns are bit-identical on one numerics path (the same CPU kernels or GPU and library builds, "
        "and the same job's thread count, which each record's `numerics.threads` holds); on another path "
        "the same config gives the same distribution (numbers agree within "
        "their intervals), not the same bits. The base model and the runs here were computed on:",
        "",
        "| numerics path | records |",
        "|---|---|",
        *[f"| {path} | {len(names)}: {', '.join(names)} |" for path, names in by_path.items()],
        "",
    ]
    if len(by_path) > 1:
        lines += [f"**{len(by_path)} numerics paths** in one analysis: no bit-level claim spans them.", ""]
    return "\n".join(lines)
