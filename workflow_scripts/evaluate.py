"""Evaluation of one run on one task (rule ``evaluate``) and its KL to the base policy (rule ``kl``).

A run is ``base`` (results/models/base) or ``{precision}-s{seed}`` (results/train/{precision}/seed{seed}/
model). Every model is loaded in the dtype its safetensors files were saved in (``saved_dtype``): a bf16
run is evaluated in bf16, which is the point of the experiment; the dtype is recorded in the outputs.

evaluate = generate -> score -> summarize (separate functions, so scoring and summaries are tested on
crafted completions):

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
- ``summarize``: pass@1 and SE, pass@k, status counts, eval-noise variance, paired dJ against the
  base run (estimators and their rationale: ``passk``).

Seeds: sampling seed = hash(eval.seed, run, task, purpose) (``derive_seed``), purpose "eval" or "kl".
Each run/task gets its own reproducible stream, independent of the other runs, so the finite-sample
noise of two runs' pass@1 is independent and ``eval_noise_var`` is exactly its contribution to an
across-seed variance (common random numbers across runs would correlate that noise and make the
correction wrong). KL prompts are a seeded sample that depends on (eval.seed, task) only: every run's KL
is measured on the same prompts.

Outputs (results/eval/{run}/):

``{task}.samples.parquet``, one row per problem x sample (``SAMPLE_COLUMNS``): run, task, prompt_id (the
data row's id), prompt_index (row order in the eval file), sample_index, completion, extracted (the
verifier's answer, null if none), correct, status (ok / no_answer / timeout / error), length (generated
tokens, end token included), truncated (hit max_new_tokens without an end token).

``{task}.json``: run, task, kind, role, backend, dtype, model_dir, seed, sampling {temperature, top_p,
max_new_tokens, n_samples}, N (problems), n (samples per problem), pass_at_1, pass_at_1_se, pass_at_k
{k: {mean, se}} for k in 1, 2, 4, ... <= n and n, eval_noise_var, counts {samples, correct, ok,
no_answer, timeout, error, truncated}, mean_length, problem_ids and correct_counts (per-problem success
counts c_i, aligned; the variance analysis reads these, not the parquet), dJ, dJ_se, base_pass_at_1,
paired_N (null for base: dJ is relative to base), timing {generate_s, score_s, completions_per_s}.

``{task}.kl.json`` (rule ``kl``; estimator: ``kl``): run, task, policy_dtype, reference_dtype, seed,
temperature 1.0, top_p 1.0, max_new_tokens, k1_mean, k1_se, k3_mean, k3_se, n_prompts, n_samples,
prompt_ids, per_prompt_k1, per_prompt_k3 (aligned with prompt_ids), mean_length, truncated_frac,
timing {sample_s, score_s}. Base vs base is exactly 0.

Standard errors are null (not NaN) where undefined (a single problem or prompt).
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import math
import os
import sys
import time
from collections import Counter
from pathlib import Path

import pandas as pd
import torch

from workflow_scripts import passk
from workflow_scripts.atomic import write_json, write_parquet
from workflow_scripts.generation import Completion, sample_completions, stop_token_ids
from workflow_scripts.modeling import DTYPES, load_model, load_tokenizer
from workflow_scripts.rows import Row, read_rows

log = logging.getLogger("evaluate")

SAMPLE_COLUMNS = (
    "run", "task", "prompt_id", "prompt_index", "sample_index", "completion", "extracted", "correct",
    "status", "length", "truncated",
)  # fmt: skip
STATUS_KEYS = ("ok", "no_answer", "timeout", "error")
BACKENDS = ("hf", "vllm")
KL_KEYS = ("kl_prompts", "kl_samples")


def derive_seed(base_seed: int, *parts: str) -> int:
    """A stable 31-bit seed from the config seed and names (Python's hash() is salted per process)."""
    digest = hashlib.sha256("/".join([str(base_seed), *map(str, parts)]).encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def saved_dtype(model_dir: str | os.PathLike) -> str:
    """The floating dtype a model folder's safetensors hold (the most common one if mixed)."""
    from workflow_scripts.precision import saved_dtypes

    counts = Counter(d for d in saved_dtypes(model_dir).values() if d in DTYPES)
    if not counts:
        raise ValueError(f"{model_dir}: no floating-point tensors in the safetensors files")
    if len(counts) > 1:
        log.warning("%s: mixed dtypes %s; loading in the most common", model_dir, dict(counts))
    return counts.most_common(1)[0][0]


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def load_run_model(model_dir: str | os.PathLike, trust_remote_code: bool = False, device=None):
    """(model in its saved dtype, on ``device``, eval mode; the dtype's name)."""
    dtype = saved_dtype(model_dir)
    model = load_model(model_dir, dtype, trust_remote_code).to(device or default_device()).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model, dtype


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
) -> tuple[list[Completion], dict]:
    """``eval.n_samples`` completions per prompt (prompt-major) and {backend, dtype, generate_s}."""
    backend = eval_cfg.get("backend", "hf")
    _check_backend(backend)
    tokenizer = load_tokenizer(model_dir, trust_remote_code)
    start = time.perf_counter()
    common = {
        "n_samples": eval_cfg["n_samples"],
        "temperature": eval_cfg["temperature"],
        "top_p": eval_cfg["top_p"],
        "max_new_tokens": max_new_tokens,
        "seed": seed,
    }
    if backend == "vllm":
        from workflow_scripts.vllm_backend import import_vllm, sample_completions_vllm

        import_vllm()  # fail before anything is loaded
        dtype = saved_dtype(model_dir)
        from transformers import GenerationConfig

        try:
            gen_cfg = GenerationConfig.from_pretrained(model_dir)
        except OSError:  # no generation_config.json: the tokenizer's eos only
            gen_cfg = None
        stops = stop_token_ids(None, tokenizer, gen_cfg)
        completions = sample_completions_vllm(
            model_dir, tokenizer, prompts, dtype=dtype, stop_ids=stops, **common
        )
    else:
        model, dtype = load_run_model(model_dir, trust_remote_code)
        completions = sample_completions(
            model,
            tokenizer,
            prompts,
            batch_size=eval_cfg["batch_size"],
            memory_budget_gb=eval_cfg.get("memory_budget_gb"),
            **common,
        )
        del model
    info = {"backend": backend, "dtype": dtype, "generate_s": round(time.perf_counter() - start, 3)}
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
) -> pd.DataFrame:
    """One row per completion (``SAMPLE_COLUMNS``), verified by the task's verifier."""
    from workflow_scripts.verifiers import verify_batch

    timeout = eval_cfg["code_timeout"] if kind == "code" else eval_cfg["verify_timeout"]
    rows_of = [rows[c.prompt_index] for c in completions]
    verdicts = verify_batch(
        kind,
        [c.text for c in completions],
        [str(r["answer"]) for r in rows_of],
        [r["meta"] for r in rows_of],
        timeout=timeout,
        workers=max(1, workers),
        prompts=[r["prompt"] for r in rows_of],
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


# ----------------------------------------------------------------------------------- summarize


def per_problem_counts(samples: pd.DataFrame) -> pd.DataFrame:
    """prompt_id -> (c: correct samples, m: samples), in eval-file order."""
    grouped = samples.groupby("prompt_id", sort=False).agg(
        c=("correct", "sum"), m=("correct", "size"), order=("prompt_index", "min")
    )
    return grouped.sort_values("order")[["c", "m"]]


def summarize(samples: pd.DataFrame, n: int, base_samples: pd.DataFrame | None = None) -> dict:
    """pass@1 +- SE, pass@k, counts, eval-noise variance and (with ``base_samples``) the paired dJ."""
    if samples.empty:
        raise ValueError("no samples to summarize")
    per = per_problem_counts(samples)
    wrong_n = per[per["m"] != n]
    if len(wrong_n):
        example = f"{wrong_n.index[0]!r} has {wrong_n['m'].iloc[0]}"
        raise ValueError(f"expected {n} samples per problem; e.g. {example}")
    counts = per["c"].astype(int).tolist()
    p = per["c"].to_numpy(dtype=float) / n
    pass1, pass1_se = passk.mean_se(p)
    status = samples["status"].value_counts()
    summary: dict = {
        "N": len(per),
        "n": n,
        "pass_at_1": pass1,
        "pass_at_1_se": pass1_se,
        "pass_at_k": passk.pass_at_k_summary(n, counts),
        "eval_noise_var": passk.eval_noise_variance(n, counts),
        "counts": {
            "samples": len(samples),
            "correct": int(samples["correct"].sum()),
            **{key: int(status.get(key, 0)) for key in STATUS_KEYS},
            "truncated": int(samples["truncated"].sum()),
        },
        "mean_length": float(samples["length"].mean()),
        "problem_ids": per.index.tolist(),
        "correct_counts": counts,
        "dJ": None,
        "dJ_se": None,
        "base_pass_at_1": None,
        "paired_N": None,
    }
    if base_samples is not None:
        base = per_problem_counts(base_samples)
        if set(base.index) != set(per.index):
            missing = sorted(set(per.index) ^ set(base.index))[:5]
            raise ValueError(f"base samples cover other problems than this run (e.g. {missing}); rerun base")
        base = base.loc[per.index]
        p0 = base["c"].to_numpy(dtype=float) / base["m"].to_numpy(dtype=float)
        dj, dj_se = passk.paired_difference(p, p0)
        summary.update(dJ=dj, dJ_se=dj_se, base_pass_at_1=float(p0.mean()), paired_N=len(p0))
    return summary


def _finite(obj):
    """NaN/inf -> None, recursively (JSON has no NaN)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    return obj


# ------------------------------------------------------------------------------------ rule entries


def evaluate_run(
    model_dir: str | os.PathLike,
    data_path: str | os.PathLike,
    samples_out: str | os.PathLike,
    summary_out: str | os.PathLike,
    eval_cfg: dict,
    task_cfg: dict,
    run: str,
    task: str,
    base_samples: str | os.PathLike | None = None,
    threads: int = 1,
    trust_remote_code: bool = False,
) -> dict:
    """The ``evaluate`` rule: generate -> score -> summarize, written atomically; returns the summary."""
    torch.set_num_threads(max(1, threads))
    rows = read_rows(data_path)
    if not rows:
        raise ValueError(f"{data_path}: no problems")
    kind = task_cfg["kind"]
    kinds = {r["kind"] for r in rows}
    if kinds != {kind}:
        raise ValueError(f"{data_path}: rows have kind(s) {sorted(kinds)} but the task's kind is {kind!r}")
    seed = derive_seed(eval_cfg["seed"], run, task, "eval")
    max_new = task_cfg["max_new_tokens"]
    log.info("%s/%s: %d problems x %d samples, seed %d", run, task, len(rows), eval_cfg["n_samples"], seed)
    prompts = [r["prompt"] for r in rows]
    completions, info = generate(model_dir, prompts, eval_cfg, max_new, seed, trust_remote_code)
    log.info("generated %d completions in %.1fs (%s, %s)", len(completions), info["generate_s"],
             info["backend"], info["dtype"])  # fmt: skip
    start = time.perf_counter()
    samples = score(rows, completions, kind, eval_cfg, workers=threads, run=run, task=task)
    score_s = time.perf_counter() - start
    base = pd.read_parquet(base_samples) if base_samples else None
    summary = summarize(samples, eval_cfg["n_samples"], base)
    summary.update(
        run=run,
        task=task,
        kind=kind,
        role=task_cfg.get("role"),
        backend=info["backend"],
        dtype=info["dtype"],
        model_dir=str(model_dir),
        seed=seed,
        sampling={
            "temperature": eval_cfg["temperature"],
            "top_p": eval_cfg["top_p"],
            "max_new_tokens": max_new,
            "n_samples": eval_cfg["n_samples"],
        },
        timing={
            "generate_s": info["generate_s"],
            "score_s": round(score_s, 3),
            "completions_per_s": round(len(completions) / max(info["generate_s"], 1e-9), 2),
        },
    )
    summary = _finite(summary)
    write_parquet(samples_out, samples)
    write_json(summary_out, summary)
    log.info("%s/%s: pass@1 %.4f +- %s; counts %s; dJ %s", run, task, summary["pass_at_1"],
             summary["pass_at_1_se"], summary["counts"], summary["dJ"])  # fmt: skip
    return summary


def kl_prompt_indices(n_rows: int, k: int, seed: int) -> list[int]:
    """``k`` of ``n_rows`` problems, a seeded sample in file order (all of them when k >= n_rows)."""
    if k >= n_rows:
        return list(range(n_rows))
    gen = torch.Generator().manual_seed(seed)
    return sorted(torch.randperm(n_rows, generator=gen)[:k].tolist())


def kl_run(
    policy_dir: str | os.PathLike,
    base_dir: str | os.PathLike,
    data_path: str | os.PathLike,
    out_path: str | os.PathLike,
    eval_cfg: dict,
    task_cfg: dict,
    run: str,
    task: str,
    threads: int = 1,
    trust_remote_code: bool = False,
) -> dict:
    """The ``kl`` rule: KL(pi_run || pi_base) on this task's prompts (``kl.estimate_kl``), atomically."""
    from workflow_scripts.kl import estimate_kl

    torch.set_num_threads(max(1, threads))
    rows = read_rows(data_path)
    if not rows:
        raise ValueError(f"{data_path}: no problems")
    prompt_seed = derive_seed(eval_cfg["seed"], task, "kl-prompts")
    chosen = kl_prompt_indices(len(rows), eval_cfg["kl_prompts"], prompt_seed)
    seed = derive_seed(eval_cfg["seed"], run, task, "kl")
    tokenizer = load_tokenizer(policy_dir, trust_remote_code)
    policy, policy_dtype = load_run_model(policy_dir, trust_remote_code)
    # A separate object even for base vs base (two loads of the same weights: exactly 0).
    reference, reference_dtype = load_run_model(base_dir, trust_remote_code)
    est = estimate_kl(
        policy,
        reference,
        tokenizer,
        [rows[i]["prompt"] for i in chosen],
        n_samples=eval_cfg["kl_samples"],
        max_new_tokens=task_cfg["max_new_tokens"],
        batch_size=eval_cfg["batch_size"],
        seed=seed,
        memory_budget_gb=eval_cfg.get("memory_budget_gb"),
    )
    out = est.as_dict()
    timing = {"sample_s": round(out.pop("sample_seconds"), 3), "score_s": round(out.pop("score_seconds"), 3)}
    out.update(
        run=run,
        task=task,
        policy_dtype=policy_dtype,
        reference_dtype=reference_dtype,
        seed=seed,
        temperature=1.0,
        top_p=1.0,
        max_new_tokens=task_cfg["max_new_tokens"],
        prompt_ids=[str(rows[i]["id"]) for i in chosen],
        timing=timing,
    )
    out = _finite(out)
    write_json(out_path, out)
    log.info("%s/%s: KL k1 %.4g +- %s, k3 %.4g +- %s (%d prompts x %d)", run, task, out["k1_mean"],
             out["k1_se"], out["k3_mean"], out["k3_se"], out["n_prompts"], out["n_samples"])  # fmt: skip
    return out


# ---------------------------------------------------------------------------------------------- CLI


def run_model_dir(run: str, results: str | os.PathLike = "results") -> Path:
    """The model folder a run name refers to (the same mapping as the rules' ``get_model_dir``)."""
    from workflow_scripts.config import parse_run

    parsed = parse_run(run)
    if parsed is None:
        return Path(results) / "models" / "base"
    precision, seed = parsed
    return Path(results) / "train" / precision / f"seed{seed}" / "model"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Evaluate a run on a task (pass@1) or its KL to base.")
    parser.add_argument("what", choices=["evaluate", "kl"])
    parser.add_argument("--config", default="config.yaml")
    parser.add_argument("--run", default="base")
    parser.add_argument("--task", required=True)
    parser.add_argument("--results", default="results")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    from workflow_scripts.config import load_config

    config = load_config(args.config)
    res = Path(args.results)
    task_cfg = config["data"]["tasks"][args.task]
    data = res / "data" / "eval" / f"{args.task}.jsonl"
    out = res / "eval" / args.run
    trust = config["model"]["trust_remote_code"]
    if args.what == "evaluate":
        base = None if args.run == "base" else out.parent / "base" / f"{args.task}.samples.parquet"
        evaluate_run(run_model_dir(args.run, res), data, out / f"{args.task}.samples.parquet",
                     out / f"{args.task}.json", config["eval"], task_cfg, args.run, args.task, base,
                     args.threads, trust)  # fmt: skip
    else:
        kl_run(run_model_dir(args.run, res), run_model_dir("base", res), data, out / f"{args.task}.kl.json",
               config["eval"], task_cfg, args.run, args.task, args.threads, trust)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
