"""Readers of the upstream outputs that aggregate joins: one function per file kind, each returning rows.

The table columns they fill (``METRIC_COLUMNS``, ``CURVE_COLUMNS``, ``SPARSITY_TABLE_COLUMNS``) are
defined here, next to the code that fills them; ``aggregate`` joins the rows into the tables. A file
without the keys its stage always writes is an ``AggregateError`` naming the file; an optional key
that is absent (older results) becomes null.
"""

import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from workflow_scripts.runtime import paths
from workflow_scripts.training import metrics_log

ID_COLUMNS = ["run", "precision", "seed", "repeat", "task", "role"]  # repeat: 1, k >= 2 (noise floor)
EVAL_COLUMNS = [
    "reference_run",
    "kind",
    "dtype",
    "J",
    "J_se",
    "dJ",
    "dJ_se",
    "base_J",
    "paired_N",
    "eval_noise_var",
    "n_problems",
    "n_samples",
    "mean_length",
    "truncated_frac",
    "no_answer_frac",
    "timeout_frac",
    "error_frac",
]
# kl_k*_mc_var: Monte-Carlo variance of the mean given the prompts (the noise stats uses, ``kl``)
KL_COLUMNS = [
    "kl_k1",
    "kl_k1_se",
    "kl_k1_mc_var",
    "kl_k3",
    "kl_k3_se",
    "kl_k3_mc_var",
    "kl_rb",
    "kl_rb_se",
    "kl_rb_mc_var",
    "kl_n_prompts",
    "kl_n_samples",
]
TRAIN_COLUMNS = [
    "train_steps",
    "train_wall_s",
    "train_rollouts",
    "reward_first10",
    "reward_last10",
    "reward_gain",
    "accuracy_first10",
    "accuracy_last10",
    "informative_frac_mean",
    "informative_frac_last10",
    "clip_region_mean",
    "clip_region_last10",
    "clip_low_mean",
    "clip_high_mean",
    "entropy_first10",
    "entropy_last10",
    "grad_norm_mean",
    "train_kl_k3_final",
    "train_kl_k1_final",
    "diverged",
    "health_reasons",
    "representable_update_frac",
    "representable_update_lr",
    "sampler_gap_mean",
    "sampler_gap_max",
    "sampler_gap_outside_clip",
    "sampler_gap_clipped",
    "sampler_gap_kl_k1",
    "sampler_gap_kl_k3",
    "sampler_gap_log_ppl_abs_diff",
    "sampler_gap_growth",
    "vllm_logp_diff_mean",
    "loss_scale_final",
    "skipped_steps",
]
SPARSITY_COLUMNS = ["equal_bf16_frac", "equal_stored_frac", "tensors_bf16_equal", "n_tensors"]
METRIC_COLUMNS = ID_COLUMNS + EVAL_COLUMNS + KL_COLUMNS + TRAIN_COLUMNS + SPARSITY_COLUMNS
CHANGED_PREFIX = "changed_frac_eta_"
CURVE_COLUMNS = [
    "run",
    "precision",
    "seed",
    "step",
    "generation_step",
    "reward",
    "reward_std",
    "accuracy",
    "informative_frac",
    "completion_length",
    "truncation_rate",
    "clip_low",
    "clip_high",
    "clip_region",
    "entropy",
    "grad_norm",
    "learning_rate",
    "loss",
    "kl_k1",
    "kl_k3",
    "wall_time_s",
    "sampler_gap_mean",
    "sampler_gap_outside_clip",
    "sampler_gap_max",
    "sampler_gap_clipped",
    "sampler_gap_kl_k1",
    "sampler_gap_kl_k3",
    "sampler_gap_log_ppl_abs_diff",
    "sampler_gap_growth",
    *metrics_log.GAP_POSITION_KEYS,  # sampler_gap_pos_<k>: mean |gap| per log2 position bin
    "loss_scale",
    "step_skipped",
    "phase",
]
SPARSITY_TABLE_COLUMNS = [  # + "representable_fraction" on scope "representable" rows
    "run",
    "precision",
    "seed",
    "scope",
    "group",
    "eta",
    "eta_label",
    "changed_fraction",
    "equal_bf16_fraction",
    "equal_stored_fraction",
    "numel",
    "n_tensors",
    "representable_fraction",
]
# required keys: a file without them is not the stage's output (raise), other keys may be absent (null)
EVAL_REQUIRED = ("run", "task", "pass_at_1", "N", "n")
KL_REQUIRED = ("run", "task", "k3_mean")
SPARSITY_REQUIRED = ("precision", "seed", "model")


