"""stats.json: ``analyze(metrics, cfg)`` runs the gate, the mixed model, the classical tests and the verdicts.

Pure (no file I/O). The unit of replication is the training seed. Per task role (on_task, off_task)
and quantity (dJ; KL for H3, by the estimator ``analysis.kl_estimator``, default rb):

- the mixed model (``variance_model``; primary): per (precision, role) the whole seed variance of a
  task (shared seed effect + seed x task effect) and its two parts, with the known eval noise of every
  task, profile CIs, the whole ratio arm / reference with a bootstrap-calibrated test, and its power
  (``power``, simulated for that statistic);
- classical tests (``stat_tests``): paired t / TOST of one mean over the tasks per run; Brown-Forsythe,
  Pitman-Morgan (one task) and a seed-bootstrap CI on the per-task variance across seeds pooled over
  the tasks, the model's unit (the fallback when a fit fails);
- ``noise_share``: the eval-noise share of that pooled variance per role, quantity and arm;
- ``by_task``: the classical tests per single task (descriptive, no multiplicity correction; with one
  task the seed and seed x task variances are not separable);
- ``controls``: control arms (``control`` in a precision entry), judged apart from H1-H3.

The decision rules (gate, H1-H3) live in ``verdicts``. Runs marked diverged (column ``diverged``,
from run.json's health record) are excluded before anything is computed and listed in
``excluded_runs``: a collapsed policy's dJ measures the collapse, not precision.

Input columns: required ``run, precision, seed, task, role, dJ``; base rows (precision null, or a run
named ``base``/``base-<dtype>``) give the base's own eval noise for the gate and are otherwise ignored
(dJ is already relative to the arm's base). Optional: ``eval_noise_var`` (else ``J, n_samples,
n_problems`` give the bound J(1-J)/(n N)), ``kl_<estimator>`` (+ its noise ``kl_<estimator>_mc_var``,
else the larger ``kl_<estimator>_se``^2 with a warning), ``diverged``.
Config: the schema's ``analysis`` section; missing keys take the schema's defaults (the only copy).
"""

from workflow_scripts.runtime import startup  # noqa: F401  first: no garbage collection during imports

# isort: split

import argparse
import copy
import functools
import json
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from workflow_scripts.runtime import paths
from workflow_scripts.runtime.atomic import write_text
from workflow_scripts.runtime.smk import main_from
from workflow_scripts.statistics import arms as am
from workflow_scripts.statistics import decompose as dc
from workflow_scripts.statistics import matched as mt
from workflow_scripts.statistics import noise_floor as nf
from workflow_scripts.statistics import scopes as sc
from workflow_scripts.statistics import verdicts as vd
from workflow_scripts.statistics.stat_tests import (
    eval_noise,
    json_safe,
    sampling_noise_var,
)
from workflow_scripts.tasks.rows import read_parquet

__all__ = ["analysis_defaults", "analyze", "json_safe", "run", "sampling_noise_var"]
# 3: whole seed variance (shared + seed x task), noise_share, controls; 4: kl_estimator, KL blocks "kl";
# 5: arms, decomposition, matched-drift scales (mixed_model off_task log_kl, dJ_drift), findings, Holm
# 6: one primary family (``primary``; Holm over larger and smaller, H2 and H3), the null yardstick
#    (mixed_model comparisons' ``yardstick``), inert_tasks, base noise in the decomposition, divisor scales
#    only with analysis.exploratory_scales
SCHEMA_VERSION = 6
ROLES = ("on_task", "off_task")
REQUIRED_COLUMNS = ("run", "precision", "seed", "task", "role", "dJ")


@functools.cache
def _schema_defaults() -> dict[str, Any]:
    from workflow_scripts.runtime.config import load_schema

    props = load_schema()["properties"]["analysis"]["properties"]
    return {k: v["default"] for k, v in props.items() if "default" in v}


def analysis_defaults() -> dict[str, Any]:
    """The schema's defaults of every ``analysis`` key (the schema is their only source)."""
    return copy.deepcopy(_schema_defaults())


