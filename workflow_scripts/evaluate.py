"""Evaluation of one run on one task: pass@1 and KL to the run's reference base, one job (``evaluate``).

One job per (run, task) loads the tokenizer, the policy and the reference base once and writes the
three files of that pair (a second job per pair would pay the start-up, ~5-10 s of imports and a model
load, again for a few seconds of work). Run names (``paths``): ``base`` (results/models/base in its
saved dtype, model.dtype), ``base-<dtype>`` (the same weights cast to an arm's param dtype, as training
starts from them: ``load_model(base, param_dtype)``, what ``precision.load_policy`` does) and
``{precision}-s{seed}`` (results/train/{precision}/seed{seed}/model, in the dtype it was saved in: a
bf16 run is evaluated in bf16, which is the point of the experiment).

Per-arm reference (``reference_run``): a trained run is compared with the base in its arm's starting
dtype: dJ is paired with the samples of base run ``reference_run`` and KL is measured against the base
loaded in the arm's param dtype, so a difference measures training, not the cast. A base run is its own
reference (KL exactly 0: a separate copy of the same weights).

The job = generate -> score -> summarize, then KL (separate functions, so scoring and summaries are
tested on crafted completions):

- ``generate``: ``eval.n_samples`` samples per problem at ``eval.temperature`` / ``eval.top_p``, the task's
  ``max_new_tokens``, through the backend ``eval.backend`` names:

  | backend | sampler                                                 | where    | imports vllm |
  |---------|---------------------------------------------------------|----------|--------------|
  | hf      | ``generation.sample_completions``: batched across       | CPU, GPU | never        |
  |         | prompts, left padding, KV cache, memory-bounded batches |          |              |
  | vllm    | ``vllm_backend.sample_completions_vllm``                | GPU      | when chosen  |

- ``score``: ``verifiers.verify_batch`` (the verifier the training reward uses), ``eval.code_timeout``
  seconds per check for code tasks and ``eval.verify_timeout`` for the rest; a check that hangs or
  crashes is scored wrong with status timeout/error, never fails the job.
- ``summarize`` (``eval_summary``): pass@1 and SE, pass@k, status counts, eval-noise variance, paired
  dJ against the reference base run (estimators and their rationale: ``passk``).
- KL: ``kl.estimate_kl`` on ``eval.kl_prompts`` prompts x ``eval.kl_samples`` fresh samples of the policy
  at T=1, top_p=1 (the eval samples are not draws from pi_theta).

Seeds: sampling seed = hash(eval.seed, run, task, purpose) (``derive_seed``), purpose "eval" or "kl";
a repeat (``<precision>-s<seed>-r<k>``, the noise floor) uses the streams of the run it repeats
(``paths.stream_run``: common random numbers, so repeats differ only by their numerics).
Each run/task gets its own reproducible stream, independent of the other runs, so the finite-sample
noise of two runs' pass@1 is independent and ``eval_noise_var`` is exactly its contribution to an
across-seed variance (common random numbers across runs would correlate that noise and make the
correction wrong). KL prompts are a seeded sample that depends on (eval.seed, task) only: every run's KL
is measured on the same prompts. Both streams are the ones the former separate evaluate and kl jobs
drew, so merging the jobs changed no number (tested against the pre-merge outputs).

Outputs (results/eval/{run}/):

``{task}.samples.parquet``, one row per problem x sample (``SAMPLE_COLUMNS``): run, task, prompt_id (the
data row's id), prompt_index (row order in the eval file), sample_index, completion, extracted (the
verifier's answer, null if none), correct, status (ok / no_answer / timeout / error), length (generated
tokens, end token included), truncated (hit max_new_tokens without an end token).

``{task}.json``: run, task, kind, role, backend, dtype, bf16_matmul (the path a bf16 model's products
took: native / emulated, ``bf16_matmul``; null without a bf16 model), model_dir, seed, sampling
{temperature, top_p, max_new_tokens, n_samples}, N (problems), n (samples per problem), pass_at_1,
pass_at_1_se, pass_at_k {k: {mean, se}} for k in 1, 2, 4, ... <= n and n, eval_noise_var, counts
{samples, correct, ok, no_answer, timeout, error, truncated}, mean_length, problem_ids and correct_counts
(per-problem success counts c_i, aligned; the variance analysis reads these, not the parquet),
reference_run, dJ, dJ_se, base_pass_at_1, paired_N (null for a base run), timing {startup_s (process
start to the job's first line: interpreter, imports), load_s (tokenizer and models), generate_s, score_s,
completions_per_s}.

``{task}.kl.json`` (estimator: ``kl``): run, task, reference_run, policy_dtype, reference_dtype,
bf16_matmul, seed, temperature 1.0, top_p 1.0, max_new_tokens, k1_mean, k1_se, k3_mean, k3_se, rb_mean,
rb_se (across prompts), k1_mc_var, k3_mc_var, rb_mc_var (Monte-Carlo variance given the prompts: the eval
noise of a run's KL, since every run has the same prompts), n_prompts, n_samples, prompt_ids,
per_prompt_k1, per_prompt_k3, per_prompt_rb (aligned with prompt_ids), mean_length, truncated_frac,
timing {sample_s, score_s}. A base run against itself is exactly 0.

Standard errors are null (not NaN) where undefined (a single problem or prompt); so are the mc vars
with ``eval.kl_samples`` 1.
"""

