"""The number tables of report.md: per role and task, variance components, training and sparsity,
overlap (the sampler-trainer mismatch: ``mismatch_report``).

Pure formatting of stats.json and the aggregate tables (``report`` assembles the document); plus the
data-quality warnings the statistics do not see.
"""

import math
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from workflow_scripts.measures.aggregate_inputs import CHANGED_PREFIX
from workflow_scripts.statistics.noise_floor import without_repeats

# data checks: fraction of samples above which a warning is raised
TRUNCATION_WARN = 0.5
NO_ANSWER_WARN = 0.5
VERIFIER_FAIL_WARN = 0.0
# a task whose base pass@1 is outside this band cannot show a change in one direction (docs/miniature.md,
# "Synthetic task families": the base must sit off the floor and the ceiling)
BASE_J_BAND = (0.05, 0.95)


def fmt(x: Any, digits: int = 3) -> str:
    """Compact number, 'n/a' for missing or non-finite values ('inf' kept: an unbounded interval)."""
    try:
        x = float(x)
    except (TypeError, ValueError):
        return "n/a"
    if math.isinf(x):
        return "∞" if x > 0 else "-∞"
    if not math.isfinite(x):
        return "n/a"
    return f"{x:.{digits}g}"


def ci(pair: Sequence[Any] | None) -> str:
    """An interval; stats.json stores an unbounded upper end (inf) as null, shown as ∞."""
    if not pair or pair[0] is None:
        return "n/a"
    return f"[{fmt(pair[0])}, {'∞' if pair[1] is None else fmt(pair[1])}]"


def ratio_with_ci(comp: Mapping) -> str:
    """A mixed-model ratio with its CI; a ratio stats.json stores as null says why (0/0 or x/0)."""
    why = comp.get("reason") or ""
    if comp.get("ratio") is not None or not why.startswith("ratio "):
        value = fmt(comp.get("ratio"))
    else:
        value = "∞ (reference 0)" if why.startswith("ratio infinite") else "undefined (both 0)"
    return f"{value} {ci(comp.get('ratio_ci'))}"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def get(obj: Any, *keys: str) -> Any:
    for k in keys:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(k)
    return obj


def _p(block: Mapping | None) -> str:
    return fmt(block.get("p")) if isinstance(block, Mapping) and block.get("status") == "ok" else "n/a"


def _with_ci(fit: Mapping, key: str) -> str:
    return "n/a (one task)" if fit.get(key) is None else f"{fmt(fit[key])} {ci(fit.get(key + '_ci'))}"


def _part_ratio(comp: Mapping, part: str) -> str:
    block = get(comp, "parts", part) or {}
    if block.get("status") != "ok":
        return "n/a"
    return f"{fmt(block.get('ratio'))} {ci(block.get('ratio_ci'))}"


def kl_name(stats: Mapping) -> str:
    """How tables and figures name the KL the analysis read (stats.json ``kl_estimator``; older files: k3)."""
    return f"KL {stats.get('kl_estimator') or 'k3'}"


def components_section(stats: Mapping) -> str:
    """Whole seed variance per arm and role (mixed model) and its two parts with CIs, and the ratios."""
    model = stats.get("mixed_model") or {}
    if not model:
        return ""
    rows, ratios = [], []
    for role, per_q in model.items():
        for q, block in (per_q or {}).items():
            name = {"dJ": "dJ", "kl": kl_name(stats), "log_kl": "log KL (exploratory)",
                    "dJ_drift": "dJ / sqrt(arm's relative KL) (exploratory)"}.get(q, q)  # fmt: skip
            for arm, fit in (block.get("arms") or {}).items():
                if fit.get("status") != "ok":
                    rows.append([role, name, arm, f"failed: {fit.get('reason')}", "", "", "", "", ""])
                    continue
                rows.append(
                    [
                        role,
                        name,
                        arm,
                        _with_ci(fit, "whole_var"),
                        _with_ci(fit, "shared_var"),
                        _with_ci(fit, "task_var"),
                        fmt(fit.get("noise_var_mean")),
                        str(fit.get("n_seeds")),
                        str(fit.get("n_tasks")),
                    ]
                )
            for arm, comp in (block.get("comparisons") or {}).items():
                if comp.get("status") != "ok":
                    ratios.append([role, name, arm, f"failed: {comp.get('reason')}", "", "", "", "", ""])
                    continue
                power = comp.get("power") or {}
                mde = fmt(power.get("mde_ratio")) if power.get("status") == "ok" else "n/a"
                if "equivalence_power" in power:  # an equivalence scope (H1): no detection curve
                    mde = f"(equivalence power {fmt(power['equivalence_power'], 2)})"
                ratios.append(
                    [
                        role,
                        name,
                        arm,
                        ratio_with_ci(comp),
                        ci(comp["ratio_ci_equivalence"]),
                        _part_ratio(comp, "shared"),
                        _part_ratio(comp, "task"),
                        f"{fmt(comp['p'])} ({comp['p_source']})",
                        mde,
                    ]
                )
    return "\n".join(
        [
            "## Seed-variance components (mixed model)",
            "",
            "Per precision and task role: the whole seed variance of a task (its variance across seeds that "
            "training causes; what the verdicts compare) and its two parts, the seed effect shared by the "
            "role's tasks and the seed x task effect, with the known eval-sampling noise of every task held "
            "fixed in the model (not estimated). 95% profile-likelihood intervals; ∞ = unbounded; with one "
            "task the parts cannot be told apart.",
            "",
            table(
                [
                    "role",
                    "quantity",
                    "arm",
                    "whole seed variance [95% CI]",
                    "shared [95% CI]",
                    "seed x task [95% CI]",
                    "eval noise (mean)",
                    "seeds",
                    "tasks",
                ],
                rows,
            ),
            "",
            table(
                [
                    "role",
                    "quantity",
                    "arm",
                    "whole ratio arm / ref. [95% CI]",
                    "90% CI (H1 equivalence)",
                    "shared ratio [95% CI]",
                    "seed x task ratio [95% CI]",
                    "p (one-sided, whole)",
                    "MDE at target power",
                ],
                ratios,
            ),
            "",
        ]
    )


