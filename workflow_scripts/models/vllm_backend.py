"""The vLLM sampler behind ``eval.backend: vllm`` (GPU machines). vllm is imported only when chosen.

It mirrors ``generation.sample_completions``: the same prompt token ids (the HF tokenizer,
``add_special_tokens=False``, passed to vLLM as token prompts), the same end tokens, temperature/top_p and
nothing else (``generation_config="vllm"``: the model's saved sampling defaults are ignored; repetition
penalty 1), and the same ``Completion`` records, text decoded by the HF tokenizer. The model runs in
the run's saved dtype (``dtype=``; vLLM supports float32 and bfloat16). Each request gets its own seed
(seed + prompt index), so results do not depend on how vLLM batches them.

Not used for KL: vLLM's kernels and sampler differ numerically from the HF forward that teacher-forces
the samples, so its draws are not exactly from the pi_theta that is scored (a bias, not only noise).
"""

from __future__ import annotations

import os

from workflow_scripts.models.generation import Completion


class BackendError(RuntimeError):
    """The chosen evaluation backend cannot run here."""


def import_vllm():
    """Import vllm or fail with an error that names the config key that chose it."""
    try:
        import vllm
    except ImportError as err:
        raise BackendError(
            "eval.backend is 'vllm' but the vllm package cannot be imported "
            f"({err}); install it on a GPU machine (pip install '.[gpu]') or set eval.backend: hf"
        ) from err
    return vllm


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
    llm_kwargs: dict | None = None,
) -> list[Completion]:
    """``n_samples`` completions per prompt from vLLM, prompt-major, as ``Completion`` records."""
    vllm = import_vllm()
    llm = vllm.LLM(
        model=str(model_dir),
        tokenizer=str(model_dir),
        dtype=dtype,
        seed=seed,
        generation_config="vllm",
        **(llm_kwargs or {}),
    )
    prompt_ids = tokenizer(list(prompts), add_special_tokens=False)["input_ids"]
    greedy = temperature <= 0
    params = [
        vllm.SamplingParams(
            n=n_samples,
            temperature=0.0 if greedy else temperature,
            top_p=1.0 if greedy else top_p,
            max_tokens=max_new_tokens,
            seed=seed + i,
            stop_token_ids=list(stop_ids),
            repetition_penalty=1.0,
        )
        for i in range(len(prompts))
    ]
    outputs = llm.generate([{"prompt_token_ids": ids} for ids in prompt_ids], params, use_tqdm=False)
    release(llm)
    del llm
    stops = set(stop_ids)
    out: list[Completion] = []
    for i, request in enumerate(outputs):
        samples = list(request.outputs)
        if len(samples) != n_samples:
            raise BackendError(f"vLLM returned {len(samples)} samples for prompt {i}, expected {n_samples}")
        for s, sample in enumerate(samples):
            ids = list(sample.token_ids)
            stop = None
            if ids and ids[-1] in stops:
                stop = ids.pop()
            elif sample.finish_reason == "stop" and len(ids) < max_new_tokens:
                stop = stop_ids[0]  # vLLM dropped the end token from token_ids
            text = tokenizer.decode(ids, skip_special_tokens=True)
            length = len(ids) + int(stop is not None)
            out.append(Completion(i, s, text, length, stop is None, tuple(ids), stop))
    return out


def release(llm) -> None:
    """Free vLLM's GPU memory before the job loads the HF policy and reference for KL (best effort:
    vLLM keeps its KV-cache pool until its engine is shut down)."""
    import gc

    shutdown = getattr(getattr(llm, "llm_engine", None), "shutdown", None)
    if callable(shutdown):
        shutdown()
    gc.collect()
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()