from workflow_scripts.runtime import startup  # noqa: F401  first: no garbage collection during imports
from workflow_scripts.runtime.threads import (
    limit_threads,
    log_startup,
    process_age_s,
)  # first: sets OpenMP's wait policy

# isort: split

import argparse
import hashlib
import logging
import os
import time

import pandas as pd
import torch

from workflow_scripts.measures.eval_summary import finite, summarize
from workflow_scripts.models.generation import Completion, sample_completions, stop_token_ids
from workflow_scripts.models.loading import dtype_of, load_pair, load_run_model, saved_dtype
from workflow_scripts.models.modeling import load_tokenizer
from workflow_scripts.runtime import paths
from workflow_scripts.runtime.atomic import write_json, write_parquet
from workflow_scripts.runtime.eval_matmul import bf16_matmul as eval_bf16_matmul
from workflow_scripts.runtime.smk import main_from
from workflow_scripts.tasks.rows import Row, read_parquet, read_rows
from workflow_scripts.training.bf16_matmul import bf16_matmul as matmul_context
from workflow_scripts.training.bf16_matmul import resolve as resolve_matmul

log = logging.getLogger("evaluate")

SAMPLE_COLUMNS = (
    "run", "task", "prompt_id", "prompt_index", "sample_index", "completion", "extracted", "correct",
    "status", "length", "truncated",
)  # fmt: skip
BACKENDS = ("hf", "vllm")


def derive_seed(base_seed: int, *parts: str) -> int:
    """A stable 31-bit seed from the config seed and names (Python's hash() is salted per process)."""
    digest = hashlib.sha256("/".join([str(base_seed), *map(str, parts)]).encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def _check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"eval.backend: unknown backend {backend!r}; known: {BACKENDS}")


# ------------------------------------------------------------------------------------ generate


def generate(
    model_dir: str | os.PathLike,
    prompts: list[str],
    eval_cfg: dict,
    max_new_tokens: int,
    seed: int,
    trust_remote_code: bool = False,
    *,
    model=None,
    tokenizer=None,
    dtype: str | None = None,
    threads: int | None = None,
) -> tuple[list[Completion], dict]:
    """``eval.n_samples`` completions per prompt (prompt-major) and {backend, dtype, generate_s, vllm}
    (vllm: the engine's record, ``vllm_engine.engine_record``; None on the hf backend).

    ``model``/``tokenizer``: already loaded ones (hf backend; the evaluate job loads them once for
    sampling and KL); else loaded from ``model_dir`` in ``dtype`` (default: the saved dtype)."""
    backend = eval_cfg["backend"]
    _check_backend(backend)
    tokenizer = tokenizer or load_tokenizer(model_dir, trust_remote_code)
    start = time.perf_counter()
    common = {
        "n_samples": eval_cfg["n_samples"],
        "temperature": eval_cfg["temperature"],
        "top_p": eval_cfg["top_p"],
        "max_new_tokens": max_new_tokens,
        "seed": seed,
    }
    engine = None
    if backend == "vllm":
        from workflow_scripts.models.vllm_backend import import_vllm, sample_completions_vllm

        import_vllm()  # fail before anything is loaded
        dtype = dtype or saved_dtype(model_dir)
        from transformers import GenerationConfig

        try:
            gen_cfg = GenerationConfig.from_pretrained(model_dir)
        except OSError:  # no generation_config.json: the tokenizer's eos only
            gen_cfg = None
        stops = stop_token_ids(None, tokenizer, gen_cfg)
        completions, engine = sample_completions_vllm(
            model_dir, tokenizer, prompts, dtype=dtype, stop_ids=stops, engine=eval_cfg.get("vllm"),
            threads=threads, **common,
        )  # fmt: skip
    else:
        if model is None:
            model, dtype = load_run_model(model_dir, trust_remote_code, dtype=dtype)
        else:
            dtype = dtype or str(next(model.parameters()).dtype).removeprefix("torch.")
        completions = sample_completions(
            model,
            tokenizer,
            prompts,
            batch_size=eval_cfg["batch_size"],
            memory_budget_gb=eval_cfg.get("memory_budget_gb"),
            **common,
        )
    info = {"backend": backend, "dtype": dtype, "generate_s": round(time.perf_counter() - start, 3),
            "vllm": engine}  # fmt: skip
    return completions, info


