"""stats.json: ``analyze(metrics, cfg)`` runs the gate, the mixed model, the classical tests and the verdicts.

Pure (no file I/O). The unit of replication is the training seed. Per task role (on_task, off_task)
and quantity (dJ; KL k3 for H3):

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
n_problems`` give the bound J(1-J)/(n N)), ``kl_k3`` (+ ``kl_k3_se``), ``diverged``.
Config: the schema's ``analysis`` section; missing keys take the schema's defaults (the only copy).
"""

from workflow_scripts import startup  # noqa: F401  first: no garbage collection during imports

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

from workflow_scripts import noise_floor as nf
from workflow_scripts import paths
from workflow_scripts import power as pw
from workflow_scripts import variance_model as vm
from workflow_scripts import verdicts as vd
from workflow_scripts.atomic import write_text
from workflow_scripts.rows import read_parquet
from workflow_scripts.smk import main_from
from workflow_scripts.stat_tests import (
    compare_means,
    compare_variances,
    describe,
    eval_noise,
    json_safe,
    paired,
    pooled_var,
    rng_for,
    sampling_noise_var,
    skip,
)

__all__ = ["analysis_defaults", "analyze", "json_safe", "run", "sampling_noise_var"]
SCHEMA_VERSION = 3  # 3: whole seed variance (shared + seed x task), noise_share, controls
ROLES = ("on_task", "off_task")
REQUIRED_COLUMNS = ("run", "precision", "seed", "task", "role", "dJ")
QUANTITIES = {"dJ": ("dJ", "noise"), "kl": ("kl", "kl_var")}


@functools.cache
def _schema_defaults() -> dict[str, Any]:
    from workflow_scripts.config import load_schema

    props = load_schema()["properties"]["analysis"]["properties"]
    return {k: v["default"] for k, v in props.items() if "default" in v}


def analysis_defaults() -> dict[str, Any]:
    """The schema's defaults of every ``analysis`` key (the schema is their only source)."""
    return copy.deepcopy(_schema_defaults())


def _units(rows: pd.DataFrame, tasks: Sequence[str]) -> pd.DataFrame:
    """One row per run: mean over ``tasks`` of dJ and KL; noise of a mean of T tasks = sum(noise)/T^2."""
    sub = rows[rows["task"].isin(tasks)]
    t = len(tasks)
    g = sub.groupby("run", sort=True)
    return pd.DataFrame(
        {
            "precision": g["precision"].first(),
            "seed": g["seed"].first(),
            "y": g["dJ"].mean(),
            "noise": g["noise"].sum() / t**2,
            "kl": g["kl"].sum(min_count=t) / t,
            "kl_noise": g["kl_var"].sum() / t**2,
        }
    )


