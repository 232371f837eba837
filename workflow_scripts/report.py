"""The report stage: report.md, the verdicts in words a reader can check against their tables.

Long on purpose: one section function per report section, each short, in the order report.md reads.

Order: the design in one paragraph; the arm table (what each arm stores, computes and samples in) and
"What this run says" (sentences generated from stats.json, ``statistics.summary``); the training-worked
gate (passed or not, with its numbers, and what it means for the verdicts); the verdict table (each
verdict with the numbers it rests on and its power or minimal detectable ratio, MDE) and a warning where
a verdict rests on an eval-noise share above 1/2; one paragraph per hypothesis; the decomposition of the
mean effects into factors; the controls (when the config has control arms: did each come out as it must);
excluded (diverged) runs and how the verdicts treat them; the seed-variance components (whole, shared,
seed x task) and the eval-noise shares; key numbers (classical tests); the numerical noise floor (when
the config has ``repeats``: repeat variance beside seed variance); the learning curves (from
learning_curves.json: the first step at which each arm's held-out curves part from the reference's);
training, representable-update fraction and sparsity per precision; cross-seed overlap of the update
masks; the figures (``figure_list``: name and the first sentence of its caption); warnings.

It only formats what ``stats.analyze`` decided (stats.json), so the report and stats.json cannot
disagree. Repeats (runs ``<arm>-s<seed>-r<k>``) are not seeds: every seed-level table reads the metrics
without them (``noise_floor.without_repeats``, as stats does); only the noise-floor section shows them.
"""

from workflow_scripts.runtime import startup  # noqa: F401  first: no garbage collection during imports

# isort: split

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from workflow_scripts.plots.figure_list import figures_section
from workflow_scripts.runtime import paths
from workflow_scripts.runtime.atomic import write_text
from workflow_scripts.runtime.numerics import provenance_section
from workflow_scripts.runtime.smk import main_from, parse_pairs
from workflow_scripts.statistics.arms import run_setups
from workflow_scripts.statistics.curve_report import learning_curves_section
from workflow_scripts.statistics.matched import summary_lines as matched_lines
from workflow_scripts.statistics.mismatch_report import gaps_by_arm, mismatch_table
from workflow_scripts.statistics.noise_floor import without_repeats
from workflow_scripts.statistics.report_tables import (
    components_section,
    data_warnings,
    fmt,
    get,
    kl_name,
    noise_share_section,
    numbers_section,
    overlap_section,
    ratio_with_ci,
    table,
    training_section,
)
from workflow_scripts.statistics.summary import (
    arms_section,
    decomposition_section,
    summary_section,
    twin_cell,
    yardstick_words,
)
from workflow_scripts.statistics.verdicts import _f as vd_f
from workflow_scripts.tasks.rows import read_json, read_parquet

GLOSSARY = Path(__file__).resolve().parents[1] / "docs" / "glossary.md"  # linked from the report's head
HYPOTHESES = {  # the role and quantity each one tests come from stats.json (verdicts[H].scope)
    "H1": "on-task performance is insensitive to precision (mean and seed variance of dJ equivalent)",
    "H2": "off-task performance is sensitive: the seed variance of dJ is larger",
    "H3": "off-task KL to the base policy drifts more: the seed variance of KL is larger (on-task KL "
    "stays leashed)",
}
RATIO_NOTE = (
    "Ratio = whole seed variance arm / reference of the mixed model (each task's variance across seeds "
    "that training causes: the seed effect shared by the role's tasks plus the seed x task effect, the "
    "known eval noise held out; dJ for H1/H2, KL for H3) with its (1-alpha) profile interval (H2 and "
    "H3 are decided on the interval's one-sided bound at alpha, the lower end of the (1-2 alpha) interval)"
)


def gate_section(stats: Mapping) -> str:
    g = stats.get("gate") or {}
    if g.get("passed"):
        verdict = (
            f"**Passed.** {g.get('reason')}. The verdicts below are tested; H1's mean margin is "
            f"±{fmt(g.get('margin'))} ({fmt(g.get('mean_margin_fraction'))} of this gain)."
        )
    else:
        verdict = (
            f"**Not passed.** {g.get('reason') or 'no reference arm or no on-task task'}. Every "
            "hypothesis is therefore 'not testable': with no on-task gain, equal on-task change and "
            "larger off-task spread say nothing about precision. The numbers below are descriptive."
        )
    return "\n".join(
        [
            "## Gate: did training improve the on-task score?",
            "",
            f"The reference arm's on-task dJ must be significantly above 0 (one-sided t across seeds "
            f"at alpha {fmt(g.get('alpha'))}, the base's eval noise included). {verdict}",
            "",
        ]
    )