def _arm_order(
    rows: pd.DataFrame, precisions: Sequence[str] | Mapping[str, Any] | None, warn: list[str]
) -> list[str]:
    present = list(dict.fromkeys(rows["precision"].tolist()))
    if not precisions:
        return present
    order = [p for p in precisions if p in present]
    missing = [p for p in precisions if p not in present]
    extra = [p for p in present if p not in precisions]
    if missing:
        warn.append(f"configured precision(s) without runs: {missing}")
    if extra:
        warn.append(f"precision(s) not in config appended: {extra}")
    return order + extra


def _prepare(
    metrics: pd.DataFrame, warn: list[str], estimator: str | None = None
) -> tuple[pd.DataFrame, pd.DataFrame, dict, str]:
    """(trained rows, base rows, excluded-runs block, noise source); raises ValueError if malformed.
    ``estimator``: the KL estimator H3 reads (``kl_<estimator>`` columns; None: the schema's default of
    ``analysis.kl_estimator``)."""
    missing = [c for c in REQUIRED_COLUMNS if c not in metrics.columns]
    if missing:
        raise ValueError(f"metrics table lacks column(s) {missing}")
    if metrics.duplicated(["run", "task"]).any():
        dup = metrics.loc[metrics.duplicated(["run", "task"]), ["run", "task"]].head(3).values.tolist()
        raise ValueError(f"metrics table has duplicate (run, task) rows, e.g. {dup}")
    run = metrics["run"].astype(str)
    is_base = metrics["precision"].isna() | (run == "base") | run.str.startswith("base-")
    metrics = metrics.copy()
    metrics["noise"], source = eval_noise(metrics)
    base, rows = metrics.loc[is_base].copy(), metrics.loc[~is_base].copy()
    excluded: dict[str, Any] = {"diverged": [], "count": 0, "reasons": {}}
    if "diverged" in rows.columns:
        div = rows["diverged"].fillna(False).astype(bool)
        bad = sorted(rows.loc[div, "run"].unique())
        if bad:
            reasons = {}
            if "health_reasons" in rows.columns:
                reasons = {r: str(rows.loc[rows["run"] == r, "health_reasons"].iloc[0]) for r in bad}
            excluded = {"diverged": bad, "count": len(bad), "reasons": reasons}
            warn.append(f"{len(bad)} diverged run(s) excluded from every test: {bad}")
        rows = rows.loc[~div]
    else:
        warn.append("no 'diverged' column (results older than the training health record): no run excluded")
    rows["dJ"] = pd.to_numeric(rows["dJ"], errors="coerce")
    if rows["dJ"].isna().any():
        warn.append(f"dropped {int(rows['dJ'].isna().sum())} row(s) with missing dJ")
        rows = rows[rows["dJ"].notna()]
    rows["seed"] = pd.to_numeric(rows["seed"], errors="coerce")
    if rows["seed"].notna().all() and (rows["seed"] % 1 == 0).all():
        rows["seed"] = rows["seed"].astype(int)
    rows["precision"] = rows["precision"].astype(str)
    if source != "column":
        warn.append(f"eval_noise_var incomplete: noise source is '{source}'")
    name = f"kl_{estimator or _schema_defaults()['kl_estimator']}"
    if name in rows.columns:
        rows["kl"] = pd.to_numeric(rows[name], errors="coerce")
        # KL noise: the Monte-Carlo variance given the (shared) prompts; else the prompt-level SE^2 (kl)
        absent = pd.Series(np.nan, index=rows.index)
        col = {c: pd.to_numeric(rows.get(name + c, absent), errors="coerce") for c in ("_mc_var", "_se")}
        mc = col["_mc_var"].where(np.isfinite(col["_mc_var"]))
        rows["kl_var"] = mc.fillna(col["_se"] ** 2).fillna(0.0)
        fallback = int((rows["kl"].notna() & mc.isna()).sum())
        if fallback:
            warn.append(
                f"{name}_mc_var missing for {fallback} row(s): their KL eval noise is {name}_se^2, the "
                "conservative prompt-level bound (it counts the fixed between-prompt spread as noise)"
            )
        if rows["kl"].isna().any():
            warn.append(f"{name} missing for some rows: KL tests skipped where it is")
    else:
        rows["kl"], rows["kl_var"] = np.nan, 0.0
        warn.append(f"no {name} column: H3 not tested")
    _drift_scales(rows)
    return rows, base, excluded, source


