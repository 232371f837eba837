"""The vLLM sampler behind ``eval.backend: vllm``. vllm is imported only when chosen.

It mirrors ``generation.sample_completions``: the same prompt token ids (the HF tokenizer,
``add_special_tokens=False``, passed to vLLM as token prompts), the same end tokens, temperature/top_p and
nothing else (``generation_config="vllm"``: the model's saved sampling defaults are ignored; repetition
penalty 1), and the same ``Completion`` records, text decoded by the HF tokenizer. The model runs in
the run's saved dtype (``dtype=``; vLLM supports float32 and bfloat16). The engine's settings are
``eval.vllm`` (``vllm_engine``); it is shut down before the function returns.

Seeds. vLLM seeds sample j of a request with n samples as ``request seed + j``
(vllm/v1/engine/parallel_sampling.py), so prompt i's request gets ``sample_seed(seed, i, n) = seed + i*n``
and every (prompt, sample) draws from its own stream ``seed + i*n + j``: no two samples of one job share
one (with ``seed + i`` sample j of prompt i and sample j-1 of prompt i+1 did). Results do not depend on
how vLLM batches the requests. Greedy decoding (temperature 0) sends one request per prompt (vLLM
refuses n > 1 without sampling) and repeats its completion n times, as the HF path returns them.

Not used for KL: vLLM's kernels and sampler differ numerically from the HF forward that teacher-forces
the samples, so its draws are not exactly from the pi_theta that is scored (a bias, not only noise).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping

from workflow_scripts.models.generation import Completion
from workflow_scripts.models.vllm_engine import (
    BackendError,
    engine_kwargs,
    engine_record,
    free_memory,
    import_vllm,
    keep_threads,
    prepare_process,
    release,
)

__all__ = ["BackendError", "import_vllm", "sample_completions_vllm", "sample_seed"]


def sample_seed(seed: int, prompt_index: int, n_samples: int) -> int:
    """The request seed of prompt ``prompt_index``: its samples draw streams seed + i*n ... + n - 1."""
    return int(seed) + int(prompt_index) * int(n_samples)


def sample_completions_vllm(
    model_dir: str | os.PathLike,
    tokenizer,
    prompts: list[str],
    n_samples: int,
    temperature: float,
    top_p: float,
    max_new_tokens: int,
    seed: int,
    dtype: str,
    stop_ids: list[int],
    engine: Mapping | None = None,
    threads: int | None = None,
) -> tuple[list[Completion], dict]:
    """``n_samples`` completions per prompt from vLLM, prompt-major, as ``Completion`` records, and the
    engine's record (``vllm_engine.engine_record`` + start_s, the engine's start, and sample_s, the
    sampling alone). ``engine``: the ``eval.vllm`` settings."""
    vllm = import_vllm()
    prepare_process()
    settings = dict(engine or {"gpu_memory_utilization": 0.9})
    started = time.perf_counter()
    with keep_threads(threads):
        llm = vllm.LLM(
            model=str(model_dir),
            tokenizer=str(model_dir),
            dtype=dtype,
            seed=seed,
            generation_config="vllm",
            **engine_kwargs(settings, "eval.vllm"),
        )
    try:
        record = engine_record(llm) | {"start_s": round(time.perf_counter() - started, 3)}
        prompt_ids = tokenizer(list(prompts), add_special_tokens=False)["input_ids"]
        greedy = temperature <= 0
        per_request = 1 if greedy else n_samples
        params = [
            vllm.SamplingParams(
                n=per_request,
                temperature=0.0 if greedy else temperature,
                top_p=1.0 if greedy else top_p,
                max_tokens=max_new_tokens,
                seed=sample_seed(seed, i, n_samples),
                stop_token_ids=list(stop_ids),
                repetition_penalty=1.0,
            )
            for i in range(len(prompts))
        ]
        sampling = time.perf_counter()
        outputs = llm.generate([{"prompt_token_ids": ids} for ids in prompt_ids], params, use_tqdm=False)
        record["sample_s"] = round(time.perf_counter() - sampling, 3)
    finally:
        release(llm)
        del llm
        free_memory()
    stops = set(stop_ids)
    out: list[Completion] = []
    for i, request in enumerate(outputs):
        samples = list(request.outputs)
        if len(samples) != per_request:
            raise BackendError(f"vLLM returned {len(samples)} samples for prompt {i}, expected {per_request}")
        if greedy:
            samples = samples * n_samples
        for s, sample in enumerate(samples):
            ids = list(sample.token_ids)
            stop = None
            if ids and ids[-1] in stops:
                stop = ids.pop()
            elif sample.finish_reason == "stop" and len(ids) < max_new_tokens:  # end token not in token_ids
                reason = getattr(sample, "stop_reason", None)
                stop = reason if reason in stops else stop_ids[0]
            text = tokenizer.decode(ids, skip_special_tokens=True)
            length = len(ids) + int(stop is not None)
            out.append(Completion(i, s, text, length, stop is None, tuple(ids), stop))
    return out, record