def _power(comp: Mapping, h: str) -> tuple[str, str]:
    """(power / MDE, seeds needed) cells of the verdict table for one arm's comparison."""
    p = comp.get("power") or {}
    if p.get("status") != "ok":
        return f"n/a ({p.get('reason') or 'no model fit'})", "n/a"
    target = f"{p['target']:.0%}"
    if h == "H1":  # an equivalence verdict: its power, no detection MDE (power.power_block)
        need = p.get("seeds_needed_equivalence")
        return (
            f"equivalence power {fmt(p.get('equivalence_power'), 2)} (ratio 1, inside 1/r0..r0)",
            f"{need or '> ' + str(p['max_seeds'])} (equivalence at {target})",
        )
    mde = (
        f"MDE {fmt(p['mde_ratio'])}x"
        if p.get("mde_ratio")
        else f"MDE > {max(map(float, p['power_by_ratio'])):g}x"
    )
    need = p.get("seeds_needed_r0")
    if (p.get("family") or 1) > 1:  # the whole rule's MDE (power.py); Holm's first step
        single = p.get("mde_ratio_single")
        mde += f" (Holm over {p['family']} arms; one comparison: {f'{fmt(single)}x' if single else 'n/a'})"
    return (
        f"power at r0={fmt(p['r0'])}: {fmt(p.get('power_at_r0'), 2)}; {mde} at {target}",
        f"{need or '> ' + str(p['max_seeds'])} (ratio r0 at {target})",
    )


def _scope(stats: Mapping, h: str) -> tuple[str | None, str | None]:
    scope = get(stats, "verdicts", h, "scope") or {}
    return scope.get("role"), scope.get("quantity")


def noise_warnings(stats: Mapping) -> list[str]:
    """One line per hypothesis whose compared arms have an eval-noise share above the stated limit."""
    ns = stats.get("noise_share") or {}
    out = []
    for h, shares in (ns.get("at_risk") or {}).items():
        role, q = _scope(stats, h)
        verdict = get(stats, "verdicts", h, "verdict") or "n/a"
        arms = ", ".join(f"{a} {fmt(v, 2)}" for a, v in shares.items())
        out.append(
            f"**Warning: {h} ({verdict}) rests on an eval-noise share above {fmt(ns.get('warn_above'))}** "
            f"({role} {kl_name(stats) if q == 'kl' else q}: {arms}): most of the across-seed spread it "
            "compares is measurement noise; more problems or samples per task would shrink it."
        )
    return out


VERDICT_HEADER = ["", "comparison", "finding (verdict)", "ratio [95% CI]", "p (Holm-adjusted)",
                  "null yardstick (reference splits)", "null twin", "power / MDE",
                  "seeds per arm needed"]  # fmt: skip