class AggregateError(ValueError):
    """An upstream output is malformed; the message names the file."""


# ----------------------------------------------------------------------------- readers


def read_json(path: str | os.PathLike, required: Sequence[str] = ()) -> dict:
    """A JSON object from ``path``; AggregateError (naming the file) if unreadable or lacking ``required``."""
    try:
        with open(path, encoding="utf-8") as fh:
            obj = json.load(fh)
    except json.JSONDecodeError as err:
        raise AggregateError(f"{path}: not valid JSON ({err})") from err
    except OSError as err:
        raise AggregateError(f"{path}: cannot read ({err})") from err
    if not isinstance(obj, dict):
        raise AggregateError(f"{path}: expected a JSON object, got {type(obj).__name__}")
    missing = [k for k in required if k not in obj]
    if missing:
        raise AggregateError(f"{path}: missing key(s) {missing}")
    return obj


def read_steps(path: str | os.PathLike) -> list[dict]:
    """The per-step lines of a training metrics.jsonl (``metrics_log.read_metrics``), each with a ``step``."""
    try:
        rows = metrics_log.read_metrics(path)
    except ValueError as err:
        raise AggregateError(str(err)) from err
    for i, row in enumerate(rows, 1):
        if not isinstance(row, dict) or "step" not in row:
            raise AggregateError(f"{path}: line {i} is not a JSON object with a 'step' key")
    return rows


def _num(x: Any) -> float:
    """A float, NaN for null/non-numeric/non-finite (JSON null and NaN both mean 'not measured')."""
    try:
        x = float(x)
    except (TypeError, ValueError):
        return math.nan
    return x if math.isfinite(x) else math.nan


def _frac(count: Any, total: Any) -> float:
    c, t = _num(count), _num(total)
    return c / t if t > 0 else math.nan


def _mean(values: Iterable[Any]) -> float:
    vals = [v for v in map(_num, values) if not math.isnan(v)]
    return float(np.mean(vals)) if vals else math.nan


def parsed_run(run: str, path: str | os.PathLike = "") -> paths.Run:
    """``paths.parse_run``; AggregateError naming ``path`` if ``run`` is not a run name."""
    try:
        return paths.parse_run(run)
    except ValueError as err:
        raise AggregateError(f"{path}: {err}") from None


def run_identity(run: str, path: str | os.PathLike = "") -> tuple[str | None, int | None]:
    """(precision, seed) of a run name, (None, None) for a base run; AggregateError if it is neither."""
    parsed = parsed_run(run, path)
    return (None, None) if parsed.is_base else (parsed.precision, parsed.seed)


# ----------------------------------------------------------------------------- per-file rows


def eval_row(path: str | os.PathLike) -> dict:
    """The eval columns of one results/eval/{run}/{task}.json."""
    d = read_json(path, EVAL_REQUIRED)
    counts = d.get("counts") or {}
    samples = counts.get("samples")
    is_base = run_identity(str(d["run"]), path)[0] is None
    return {
        "run": str(d["run"]),
        "task": str(d["task"]),
        "reference_run": str(d["run"]) if is_base else d.get("reference_run"),
        "kind": d.get("kind"),
        "dtype": d.get("dtype"),
        "J": _num(d["pass_at_1"]),
        "J_se": _num(d.get("pass_at_1_se")),
        "dJ": 0.0 if is_base else _num(d.get("dJ")),
        "dJ_se": 0.0 if is_base else _num(d.get("dJ_se")),
        "base_J": _num(d["pass_at_1"]) if is_base else _num(d.get("base_pass_at_1")),
        "paired_N": _num(d.get("paired_N")),
        "eval_noise_var": _num(d.get("eval_noise_var")),
        "n_problems": _num(d["N"]),
        "n_samples": _num(d["n"]),
        "mean_length": _num(d.get("mean_length")),
        **{
            f"{k}_frac": _frac(counts.get(k), samples) for k in ("truncated", "no_answer", "timeout", "error")
        },
    }