# --------------------------------------------------------------------------------------- score


def score(
    rows: list[Row],
    completions: list[Completion],
    kind: str,
    eval_cfg: dict,
    workers: int = 1,
    run: str = "",
    task: str = "",
    settings: dict | None = None,
) -> pd.DataFrame:
    """One row per completion (``SAMPLE_COLUMNS``), verified by the task's verifier (``settings``: the
    task's ``verifier`` block, None = the verifier's defaults)."""
    from workflow_scripts.verify.verifiers import VERIFIERS, verify_batch

    timeout = eval_cfg[VERIFIERS[kind].timeout_key]
    rows_of = [rows[c.prompt_index] for c in completions]
    verdicts = verify_batch(
        kind,
        [c.text for c in completions],
        [str(r["answer"]) for r in rows_of],
        [r["meta"] for r in rows_of],
        timeout=timeout,
        workers=max(1, workers),
        prompts=[r["prompt"] for r in rows_of],
        settings=settings,
    )
    frame = pd.DataFrame(
        {
            "run": run,
            "task": task,
            "prompt_id": [str(r["id"]) for r in rows_of],
            "prompt_index": [c.prompt_index for c in completions],
            "sample_index": [c.sample_index for c in completions],
            "completion": [c.text for c in completions],
            "extracted": [v.extracted for v in verdicts],
            "correct": [bool(v.correct) for v in verdicts],
            "status": [v.status for v in verdicts],
            "length": [c.num_tokens for c in completions],
            "truncated": [bool(c.truncated) for c in completions],
        },
        columns=list(SAMPLE_COLUMNS),
    )
    types = {"prompt_index": "int32", "sample_index": "int32", "length": "int32"}
    return frame.astype({**types, "correct": bool, "truncated": bool})


# ------------------------------------------------------------------------------------------ KL


def kl_prompt_indices(n_rows: int, k: int, seed: int) -> list[int]:
    """``k`` of ``n_rows`` problems, a seeded sample in file order (all of them when k >= n_rows)."""
    if k >= n_rows:
        return list(range(n_rows))
    gen = torch.Generator().manual_seed(seed)
    return sorted(torch.randperm(n_rows, generator=gen)[:k].tolist())


def measure_kl(policy, reference, tokenizer, rows: list[Row], eval_cfg: dict, max_new_tokens: int,
               run: str, task: str) -> dict:  # fmt: skip
    """KL(pi_run || pi_reference) on this task's KL prompts (``kl.estimate_kl``), as the kl.json dict."""
    from workflow_scripts.measures.kl import estimate_kl

    prompt_seed = derive_seed(eval_cfg["seed"], task, "kl-prompts")
    chosen = kl_prompt_indices(len(rows), eval_cfg["kl_prompts"], prompt_seed)
    seed = derive_seed(eval_cfg["seed"], paths.stream_run(run), task, "kl")
    est = estimate_kl(
        policy,
        reference,
        tokenizer,
        [rows[i]["prompt"] for i in chosen],
        n_samples=eval_cfg["kl_samples"],
        max_new_tokens=max_new_tokens,
        batch_size=eval_cfg["batch_size"],
        seed=seed,
        memory_budget_gb=eval_cfg.get("memory_budget_gb"),
    )
    out = est.as_dict()
    timing = {"sample_s": round(out.pop("sample_seconds"), 3), "score_s": round(out.pop("score_seconds"), 3)}
    out.update(
        run=run,
        task=task,
        seed=seed,
        temperature=1.0,
        top_p=1.0,
        max_new_tokens=max_new_tokens,
        prompt_ids=[str(rows[i]["id"]) for i in chosen],
        timing=timing,
    )
    return out