def verdict_section(stats: Mapping) -> str:
    arms = stats.get("precisions") or []
    controls = stats.get("controls") or {}
    ref, others = (arms[0], [a for a in arms[1:] if a not in controls]) if arms else ("n/a", [])
    verdicts = stats.get("verdicts") or {}
    model = stats.get("mixed_model") or {}
    rows = []
    for h in HYPOTHESES:
        role, q = _scope(stats, h)
        for arm in others or ["n/a"]:
            comp = get(model, role, q, "comparisons", arm) or {}
            v = get(verdicts, h, "by_arm", arm, "verdict") or get(verdicts, h, "verdict") or "n/a"
            by_arm = get(verdicts, h, "by_arm", arm) or {}
            finding = by_arm.get("finding") or v
            ratio = ratio_with_ci(comp) if comp.get("status") == "ok" else "n/a"
            pw, need = _power(comp, h)
            label = (
                f"{arm} vs {ref}"
                if others
                else "no precision arm" + (" (controls below)" if controls else "")
            )
            adj = f" ({fmt(by_arm['holm_p'])})" if by_arm.get("holm_p") is not None else ""
            yard = yardstick_words(comp.get("yardstick")) if comp.get("status") == "ok" else "-"
            rows.append(
                [h, label, f"**{finding}** ({v})", ratio, fmt(comp.get("p")) + adj, yard,
                 twin_cell(by_arm), pw, need]
            )  # fmt: skip
    out = [
        "## Verdicts",
        "",
        f"{RATIO_NOTE}; p = one-sided test of equal whole seed variances (parametric bootstrap); MDE = "
        "smallest ratio detected with the target power at these seeds (simulated for this statistic).",
        "",
        table(VERDICT_HEADER, rows),
        "",
        "Findings: larger (the rule's 'supported'), smaller (the ratio's interval lies below 1), not larger "
        "than r0 (below r0 but containing 1), equivalent / mean lower / mean higher (H1), inconclusive. "
        "One primary analysis (analysis.primary): the absolute scale, and every variance claim of H2 and H3 "
        "(larger or smaller, every arm) corrected together by Holm; 'not larger than r0' is a bound, "
        "corrected over the same comparisons apart. 'null yardstick': the 5-95% range of the same ratio "
        "over random splits of the reference's seeds into two sets of the arm's size, and the share of "
        "splits at least as extreme (only where the reference has twice the arm's seeds). 'null twin': a "
        "negative control's ratio on the same comparison (config.controls.yaml).",
        "",
    ]
    for line in noise_warnings(stats):
        out += [line, ""]
    for h, text in HYPOTHESES.items():
        v = verdicts.get(h) or {}
        out += [
            f"### {h}: {v.get('verdict', 'n/a')}",
            "",
            f"- Hypothesis: {text} ({', '.join(others) or 'no other arm'} vs {ref}).",
            f"- Why: {v.get('reason', 'n/a')}",
        ]
        by_arm = v.get("by_arm") or {}
        if len(by_arm) > 1:
            out += [f"  - {arm}: {av.get('verdict')} ({av.get('reason')})" for arm, av in by_arm.items()]
        if v.get("rule"):
            out.append(f"- Rule: {v['rule']} (r0 = {fmt(get(stats, 'config', 'variance_ratio_margin'))}).")
        out.append("")
    return "\n".join(out)


def controls_section(stats: Mapping) -> str:
    """Whether each control arm came out as it must (only when the config has control arms)."""
    controls = stats.get("controls") or {}
    if not controls:
        return ""
    ref = stats.get("reference") or "the reference"
    rows, reasons = [], []
    for arm, c in controls.items():
        passed = c.get("passed")
        status = "**as it must**" if passed else "**NOT as it must**" if passed is False else "not judged"
        rows.append([arm, str(c.get("kind")), str(c.get("expected")), c.get("outcome") or "n/a",
                     c.get("kl_outcome") or "n/a", status])  # fmt: skip
        reasons.append(
            f"- {arm}: dJ: {c.get('reason')}" + (f"; KL: {c['kl_reason']}" if c.get("kl_reason") else "")
        )
    gate = "passed" if get(stats, "gate", "passed") else "did not pass"
    return "\n".join(
        [
            "## Controls",
            "",
            f"Arms that check the instrument, each against {ref}, judged by the H2 rule on the off-task dJ "
            f"and the H3 rule on the off-task KL (whole seed-variance ratios) without the gate (it {gate}): "
            "a negative control (the reference under another name, its own seeds) must not be called "
            "different (not 'supported') on either; a positive control (the reference with added update "
            "noise) must be detected ('supported') on both. Controls are left out of the H1-H3 verdicts.",
            "",
            table(["control arm", "kind", "must be", "off-task dJ", "off-task KL", "result"], rows),
            "",
            *reasons,
            "",
        ]
    )


# ------------------------------------------- the base and the movement-matched comparison (issue 60)


def base_section(base: Mapping | None) -> str:
    """Which base every run started from, and that the conclusions are conditional on it."""
    if not base:
        return ""
    shipped = base.get("shipped")
    if shipped:
        built = shipped.get("built") or {}
        cpu = ((built.get("numerics") or {}).get("cpu_model")) or "n/a"
        steps = (built.get("sft") or {}).get("steps", "n/a")
        sha = (shipped.get("files") or {}).get("model.safetensors", "n/a")
        where = (
            f"the shipped base `{shipped.get('path')}` (model.safetensors sha256 {sha[:16]}..., checked "
            f"against its manifest; built once on {cpu}, {steps} warm-start steps): every machine starts "
            "from these bits"
        )
    else:
        where = (
            f"a base built on this machine (model.source {base.get('source')}): another CPU kind builds "
            "another base from the same config"
        )
    return "\n".join(
        [
            "## Base model",
            "",
            f"Every run starts from {where}. Every conclusion below is conditional on this one base: how far "
            "they travel to other bases is what config.bases.yaml (`make bases`) asks. From the same base, "
            "training floats still differ between CPU kinds, so another machine's numbers are the same "
            "distribution, not the same bits (docs/reproducibility.md).",
            "",
        ]
    )


