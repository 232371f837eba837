"""The analysis outputs that state conclusions: stats.json (``write_stats``) and report.md (``render``).

``write_stats`` runs ``stats.analyze`` on the tidy table with config ``analysis`` and the precision order
(reference first) and writes the JSON-safe result (plus a ``source`` block: the table and its size).

The report puts the verdicts first, then the numbers behind them.

Sections: the design in one paragraph (arms, seeds, tasks); per hypothesis the verdict, its reason, the
decision rule and a power line (power of the BF decision now, seeds per arm needed for ``power_target``,
from ``stats.power``); key-number tables per task type and per task (mean and variance of dJ, variance
ratio with bootstrap CI, BF and TOST p, KL); per precision training and sparsity summaries; the mixed
model's LRTs; the figure list; warnings (from stats.analyze plus data checks on the tidy table: verifier
timeouts and errors, truncation, missing KL, a run evaluated in an unexpected dtype).

It only formats what ``stats.analyze`` decided, so the report and stats.json cannot disagree.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from workflow_scripts.aggregate import CHANGED_PREFIX
from workflow_scripts.atomic import write_text
from workflow_scripts.stats import analyze

HYPOTHESES = {
    "H1": ("on-task performance is insensitive to precision (E and Var of dJ similar)", "on_task", "dJ"),
    "H2": ("off-task performance is sensitive: Var[dJ] across seeds larger", "off_task", "dJ"),
    "H3": ("off-task KL to the base policy drifts more (Var of KL k3 larger)", "off_task", "kl_k3"),
}
FIGURE_NOTES = {
    "dJ_by_task": "dJ per task, one dot per seed, by precision",
    "variance_ratios": "variance ratios (arm / reference) of dJ and KL with bootstrap CIs",
    "kl_by_task": "KL (k3) to the base policy per task",
    "sparsity_by_module": "changed and bf16-equal fractions per module type",
    "sparsity_vs_eta": "whole-model changed fraction against eta",
    "training_curves": "training curves per precision (mean over seeds, band +-1 SD)",
}
# data checks: fraction of samples above which a warning is raised
TRUNCATION_WARN = 0.5
NO_ANSWER_WARN = 0.5
VERIFIER_FAIL_WARN = 0.0
# a task whose base pass@1 is outside this band cannot show a change in one direction (design.md)
BASE_J_BAND = (0.05, 0.95)


def fmt(x: Any, digits: int = 3) -> str:
    """Compact number, 'n/a' for missing or non-finite values."""
    try:
        x = float(x)
    except (TypeError, ValueError):
        return "n/a"
    if not math.isfinite(x):
        return "n/a"
    return f"{x:.{digits}g}"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def _get(obj: Any, *keys: str) -> Any:
    for k in keys:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(k)
    return obj


def _ratio_ci(var: Mapping | None) -> str:
    boot = _get(var, "bootstrap") or {}
    ratio = fmt(_get(var, "ratio"))
    if boot.get("status") == "ok":
        return f"{ratio} [{fmt(boot['ratio_ci_low'])}, {fmt(boot['ratio_ci_high'])}]"
    return ratio


def _p(block: Mapping | None) -> str:
    return fmt(block.get("p")) if isinstance(block, Mapping) and block.get("status") == "ok" else "n/a"


# ----------------------------------------------------------------------------- sections


def power_line(stats: Mapping, scope: str, quantity: str, arm: str) -> str:
    """'With n seeds per arm ... power ... seeds needed ...' for one hypothesis and arm."""
    block = _get(stats, "power", scope, arm, quantity) or {}
    what = f"{scope.replace('_', '-')} {'dJ' if quantity == 'dJ' else 'KL k3'}"
    if block.get("status") != "ok":
        reason = block.get("reason") or "not computed"
        return f"power ({arm}, {what}): not computed ({reason})"
    n = min(block["n_seeds"])
    target = block.get("target", 0.8)
    parts = []
    for ratio, r in (block.get("ratios") or {}).items():
        need = r.get("seeds_needed")
        need_s = f"{need} seeds per arm" if need else f"more than {block.get('max_seeds')} seeds per arm"
        parts.append(f"{ratio}x ratio: power {fmt(r.get('power_now'), 2)} now, {need_s} for {target:.0%}")
    return f"power ({arm}, {what}, Brown-Forsythe with {n} seeds per arm): " + "; ".join(parts)


def verdict_section(stats: Mapping) -> str:
    arms = stats.get("precisions") or []
    ref, others = (arms[0], arms[1:]) if arms else ("n/a", [])
    out = ["## Verdicts", ""]
    verdicts = stats.get("verdicts") or {}
    summary = [
        [h, text, f"**{_get(verdicts, h, 'verdict') or 'n/a'}**", _get(verdicts, h, "reason") or ""]
        for h, (text, _, _) in HYPOTHESES.items()
    ]
    out += [_table(["", "hypothesis", "verdict", "reason"], summary), ""]
    for h, (text, scope, quantity) in HYPOTHESES.items():
        v = verdicts.get(h) or {}
        out.append(f"### {h}: {v.get('verdict', 'n/a')}")
        out.append("")
        out.append(f"- Hypothesis: {text} ({', '.join(others) or 'no other arm'} vs {ref}).")
        out.append(f"- Reason: {v.get('reason', 'n/a')}")
        by_arm = v.get("by_arm") or {}
        if len(by_arm) > 1:
            for arm, av in by_arm.items():
                out.append(f"  - {arm}: {av.get('verdict')} ({av.get('reason')})")
        for arm in others:
            out.append(f"- {power_line(stats, scope, quantity, arm)}")
        if v.get("rule"):
            out.append(f"- Rule: {v['rule']}")
        out.append("")
    return "\n".join(out)


def _scope_rows(
    stats: Mapping, scope: Mapping, label: str, metrics: pd.DataFrame, tasks: Sequence[str]
) -> list[list[str]]:
    """Key-number rows of one scope, one per arm; mean J = mean over the scope's tasks and the arm's runs."""
    rows = []
    ref = scope.get("reference")
    for arm, block in (scope.get("arms") or {}).items():
        dj = block.get("dJ") or {}
        kl = block.get("kl_k3") or {}
        comp = (scope.get("comparisons") or {}).get(arm) or {}
        is_ref = arm == ref
        sel = (
            metrics[metrics["task"].isin(tasks) & (metrics["precision"] == arm)] if len(metrics) else metrics
        )
        mean_j = fmt(sel["J"].mean()) if len(sel) else "n/a"
        rows.append(
            [
                label,
                arm,
                str(block.get("n_seeds", 0)),
                mean_j,
                f"{fmt(dj.get('mean'))} ± {fmt(dj.get('se'), 2)}",
                fmt(dj.get("var")),
                fmt(dj.get("var_corrected")),
                "ref" if is_ref else _ratio_ci(comp.get("dJ_var")),
                "" if is_ref else _p(_get(comp, "dJ_var", "brown_forsythe")),
                "" if is_ref else fmt(_get(comp, "dJ_mean", "tost", "p")),
                fmt(kl.get("mean")),
                "ref" if is_ref else _ratio_ci(comp.get("kl_var")),
                "" if is_ref else _p(_get(comp, "kl_var", "brown_forsythe")),
            ]
        )
    return rows


KEY_HEADER = [
    "scope",
    "arm",
    "seeds",
    "mean J",
    "mean dJ ± SE",
    "Var dJ",
    "Var dJ (noise-corr.)",
    "Var ratio [CI]",
    "BF p",
    "TOST p",
    "mean KL k3",
    "KL Var ratio [CI]",
    "BF p (KL)",
]


def numbers_section(stats: Mapping, metrics: pd.DataFrame) -> str:
    out = [
        "## Key numbers",
        "",
        "Across seeds: mean dJ ± SE, variance (raw; noise-corrected = minus the mean eval-sampling "
        "variance), ratio of variances arm / reference with its bootstrap CI; BF = Brown-Forsythe; "
        "TOST = equivalence of mean dJ within the margin.",
        "",
    ]
    by_type = stats.get("by_task_type") or {}
    rows = []
    for t, scope in by_type.items():
        label = f"{t} ({', '.join(scope.get('tasks') or [])})"
        rows += _scope_rows(stats, scope, label, metrics, scope.get("tasks") or [])
    if rows:
        out += [
            "### By task type (the unit: one mean over the type's tasks per run)",
            "",
            _table(KEY_HEADER, rows),
            "",
        ]
    rows = []
    for task, scope in (stats.get("by_task") or {}).items():
        rows += _scope_rows(stats, scope, task, metrics, [task])
    if rows:
        out += ["### By task (descriptive, no multiplicity correction)", "", _table(KEY_HEADER, rows), ""]
    base = metrics[metrics["run"] == "base"] if len(metrics) else metrics
    if len(base):
        out += [
            "Base policy pass@1: "
            + ", ".join(f"{t} {fmt(j)}" for t, j in zip(base["task"], base["J"], strict=True)),
            "",
        ]
    return "\n".join(out)


def training_section(metrics: pd.DataFrame, precisions: Sequence[str]) -> str:
    """Per-precision means over seeds of the run-level training and sparsity columns."""
    trained = metrics[metrics["precision"].notna()] if len(metrics) else metrics
    if trained.empty:
        return ""
    runs = trained.drop_duplicates("run")
    changed = [c for c in runs.columns if c.startswith(CHANGED_PREFIX)]
    cols = [
        ("train_steps", "steps"),
        ("train_wall_s", "wall s"),
        ("reward_first10", "reward first 10%"),
        ("reward_last10", "reward last 10%"),
        ("informative_frac_mean", "informative frac"),
        ("clip_region_mean", "clip frac"),
        ("clip_region_last10", "clip frac last 10%"),
        ("train_kl_k3_final", "final train KL k3"),
        *((c, f"changed (η={c.removeprefix(CHANGED_PREFIX)})") for c in changed),
        ("equal_bf16_frac", "bf16-equal frac"),
    ]
    cols = [(c, n) for c, n in cols if c in runs.columns and runs[c].notna().any()]
    order = [p for p in precisions if p in set(runs["precision"])]
    order += [p for p in runs["precision"].unique() if p not in order]
    rows = []
    for p in order:
        sel = runs[runs["precision"] == p]
        rows.append([p, str(len(sel)), *(fmt(sel[c].mean()) for c, _ in cols)])
    return "\n".join(
        [
            "## Training and update sparsity (mean over seeds)",
            "",
            _table(["precision", "seeds", *(n for _, n in cols)], rows),
            "",
        ]
    )


def mixed_model_section(stats: Mapping) -> str:
    mm = stats.get("mixed_model") or {}
    out = ["## Mixed model (evidence using every task)", ""]
    if mm.get("status") in ("skipped", "failed"):
        reason = mm.get("reason") or "; ".join(filter(None, mm.get("messages") or []))
        out += [f"{mm.get('status')}: {reason or 'no reason given'}", ""]
        return "\n".join(out)
    out.append(f"Model: {mm.get('formula')}; random: {mm.get('random')} (status {mm.get('status')}).")
    out.append("")
    for t, lrt in (mm.get("lrt") or {}).items():
        line = f"- {t}: LRT of per-precision vs pooled seed variance: "
        if lrt.get("status") in ("ok", "warning"):
            line += f"chi2 {fmt(lrt.get('statistic'))}, df {lrt.get('df')}, p {fmt(lrt.get('p'))}"
            line += " (fit warnings)" if lrt.get("status") == "warning" else ""
        else:
            line += f"{lrt.get('status')}"
        out.append(line)
    for arm, per_type in (mm.get("seed_var") or {}).items():
        out.append(f"- seed variance {arm}: " + ", ".join(f"{t} {fmt(v)}" for t, v in per_type.items()))
    out.append("")
    return "\n".join(out)


def figures_section(figures: Mapping[str, str | os.PathLike], report_path: str | os.PathLike) -> str:
    if not figures:
        return ""
    here = Path(report_path).resolve().parent
    out = ["## Figures", ""]
    for name, path in figures.items():
        rel = os.path.relpath(Path(path).resolve(), here)
        out.append(f"- [{name}]({rel}): {FIGURE_NOTES.get(name, '')}".rstrip(": "))
    out.append("")
    return "\n".join(out)


def data_warnings(metrics: pd.DataFrame) -> list[str]:
    """Problems in the tidy table that the statistics do not see (they would bias dJ or KL silently)."""
    if metrics.empty:
        return ["the metrics table is empty"]
    warn = []
    for col, what in (("timeout_frac", "verifier timeouts"), ("error_frac", "verifier errors")):
        if col in metrics.columns:
            bad = metrics[metrics[col].fillna(0) > VERIFIER_FAIL_WARN]
            if len(bad):
                worst = bad.loc[bad[col].idxmax()]
                warn.append(
                    f"{what} in {len(bad)} run x task(s) (worst {worst['run']}/{worst['task']}: "
                    f"{worst[col]:.1%} of samples, scored wrong)"
                )
    sample_checks = (
        ("truncated_frac", TRUNCATION_WARN, "over {:.0%} of samples hit max_new_tokens in {} run x task(s) "
         "(tasks {}): raise the task's max_new_tokens"),
        ("no_answer_frac", NO_ANSWER_WARN, "no answer could be extracted from over {:.0%} of samples in {} "
         "run x task(s) (tasks {}): check the prompt format and max_new_tokens"),
    )  # fmt: skip
    for col, limit, message in sample_checks:
        if col in metrics.columns:
            bad = metrics[metrics[col].fillna(0) > limit]
            if len(bad):
                warn.append(message.format(limit, len(bad), sorted(set(bad["task"]))))
    base = metrics[metrics["run"] == "base"]
    lo, hi = BASE_J_BAND
    for task, j in zip(base["task"], base["J"], strict=True):
        if pd.notna(j) and not lo <= j <= hi:
            side = "floor" if j < lo else "ceiling"
            warn.append(
                f"{task}: base pass@1 {j:.3g} is at the {side} (outside {lo:g}-{hi:g}): dJ can hardly move "
                f"{'down' if side == 'floor' else 'up'}, so its variance says little about H1/H2"
            )
    trained = metrics[metrics["precision"].notna()]
    if "kl_k3" in metrics.columns and trained["kl_k3"].isna().any():
        warn.append(f"KL k3 missing for {int(trained['kl_k3'].isna().sum())} trained run x task(s)")
    if "dJ" in metrics.columns and trained["dJ"].isna().any():
        warn.append(f"dJ missing for {int(trained['dJ'].isna().sum())} trained run x task(s)")
    if "dtype" in metrics.columns:
        dtypes = trained.groupby("precision")["dtype"].agg(lambda s: sorted(set(s.dropna())))
        mixed = {p: d for p, d in dtypes.items() if len(d) > 1}
        if mixed:
            warn.append(f"runs of one precision were evaluated in different dtypes: {mixed}")
    return warn


def render(
    stats: Mapping,
    metrics: pd.DataFrame,
    figures: Mapping[str, str | os.PathLike],
    report_path: str | os.PathLike,
    precisions: Sequence[str] = (),
) -> str:
    """The whole report.md text."""
    arms = stats.get("precisions") or list(precisions)
    n = stats.get("n") or {}
    seeds = ", ".join(f"{a} {s}" for a, s in (n.get("seeds") or {}).items())
    tasks = "; ".join(f"{t}: {', '.join(v)}" for t, v in (stats.get("tasks") or {}).items())
    cfg = stats.get("config") or {}
    head = [
        "# rlvr-precision: analysis report",
        "",
        f"Reference arm **{stats.get('reference', 'n/a')}**; compared: {', '.join(arms[1:]) or 'none'}. "
        f"Seeds per arm: {seeds or 'n/a'}. Tasks by type: {tasks or 'n/a'}. "
        f"alpha {cfg.get('alpha')}, TOST margin ±{cfg.get('tost_margin')}, variance-ratio margin "
        f"{cfg.get('variance_ratio_margin')}, eval-noise source: {stats.get('eval_noise_source', 'n/a')}. "
        "dJ = pass@1(trained) − pass@1(base); the unit of replication is the training seed.",
        "",
    ]
    warnings = list(stats.get("warnings") or []) + data_warnings(metrics)
    parts = [
        "\n".join(head),
        verdict_section(stats),
        numbers_section(stats, metrics),
        training_section(metrics, arms),
        mixed_model_section(stats),
        figures_section(figures, report_path),
        "\n".join(["## Warnings", "", *([f"- {w}" for w in warnings] or ["- none"]), ""]),
    ]
    return "\n".join(p for p in parts if p).rstrip() + "\n"


# ----------------------------------------------------------------------------- CLI


def write_stats(
    metrics_path: str | os.PathLike,
    out: str | os.PathLike,
    cfg: Mapping | None,
    precisions: Sequence[str] = (),
) -> dict:
    """stats.json = stats.analyze(metrics, cfg, precisions) + source; strict JSON (no NaN)."""
    metrics = pd.read_parquet(metrics_path)
    result = analyze(metrics, cfg, precisions=list(precisions) or None)
    result["source"] = {
        "metrics": str(metrics_path),
        "rows": len(metrics),
        "runs": int(metrics["run"].nunique()),
    }
    write_text(out, json.dumps(result, indent=2, allow_nan=False) + "\n")
    return result


def _pairs(items: Sequence[str], flag: str) -> dict[str, str]:
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise SystemExit(f"{flag}: expected NAME=VALUE, got {item!r}")
        out[name] = value
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m workflow_scripts.report",
        description="stats.json from the tidy table, or report.md from stats.json.",
    )
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("stats", help="metrics.parquet -> stats.json (stats.analyze)")
    s.add_argument("--metrics", required=True, help="results/analysis/metrics.parquet")
    s.add_argument("--config", help="a JSON object: config 'analysis' section (defaults: stats.DEFAULTS)")
    s.add_argument("--precisions", nargs="*", default=[], help="precision order (reference first)")
    s.add_argument("--out", required=True, help="results/analysis/stats.json")
    r = sub.add_parser("markdown", help="stats.json + metrics.parquet -> report.md")
    r.add_argument("--stats", required=True, help="results/analysis/stats.json")
    r.add_argument("--metrics", required=True, help="results/analysis/metrics.parquet")
    r.add_argument("--figure", nargs="*", default=[], metavar="NAME=PATH", help="figures to list")
    r.add_argument("--precisions", nargs="*", default=[], help="precision order (reference first)")
    r.add_argument("--out", required=True, help="results/analysis/report.md")
    args = p.parse_args(argv)
    if args.command == "stats":
        cfg = json.loads(args.config) if args.config else None
        result = write_stats(args.metrics, args.out, cfg, args.precisions)
        verdicts = ", ".join(f"{h} {v['verdict']}" for h, v in result["verdicts"].items())
        print(f"stats: {verdicts} -> {args.out}", file=sys.stderr)
        for w in result["warnings"]:
            print(f"stats warning: {w}", file=sys.stderr)
        return 0
    with open(args.stats, encoding="utf-8") as fh:
        stats = json.load(fh)
    text = render(
        stats, pd.read_parquet(args.metrics), _pairs(args.figure, "--figure"), args.out, args.precisions
    )
    write_text(args.out, text)
    print(f"report: {len(text.splitlines())} lines -> {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
