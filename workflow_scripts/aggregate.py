"""aggregate stage: every upstream result joined into tidy tables for the statistics and the figures.

Reads only the declared outputs of the upstream rules (never a model or a samples parquet):

| input (under results/)                        | per                  | table columns                  |
| --------------------------------------------- | -------------------- | ------------------------------ |
| eval/{run}/{task}.json                        | run x task (+ base)  | J, J_se, dJ, dJ_se, eval_...   |
| eval/{run}/{task}.kl.json                     | run x task           | kl_k1, kl_k1_se, kl_k3, ...    |
| train/{precision}/seed{seed}/metrics.jsonl    | trained run          | train_* summaries; curves      |
| train/{precision}/seed{seed}/run.json         | trained run          | train_wall_s, train_steps      |
| sparsity/{precision}/seed{seed}.summary.json  | trained run          | changed_frac_eta_*, equal_*    |

Outputs:

- ``metrics.parquet``: one row per run x task (``METRIC_COLUMNS`` + one ``changed_frac_eta_{label}`` per
  eta), the input of ``stats.analyze``. The base row is kept: precision and seed null, dJ = 0 (the base
  is its own reference; stats ignores base rows), training and sparsity columns null. ``role`` comes from
  the config (``data.tasks[task].role``), not from the eval file, so re-labelling a task needs no rerun
  of evaluation. Run-level columns (train_*, sparsity) repeat on every task row of the run.
- ``training_curves.parquet``: one row per run x optimizer step, ``CURVE_COLUMNS`` (rollout statistics
  are carried forward between generation rounds; ``generation_step`` marks the fresh ones; KL is null
  except every ``kl_every`` steps).
- ``sparsity.parquet``: one row per run x scope (model / module / layer) x group x eta: changed_fraction,
  equal_bf16_fraction, equal_stored_fraction, numel, n_tensors.

Missing pieces degrade to nulls with a logged warning (a run without KL, a summary without an eta); a
malformed input (bad JSON, a missing required key, a duplicate run x task) raises ``AggregateError``
naming the file, because a silently wrong table would reach the verdicts.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from workflow_scripts.atomic import write_parquet
from workflow_scripts.config import parse_run

log = logging.getLogger("aggregate")

ID_COLUMNS = ["run", "precision", "seed", "task", "role"]
EVAL_COLUMNS = [
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
KL_COLUMNS = ["kl_k1", "kl_k1_se", "kl_k3", "kl_k3_se", "kl_n_prompts", "kl_n_samples"]
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
]
SPARSITY_TABLE_COLUMNS = [
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


def read_metrics_jsonl(path: str | os.PathLike) -> list[dict]:
    """The per-step lines of a training metrics.jsonl (each must be a JSON object with ``step``)."""
    rows = []
    try:
        with open(path, encoding="utf-8") as fh:
            for i, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as err:
                    raise AggregateError(f"{path}:{i}: not valid JSON ({err})") from err
                if not isinstance(row, dict) or "step" not in row:
                    raise AggregateError(f"{path}:{i}: expected a JSON object with a 'step' key")
                rows.append(row)
    except OSError as err:
        raise AggregateError(f"{path}: cannot read ({err})") from err
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


def run_identity(run: str, path: str | os.PathLike = "") -> tuple[str | None, int | None]:
    """(precision, seed) of a run name, (None, None) for base; AggregateError if it is neither."""
    try:
        parsed = parse_run(run)
    except ValueError:
        raise AggregateError(
            f"{path}: run name {run!r} is neither 'base' nor '<precision>-s<seed>'"
        ) from None
    return (None, None) if parsed is None else parsed


# ----------------------------------------------------------------------------- per-file rows


def eval_row(path: str | os.PathLike) -> dict:
    """The eval columns of one results/eval/{run}/{task}.json."""
    d = read_json(path, EVAL_REQUIRED)
    counts = d.get("counts") or {}
    samples = counts.get("samples")
    is_base = d["run"] == "base"
    return {
        "run": str(d["run"]),
        "task": str(d["task"]),
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
        "kl_n_prompts": _num(d.get("n_prompts")),
        "kl_n_samples": _num(d.get("n_samples")),
    }


def _window(rows: Sequence[dict], key: str, first: bool) -> float:
    """Mean of ``key`` over the first/last 10% of ``rows`` (at least one row)."""
    k = max(1, len(rows) // 10)
    return _mean(r.get(key) for r in (rows[:k] if first else rows[-k:]))


def train_summary(steps: Sequence[dict], run_record: Mapping) -> dict:
    """Run-level training summaries; rollout statistics over generation steps only (each rollout once).

    reward_first10/last10 = mean reward over the first/last 10% of rollouts (the logged training reward
    moves slowly, so the window is averaged, not read at one step); clip and entropy over all steps.
    """
    steps = sorted(steps, key=lambda r: _num(r.get("step")))
    fresh = [r for r in steps if r.get("generation_step", True)] or steps
    kl = [r for r in steps if not math.isnan(_num(r.get("kl_k3")))]
    wall = _num(run_record.get("train_wall_s"))
    if math.isnan(wall) and steps:
        wall = _num(steps[-1].get("wall_time_s"))
    n_steps = _num(run_record.get("steps"))
    out = {
        "train_steps": n_steps if not math.isnan(n_steps) else float(len(steps)),
        "train_wall_s": wall,
        "train_rollouts": float(len(fresh)) if steps else math.nan,
        "reward_first10": _window(fresh, "reward", True),
        "reward_last10": _window(fresh, "reward", False),
        "accuracy_first10": _window(fresh, "accuracy", True),
        "accuracy_last10": _window(fresh, "accuracy", False),
        "informative_frac_mean": _mean(r.get("informative_frac") for r in fresh),
        "informative_frac_last10": _window(fresh, "informative_frac", False),
        "clip_region_mean": _mean(r.get("clip_region") for r in steps),
        "clip_region_last10": _window(steps, "clip_region", False),
        "clip_low_mean": _mean(r.get("clip_low") for r in steps),
        "clip_high_mean": _mean(r.get("clip_high") for r in steps),
        "entropy_first10": _window(steps, "entropy", True),
        "entropy_last10": _window(steps, "entropy", False),
        "grad_norm_mean": _mean(r.get("grad_norm") for r in steps),
        "train_kl_k3_final": _num(kl[-1].get("kl_k3")) if kl else math.nan,
        "train_kl_k1_final": _num(kl[-1].get("kl_k1")) if kl else math.nan,
    }
    out["reward_gain"] = out["reward_last10"] - out["reward_first10"]
    return out


def curve_frame(steps: Sequence[dict], run: str, precision: str, seed: int) -> pd.DataFrame:
    frame = pd.DataFrame(list(steps))
    out = pd.DataFrame({"run": run, "precision": precision, "seed": seed}, index=range(len(frame)))
    for col in CURVE_COLUMNS[3:]:
        values = frame[col] if col in frame.columns else pd.Series(np.nan, index=frame.index)
        out[col] = values.astype(bool) if col == "generation_step" else pd.to_numeric(values, errors="coerce")
    return out.sort_values("step", kind="stable")


def sparsity_rows(path: str | os.PathLike) -> tuple[dict, list[dict]]:
    """(run-level model columns, long rows for sparsity.parquet) of one sparsity summary json."""
    d = read_json(path, SPARSITY_REQUIRED)
    if not isinstance(d["model"], Mapping):
        raise AggregateError(f"{path}: 'model' is not an object")
    precision, seed = str(d["precision"]), int(d["seed"])
    run = f"{precision}-s{seed}"
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


# ----------------------------------------------------------------------------- the join


def _index(rows: list[dict], what: str, paths: Sequence) -> pd.DataFrame:
    frame = pd.DataFrame(rows)
    dup = frame.duplicated(["run", "task"], keep=False)
    if dup.any():
        files = [str(p) for p, d in zip(paths, dup, strict=True) if d]
        raise AggregateError(f"{what}: duplicate run x task in {files[:4]}")
    return frame


def aggregate(
    eval_paths: Sequence[str | os.PathLike],
    kl_paths: Sequence[str | os.PathLike],
    train_paths: Sequence[tuple[str | os.PathLike, str | os.PathLike]],
    sparsity_paths: Sequence[str | os.PathLike],
    roles: Mapping[str, str],
    precisions: Sequence[str] = (),
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, list[str]]:
    """(metrics, training curves, sparsity, warnings) from the upstream files.

    ``train_paths`` pairs each metrics.jsonl with its run.json (which names precision and seed).
    ``roles``: task -> role from the config; a task outside it is an error. ``precisions`` orders rows.
    """
    warnings: list[str] = []
    if not eval_paths:
        raise AggregateError("no evaluation summaries given")
    ev = _index([eval_row(p) for p in eval_paths], "evaluation summaries", eval_paths)
    unknown = sorted(set(ev["task"]) - set(roles))
    if unknown:
        raise AggregateError(f"task(s) {unknown} in the evaluation summaries have no role in the config")
    ids = [run_identity(r, p) for r, p in zip(ev["run"], eval_paths, strict=True)]
    ev.insert(1, "precision", [p for p, _ in ids])
    ev.insert(2, "seed", pd.array([s for _, s in ids], dtype="Int64"))
    ev.insert(4, "role", ev["task"].map(roles))
    if "base" not in set(ev["run"]):
        warnings.append("no base run among the evaluation summaries")

    if kl_paths:
        kl = _index([kl_row(p) for p in kl_paths], "KL summaries", kl_paths)
        ev = ev.merge(kl, on=["run", "task"], how="left", validate="one_to_one")
    missing_kl = ev[ev["kl_k3"].isna()] if "kl_k3" in ev else ev
    if len(missing_kl):
        pairs = [f"{r}/{t}" for r, t in zip(missing_kl["run"], missing_kl["task"], strict=True)]
        warnings.append(f"KL (k3) missing for {len(pairs)} run x task(s), e.g. {pairs[:3]}")

    curves, train_rows = [], []
    for metrics_path, record_path in train_paths:
        record = read_json(record_path, ("precision", "seed"))
        precision, seed = str(record["precision"]), int(record["seed"])
        steps = read_metrics_jsonl(metrics_path)
        run = f"{precision}-s{seed}"
        if not steps:
            warnings.append(f"{metrics_path}: no training steps")
        train_rows.append({"run": run, **train_summary(steps, record)})
        if steps:
            curves.append(curve_frame(steps, run, precision, seed))
    if train_rows:
        ev = ev.merge(pd.DataFrame(train_rows), on="run", how="left", validate="many_to_one")

    sparse_wide, sparse_long = [], []
    for path in sparsity_paths:
        wide, long = sparsity_rows(path)
        sparse_wide.append(wide)
        sparse_long += long
    if sparse_wide:
        ev = ev.merge(pd.DataFrame(sparse_wide), on="run", how="left", validate="many_to_one")

    trained = ev.loc[ev["precision"].notna(), "run"].unique()
    for what, have in (
        ("training metrics", {r["run"] for r in train_rows}),
        ("sparsity summaries", {r["run"] for r in sparse_wide}),
    ):
        lacking = sorted(set(trained) - have)
        if lacking:
            warnings.append(f"{what} missing for run(s) {lacking[:4]}")
    changed = sorted(
        (c for c in ev.columns if c.startswith(CHANGED_PREFIX)),
        key=lambda c: -float(c[len(CHANGED_PREFIX) :]),
    )
    metrics = ev.reindex(columns=METRIC_COLUMNS + changed)
    metrics = _order(metrics, precisions, list(roles))
    curve_table = (
        pd.concat(curves, ignore_index=True)
        if curves
        else pd.DataFrame({c: pd.Series(dtype=float) for c in CURVE_COLUMNS})
    )
    curve_table["seed"] = curve_table["seed"].astype("Int64")
    sparsity = pd.DataFrame(sparse_long, columns=SPARSITY_TABLE_COLUMNS)
    sparsity["seed"] = sparsity["seed"].astype("Int64")
    for w in warnings:
        log.warning(w)
    return metrics, curve_table, sparsity, warnings


def _order(frame: pd.DataFrame, precisions: Sequence[str], tasks: Sequence[str]) -> pd.DataFrame:
    """Base first, then precisions in config order, seeds ascending; tasks in config order."""
    arm = {p: i for i, p in enumerate(precisions)}
    key_p = frame["precision"].map(lambda p: -1 if p is None or p != p else arm.get(p, len(arm)))
    key_t = frame["task"].map({t: i for i, t in enumerate(tasks)})
    keys = pd.DataFrame(
        {"p": key_p, "name": frame["precision"].fillna(""), "s": frame["seed"].fillna(-1), "t": key_t}
    )
    order = keys.sort_values(["p", "name", "s", "t"], kind="stable").index
    return frame.loc[order].reset_index(drop=True)


# ----------------------------------------------------------------------------- CLI


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m workflow_scripts.aggregate",
        description="Join evaluation, KL, training and sparsity outputs into tidy tables.",
    )
    p.add_argument("--eval", nargs="+", required=True, help="results/eval/{run}/{task}.json files")
    p.add_argument("--kl", nargs="*", default=[], help="results/eval/{run}/{task}.kl.json files")
    p.add_argument(
        "--train-metrics", nargs="*", default=[], help="train/{precision}/seed{seed}/metrics.jsonl"
    )
    p.add_argument("--train-runs", nargs="*", default=[], help="the matching run.json files, same order")
    p.add_argument("--sparsity", nargs="*", default=[], help="sparsity/{precision}/seed{seed}.summary.json")
    p.add_argument(
        "--roles", nargs="+", required=True, metavar="TASK=ROLE", help="task roles from the config"
    )
    p.add_argument("--precisions", nargs="*", default=[], help="precision order (reference first)")
    p.add_argument("--out", required=True, help="metrics.parquet")
    p.add_argument("--curves", required=True, help="training_curves.parquet")
    p.add_argument("--sparsity-out", required=True, help="sparsity.parquet")
    return p


def _pairs(items: Sequence[str], what: str) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key or not value:
            raise SystemExit(f"{what}: expected NAME=VALUE, got {item!r}")
        out[key] = value
    return out


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if len(args.train_metrics) != len(args.train_runs):
        raise SystemExit("--train-metrics and --train-runs must pair up (same length and order)")
    metrics, curves, sparsity, _ = aggregate(
        args.eval,
        args.kl,
        list(zip(args.train_metrics, args.train_runs, strict=True)),
        args.sparsity,
        _pairs(args.roles, "--roles"),
        args.precisions,
    )
    write_parquet(args.out, metrics)
    write_parquet(args.curves, curves)
    write_parquet(args.sparsity_out, sparsity)
    print(
        f"aggregate: {len(metrics)} run x task rows, {len(curves)} training steps, "
        f"{len(sparsity)} sparsity rows -> {args.out}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
