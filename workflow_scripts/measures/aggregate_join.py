"""The aggregate join: every upstream result as tidy tables (metrics, curves, sparsity, overlap). Apart
from the aggregate stage so that other stages (snapshot_metrics) read runs through the same join without
importing a stage module.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping, Sequence

import pandas as pd

from workflow_scripts.measures.aggregate_inputs import (
    CHANGED_PREFIX,
    CURVE_COLUMNS,
    METRIC_COLUMNS,
    SPARSITY_TABLE_COLUMNS,
    AggregateError,
    curve_frame,
    eval_row,
    kl_row,
    parsed_run,
    read_json,
    read_steps,
    run_record_columns,
    sparsity_rows,
    train_summary,
)
from workflow_scripts.runtime import paths
from workflow_scripts.tasks.rows import read_parquet

log = logging.getLogger("aggregate")


# ----------------------------------------------------------------------------- the join


def _index(rows: list[dict], what: str, files: Sequence) -> pd.DataFrame:
    frame = pd.DataFrame(rows)
    dup = frame.duplicated(["run", "task"], keep=False)
    if dup.any():
        names = [str(p) for p, d in zip(files, dup, strict=True) if d]
        raise AggregateError(f"{what}: duplicate run x task in {names[:4]}")
    return frame


def _reference(ev: pd.DataFrame, references: Mapping[str, str], warn: list[str]) -> pd.DataFrame:
    """Fill ``reference_run`` (file, else the rule's mapping, else 'base') and ``base_J`` from that base."""
    trained = ev["precision"].notna()
    missing = trained & ev["reference_run"].isna()
    if missing.any():
        ev.loc[missing, "reference_run"] = (
            ev.loc[missing, "precision"].map(dict(references)).fillna(paths.BASE)
        )
        if not references:
            warn.append(
                "eval summaries lack 'reference_run' and no references were given: runs compared with 'base'"
            )
    base_j = ev.loc[~trained].set_index(["run", "task"])["J"]
    looked_up = pd.Series(
        [base_j.get((r, t), math.nan) for r, t in zip(ev["reference_run"], ev["task"], strict=True)],
        index=ev.index,
    )
    ev["base_J"] = ev["base_J"].fillna(looked_up)
    lacking = sorted(set(ev.loc[trained, "reference_run"]) - set(ev.loc[~trained, "run"]))
    if lacking:
        warn.append(f"reference base run(s) {lacking} have no evaluation summaries")
    return ev


def aggregate(
    eval_paths: Sequence[str | os.PathLike],
    kl_paths: Sequence[str | os.PathLike],
    train_paths: Sequence[tuple[str | os.PathLike, str | os.PathLike]],
    sparsity_paths: Sequence[str | os.PathLike],
    roles: Mapping[str, str],
    precisions: Sequence[str] = (),
    overlap_paths: Sequence[str | os.PathLike] = (),
    references: Mapping[str, str] | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, list[str], pd.DataFrame]:
    """(metrics, training curves, sparsity, warnings, overlap) from the upstream files.

    ``train_paths`` pairs each metrics.jsonl with its run.json (which names precision and seed).
    ``roles``: task -> role from the config; a task outside it is an error. ``precisions`` orders rows.
    ``references``: precision -> its base run, used when an eval file lacks ``reference_run``.
    """
    warnings: list[str] = []
    if not eval_paths:
        raise AggregateError("no evaluation summaries given")
    ev = _index([eval_row(p) for p in eval_paths], "evaluation summaries", eval_paths)
    unknown = sorted(set(ev["task"]) - set(roles))
    if unknown:
        raise AggregateError(f"task(s) {unknown} in the evaluation summaries have no role in the config")
    ids = [parsed_run(r, p) for r, p in zip(ev["run"], eval_paths, strict=True)]
    ev.insert(1, "precision", [r.precision for r in ids])
    ev.insert(2, "seed", pd.array([r.seed for r in ids], dtype="Int64"))
    ev.insert(3, "repeat", pd.array([r.repeat for r in ids], dtype="Int64"))
    ev.insert(5, "role", ev["task"].map(roles))
    if paths.BASE not in set(ev["run"]):
        warnings.append("no base run among the evaluation summaries")
    ev = _reference(ev, references or {}, warnings)

    if kl_paths:
        kl = _index([kl_row(p) for p in kl_paths], "KL summaries", kl_paths)
        ev = ev.merge(kl, on=["run", "task"], how="left", validate="one_to_one")
    missing_kl = ev[ev["kl_k3"].isna()] if "kl_k3" in ev else ev
    if len(missing_kl):
        pairs = [f"{r}/{t}" for r, t in zip(missing_kl["run"], missing_kl["task"], strict=True)]
        warnings.append(f"KL (k3) missing for {len(pairs)} run x task(s), e.g. {pairs[:3]}")

    curves, train_rows, representable = [], [], []
    for metrics_path, record_path in train_paths:
        record = read_json(record_path, ("precision", "seed"))
        precision, seed = str(record["precision"]), int(record["seed"])
        steps = read_steps(metrics_path)
        run = paths.run_name(precision, seed, int(record.get("repeat") or 1))
        if not steps:
            warnings.append(f"{metrics_path}: no training steps")
        extra = run_record_columns(record, record_path, warnings)
        representable += [
            {
                "run": run,
                "precision": precision,
                "seed": seed,
                "scope": "representable",
                "group": g,
                "representable_fraction": f,
            }
            for g, f in extra.pop("_by_module").items()
        ]
        train_rows.append({"run": run, **train_summary(steps, record), **extra})
        if steps:
            curves.append(curve_frame(steps, run, precision, seed))
    if train_rows:
        ev = ev.merge(pd.DataFrame(train_rows), on="run", how="left", validate="many_to_one")
        if ev["diverged"].notna().any():
            ev["diverged"] = ev["diverged"].astype("boolean")
    diverged = sorted({r["run"] for r in train_rows if r["diverged"]})
    if diverged:
        warnings.append(f"diverged run(s) (excluded from the verdicts by the statistics): {diverged}")

    sparse_wide, sparse_long = [], []
    for path in sparsity_paths:
        wide, long = sparsity_rows(path)
        sparse_wide.append(wide)
        sparse_long += long
    if sparse_wide:
        ev = ev.merge(pd.DataFrame(sparse_wide), on="run", how="left", validate="many_to_one")

    trained = ev.loc[ev["precision"].notna(), "run"].unique()
    first_runs = ev.loc[ev["precision"].notna() & (ev["repeat"] == 1), "run"].unique()
    for what, have, expected in (
        ("training metrics", {r["run"] for r in train_rows}, trained),
        ("sparsity summaries", {r["run"] for r in sparse_wide}, first_runs),  # none for repeats
    ):
        lacking = sorted(set(expected) - have)
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
    sparsity = pd.DataFrame(sparse_long + representable, columns=SPARSITY_TABLE_COLUMNS)
    sparsity["seed"] = sparsity["seed"].astype("Int64")
    overlap = read_overlap(overlap_paths)
    for w in warnings:
        log.warning(w)
    return metrics, curve_table, sparsity, warnings, overlap


OVERLAP_COLUMNS = [
    "precision",
    "seed_a",
    "seed_b",
    "eta",
    "numel",
    "intersection",
    "union",
    "jaccard",
    "density_a",
    "density_b",
    "jaccard_chance",
    "ratio",
]


def read_overlap(overlap_paths: Sequence[str | os.PathLike]) -> pd.DataFrame:
    """The overlap rule's whole-model tables, concatenated (an empty table with the columns if none)."""
    frames = [read_parquet(p) for p in overlap_paths]
    frames = [f for f in frames if len(f)]
    if not frames:
        return pd.DataFrame({c: pd.Series(dtype=float) for c in OVERLAP_COLUMNS})
    out = pd.concat(frames, ignore_index=True)
    missing = [c for c in ("precision", "eta", "jaccard", "jaccard_chance") if c not in out.columns]
    if missing:
        raise AggregateError(
            f"overlap tables {list(map(str, overlap_paths))[:2]}: missing column(s) {missing}"
        )
    return out


def _order(frame: pd.DataFrame, precisions: Sequence[str], tasks: Sequence[str]) -> pd.DataFrame:
    """Base first, then precisions in config order, seeds ascending; tasks in config order."""
    arm = {p: i for i, p in enumerate(precisions)}
    key_p = frame["precision"].map(lambda p: -1 if p is None or p != p else arm.get(p, len(arm)))
    key_t = frame["task"].map({t: i for i, t in enumerate(tasks)})
    keys = pd.DataFrame(
        {
            "p": key_p,
            "name": frame["precision"].fillna(frame["run"]),
            "s": frame["seed"].fillna(-1),
            "t": key_t,
        }
    )
    order = keys.sort_values(["p", "name", "s", "t"], kind="stable").index
    return frame.loc[order].reset_index(drop=True)


# ----------------------------------------------------------------------------- stage