def matched_section(stats: Mapping) -> str:
    """stats.json ``matched`` (statistics/matched.py): each arm's seed variance beside the reference's at
    the step where the reference has moved as far (off-task KL)."""
    block = stats.get("matched")
    if not block:
        return ""
    intro = (
        "Before a smaller seed variance is read as more stable: the reference's own snapshots, evaluated "
        "on the off-task tasks, at the step whose mean off-task KL is nearest the arm's (the nearest "
        "evaluated step, not an interpolation; the KL ratio says how close). The whole seed-variance "
        "ratio arm / reference there, off-task dJ and KL, by the mixed model as in the verdicts; Holm "
        "over this block's own claims (it qualifies the verdicts, it is not one of them)."
    )
    curve = block.get("reference_kl") or {}
    kl_line = ", ".join(f"step {k} {vd_f(v)}" for k, v in curve.items())
    return "\n".join(
        [
            "## Movement-matched comparison",
            "",
            intro,
            "",
            f"Reference mean off-task KL by step: {kl_line or 'n/a'}.",
            "",
            *matched_lines(block),
            "",
        ]
    )


def excluded_section(stats: Mapping, metrics: pd.DataFrame) -> str:
    ex = stats.get("excluded_runs") or {}
    total = int(metrics.loc[metrics["precision"].notna(), "run"].nunique()) if len(metrics) else 0
    out = ["## Diverged runs", ""]
    if (
        "diverged" not in metrics.columns
        or metrics.loc[metrics["precision"].notna(), "diverged"].isna().all()
    ):
        out.append(
            "Not checked: these results predate the training health record (run.json has no 'health'); "
            "no run was excluded."
        )
    elif not ex.get("count"):
        out.append(f"None of the {total} trained runs diverged; every run enters the verdicts.")
    else:
        out.append(
            f"{ex['count']} of {total} trained runs diverged and are **excluded** from every test and "
            "verdict (a collapsed policy's dJ measures the collapse, not precision); paired comparisons "
            "use the seeds both arms kept:"
        )
        out += [
            f"- {run}: {(ex.get('reasons') or {}).get(run) or 'marked diverged'}" for run in ex["diverged"]
        ]
    out.append("")
    return "\n".join(out)


def _pooled_over(by_task: Mapping, tasks: Sequence[str]) -> tuple[float | None, int]:
    """Repeat variance pooled over ``tasks`` (weights: each task's degrees of freedom) and its df."""
    parts = [(b["var"], b["df"]) for t in tasks for b in [by_task.get(t) or {}] if b.get("var") is not None]
    df = sum(d for _, d in parts)
    return (sum(v * d for v, d in parts) / df if df else None), df


def _runs_label(runs: Sequence[str]) -> str:
    """The runs of a repeated (arm, seed), each named as first run or repeat k (``paths.parse_run``)."""
    out = []
    for run in runs:
        k = paths.parse_run(run).repeat or 1
        out.append(f"{run} ({'first run' if k == 1 else f'repeat {k}'})")
    return ", ".join(out)


FLOOR_HEADER = [
    "arm",
    "role",
    "repeated pairs",
    "repeat var dJ",
    "seed var dJ",
    "repeat var KL",
    "seed var KL",
]


