"""learning_curves stage: every run's held-out curve joined into one table, and when the arms' curves part.

Training measures held-out pass@1 (by sampling) on a slice of every evaluation task at step 0, every
``train.eval_every`` steps and at the last step, one JSON line per (step, task) in
``train/{precision}/seed{seed}[-r{k}]/heldout.jsonl``. This stage reads those files only and writes:

- ``analysis/heldout_curves.parquet``: one row per run x step x task, ``COLUMNS``, ordered by precision
  (config order), seed, repeat, step and task (config order). ``J`` is the line's pass_at_1, ``J_se`` its
  pass_at_1_se. ``dJ`` = J minus the arm's mean step-0 J on that task over its seeds (repeat 1): every seed
  of an arm starts from the same weights, so the offset is one constant per (arm, task), dJ starts near 0,
  and the across-seed variance of dJ at a step equals that of J. ``eval_noise_var`` is the line's, else
  (null) ``stat_tests.sampling_noise_var`` of its correct_counts (with one sample per problem the bound
  J(1-J)/P), with a warning. ``role`` comes from the config (``data.tasks[task].role``), as in aggregate.
  Repeats keep their rows (``repeat`` k > 1) and are left out of the statistics.
- ``analysis/learning_curves.json``: ``statistics.curve_tests.analyze_curves`` (per step and arm: on-task
  means and off-task variances against the reference arm, the first step that differs with its
  uncertainty, the step-0 noise check), plus ``source`` and the warnings of reading.

Bad input raises ``CurveError`` naming the file (and line) and the field: a malformed line, a missing or
mistyped field, two runs in one file, a step x task twice, a task missing a step the others have, no step
0, and step grids or task sets that differ between runs.
"""

from workflow_scripts.runtime import startup  # noqa: F401  first: no garbage collection during imports

# isort: split

import argparse
import json
import math
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from workflow_scripts.runtime import paths
from workflow_scripts.runtime.atomic import write_parquet, write_text
from workflow_scripts.runtime.smk import main_from
from workflow_scripts.statistics.curve_tests import analyze_curves
from workflow_scripts.statistics.stat_tests import sampling_noise_var

COLUMNS = ("run", "precision", "seed", "repeat", "step", "task", "role", "kind", "J", "J_se", "dJ",
           "eval_noise_var", "n_problems", "n_samples", "sampling_seed", "phase", "backend", "dtype",
           "generate_s", "score_s")  # fmt: skip
# line field -> (type, required); an optional field may be absent or null
FIELDS: dict[str, tuple[type, bool]] = {
    "run": (str, True), "precision": (str, True), "seed": (int, True), "repeat": (int, True),
    "step": (int, True), "task": (str, True), "role": (str, True), "pass_at_1": (float, True),
    "n_problems": (int, True), "n_samples": (int, True), "kind": (str, False),
    "pass_at_1_se": (float, False), "eval_noise_var": (float, False), "sampling_seed": (int, False),
    "backend": (str, False), "dtype": (str, False), "phase": (int, False), "generate_s": (float, False),
    "score_s": (float, False), "correct_counts": (list, False),
}  # fmt: skip
IDENTITY = ("run", "precision", "seed", "repeat")


class CurveError(ValueError):
    """A heldout.jsonl that cannot be read into the table; the message names the file and the field."""


# ----------------------------------------------------------------------------- reading


def _typed(value: Any, kind: type) -> bool:
    if isinstance(value, bool):
        return False
    if kind is float:
        return isinstance(value, int | float) and math.isfinite(value)
    return isinstance(value, kind)


def _checked(record: Any, where: str) -> dict[str, Any]:
    if not isinstance(record, dict):
        raise CurveError(f"{where}: expected a JSON object, got {type(record).__name__}")
    for name, (kind, required) in FIELDS.items():
        value = record.get(name)
        if value is None:
            if required:
                raise CurveError(f"{where}: field '{name}' is missing or null")
            continue
        if not _typed(value, kind):
            raise CurveError(f"{where}: field '{name}' must be {kind.__name__}, got {value!r}")
    if not 0.0 <= record["pass_at_1"] <= 1.0:
        raise CurveError(f"{where}: field 'pass_at_1' must lie in [0, 1], got {record['pass_at_1']!r}")
    for name, low in (("step", 0), ("n_problems", 1), ("n_samples", 1), ("repeat", 1)):
        if record[name] < low:
            raise CurveError(f"{where}: field '{name}' must be >= {low}, got {record[name]!r}")
    return record


