"""The reference path of the merged evaluate job: the separate ``evaluate`` and ``kl`` rules it replaced.

Kept runnable so that tests/workflow/test_fast_jobs.py computes both sides on the same machine in the same run
(floats differ between CPUs: a constant recorded on another machine proves nothing here). Each function
is the call sequence of the pre-merge rule (commit a8ce4c0, ``evaluate_run`` and ``kl_run``) written over
today's library functions: every model is loaded afresh from its folder in its saved dtype, the eval job
generates and scores, and the kl job loads the policy and the reference again as separate objects. What
the merged job could get wrong (state shared between sampling and KL, one model object reused, the
in-memory cast of the base instead of a saved bf16 copy) is thus absent from this side.
"""

from __future__ import annotations

import os

import pandas as pd

from workflow_scripts import evaluate
from workflow_scripts.measures.eval_summary import finite, score, summarize
from workflow_scripts.models.loading import load_run_model
from workflow_scripts.models.modeling import load_tokenizer
from workflow_scripts.tasks.rows import read_rows


def evaluate_job(
    model_dir: str | os.PathLike,
    data: str | os.PathLike,
    eval_cfg: dict,
    task_cfg: dict,
    run: str,
    task: str,
    base_samples: pd.DataFrame | None = None,
) -> tuple[pd.DataFrame, dict]:
    """The old ``evaluate`` rule: (samples, summary) of ``model_dir`` loaded in its saved dtype."""
    rows = read_rows(data)
    seed = evaluate.derive_seed(eval_cfg["seed"], run, task, "eval")
    completions, info = evaluate.generate(
        model_dir, [r["prompt"] for r in rows], eval_cfg, task_cfg["max_new_tokens"], seed
    )
    samples = score(rows, completions, task_cfg["kind"], eval_cfg, run=run, task=task)
    summary = summarize(samples, eval_cfg["n_samples"], base_samples)
    summary.update(
        run=run,
        task=task,
        kind=task_cfg["kind"],
        role=task_cfg.get("role"),
        backend=info["backend"],
        dtype=info["dtype"],
        seed=seed,
        sampling={
            "temperature": eval_cfg["temperature"],
            "top_p": eval_cfg["top_p"],
            "max_new_tokens": task_cfg["max_new_tokens"],
            "n_samples": eval_cfg["n_samples"],
        },
    )
    return samples, finite(summary)


def kl_job(
    policy_dir: str | os.PathLike,
    reference_dir: str | os.PathLike,
    data: str | os.PathLike,
    eval_cfg: dict,
    task_cfg: dict,
    run: str,
    task: str,
) -> dict:
    """The old ``kl`` rule: policy and reference loaded separately, each in the dtype it was saved in."""
    rows = read_rows(data)
    tokenizer = load_tokenizer(policy_dir)
    policy, policy_dtype = load_run_model(policy_dir)
    reference, reference_dtype = load_run_model(reference_dir)  # a separate object, even base vs base
    kl = evaluate.measure_kl(
        policy, reference, tokenizer, rows, eval_cfg, task_cfg["max_new_tokens"], run, task
    )
    kl.update(policy_dtype=policy_dtype, reference_dtype=reference_dtype)
    return finite(kl)