def _arm_matrix(
    rows: pd.DataFrame, arm: str, tasks: Sequence[str], col: str, ncol: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(seeds, values, known noise) of one arm: seeds x tasks in seed order (numpy, not pivot: this runs
    per simulated table); a run lacking a task has NaN there."""
    sub = rows[(rows["precision"] == arm) & rows["task"].isin(tasks)]
    r_codes, runs = pd.factorize(sub["run"])
    t_idx = sub["task"].map({t: i for i, t in enumerate(tasks)}).to_numpy()
    y, v = np.full((len(runs), len(tasks)), np.nan), np.zeros((len(runs), len(tasks)))
    y[r_codes, t_idx] = sub[col].to_numpy(dtype=float)
    v[r_codes, t_idx] = sub[ncol].to_numpy(dtype=float)
    seeds = sub["seed"].to_numpy()[np.unique(r_codes, return_index=True)[1]]
    order = np.argsort(seeds, kind="stable")
    return seeds[order], y[order], v[order]


def noise_share(values: np.ndarray, noise: np.ndarray) -> dict[str, Any]:
    """Eval-noise share of the across-seed variance of one arm's run x task values (seeds x tasks): mean
    noise variance / per-task variance across seeds pooled over tasks (what the statistic compares)."""
    if len(values) < 2:
        return {"share": None, "noise_var": float(noise.mean()) if noise.size else None, "observed_var": None}
    observed = float(pooled_var(values))
    mean_noise = float(noise.mean())
    return {
        "share": mean_noise / observed if observed > 0 else None,
        "noise_var": mean_noise,
        "observed_var": observed,
        "df": int(values.shape[1] * (len(values) - 1)),
    }


def classical_scope(
    rows: pd.DataFrame, tasks: Sequence[str], arms: Sequence[str], cfg: Mapping, key: str, margin: float
) -> dict:
    """Per-arm summaries and arm-vs-reference classical comparisons of dJ and KL for one scope: means of
    one mean over the tasks per run, variances of the per-task variance pooled over the tasks."""
    alpha = float(cfg["alpha"])
    has_kl = bool(rows.loc[rows["task"].isin(tasks), "kl"].notna().all()) and len(rows) > 0
    mats = {a: {q: _arm_matrix(rows, a, tasks, *cols) for q, cols in QUANTITIES.items()} for a in arms}
    arm_blocks = {}
    for a in arms:
        seeds, y, v = mats[a]["dJ"]
        block = {"n_seeds": len(seeds), "seeds": seeds.tolist(), "dJ": _describe(y, v, alpha)}
        if has_kl:
            block["kl_k3"] = _describe(*mats[a]["kl"][1:], alpha)
        arm_blocks[a] = block
    comparisons = {}
    for i, a in enumerate(arms[1:], 1):
        rng = rng_for(cfg["seed"], f"{key}/{i}")
        comp: dict[str, Any] = {
            "paired": False,
            "n_seeds": [len(mats[a]["dJ"][0]), len(mats[arms[0]]["dJ"][0])],
        }
        for q in QUANTITIES:
            if q == "kl" and not has_kl:
                comp["kl_mean"] = comp["kl_var"] = skip("KL (kl_k3) missing for some runs or tasks")
                continue
            (sx, x, nx), (sy, y, ny) = mats[a][q], mats[arms[0]][q]
            pairs = paired(x, sx, y, sy)
            mean_pairs = (pairs[0].mean(axis=1), pairs[1].mean(axis=1)) if pairs is not None else None
            comp["paired"] = comp["paired"] or pairs is not None
            comp[f"{q}_mean"] = compare_means(x.mean(axis=1), y.mean(axis=1), mean_pairs, alpha, margin)
            comp[f"{q}_var"] = compare_variances(x, y, float(nx.mean()), float(ny.mean()), pairs, cfg, rng)
        comparisons[a] = comp
    return {"reference": arms[0], "arms": arm_blocks, "comparisons": comparisons}


def _describe(y: np.ndarray, v: np.ndarray, alpha: float) -> dict[str, Any]:
    """One arm: the mean over tasks per run across seeds (``describe``) and the pooled per-task variance
    across seeds with its eval noise (the variance unit of the tests)."""
    t = max(y.shape[1], 1)
    block = describe(y.mean(axis=1), alpha)
    block["noise_var_of_mean"] = float(v.sum(axis=1).mean()) / t**2 if len(v) else None
    ns = noise_share(y, v)
    block["pooled_var"] = ns["observed_var"]
    block["noise_var"] = ns["noise_var"]
    block["pooled_var_corrected"] = (
        max(ns["observed_var"] - ns["noise_var"], 0.0) if ns["observed_var"] is not None else None
    )
    block["noise_share"] = ns["share"]
    return block


def _matrix(rows: pd.DataFrame, arm: str, tasks: Sequence[str], col: str, ncol: str) -> vm.ArmData:
    """Seeds x tasks values and known noise of one arm, as the mixed model takes them."""
    _, y, v = _arm_matrix(rows, arm, tasks, col, ncol)
    return vm.arm_data(y, v)


def model_scope(
    rows: pd.DataFrame,
    tasks: Sequence[str],
    arms: Sequence[str],
    quantity: str,
    cfg: Mapping,
    key: str,
    power_for: str | None,
) -> dict[str, Any]:
    """Mixed-model fits of one role and quantity: per-arm components (whole, shared, seed x task) and
    arm-vs-reference comparisons of the whole seed variance, with power.

    ``power_for``: None, 'detect' or 'equivalence' (which power block the verdict of this scope needs).
    """
    col, ncol = QUANTITIES[quantity]
    if rows.loc[rows["task"].isin(tasks), col].isna().any():
        return {"status": "failed", "reason": f"{quantity} missing for some runs of these tasks"}
    datas = {a: _matrix(rows, a, tasks, col, ncol) for a in arms}
    scale = vm.scale_of(*datas.values())
    if not scale > 0:
        return {"status": "failed", "reason": f"no variation in {quantity} and no eval noise"}
    grid, floor = vm.Grid.around(scale), scale * 1e-12
    alpha = float(cfg["alpha"])
    fits = {a: vm.fit_arm(d, grid, floor) for a, d in datas.items()}
    out: dict[str, Any] = {
        "status": "ok",
        "tasks": list(tasks),
        "grid_step": grid.step,
        "arms": {a: f.summary(grid, alpha, floor) for a, f in fits.items()},
        "comparisons": {},
    }
    for i, a in enumerate(arms[1:], 1):
        rng = rng_for(cfg["seed"], f"model/{key}/{i}")
        comp = vm.compare_arms(fits[a], fits[arms[0]], grid, alpha, int(cfg["bootstrap"]), rng, floor)
        if power_for and comp.get("status") == "ok":
            comp["power"] = pw.power_block(
                fits[a],
                fits[arms[0]],
                vm.null_fit(fits[a], fits[arms[0]], grid),
                dict(cfg),
                rng_for(cfg["seed"], f"power/{key}/{i}"),
                floor,
                equivalence=power_for == "equivalence",
            )
        out["comparisons"][a] = comp
    failed = [f"{a}: {f.reason}" for a, f in fits.items() if f.status != "ok"]
    if failed:
        out["status"], out["reason"] = "failed", "; ".join(failed)
    return out


NOISE_SHARE_WARN = 0.5  # report.md warns when a verdict rests on an eval-noise share above this


def noise_share_block(by_type: Mapping, arms: Sequence[str], controls: Mapping[str, str]) -> dict[str, Any]:
    """by_role[role][quantity][arm] = {share, noise_var, observed_var} (``noise_share`` of the classical
    arm blocks) and at_risk[hypothesis] = {arm: share} for the arms its verdict compares (the reference
    and the non-control arms) above ``NOISE_SHARE_WARN`` (that verdict rests mostly on measurement noise)."""
    by_role: dict[str, dict] = {}
    for role, scope in by_type.items():
        by_role[role] = {}
        for q, key in (("dJ", "dJ"), ("kl", "kl_k3")):
            blocks = {a: (scope["arms"].get(a) or {}).get(key) for a in arms}
            by_role[role][q] = {
                a: {"share": b["noise_share"], "noise_var": b["noise_var"], "observed_var": b["pooled_var"]}
                for a, b in blocks.items()
                if b
            }
    at_risk = {}
    for h, (role, q) in vd.SCOPES.items():
        shares = by_role.get(role, {}).get(q, {})
        high = {
            a: b["share"]
            for a, b in shares.items()
            if a not in controls and (b["share"] or 0) > NOISE_SHARE_WARN
        }
        if high:
            at_risk[h] = high
    return {"by_role": by_role, "warn_above": NOISE_SHARE_WARN, "at_risk": at_risk}


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


def _prepare(metrics: pd.DataFrame, warn: list[str]) -> tuple[pd.DataFrame, pd.DataFrame, dict, str]:
    """(trained rows, base rows, excluded-runs block, noise source); raises ValueError if malformed."""
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
    if "kl_k3" in rows.columns:
        rows["kl"] = pd.to_numeric(rows["kl_k3"], errors="coerce")
        se = pd.to_numeric(rows["kl_k3_se"], errors="coerce") if "kl_k3_se" in rows.columns else None
        rows["kl_var"] = (se**2).fillna(0.0) if se is not None else 0.0
        if rows["kl"].isna().any():
            warn.append("kl_k3 missing for some rows: KL tests skipped where it is")
    else:
        rows["kl"], rows["kl_var"] = np.nan, 0.0
        warn.append("no kl_k3 column: H3 not tested")
    return rows, base, excluded, source


def analyze(
    metrics: pd.DataFrame,
    cfg: Mapping | None = None,
    *,
    precisions: Sequence[str] | Mapping[str, Any] | None = None,
    controls: Mapping[str, str] | None = None,
) -> dict:
    """Statistics and verdicts for H1-H3 (the content of analysis/stats.json; JSON-safe, no NaN).

    ``cfg``: config ``analysis`` (schema defaults fill what is missing). The reference arm is the first
    of ``precisions``, else the first precision in the table. ``precisions`` may be the config's
    precisions section: its ``control`` labels (``verdicts.control_arms``) then mark control arms, as
    ``controls`` ({arm: negative | positive}) does; control arms are judged in ``controls`` and left
    out of the H1-H3 verdicts. Degenerate data (1 seed, constant dJ, no
    KL) gives 'skipped'/'failed' blocks with reasons and 'inconclusive'/'not testable' verdicts, never
    an exception; a malformed table (missing columns, duplicate run x task rows) raises ValueError.

    Keys: schema_version, config, reference, precisions, n, tasks, eval_noise_source, excluded_runs,
    gate, by_task_type[role] (classical: arms, comparisons), mixed_model[role][dJ | kl] (arms: whole_var,
    shared_var, task_var with CIs; comparisons of the whole seed variance: ratio, ratio_ci,
    ratio_ci_equivalence, p, parts, power), by_task[task], noise_share (per role, quantity and arm, and
    the verdicts resting on a share above ``NOISE_SHARE_WARN``), verdicts[H1 | H2 | H3] = {verdict,
    reason, rule, scope, by_arm}, controls[arm], noise_floor (``noise_floor``: repeats of an
    (arm, seed), left out of everything else), warnings. Infinite values (an unbounded
    CI end, a ratio over a zero variance) are stored as null (strict JSON).
    """
    cfg = {**analysis_defaults(), **dict(cfg or {})}
    warn: list[str] = []
    rows, base, excluded, noise_source = _prepare(nf.without_repeats(metrics), warn)  # repeats: noise_floor
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
    on_tasks = tasks_by_type.get("on_task") or []
    if ref is not None and on_tasks:
        ref_rows = rows[rows["precision"] == ref]
        ref_units = _units(ref_rows, on_tasks)
        ref_base = "base"  # the base the reference arm's dJ is measured from (aggregate's reference_run)
        if "reference_run" in ref_rows.columns and ref_rows["reference_run"].notna().any():
            ref_base = str(ref_rows["reference_run"].dropna().iloc[0])
        on_base = base["task"].isin(on_tasks) & (base["run"].astype(str) == ref_base)
        base_noise = float(base.loc[on_base, "noise"].sum()) / len(on_tasks) ** 2
        gate = vd.gate(ref_units["y"].tolist(), alpha, ref, base_noise)
    else:
        gate = {"passed": False, "arm": ref, "reason": "no on-task tasks or no reference arm"}
    gain = gate.get("mean") if gate.get("passed") else max(gate.get("mean") or 0.0, 0.0)
    margin = float(cfg["mean_margin_fraction"]) * float(gain or 0.0)

    by_type, model = {}, {}
    for t, tasks in tasks_by_type.items():
        if not tasks:
            warn.append(f"no task of role {t} is complete across runs")
            continue
        by_type[t] = {
            "tasks": tasks,
            "n_tasks": len(tasks),
            **classical_scope(rows, tasks, arms, cfg, f"type/{t}", margin),
        }
        if len(arms) < 2:
            continue
        model[t] = {
            "dJ": model_scope(
                rows,
                tasks,
                arms,
                "dJ",
                cfg,
                f"{t}/dJ",
                "equivalence" if t == "on_task" else "detect" if t == "off_task" else None,
            ),
            "kl": model_scope(rows, tasks, arms, "kl", cfg, f"{t}/kl", "detect" if t == "off_task" else None),
        }
        for a, comp in by_type[t]["comparisons"].items():
            for q in ("dJ", "kl"):
                mc = model[t][q]["comparisons"].get(a) if "comparisons" in model[t][q] else None
                comp[f"{q}_model"] = mc or {"status": "failed", "reason": model[t][q].get("reason")}
                comp[f"{q}_power"] = (mc or {}).get("power")
        for q, block in model[t].items():
            if block.get("status") != "ok":
                warn.append(
                    f"mixed model failed for {t} {q}: {block.get('reason')}; verdicts fall back to "
                    "the classical tests"
                )
    by_task = {}
    for task in sorted(role_of.index):
        by_task[task] = {
            "role": role_of[task],
            **classical_scope(rows, [task], arms, cfg, f"task/{task}", margin),
        }

    n_seeds = rows.groupby("precision")["run"].nunique()
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
        "eval_noise_source": noise_source,
        "excluded_runs": excluded,
        "gate": {**gate, "margin": margin, "mean_margin_fraction": cfg["mean_margin_fraction"]},
        "by_task_type": by_type,
        "mixed_model": model,
        "by_task": by_task,
        "noise_share": noise_share_block(by_type, arms, controls),
        "verdicts": vd.decide(gate, by_type, arms, cfg, controls),
        "controls": vd.control_outcomes(by_type, arms, controls, cfg, gate),
        "noise_floor": nf.noise_floor(metrics),
        "warnings": warn,
    }
    return json_safe(out)


# ----------------------------------------------------------------------------- stage


def run(
    *,
    metrics: str | os.PathLike,
    out: str | os.PathLike,
    analysis: Mapping | None,
    precisions: Sequence[str] | Mapping[str, Any] = (),
) -> dict:
    """The analysis_stats stage: stats.json = analyze(metrics.parquet) + a ``source`` block; strict JSON.

    ``precisions``: the arm order, or the config's precisions section (arm order and control labels)."""
    table = read_parquet(metrics)
    order = dict(precisions) if isinstance(precisions, Mapping) else list(precisions)
    result = analyze(table, analysis, precisions=order or None)
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
        from workflow_scripts.config import load_config

        cfg = load_config(args.config, check_files=False)
        analysis, precisions = cfg["analysis"], precisions or dict(cfg["precisions"])
    run(metrics=args.metrics, out=args.out, analysis=analysis, precisions=precisions)
    return 0


if __name__ == "__main__":
    main_from(globals())