def read_heldout(path: str | os.PathLike) -> list[dict[str, Any]]:
    """One run's checked lines: one run per file, each step x task once, every task on the same steps,
    step 0 among them."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CurveError(f"{path}: file not found") from None
    records = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise CurveError(f"{path}:{lineno}: not valid JSON ({err.msg}, column {err.colno})") from err
        records.append(_checked(record, f"{path}:{lineno}"))
    if not records:
        raise CurveError(f"{path}: no lines (field 'step': nothing measured)")
    for name in IDENTITY:
        values = sorted({r[name] for r in records}, key=str)
        if len(values) > 1:
            raise CurveError(f"{path}: field '{name}' takes several values {values}: one run per file")
    seen: dict[str, set[int]] = {}
    for r in records:
        steps = seen.setdefault(r["task"], set())
        if r["step"] in steps:
            raise CurveError(f"{path}: field 'step': step {r['step']} of task '{r['task']}' appears twice")
        steps.add(r["step"])
    grid = set().union(*seen.values())
    for task, steps in seen.items():
        if steps != grid:
            raise CurveError(f"{path}: field 'step': task '{task}' lacks step(s) {sorted(grid - steps)}")
    if 0 not in grid:
        raise CurveError(f"{path}: field 'step': no step 0 (dJ is measured from the step-0 evaluation)")
    return records


def _row(r: Mapping[str, Any], role: str, warn: list[str]) -> dict[str, Any]:
    noise = r.get("eval_noise_var")
    if noise is None:
        counts = r.get("correct_counts")
        noise = (
            sampling_noise_var(counts, r["n_samples"])
            if counts
            else r["pass_at_1"] * (1 - r["pass_at_1"]) / (r["n_samples"] * r["n_problems"])
        )
        warn.append(f"{r['run']} step {r['step']} {r['task']}")
    return {
        **{c: r.get(c) for c in COLUMNS if c in FIELDS},
        "role": role,
        "J": float(r["pass_at_1"]),
        "J_se": r.get("pass_at_1_se"),
        "eval_noise_var": float(noise),
    }


def _rank(values: Sequence[str], first: Sequence[str]) -> dict[str, int]:
    order = [v for v in first if v in set(values)] + [v for v in dict.fromkeys(values) if v not in first]
    return {v: i for i, v in enumerate(order)}


def build_table(
    files: Sequence[str | os.PathLike],
    roles: Mapping[str, str] | None = None,
    precisions: Sequence[str] = (),
) -> tuple[pd.DataFrame, list[str]]:
    """(heldout_curves table, warnings) from every run's heldout.jsonl; ``roles``: task -> role (config
    order; a task the mapping lacks keeps its line's role)."""
    roles = dict(roles or {})
    rows, grid, names = [], None, {}
    relabelled: dict[str, None] = {}
    no_noise: list[str] = []
    for path in files:
        records = read_heldout(path)
        run = records[0]["run"]
        if run in names:
            raise CurveError(f"{path}: field 'run': run {run!r} is also in {names[run]}")
        names[run] = path
        steps = sorted({r["step"] for r in records})
        tasks = sorted({r["task"] for r in records})
        if grid is None:
            grid = (path, steps, tasks)
        elif steps != grid[1]:
            raise CurveError(f"{path}: field 'step': steps {steps} differ from {grid[0]}'s {grid[1]}")
        elif tasks != grid[2]:
            raise CurveError(f"{path}: field 'task': tasks {tasks} differ from {grid[0]}'s {grid[2]}")
        for r in records:
            role = roles.get(r["task"], r["role"])
            if role != r["role"]:
                relabelled[r["task"]] = None
            rows.append(_row(r, role, no_noise))
    warn = [
        f"task {t}: heldout.jsonl's role differs from the config's; the config's is used" for t in relabelled
    ]
    if no_noise:
        warn.append(
            f"eval_noise_var null in {len(no_noise)} line(s) (e.g. {no_noise[0]}): filled from "
            "correct_counts (one sample per problem: the bound J(1-J)/P)"
        )
    if not rows:
        return pd.DataFrame(columns=list(COLUMNS)), warn
    table = pd.DataFrame(rows)
    arm_rank = _rank(table["precision"].tolist(), list(precisions))
    task_rank = _rank(table["task"].tolist(), list(roles))
    table = (
        table.assign(_a=table["precision"].map(arm_rank), _t=table["task"].map(task_rank))
        .sort_values(["_a", "seed", "repeat", "step", "_t"], kind="stable")
        .drop(columns=["_a", "_t"])
    )
    start = table[(table["step"] == 0) & (table["repeat"] == 1)].groupby(["precision", "task"])["J"].mean()
    table["dJ"] = table["J"] - table.join(start.rename("J0"), on=["precision", "task"])["J0"]
    for column in ("sampling_seed", "phase"):
        table[column] = table[column].astype("Int64")
    return table[list(COLUMNS)].reset_index(drop=True), warn


