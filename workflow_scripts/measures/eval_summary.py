"""One run's samples on one task: the samples table (``score``: each completion verified, one row each)
and its summary: pass@1 +- SE, pass@k, status counts, eval-noise variance and the dJ paired with the
reference base's samples (the estimators themselves: ``passk``)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import pandas as pd

from workflow_scripts.measures import passk

if TYPE_CHECKING:  # the readers (aggregate) import this module without torch
    from workflow_scripts.models.generation import Completion
    from workflow_scripts.tasks.rows import Row

STATUS_KEYS = ("ok", "no_answer", "timeout", "error")
SAMPLE_COLUMNS = (
    "run", "task", "prompt_id", "prompt_index", "sample_index", "completion", "extracted", "correct",
    "status", "length", "truncated",
)  # fmt: skip


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


def finite(obj):
    """NaN/inf -> None, recursively (JSON has no NaN)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [finite(v) for v in obj]
    return obj
