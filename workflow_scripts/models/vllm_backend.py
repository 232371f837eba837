"""The vLLM sampler behind ``eval.backend: vllm``. vllm is imported only when chosen.

It mirrors ``generation.sample_completions``: the same prompt token ids (the HF tokenizer,
``add_special_tokens=False``, passed to vLLM as token prompts), the same end tokens, temperature/top_p and
nothing else (``generation_config="vllm"``: the model's saved sampling defaults are ignored; repetition
penalty 1), and the same ``Completion`` records, text decoded by the HF tokenizer. The model runs in
the run's saved dtype (``dtype=``; vLLM supports float32 and bfloat16), in-process, with IEEE fp32
products and the job's own compile cache (``vllm_engine.prepare_process``); its record says what the
worker really ran (attention backend, KV-cache tensors' dtype, matmul precision). The engine's settings
are ``eval.vllm`` (``vllm_engine``). ``EvalEngine`` starts one engine for a job's prompt sets (every task of
a run in the per-run evaluate job) and shuts it down when the job's sampling is done.

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

__all__ = [
    "BackendError", "EvalEngine", "import_vllm", "open_engine", "sample_completions_vllm", "sample_llm",
    "sample_seed",
]  # fmt: skip


def sample_seed(seed: int, prompt_index: int, n_samples: int) -> int:
    """The request seed of prompt ``prompt_index``: its samples draw streams seed + i*n ... + n - 1."""
    return int(seed) + int(prompt_index) * int(n_samples)


class EvalEngine:
    """One evaluation engine for one model, started once and sampled for as many prompt sets as a job has
    (the per-run evaluate job: every task of a run through one engine start), then shut down.

    ``with EvalEngine(...) as engine: engine.sample(...)``; leaving the block releases the engine
    (``vllm_engine.release``) and drops this object's only reference to it, so the HF models that follow
    load into freed memory. ``record``: ``vllm_engine.engine_record`` + start_s (the engine's start)."""

    def __init__(self, model_dir: str | os.PathLike, tokenizer, dtype: str, stop_ids: list[int], seed: int,
                 engine: Mapping | None = None, threads: int | None = None):  # fmt: skip
        prepare_process()  # before vllm is imported: some of its modules read their variables on import
        vllm = import_vllm()
        settings = dict(engine or {"gpu_memory_utilization": 0.9})
        started = time.perf_counter()
        with keep_threads(threads):
            # seed: vLLM's default for requests without one; every request here carries its own
            self._llm = vllm.LLM(
                model=str(model_dir),
                tokenizer=str(model_dir),
                dtype=dtype,
                seed=seed,
                generation_config="vllm",
                **engine_kwargs(settings, "eval.vllm"),
            )
        self.tokenizer = tokenizer
        self.stop_ids = list(stop_ids)
        self.record = engine_record(self._llm) | {"start_s": round(time.perf_counter() - started, 3)}

    def __enter__(self) -> EvalEngine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._llm is not None:
            try:
                release(self._llm)
            finally:
                self._llm = None
                free_memory()

    def sample(self, prompts: list[str], n_samples: int, temperature: float, top_p: float,
               max_new_tokens: int, seed: int) -> tuple[list[Completion], float]:  # fmt: skip
        """``n_samples`` completions per prompt, prompt-major, and the seconds sampling took."""
        if self._llm is None:
            raise BackendError("the evaluation engine was already shut down")
        return sample_llm(self._llm, self.tokenizer, self.stop_ids, prompts, n_samples, temperature, top_p,
                          max_new_tokens, seed)  # fmt: skip


def sample_llm(llm, tokenizer, stop_ids: list[int], prompts: list[str], n_samples: int, temperature: float,
               top_p: float, max_new_tokens: int, seed: int,
               first_index: int = 0) -> tuple[list[Completion], float]:  # fmt: skip
    """``n_samples`` completions per prompt from an open ``vllm.LLM`` (this module's evaluation engine, or
    the trainer's colocated rollout engine for the held-out curves), prompt-major, and the seconds it took.
    ``first_index``: ``prompts`` are prompts first_index, first_index + 1, ... of a larger set (one rank's
    share of the held-out slice): their seeds and ``prompt_index`` are those the whole set would give them."""
    from vllm import SamplingParams

    prompt_ids = tokenizer(list(prompts), add_special_tokens=False)["input_ids"]
    greedy = temperature <= 0
    per_request = 1 if greedy else n_samples
    params = [
        SamplingParams(
            n=per_request,
            temperature=0.0 if greedy else temperature,
            top_p=1.0 if greedy else top_p,
            max_tokens=max_new_tokens,
            seed=sample_seed(seed, first_index + i, n_samples),
            stop_token_ids=list(stop_ids),
            repetition_penalty=1.0,
        )
        for i in range(len(prompts))
    ]
    started = time.perf_counter()
    requests = [{"prompt_token_ids": ids} for ids in prompt_ids]
    outputs = llm.generate(requests, params, use_tqdm=False)
    seconds = time.perf_counter() - started
    completions = _completions(outputs, tokenizer, list(stop_ids), n_samples, per_request, max_new_tokens,
                               first_index)  # fmt: skip
    return completions, seconds


def _completions(outputs, tokenizer, stop_ids: list[int], n_samples: int, per_request: int,
                 max_new_tokens: int, first_index: int = 0) -> list[Completion]:  # fmt: skip
    """vLLM's request outputs as ``Completion`` records (greedy: the one sample repeated n times)."""
    stops = set(stop_ids)
    out: list[Completion] = []
    for i, request in enumerate(outputs):
        samples = list(request.outputs)
        if len(samples) != per_request:
            raise BackendError(f"vLLM returned {len(samples)} samples for prompt {i}, expected {per_request}")
        if per_request != n_samples:
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
            out.append(Completion(first_index + i, s, text, length, stop is None, tuple(ids), stop))
    return out


def open_engine(model_dir: str | os.PathLike, tokenizer, settings: Mapping | None, dtype: str | None,
                seed: int, threads: int | None = None) -> EvalEngine:  # fmt: skip
    """The evaluation engine (``settings``: ``eval.vllm``) for ``model_dir`` in ``dtype`` (None: as saved),
    stopping at the tokenizer's and the model's generation config's end tokens, as the HF sampler does."""
    import_vllm()  # fail before anything is loaded
    from transformers import GenerationConfig

    from workflow_scripts.models.generation import stop_token_ids
    from workflow_scripts.models.loading import saved_dtype

    try:
        gen_cfg = GenerationConfig.from_pretrained(model_dir)
    except OSError:  # no generation_config.json: the tokenizer's eos only
        gen_cfg = None
    stops = stop_token_ids(None, tokenizer, gen_cfg)
    return EvalEngine(model_dir, tokenizer, dtype or saved_dtype(model_dir), stops, seed, settings, threads)


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
    """``n_samples`` completions per prompt from a fresh engine (``EvalEngine``, shut down before this
    returns) and the engine's record + sample_s (the sampling alone). ``engine``: the ``eval.vllm``
    settings."""
    with EvalEngine(model_dir, tokenizer, dtype, stop_ids, seed, engine, threads) as llm:
        completions, seconds = llm.sample(prompts, n_samples, temperature, top_p, max_new_tokens, seed)
        return completions, llm.record | {"sample_s": round(seconds, 3)}