# ------------------------------------------------------------------------------------ the stage


def _read_task_rows(data_path: str | os.PathLike, kind: str) -> list[Row]:
    rows = read_rows(data_path)
    if not rows:
        raise ValueError(f"{data_path}: no problems")
    kinds = {r["kind"] for r in rows}
    if kinds != {kind}:
        raise ValueError(f"{data_path}: rows have kind(s) {sorted(kinds)} but the task's kind is {kind!r}")
    return rows


def run(
    *,
    model: str | os.PathLike,
    base: str | os.PathLike,
    data: str | os.PathLike,
    samples_out: str | os.PathLike,
    summary_out: str | os.PathLike,
    kl_out: str | os.PathLike,
    eval_cfg: dict,
    task_cfg: dict,
    run: str,
    task: str,
    reference_run: str | None = None,
    policy_dtype: str | None = None,
    reference_dtype: str | None = None,
    base_samples: str | os.PathLike | None = None,
    threads: int = 1,
    trust_remote_code: bool = False,
    bf16_matmul: str = "auto",
) -> tuple[dict, dict]:
    """The ``evaluate`` rule: one (run, task) -> samples, summary and KL files, written atomically.

    ``model`` in ``policy_dtype`` (None: as saved) is the policy; ``base`` in ``reference_dtype`` (None:
    the policy's dtype) the KL reference; ``base_samples`` (the reference run's samples of this task)
    pairs dJ; ``bf16_matmul`` how a bf16 model's products run (``bf16_matmul.resolve``: auto = emulated
    on a CPU without bf16 GEMM kernels; recorded as ``bf16_matmul`` in both files): the rule and the CLI
    pass the run's training setting (``runtime.eval_matmul``). Returns (summary, kl)."""
    startup_s = process_age_s()
    limit_threads(threads)
    reference_run = reference_run or run
    kind = task_cfg["kind"]
    rows = _read_task_rows(data, kind)
    max_new = task_cfg["max_new_tokens"]
    prompts = [r["prompt"] for r in rows]
    seed = derive_seed(eval_cfg["seed"], paths.stream_run(run), task, "eval")  # a repeat: its run's
    log.info("%s/%s: %d problems x %d samples, seed %d", run, task, len(rows), eval_cfg["n_samples"], seed)
    start = time.perf_counter()
    tokenizer = load_tokenizer(model, trust_remote_code)
    load_s = time.perf_counter() - start
    completions = info = None
    if eval_cfg["backend"] == "vllm":  # vLLM holds the GPU while it samples: models after it
        completions, info = generate(model, prompts, eval_cfg, max_new, seed, trust_remote_code,
                                     tokenizer=tokenizer, dtype=policy_dtype, threads=threads)  # fmt: skip
    start = time.perf_counter()
    policy, reference = load_pair(model, base, policy_dtype, reference_dtype, trust_remote_code)
    load_s += time.perf_counter() - start
    log_startup(startup_s, load_s)
    log.info("%s/%s: started after %.1fs, tokenizer and models loaded in %.1fs (policy %s, reference %s)",
             run, task, startup_s, load_s, dtype_of(policy), dtype_of(reference))  # fmt: skip
    bf16 = "bfloat16" in (dtype_of(policy), dtype_of(reference))
    matmul = resolve_matmul(bf16_matmul, next(policy.parameters()).device.type) if bf16 else "native"
    if completions is None:
        with matmul_context(matmul):
            completions, info = generate(model, prompts, eval_cfg, max_new, seed, trust_remote_code,
                                         model=policy, tokenizer=tokenizer,
                                         dtype=dtype_of(policy))  # fmt: skip
    log.info("generated %d completions in %.1fs (%s, %s)", len(completions), info["generate_s"],
             info["backend"], info["dtype"])  # fmt: skip
    start = time.perf_counter()
    samples = score(rows, completions, kind, eval_cfg, workers=threads, run=run, task=task,
                    settings=task_cfg.get("verifier"))  # fmt: skip
    score_s = time.perf_counter() - start
    paired = read_parquet(base_samples) if base_samples and reference_run != run else None
    summary = summarize(samples, eval_cfg["n_samples"], paired)
    summary.update(
        run=run,
        task=task,
        kind=kind,
        role=task_cfg.get("role"),
        backend=info["backend"],
        dtype=info["dtype"],
        vllm=info["vllm"],
        bf16_matmul=matmul if bf16 else None,
        model_dir=str(model),
        seed=seed,
        reference_run=reference_run,
        sampling={
            "temperature": eval_cfg["temperature"],
            "top_p": eval_cfg["top_p"],
            "max_new_tokens": max_new,
            "n_samples": eval_cfg["n_samples"],
        },
        timing={
            "startup_s": round(startup_s, 3),
            "load_s": round(load_s, 3),
            "generate_s": info["generate_s"],
            "score_s": round(score_s, 3),
            "completions_per_s": round(len(completions) / max(info["generate_s"], 1e-9), 2),
        },
    )
    summary = finite(summary)
    with matmul_context(matmul):
        kl = measure_kl(policy, reference, tokenizer, rows, eval_cfg, max_new, run, task)
    kl.update(
        reference_run=reference_run,
        policy_dtype=dtype_of(policy),
        reference_dtype=dtype_of(reference),
        bf16_matmul=matmul if bf16 else None,
    )
    kl = finite(kl)
    write_parquet(samples_out, samples)
    write_json(summary_out, summary)
    write_json(kl_out, kl)
    log.info("%s/%s: pass@1 %.4f +- %s; counts %s; dJ %s vs %s", run, task, summary["pass_at_1"],
             summary["pass_at_1_se"], summary["counts"], summary["dJ"], reference_run)  # fmt: skip
    log.info("%s/%s: KL k1 %.4g +- %s, k3 %.4g +- %s (%d prompts x %d) vs %s in %s", run, task, kl["k1_mean"],
             kl["k1_se"], kl["k3_mean"], kl["k3_se"], kl["n_prompts"], kl["n_samples"], reference_run,
             kl["reference_dtype"])  # fmt: skip
    return summary, kl