def noise_floor_section(stats: Mapping) -> str:
    """The numerical noise floor (stats.json ``noise_floor``): repeat variance beside the seed variance.

    Both columns are each task's variance pooled over the role's tasks (repeats: across the repeats of
    one (arm, seed), pooled over the arm's repeated pairs; seeds: across seeds, Key numbers' "Var dJ").
    Empty when the config has no ``repeats``."""
    floor = stats.get("noise_floor") or {}
    if floor.get("status") != "ok":
        return ""
    rows = []
    for arm, block in (floor.get("arms") or {}).items():
        for role, tasks in (stats.get("tasks") or {}).items():
            cells = [arm, role, str(len(block.get("pairs") or []))]
            for q, seed_key in (("dJ", "dJ"), ("kl", "kl")):
                var, df = _pooled_over(get(block, q, "by_task") or {}, tasks)
                seed_var = get(stats, "by_task_type", role, "arms", arm, seed_key, "pooled_var")
                cells += [f"{fmt(var)} (df {df})", fmt(seed_var)]
            rows.append(cells)
    pairs = []
    for name, p in (floor.get("pairs") or {}).items():
        diffs = [b["max_abs_diff"] for b in (p.get("dJ") or {}).values() if b.get("max_abs_diff") is not None]
        identical = "yes" if p.get("identical") else "no"
        pairs.append([name, _runs_label(p.get("runs") or []), identical, fmt(max(diffs, default=None))])
    return "\n".join(
        [
            "## Numerical noise floor (repeats)",
            "",
            "A repeat trains one (arm, seed) again with the same seed (config `repeats`, run "
            "`<arm>-s<seed>-r<k>`): same data order, sampling and evaluation streams, so repeats differ by "
            "numerics alone. Repeats are not seeds: every other table, figure and verdict uses each "
            "(arm, seed) once, its first run. Repeat variance: each task's variance between the repeats, "
            "pooled over the arm's repeated pairs and the role's tasks; seed variance: each task's variance "
            "across seeds, pooled over the role's tasks (Key numbers). A seed variance near the floor is "
            "numerics, not seeds.",
            "",
            table(FLOOR_HEADER, rows),
            "",
            table(["(arm, seed)", "runs", "bit-identical", "max |Δ dJ| over tasks"], pairs),
            "",
        ]
    )


def render(
    stats: Mapping,
    metrics: pd.DataFrame,
    figures: Mapping[str, str | os.PathLike],
    report_path: str | os.PathLike,
    precisions: Sequence[str] = (),
    overlap: pd.DataFrame | None = None,
    numerics: Mapping[str, Any] | None = None,
    learning_curves: Mapping[str, Any] | None = None,
    setups: Mapping[str, Any] | None = None,
    base: Mapping[str, Any] | None = None,
) -> str:
    """The whole report.md text. ``numerics``: record name -> its base.json's or run.json's ``numerics``
    (``provenance_section``); ``learning_curves``: its json; ``setups``: run -> ``arms.sampler_setup``."""
    arms = stats.get("precisions") or list(precisions)
    n = stats.get("n") or {}
    seeds = ", ".join(f"{a} {s}" for a, s in (n.get("seeds") or {}).items())
    tasks = "; ".join(f"{t}: {', '.join(v)}" for t, v in (stats.get("tasks") or {}).items())
    cfg = stats.get("config") or {}
    head = [
        "# rlvr-precision: analysis report",
        "",
        f"Reference arm **{stats.get('reference', 'n/a')}**; compared: {', '.join(arms[1:]) or 'none'}. "
        f"Seeds per arm (after exclusions): {seeds or 'n/a'}. Tasks by role: {tasks or 'n/a'}. "
        f"alpha {cfg.get('alpha')}, H1 mean margin {cfg.get('mean_margin_fraction')} of the reference "
        f"gain, variance-ratio margin r0 {cfg.get('variance_ratio_margin')}, eval-noise source: "
        f"{stats.get('eval_noise_source', 'n/a')}. dJ = pass@1(trained) − pass@1(base in the arm's param "
        "dtype); the unit of replication is the training seed. The terms (arm, dJ, KL estimators, verdict "
        f"words, MDE): [glossary]({os.path.relpath(GLOSSARY, Path(report_path).resolve().parent)}).",
        "",
    ]
    warnings = list(stats.get("warnings") or []) + data_warnings(metrics)  # repeats' rows checked too
    seeds_only = without_repeats(metrics)  # each (arm, seed) once: repeats are in noise_floor_section
    gaps = gaps_by_arm(seeds_only, arms, setups)  # the mismatch table and the summary's words
    parts = [
        "\n".join(head),
        arms_section(stats, gaps),
        summary_section(stats, gaps),
        base_section(base),
        gate_section(stats),
        verdict_section(stats),
        decomposition_section(stats),
        controls_section(stats),
        matched_section(stats),
        excluded_section(stats, seeds_only),
        components_section(stats),
        noise_share_section(stats),
        numbers_section(stats, seeds_only),
        noise_floor_section(stats),
        learning_curves_section(learning_curves),
        training_section(seeds_only, arms),
        mismatch_table(gaps),
        overlap_section(overlap if overlap is not None else pd.DataFrame(), arms),
        figures_section(figures, report_path),
        provenance_section(dict(numerics or {})),
        "\n".join(["## Warnings", "", *([f"- {w}" for w in warnings] or ["- none"]), ""]),
    ]
    return "\n".join(p for p in parts if p).rstrip() + "\n"