def _drift_scales(rows: pd.DataFrame) -> None:
    """The divisor columns (``scopes.DRIFT_SCALES``; exploratory, in no verdict: docs/design.md, "One
    primary analysis"): log KL with its eval noise by the delta method, and dJ divided by
    sqrt(the arm's mean KL on the task / the mean over the arms of that task's mean KL) (one divisor per
    arm and task, not per run: a run's own small KL would turn its dJ into an outlier; normalised by the
    task's pooled KL so the tasks keep the weights they have on the absolute dJ scale); NaN where KL is
    missing or not positive (that scale is then not compared). Recompute after relabelling arms (the
    divisor is the arm's)."""
    kl = rows["kl"].where(rows["kl"] > 0)
    rows["log_kl"] = np.log(kl)
    rows["log_kl_var"] = rows["kl_var"] / kl**2
    drift = kl.groupby([rows["precision"], rows["task"]]).transform("mean")
    arm_means = kl.groupby([rows["precision"], rows["task"]]).mean()
    pooled = rows["task"].map(arm_means.groupby(level="task").mean())
    rel = drift / pooled
    rows["dJ_drift"] = rows["dJ"] / np.sqrt(rel)
    rows["dJ_drift_var"] = rows["noise"] / rel


def analyze(
    metrics: pd.DataFrame,
    cfg: Mapping | None = None,
    *,
    precisions: Sequence[str] | Mapping[str, Any] | None = None,
    controls: Mapping[str, str] | None = None,
    snapshots: pd.DataFrame | None = None,
) -> dict:
    """Statistics and verdicts for H1-H3 (the content of analysis/stats.json; JSON-safe, no NaN).

    ``cfg``: config ``analysis`` (schema defaults fill what is missing). The reference arm is the first
    of ``precisions``, else the first precision in the table. ``precisions`` may be the config's
    precisions section: its ``control`` labels (``verdicts.control_arms``) then mark control arms, as
    ``controls`` ({arm: negative | positive}) does; control arms are judged in ``controls`` and left
    out of the H1-H3 verdicts. Degenerate data (1 seed, constant dJ, no
    KL) gives 'skipped'/'failed' blocks with reasons and 'inconclusive'/'not testable' verdicts, never
    an exception; a malformed table (missing columns, duplicate run x task rows) raises ValueError.

    Keys: schema_version, config, reference, precisions, n, tasks, eval_noise_source, kl_estimator,
    excluded_runs, gate, by_task_type[role] (classical: arms, comparisons), mixed_model[role][dJ | kl]
    (arms: whole_var, shared_var, task_var with CIs; comparisons of the whole seed variance: ratio, ratio_ci,
    ratio_ci_equivalence, p, parts, power), by_task[task], noise_share (per role, quantity and arm, and
    the verdicts resting on a share above ``scopes.NOISE_SHARE_WARN``), verdicts[H1 | H2 | H3] = {verdict,
    reason, rule, scope, by_arm}, controls[arm], noise_floor (``noise_floor``: repeats of an
    (arm, seed), left out of everything else), warnings. Infinite values (an unbounded
    CI end, a ratio over a zero variance) are stored as null (strict JSON).
    """
    cfg = {**analysis_defaults(), **dict(cfg or {})}
    warn: list[str] = []
    estimator = str(cfg["kl_estimator"])
    # repeats are left out of the seed-variance analysis: noise_floor reads them
    rows, base, excluded, noise_source = _prepare(nf.without_repeats(metrics), warn, estimator)
    kl_column = f"kl_{estimator}"
    floor_input = metrics.assign(kl=metrics[kl_column]) if kl_column in metrics.columns else metrics
    arms = _arm_order(rows, precisions, warn)
    controls = {
        **(vd.control_arms(precisions) if isinstance(precisions, Mapping) else {}),
        **dict(controls or {}),
    }
    if len(arms) < 2:
        warn.append(f"only {len(arms)} precision arm(s): nothing to compare")
    runs = rows["run"].unique()
    role_of = rows.groupby("task")["role"].agg(lambda r: r.iloc[0])
    if (rows.groupby("task")["role"].nunique() > 1).any():
        warn.append("a task has several roles; using its first")
    rows["role"] = rows["task"].map(role_of)
    complete = rows.groupby("task")["run"].nunique() == len(runs)
    dropped = sorted(complete.index[~complete])
    if dropped:
        warn.append(f"task(s) missing for some runs, left out of the role-level analysis: {dropped}")
    types = [r for r in ROLES if r in set(role_of)] + sorted(set(role_of) - set(ROLES))
    tasks_by_type = {t: sorted(k for k in role_of.index[role_of == t] if complete[k]) for t in types}

    alpha = float(cfg["alpha"])
    ref = arms[0] if arms else None
    bases = dc.base_noise(rows, base, arms)  # per arm: the base its dJ is measured from, and its noise
    ref_base_noise = (bases.get(ref) or {}).get("noise") or {}
    inert = (
        sc.inert_tasks(rows, ref, tasks_by_type.get("off_task") or [], ref_base_noise, alpha)
        if ref is not None
        else {}
    )
    if inert:
        tasks_by_type["off_task"] = [t for t in tasks_by_type["off_task"] if t not in inert]
        warn.append(
            f"off-task task(s) {sorted(inert)} inert in the reference (no dJ and no KL beyond eval noise): "
            "kept out of the role-level analysis and the variance verdicts"
        )
    on_tasks = tasks_by_type.get("on_task") or []
    if ref is not None and on_tasks:
        ref_rows = rows[rows["precision"] == ref]
        ref_units = sc.units(ref_rows, on_tasks)
        base_noise = sum(ref_base_noise.get(t, 0.0) for t in on_tasks) / len(on_tasks) ** 2
        gate = vd.gate(ref_units["y"].tolist(), alpha, ref, base_noise)
    else:
        gate = {"passed": False, "arm": ref, "reason": "no on-task tasks or no reference arm"}
    gain = gate.get("mean") if gate.get("passed") else max(gate.get("mean") or 0.0, 0.0)
    margin = float(cfg["mean_margin_fraction"]) * float(gain or 0.0)

    by_type, model = {}, {}
    # Holm's primary family (verdicts.family_size): every compared arm under every primary hypothesis
    family = vd.family_size(len([a for a in arms[1:] if a not in controls]), vd.primary(cfg)["hypotheses"])
    for t, tasks in tasks_by_type.items():
        if not tasks:
            warn.append(f"no task of role {t} is complete across runs")
            continue
        by_type[t] = {
            "tasks": tasks,
            "n_tasks": len(tasks),
            **sc.classical_scope(rows, tasks, arms, cfg, f"type/{t}", margin),
        }
        if len(arms) < 2:
            continue
        model[t] = {
            "dJ": sc.model_scope(
                rows,
                tasks,
                arms,
                "dJ",
                cfg,
                f"{t}/dJ",
                "equivalence" if t == "on_task" else "detect" if t == "off_task" else None,
                family,
            ),
            "kl": sc.model_scope(
                rows, tasks, arms, "kl", cfg, f"{t}/kl", "detect" if t == "off_task" else None, family
            ),
        }
        if t == "off_task" and cfg.get("exploratory_scales"):  # divisor scales: in no verdict
            for q in sc.DRIFT_SCALES.values():
                model[t][q] = sc.model_scope(rows, tasks, arms, q, cfg, f"{t}/{q}", None)
        for a, comp in by_type[t]["comparisons"].items():
            for q in model[t]:
                mc = model[t][q]["comparisons"].get(a) if "comparisons" in model[t][q] else None
                comp[f"{q}_model"] = mc or {"status": "failed", "reason": model[t][q].get("reason")}
                comp[f"{q}_power"] = (mc or {}).get("power")
        for q, block in model[t].items():
            if block.get("status") != "ok" and q in sc.QUANTITIES:
                warn.append(
                    f"mixed model failed for {t} {q}: {block.get('reason')}; verdicts fall back to "
                    "the classical tests"
                )
    by_task = {}
    for task in sorted(role_of.index):
        by_task[task] = {
            "role": role_of[task],
            **sc.classical_scope(rows, [task], arms, cfg, f"task/{task}", margin),
        }

    n_seeds = rows.groupby("precision")["run"].nunique()
    arm_table = am.arms_block(precisions, arms) if isinstance(precisions, Mapping) else {}
    out = {
        "schema_version": SCHEMA_VERSION,
        "config": cfg,
        "reference": ref,
        "precisions": arms,
        "n": {
            "runs": len(runs),
            "seeds": {a: int(n_seeds.get(a, 0)) for a in arms},
            "tasks": {t: len(v) for t, v in tasks_by_type.items()},
            "rows": len(rows),
        },
        "tasks": tasks_by_type,
        "inert_tasks": inert,
        "eval_noise_source": noise_source,
        "kl_estimator": estimator,
        "excluded_runs": excluded,
        "gate": {**gate, "margin": margin, "mean_margin_fraction": cfg["mean_margin_fraction"]},
        "by_task_type": by_type,
        "mixed_model": model,
        "by_task": by_task,
        "noise_share": sc.noise_share_block(by_type, arms, controls),
        "arms": arm_table,
        "decomposition": (
            dc.decompose(rows, tasks_by_type, arm_table, alpha, bases)
            if arm_table
            else {"status": "skipped", "reason": "no arm descriptions (precisions given without entries)"}
        ),
        "verdicts": vd.decide(gate, by_type, arms, cfg, controls),
        "primary": vd.primary_block(by_type, arms, cfg, controls),
        "controls": vd.control_outcomes(by_type, arms, controls, cfg, gate),
        "noise_floor": nf.noise_floor(floor_input),
        "warnings": warn,
    }
    # movement matched by design (statistics/matched.py): the reference's evaluated snapshots, if any
    if snapshots is not None and len(snapshots):
        snap_rows = _prepare(snapshots, [], estimator)[0]
        out["matched"] = mt.matched(rows, snap_rows, arms, tasks_by_type.get("off_task") or [], cfg, controls)
    return json_safe(out)