def from_snakemake(smk) -> None:
    run(
        model=smk.input.model,
        base=smk.input.base,
        data=smk.input.data,
        samples_out=smk.output.samples,
        summary_out=smk.output.summary,
        kl_out=smk.output.kl,
        eval_cfg=dict(smk.params.eval),
        task_cfg=dict(smk.params.task),
        run=smk.wildcards.run,
        task=smk.wildcards.task,
        base_samples=smk.input.get("base_samples"),
        threads=smk.threads,
        trust_remote_code=smk.params.trust_remote_code,
        bf16_matmul=smk.params.bf16_matmul,  # the run's training path (runtime/eval_matmul.py)
        **dict(smk.params.reference),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Evaluate a run on a task: pass@1 and KL to its reference base."
    )
    parser.add_argument("--config", default="config.yaml")
    parser.add_argument("--run", default=paths.BASE)
    parser.add_argument("--task", required=True)
    parser.add_argument("--results", default=paths.RESULTS)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    from workflow_scripts.runtime.config import load_config

    config = load_config(args.config)
    res = args.results
    reference = paths.reference_spec(config, args.run)
    paired = None
    if reference["reference_run"] != args.run:
        paired = paths.eval_samples(reference["reference_run"], args.task, res)
    run(model=paths.model_dir(args.run, res), base=paths.base_model_dir(res),
        data=paths.eval_data(args.task, res), samples_out=paths.eval_samples(args.run, args.task, res),
        summary_out=paths.eval_summary(args.run, args.task, res),
        kl_out=paths.kl_summary(args.run, args.task, res),
        eval_cfg=config["eval"], task_cfg=config["data"]["tasks"][args.task], run=args.run, task=args.task,
        base_samples=paired, threads=args.threads, trust_remote_code=config["model"]["trust_remote_code"],
        bf16_matmul=eval_bf16_matmul(config, args.run), **reference)  # fmt: skip
    return 0


if __name__ == "__main__":
    main_from(globals())