# ----------------------------------------------------------------------------- stage


def run(
    *,
    stats: str | os.PathLike,
    metrics: str | os.PathLike,
    out: str | os.PathLike,
    figures: Mapping[str, str | os.PathLike],
    precisions: Sequence[str] = (),
    overlap: str | os.PathLike | None = None,
    records: Sequence[str | os.PathLike] = (),
    learning_curves: str | os.PathLike | None = None,
) -> str:
    """The report stage: report.md from stats.json and the aggregate tables; ``records``: the
    base.json and run.json files whose numerics provenance the report lists; ``learning_curves``:
    learning_curves.json."""
    content: Any = read_json(stats)
    curves = read_json(learning_curves) if learning_curves else None
    ov = read_parquet(overlap) if overlap else None
    numerics: dict[str, Any] = {}
    read: list[Any] = []
    for path in records:  # provenance only: an unreadable record is listed as such, not a failed report
        try:
            record = read_json(path)
        except (OSError, ValueError) as err:
            print(f"report: numerics provenance not readable: {err}", file=sys.stderr)
            numerics[str(path)] = None
            continue
        seeded = isinstance(record, dict) and "seed" in record and "precision" in record
        repeat = int(record.get("repeat") or 1) if seeded else 1
        name = paths.run_name(record["precision"], record["seed"], repeat) if seeded else "base"
        name += f" (repeat {repeat})" if repeat > 1 else ""
        numerics[name] = record.get("numerics") if isinstance(record, dict) else None
        read.append(record)
    setups = run_setups(read)  # what each run samples and trains in: the mismatch table's sources
    base = next((r for r in read if isinstance(r, dict) and "precision" not in r), None)  # base.json
    text = render(
        content, read_parquet(metrics), figures, out, precisions, ov, numerics, curves, setups, base
    )
    write_text(out, text)
    print(f"report: {len(text.splitlines())} lines -> {out}", file=sys.stderr)
    return text


def from_snakemake(smk: Any) -> None:
    figures = dict(zip(smk.params.figures, smk.input.figures, strict=True))
    run(
        stats=smk.input.stats,
        metrics=smk.input.metrics,
        out=smk.output.report,
        figures=figures,
        precisions=list(smk.params.precisions),
        overlap=smk.input.overlap,
        records=[smk.input.base, *smk.input.runs],
        learning_curves=smk.input.learning_curves,
    )


def main(argv: list[str] | None = None) -> int:
    analysis = paths.analysis_dir()
    p = argparse.ArgumentParser(
        prog="python -m workflow_scripts.report",
        description="report.md from stats.json and the aggregate tables.",
    )
    p.add_argument("--stats", default=str(analysis / "stats.json"))
    p.add_argument("--metrics", default=str(analysis / "metrics.parquet"))
    p.add_argument("--overlap", help="overlap.parquet")
    p.add_argument("--figure", nargs="*", default=[], metavar="NAME=PATH", help="figures to list")
    p.add_argument("--precisions", nargs="*", default=[], help="precision order (reference first)")
    p.add_argument("--records", nargs="*", default=[], help="base.json, run.json files")
    p.add_argument("--learning-curves", help="learning_curves.json")
    p.add_argument("--out", default=str(analysis / "report.md"))
    args = p.parse_args(argv)
    try:
        figures = parse_pairs(args.figure, "NAME=PATH")
    except ValueError as err:
        raise SystemExit(f"--figure: {err}") from None
    run(
        stats=args.stats,
        metrics=args.metrics,
        out=args.out,
        figures=figures,
        precisions=args.precisions,
        overlap=args.overlap,
        records=args.records,
        learning_curves=args.learning_curves,
    )
    return 0


if __name__ == "__main__":
    main_from(globals())