def noise_share_section(stats: Mapping) -> str:
    """Eval-noise share of the across-seed variance per role, quantity and arm (stats.json noise_share)."""
    ns = stats.get("noise_share") or {}
    rows = [
        [
            role,
            "dJ" if q == "dJ" else kl_name(stats),
            arm,
            fmt(b.get("share"), 2),
            fmt(b.get("noise_var")),
            fmt(b.get("observed_var")),
        ]
        for role, per_q in (ns.get("by_role") or {}).items()
        for q, per_arm in per_q.items()
        for arm, b in per_arm.items()
    ]
    if not rows:
        return ""
    return "\n".join(
        [
            "## Eval-noise share of the across-seed variance",
            "",
            "Mean eval-noise variance of one run x task / the per-task variance across seeds pooled over the "
            f"role's tasks (the observed spread the statistic works on). Above {fmt(ns.get('warn_above'))} "
            "most of the spread is measurement noise: the verdicts above that rest on it say so.",
            "",
            table(
                [
                    "role",
                    "quantity",
                    "arm",
                    "noise share",
                    "eval noise (mean)",
                    "observed across-seed variance",
                ],
                rows,
            ),
            "",
        ]
    )


def _scope_rows(scope: Mapping, label: str, metrics: pd.DataFrame, tasks: Sequence[str]) -> list[list[str]]:
    """Key-number rows of one scope, one per arm; mean J = mean over the scope's tasks and the arm's runs."""
    rows = []
    ref = scope.get("reference")
    for arm, block in (scope.get("arms") or {}).items():
        dj = block.get("dJ") or {}
        kl = block.get("kl") or block.get("kl_k3") or {}
        comp = (scope.get("comparisons") or {}).get(arm) or {}
        is_ref = arm == ref
        sel = (
            metrics[metrics["task"].isin(tasks) & (metrics["precision"] == arm)] if len(metrics) else metrics
        )
        boot = get(comp, "dJ_var", "bootstrap") or {}
        ratio = fmt(get(comp, "dJ_var", "ratio"))
        if boot.get("status") == "ok":
            ratio += f" [{fmt(boot['ratio_ci_low'])}, {fmt(boot['ratio_ci_high'])}]"
        rows.append(
            [
                label,
                arm,
                str(block.get("n_seeds", 0)),
                fmt(sel["J"].mean()) if len(sel) else "n/a",
                f"{fmt(dj.get('mean'))} ± {fmt(dj.get('se'), 2)}",
                fmt(dj.get("pooled_var")),
                fmt(dj.get("pooled_var_corrected")),
                "ref" if is_ref else ratio,
                "" if is_ref else _p(get(comp, "dJ_var", "brown_forsythe")),
                "" if is_ref else fmt(get(comp, "dJ_mean", "tost", "p")),
                fmt(kl.get("mean")),
            ]
        )
    return rows


KEY_HEADER = [
    "scope",
    "arm",
    "seeds",
    "mean J",
    "mean dJ ± SE",
    "Var dJ (per task, pooled)",
    "Var dJ (noise-corr.)",
    "Var ratio [seed-bootstrap CI]",
    "BF p",
    "TOST p",
    "mean KL",
]