def kl_row(path: str | os.PathLike) -> dict:
    """The KL columns of one results/eval/{run}/{task}.kl.json."""
    d = read_json(path, KL_REQUIRED)
    return {
        "run": str(d["run"]),
        "task": str(d["task"]),
        "kl_k1": _num(d.get("k1_mean")),
        "kl_k1_se": _num(d.get("k1_se")),
        "kl_k3": _num(d["k3_mean"]),
        "kl_k3_se": _num(d.get("k3_se")),
        "kl_k1_mc_var": _num(d.get("k1_mc_var")),
        "kl_k3_mc_var": _num(d.get("k3_mc_var")),
        "kl_rb": _num(d.get("rb_mean")),  # absent in kl.json from before the estimator: null
        "kl_rb_se": _num(d.get("rb_se")),
        "kl_rb_mc_var": _num(d.get("rb_mc_var")),
        "kl_n_prompts": _num(d.get("n_prompts")),
        "kl_n_samples": _num(d.get("n_samples")),
    }


def _window(rows: Sequence[dict], key: str, first: bool) -> float:
    """Mean of ``key`` over the first/last 10% of ``rows`` (at least one row)."""
    k = max(1, len(rows) // 10)
    return _mean(r.get(key) for r in (rows[:k] if first else rows[-k:]))


def train_summary(steps: Sequence[dict], run_record: Mapping) -> dict:
    """Run-level training summaries: rewards, clip and KL from ``metrics_log.reward_summary`` (their
    owner; rollout windows weight each rollout once), the other rollout statistics over the same
    generation lines, per-step ones over every step."""
    steps = sorted(steps, key=lambda r: _num(r.get("step")))
    fresh = metrics_log.rollout_rows(steps) or steps
    summary = metrics_log.reward_summary(steps) if steps else {}
    wall = _num(run_record.get("train_wall_s"))
    if math.isnan(wall) and steps:
        wall = _num(steps[-1].get("wall_time_s"))
    n_steps = _num(run_record.get("steps"))
    out = {
        "train_steps": n_steps if not math.isnan(n_steps) else float(len(steps)),
        "train_wall_s": wall,
        "train_rollouts": _num(summary.get("rollouts")) if steps else math.nan,
        "reward_first10": _num(summary.get("reward_first10")),
        "reward_last10": _num(summary.get("reward_last10")),
        "accuracy_first10": _window(fresh, "accuracy", True),
        "accuracy_last10": _window(fresh, "accuracy", False),
        "informative_frac_mean": _mean(r.get("informative_frac") for r in fresh),
        "informative_frac_last10": _window(fresh, "informative_frac", False),
        "clip_region_mean": _num(summary.get("clip_region_mean")),
        "clip_region_last10": _window(steps, "clip_region", False),
        "clip_low_mean": _mean(r.get("clip_low") for r in steps),
        "clip_high_mean": _mean(r.get("clip_high") for r in steps),
        "entropy_first10": _window(steps, "entropy", True),
        "entropy_last10": _window(steps, "entropy", False),
        "grad_norm_mean": _mean(r.get("grad_norm") for r in steps),
        "train_kl_k3_final": _num(summary.get("final_kl_k3")),
        "train_kl_k1_final": _num(summary.get("final_kl_k1")),
    }
    out["reward_gain"] = out["reward_last10"] - out["reward_first10"]
    gap = metrics_log.gap_summary(steps)  # per generation round, each once (the keys' owner)
    scale = metrics_log.scaler_summary(steps) or {}
    out.update(
        sampler_gap_mean=_num(gap["mean"]),
        sampler_gap_max=_num(gap["max"]),
        sampler_gap_outside_clip=_num(gap["outside_clip_mean"]),
        sampler_gap_clipped=_num(gap["clipped_mean"]),
        sampler_gap_kl_k1=_num(gap["kl_k1_mean"]),
        sampler_gap_kl_k3=_num(gap["kl_k3_mean"]),
        sampler_gap_log_ppl_abs_diff=_num(gap["log_ppl_abs_diff_mean"]),
        sampler_gap_growth=_num(gap["growth_mean"]),
        vllm_logp_diff_mean=_num(gap["vllm_logp_diff_mean"]),
        loss_scale_final=_num(scale.get("final")),
        skipped_steps=_num(scale.get("skipped_steps")),
    )
    return out


def run_record_columns(record: Mapping, path: str | os.PathLike, warn: list[str]) -> dict:
    """``diverged``/``health_reasons`` and the representable-update fraction of one run.json.

    Results written before the health record or the representable-update fraction lack these keys:
    the columns are then null and one warning names the file (not an error: old results stay readable).
    """
    health = record.get("health")
    if isinstance(health, Mapping) and "diverged" in health:
        diverged: Any = bool(health["diverged"])
        reasons = "; ".join(str(r) for r in health.get("reasons") or [])
    else:
        diverged, reasons = None, None
        warn.append(f"{path}: no 'health' record (trained before divergence checks): diverged unknown")
    rep = record.get("representable_update")
    if isinstance(rep, Mapping) and "whole_model" in rep:
        frac, lr = _num(rep.get("whole_model")), _num(rep.get("lr"))
        by_module = {str(k): _num(v) for k, v in (rep.get("by_module_type") or {}).items()}
    else:
        frac, lr, by_module = math.nan, math.nan, {}
        warn.append(f"{path}: no 'representable_update' (an older run's record): shown as n/a")
    return {
        "diverged": diverged,
        "health_reasons": reasons,
        "representable_update_frac": frac,
        "representable_update_lr": lr,
        "_by_module": by_module,
    }


def curve_frame(steps: Sequence[dict], run: str, precision: str, seed: int) -> pd.DataFrame:
    frame = pd.DataFrame(list(steps))
    out = pd.DataFrame({"run": run, "precision": precision, "seed": seed}, index=range(len(frame)))
    for col in CURVE_COLUMNS[3:]:
        values = frame[col] if col in frame.columns else pd.Series(np.nan, index=frame.index)
        if col == "generation_step":
            out[col] = values.astype(bool)
        elif col == "step_skipped":  # null without a loss scaler
            out[col] = values.astype("boolean")
        else:
            out[col] = pd.to_numeric(values, errors="coerce")
    return out.sort_values("step", kind="stable")


def sparsity_rows(path: str | os.PathLike) -> tuple[dict, list[dict]]:
    """(run-level model columns, long rows for sparsity.parquet) of one sparsity summary json."""
    d = read_json(path, SPARSITY_REQUIRED)
    if not isinstance(d["model"], Mapping):
        raise AggregateError(f"{path}: 'model' is not an object")
    precision, seed = str(d["precision"]), int(d["seed"])
    run = paths.run_name(precision, seed)
    labels = d.get("eta_labels") or list(d["model"].get("changed_fraction") or {})
    etas = d.get("etas") or [float(x) for x in labels]
    if len(etas) != len(labels):
        raise AggregateError(f"{path}: {len(etas)} etas but {len(labels)} eta_labels")
    long = []
    scopes = {
        "model": {"all": d["model"]},
        "module": d.get("by_module") or {},
        "layer": d.get("by_layer") or {},
    }
    for scope, groups in scopes.items():
        for group, agg in groups.items():
            if not isinstance(agg, Mapping):
                raise AggregateError(f"{path}: {scope} '{group}' is not an object")
            fracs = agg.get("changed_fraction") or {}
            for eta, label in zip(etas, labels, strict=True):
                long.append(
                    {
                        "run": run,
                        "precision": precision,
                        "seed": seed,
                        "scope": scope,
                        "group": str(group),
                        "eta": float(eta),
                        "eta_label": str(label),
                        "changed_fraction": _num(fracs.get(label)),
                        "equal_bf16_fraction": _num(agg.get("equal_bf16_fraction")),
                        "equal_stored_fraction": _num(agg.get("equal_stored_fraction")),
                        "numel": _num(agg.get("numel")),
                        "n_tensors": _num(agg.get("n_tensors")),
                    }
                )
    model = d["model"]
    wide = {
        "run": run,
        "equal_bf16_frac": _num(model.get("equal_bf16_fraction")),
        "equal_stored_frac": _num(model.get("equal_stored_fraction")),
        "tensors_bf16_equal": _num(model.get("tensors_bf16_equal")),
        "n_tensors": _num(model.get("n_tensors")),
        **{
            f"{CHANGED_PREFIX}{label}": _num((model.get("changed_fraction") or {}).get(label))
            for label in labels
        },
    }
    return wide, long
