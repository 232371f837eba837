"""What run.json records about where a training run ran: package versions, peak GPU memory (allocated and
reserved), and the vLLM engine as TRL built it (read from the trainer, not the config: what ran, not what
was asked)."""

from __future__ import annotations

import platform

import torch


def versions() -> dict:
    """The versions of the packages a run's numbers depend on."""
    import accelerate
    import transformers
    import trl

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "trl": trl.__version__,
        "accelerate": accelerate.__version__,
    }


def peak_gpu_memory_gb() -> float | None:
    """Peak GiB the PyTorch allocator held on this process's GPU (a colocated vLLM's KV cache included)."""
    if not torch.cuda.is_available():
        return None
    return round(torch.cuda.max_memory_allocated() / 2**30, 3)


def peak_gpu_memory_reserved_gb() -> float | None:
    """Peak GiB the PyTorch allocator reserved from the device (its allocated peak + cached, split blocks):
    what the memory plan's fragmentation term estimates. Not the CUDA context or memory outside torch."""
    if not torch.cuda.is_available():
        return None
    return round(torch.cuda.max_memory_reserved() / 2**30, 3)


def peak_gpu_memory() -> dict:
    """run.json's two peaks (GiB; null on CPU): allocated and reserved by the PyTorch allocator."""
    return {
        "peak_gpu_memory_gb": peak_gpu_memory_gb(),
        "peak_gpu_memory_reserved_gb": peak_gpu_memory_reserved_gb(),
    }


def vllm_record(trainer) -> dict:
    """Whether TRL generated the rollouts with vLLM, and the engine: the dtype and seed it runs with
    (vLLM picks its own dtype for a float32 checkpoint unless told), and ``vllm_engine.engine_record``:
    its attention backend and dtype, matmul precision, KV-cache tensors' dtype, LM-head dtype, determinism
    switches and ``train.vllm`` settings, read from its worker's objects when TRL built it
    (``grpo_trainer.vllm_engine_args``), or now where that recorded nothing; not from the config."""
    generation = getattr(trainer, "vllm_generation", None) if getattr(trainer, "use_vllm", False) else None
    if generation is None:
        return {"used": False, "mode": None, "dtype": None, "seed": None, "seed_given": None}
    llm = getattr(generation, "llm", None)
    engine = getattr(llm, "llm_engine", None)
    dtype = getattr(getattr(engine, "model_config", None), "dtype", None)
    mode = getattr(generation, "mode", None)
    built = dict(getattr(trainer, "vllm_engine_args", {}))
    given = built.pop("seed", None)  # grpo_trainer.vllm_seed(run seed, group)
    built.pop("dtype", None)
    if "matmul_precision" not in built and llm is not None:  # built without train.vllm settings
        from workflow_scripts.models.vllm_engine import engine_record

        built.update(engine_record(llm))
    seed = getattr(getattr(engine, "model_config", None), "seed", given)  # what the engine holds
    return {"used": True, "mode": mode, "dtype": str(dtype).removeprefix("torch."), "seed": seed,
            "seed_given": given, **built}  # fmt: skip