# ----------------------------------------------------------------------------- stage


def run(
    *,
    metrics: str | os.PathLike,
    out: str | os.PathLike,
    analysis: Mapping | None,
    precisions: Sequence[str] | Mapping[str, Any] = (),
    snapshots: str | os.PathLike | None = None,
) -> dict:
    """The stats stage: stats.json = analyze(metrics.parquet) + a ``source`` block; strict JSON.

    ``precisions``: the arm order, or the config's precisions section (arm order and control labels);
    ``snapshots``: the reference's snapshot metrics (statistics/matched.py; config snapshots)."""
    table = read_parquet(metrics)
    order = dict(precisions) if isinstance(precisions, Mapping) else list(precisions)
    snaps = read_parquet(snapshots) if snapshots else None
    result = analyze(table, analysis, precisions=order or None, snapshots=snaps)
    result["source"] = {"metrics": str(metrics), "rows": len(table), "runs": int(table["run"].nunique())}
    write_text(out, json.dumps(result, indent=2, allow_nan=False) + "\n")
    verdict_line = ", ".join(f"{h} {v['verdict']}" for h, v in result["verdicts"].items())
    print(
        f"stats: gate {'passed' if result['gate'].get('passed') else 'FAILED'}; {verdict_line} -> {out}",
        file=sys.stderr,
    )
    for w in result["warnings"]:
        print(f"stats warning: {w}", file=sys.stderr)
    return result


def from_snakemake(smk: Any) -> None:
    run(
        metrics=smk.input.metrics,
        out=smk.output.stats,
        analysis=dict(smk.params.analysis),
        precisions=smk.params.precisions,
        snapshots=smk.input.get("snapshots"),
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m workflow_scripts.stats",
        description="stats.json (gate, mixed model, tests, H1-H3 verdicts) from metrics.parquet.",
    )
    p.add_argument("--metrics", default=str(paths.analysis_dir() / "metrics.parquet"))
    p.add_argument(
        "--config",
        help="a config YAML: its analysis section and its precisions (order, control labels) are used "
        "(default: schema defaults)",
    )
    p.add_argument("--precisions", nargs="*", default=[], help="precision order (reference first)")
    p.add_argument("--out", default=str(paths.analysis_dir() / "stats.json"))
    args = p.parse_args(argv)
    analysis, precisions = None, list(args.precisions)
    if args.config:
        from workflow_scripts.runtime.config import load_config

        cfg = load_config(args.config, check_files=False)
        analysis, precisions = cfg["analysis"], precisions or dict(cfg["precisions"])
    run(metrics=args.metrics, out=args.out, analysis=analysis, precisions=precisions)
    return 0


if __name__ == "__main__":
    main_from(globals())