# ----------------------------------------------------------------------------- stage


def analysis_config(analysis: Mapping[str, Any] | None) -> dict[str, Any]:
    """The ``analysis`` section over the schema's defaults (the schema is their only source)."""
    from workflow_scripts.runtime.config import load_schema

    props = load_schema()["properties"]["analysis"]["properties"]
    return {**{k: v["default"] for k, v in props.items() if "default" in v}, **dict(analysis or {})}


def run(
    *,
    heldout: Sequence[str | os.PathLike],
    table_out: str | os.PathLike,
    stats_out: str | os.PathLike,
    roles: Mapping[str, str] | None = None,
    precisions: Sequence[str] = (),
    analysis: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The stage: heldout_curves.parquet and learning_curves.json from every run's heldout.jsonl."""
    table, warn = build_table(heldout, roles, precisions)
    write_parquet(table_out, table)
    result = analyze_curves(table, analysis_config(analysis), precisions)
    result["warnings"] = warn + result["warnings"]
    result["source"] = {"files": len(heldout), "rows": len(table), "table": str(table_out)}
    write_text(stats_out, json.dumps(result, indent=2, allow_nan=False) + "\n")
    for arm, comp in result["comparisons"].items():
        firsts = {
            q: (comp[q].get("first_differ") or {}).get("step") for q in ("on_task_mean", "off_task_variance")
        }
        print(
            f"learning curves {arm} vs {result['reference']}: first differing step {firsts}", file=sys.stderr
        )
    for w in result["warnings"]:
        print(f"learning curves warning: {w}", file=sys.stderr)
    return result


def from_snakemake(smk: Any) -> None:
    run(
        heldout=list(smk.input.heldout),
        table_out=smk.output.table,
        stats_out=smk.output.stats,
        roles=dict(smk.params.roles),
        precisions=list(smk.params.precisions),
        analysis=dict(smk.params.analysis),
    )


def main(argv: list[str] | None = None) -> int:
    analysis_dir = paths.analysis_dir()
    p = argparse.ArgumentParser(
        prog="python -m workflow_scripts.learning_curves",
        description="heldout_curves.parquet and learning_curves.json from the runs' heldout.jsonl files.",
    )
    p.add_argument(
        "--heldout", nargs="*", help="heldout.jsonl files (default: every one under results/train/)"
    )
    p.add_argument(
        "--config", help="a config YAML: its task roles, precision order and analysis section are used"
    )
    p.add_argument("--precisions", nargs="*", default=[], help="precision order (reference first)")
    p.add_argument("--table", default=str(analysis_dir / "heldout_curves.parquet"))
    p.add_argument("--out", default=str(analysis_dir / "learning_curves.json"))
    args = p.parse_args(argv)
    files = args.heldout or sorted(str(f) for f in Path(paths.RESULTS, "train").glob("*/seed*/heldout.jsonl"))
    roles, analysis, precisions = None, None, list(args.precisions)
    if args.config:
        from workflow_scripts.runtime.config import load_config

        cfg = load_config(args.config, check_files=False)
        roles = {task: spec["role"] for task, spec in cfg["data"]["tasks"].items()}
        analysis, precisions = cfg["analysis"], precisions or list(cfg["precisions"])
    run(heldout=files, table_out=args.table, stats_out=args.out, roles=roles, precisions=precisions,
        analysis=analysis)  # fmt: skip
    return 0


if __name__ == "__main__":
    main_from(globals())