def numbers_section(stats: Mapping, metrics: pd.DataFrame) -> str:
    out = [
        "## Key numbers (classical tests, one value per run)",
        "",
        "Across seeds: mean dJ ± SE (of the mean over the scope's tasks per run), variance (each task's "
        "variance across seeds, pooled over the scope's tasks: the unit of the verdicts; noise-corrected = "
        "minus the mean eval-sampling variance), ratio of raw variances arm / reference with its "
        "seed-bootstrap CI; BF = Brown-Forsythe on each seed's mean absolute deviation from the task "
        "medians; TOST = equivalence of mean dJ within the H1 margin. "
        "The verdicts use the mixed model above; these are the fallback when a fit fails, "
        "and the per-task rows are descriptive (no multiplicity correction).",
        "",
    ]
    rows = []
    for t, scope in (stats.get("by_task_type") or {}).items():
        rows += _scope_rows(
            scope, f"{t} ({', '.join(scope.get('tasks') or [])})", metrics, scope.get("tasks") or []
        )
    if rows:
        out += ["### By task role (one mean over the role's tasks per run)", "", table(KEY_HEADER, rows), ""]
    rows = []
    for task, scope in (stats.get("by_task") or {}).items():
        rows += _scope_rows(scope, task, metrics, [task])
    if rows:
        out += ["### By task", "", table(KEY_HEADER, rows), ""]
    base = metrics[metrics["precision"].isna()] if len(metrics) else metrics
    if len(base):
        out += [
            "Base pass@1: "
            + ", ".join(
                f"{t} {fmt(j)} ({r})" for r, t, j in zip(base["run"], base["task"], base["J"], strict=True)
            ),
            "",
        ]
    return "\n".join(out)


def training_section(metrics: pd.DataFrame, precisions: Sequence[str]) -> str:
    """Per-precision means over seeds of the run-level training, representable-update and sparsity columns."""
    trained = metrics[metrics["precision"].notna()] if len(metrics) else metrics
    if trained.empty:
        return ""
    runs = without_repeats(trained).drop_duplicates("run")  # a repeat is not a seed
    if "diverged" in runs.columns:
        runs = runs[~runs["diverged"].fillna(False).astype(bool)]
    changed = [c for c in runs.columns if c.startswith(CHANGED_PREFIX)]
    cols = [
        ("train_steps", "steps"),
        ("train_wall_s", "wall s"),
        ("reward_first10", "reward first 10%"),
        ("reward_last10", "reward last 10%"),
        ("informative_frac_mean", "informative frac"),
        ("clip_region_mean", "clip frac"),
        ("train_kl_k3_final", "final train KL k3"),
        ("representable_update_lr", "lr"),
        ("representable_update_frac", "representable update (step 0)"),
        *((c, f"changed (η={c.removeprefix(CHANGED_PREFIX)})") for c in changed),
        ("equal_bf16_frac", "bf16-equal frac"),
    ]
    shown = [(c, n) for c, n in cols if c in runs.columns and runs[c].notna().any()]
    missing_rep = (
        "representable_update_frac" not in runs.columns or runs["representable_update_frac"].isna().all()
    )
    order = [p for p in precisions if p in set(runs["precision"])]
    order += [p for p in runs["precision"].unique() if p not in order]
    rows = []
    for p in order:
        sel = runs[runs["precision"] == p]
        rows.append([p, str(len(sel)), *(fmt(sel[c].mean()) for c, _ in shown)])
    note = (
        "Representable update: the share of weights whose stored value changes under one step of size lr "
        "in the arm's param dtype, from the weights at step 0; next to it, the share that did change over "
        "the whole run (changed, η) and that kept its bf16 bits."
    )
    if missing_rep:
        note += " Not available for these results (run.json predates the representable-update record)."
    return "\n".join(
        [
            "## Training, representable update and sparsity (mean over non-diverged seeds)",
            "",
            note,
            "",
            table(["precision", "seeds", *(n for _, n in shown)], rows),
            "",
        ]
    )


def overlap_section(overlap: pd.DataFrame, precisions: Sequence[str]) -> str:
    """Cross-seed overlap of the update masks per precision and eta: Jaccard vs chance."""
    if overlap is None or overlap.empty:
        head = "## Cross-seed overlap of the update masks\n\n"
        return head + "No overlap tables (needs >= 2 seeds per precision).\n"
    g = overlap.groupby(["precision", "eta"])
    summary = pd.DataFrame(
        {
            "pairs": g.size(),
            "jaccard": g["jaccard"].mean(),
            "chance": g["jaccard_chance"].mean(),
            "ratio": g["ratio"].mean(),
        }
    ).reset_index()
    rank = {p: i for i, p in enumerate(precisions)}
    summary = summary.sort_values(
        ["precision", "eta"], key=lambda s: s.map(rank) if s.name == "precision" else -s
    )
    rows = [
        [p, f"{e:g}", str(n), fmt(j), fmt(c), fmt(r)] for p, e, n, j, c, r in summary.itertuples(index=False)
    ]
    return "\n".join(
        [
            "## Cross-seed overlap of the update masks",
            "",
            "Jaccard index of the weights two seeds of one arm changed, and its value for independent "
            "masks of the same densities (chance); ratio near 1: the seeds move unrelated weights.",
            "",
            table(["precision", "η", "seed pairs", "Jaccard", "chance", "ratio"], rows),
            "",
        ]
    )


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
    base = metrics[metrics["precision"].isna()]
    lo, hi = BASE_J_BAND
    for run, task, j in zip(base["run"], base["task"], base["J"], strict=True):
        if pd.notna(j) and not lo <= j <= hi:
            side = "floor" if j < lo else "ceiling"
            warn.append(
                f"{task} ({run}): base pass@1 {j:.3g} is at the {side} (outside {lo:g}-{hi:g}): dJ can "
                f"hardly move {'down' if side == 'floor' else 'up'}, so its variance says little about H1/H2"
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
