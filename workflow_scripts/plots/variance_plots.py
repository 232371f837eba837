"""Variance figures: seed-variance components of the mixed model with CIs, and the forest plot of ratios.

The verdicts compare the whole seed variance of a task (shared seed effect + seed x task effect); the
components figure draws it with its CI and marks its two parts.

Both read stats.json only (``FigureData.stats``): the numbers drawn are the ones the verdicts used.
"""

import math
from collections.abc import Mapping

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.transforms import blended_transform_factory

from workflow_scripts.plots.common import ROLE_LABEL, FigureData, placeholder
from workflow_scripts.statistics.report_tables import kl_name


def _positive(x: float | None) -> bool:
    """True for a finite number > 0: the values a log axis can place."""
    return x is not None and 0 < x < math.inf


def _forest_rows(stats: Mapping, block: str) -> list[dict]:
    """Rows of the forest plot: task roles (the model's ratio), then single tasks (raw variances)."""
    rows = []
    quantity = "dJ" if block == "dJ_var" else "kl"
    for role, per_q in (stats.get("mixed_model") or {}).items():
        model = (per_q or {}).get(quantity) or {}
        for arm, comp in (model.get("comparisons") or {}).items():
            ok = comp.get("status") == "ok"
            ci = comp.get("ratio_ci") or [None, None]
            rows.append(
                {
                    "label": f"{ROLE_LABEL.get(role, role)} (mixed model, whole)",
                    "arm": arm,
                    "type": True,
                    "ratio": comp.get("ratio") if ok else None,
                    "lo": ci[0],
                    "hi": ci[1],
                    "p": comp.get("p") if ok else None,
                    "why": comp.get("reason"),
                }
            )
    for task, scope in (stats.get("by_task") or {}).items():
        label = f"{task} ({ROLE_LABEL.get(scope.get('role'), scope.get('role'))})"
        for arm, comp in (scope.get("comparisons") or {}).items():
            var = comp.get(block) or {}
            boot = var.get("bootstrap") or {}
            bf = var.get("brown_forsythe") or {}
            ok = boot.get("status") == "ok"
            rows.append(
                {
                    "label": label,
                    "arm": arm,
                    "type": False,
                    "ratio": var.get("ratio"),
                    "lo": boot.get("ratio_ci_low") if ok else None,
                    "hi": boot.get("ratio_ci_high") if ok else None,
                    "p": bf.get("p") if bf.get("status") == "ok" else None,
                    "why": var.get("reason") or bf.get("reason") or boot.get("reason"),
                }
            )
    return rows


def _forest_panel(
    ax, rows: list[dict], labels: list[str], palette: Mapping, margin: float, alpha: float
) -> None:
    """One forest panel: a point per (scope, arm) at its ratio, bar = CI, p-value at the right edge."""
    arms = list(dict.fromkeys(r["arm"] for r in rows))
    step = 0.6 / max(len(arms), 1)
    finite = [v for r in rows for v in (r["ratio"], r["lo"], r["hi"]) if v is not None and 0 < v < math.inf]
    lo_lim, hi_lim = min([*finite, 1 / margin]) / 1.6, max([*finite, margin]) * 1.6
    hi_lim *= (hi_lim / lo_lim) ** 0.35  # room for the two columns of p-values inside the axes
    y_text = blended_transform_factory(ax.transAxes, ax.transData)
    small = {"va": "center", "fontsize": 8, "transform": y_text}
    for r in rows:
        y = labels.index(r["label"]) + (arms.index(r["arm"]) - (len(arms) - 1) / 2) * step
        color = palette.get(r["arm"], "C0")
        if r["ratio"] is None or r["ratio"] <= 0:
            ax.text(0.02, y, "n/a" + (" (zero variance)" if r["ratio"] == 0 else ""), color="0.4", **small)
            continue
        if r["lo"] is not None or r["hi"] is not None:
            lo = lo_lim if not r["lo"] else max(r["lo"], lo_lim)
            hi = hi_lim if r["hi"] is None or not math.isfinite(r["hi"]) else min(r["hi"], hi_lim)
            ax.plot([lo, hi], [y, y], color=color, lw=2)
        marker = {"marker": "D", "ms": 8} if r["type"] else {"marker": "o", "ms": 6}
        ax.plot([r["ratio"]], [y], color=color, mec="black", mew=0.6, zorder=4, label=r["arm"], **marker)
        if r["p"] is not None and r["type"]:  # per-task rows are descriptive: no p, no crowding
            sig = "*" if r["p"] < alpha else ""
            # neighbouring arms' labels sit in two columns, so rows closer than a line never overlap
            x = 0.99 - 0.1 * (arms.index(r["arm"]) % 2)
            ax.text(x, y, f"p={r['p']:.2g}{sig}", ha="right", **{**small, "fontsize": 7})
    ax.axvline(1.0, color="0.3", lw=1)
    ax.axvline(margin, color="0.5", lw=1, ls="--")
    x_text = blended_transform_factory(ax.transData, ax.transAxes)
    ax.text(margin, 0.01, f" {margin:g}x", transform=x_text, va="bottom", fontsize=8, color="0.4")
    ax.set_xscale("log")
    ax.set_xlim(lo_lim, hi_lim)
    ax.set_xlabel("variance ratio (log scale)")


def plot_variance_ratios(data: FigureData) -> Figure:
    """Forest plot of Var(arm)/Var(reference) across seeds, dJ and KL (log x; see the module docstring)."""
    stats = data.stats
    cfg = stats.get("config") or {}
    ref = stats.get("reference") or (data.arms()[0] if data.arms() else "reference")
    others = [a for a in stats.get("precisions") or [] if a != ref]
    if not cfg:
        fig, ax = plt.subplots(figsize=(6, 3), layout="constrained")
        placeholder(ax, "no stats.json content")
        return fig
    margin, alpha = float(cfg["variance_ratio_margin"]), float(cfg["alpha"])
    labels = list(dict.fromkeys(r["label"] for r in _forest_rows(stats, "dJ_var")))
    size = (11, max(3.0, 0.45 * len(labels) + 2.0))
    fig, axes = plt.subplots(1, 2, figsize=size, sharey=True, layout="constrained")
    arm = others[0] if len(others) == 1 else "arm"
    for ax, (block, name) in zip(axes, (("dJ_var", "dJ"), ("kl_var", kl_name(stats))), strict=True):
        rows = _forest_rows(stats, block)
        ax.set_title(f"Var[{name}] across seeds: {arm} / {ref}")
        if not labels:
            placeholder(ax, "no comparisons in stats.json\n(fewer than two precision arms?)")
        elif not any(r["ratio"] for r in rows):
            need = ",\nKL for every run" if block == "kl_var" else ""
            why = f"needs >= 2 seeds per arm{need}\nand a non-zero variance in the reference arm"
            placeholder(ax, f"no {name} variance ratio\n({why})")
        else:
            _forest_panel(ax, rows, labels, data.palette(), margin, alpha)
    uniq = {n: h for ax in axes for h, n in zip(*ax.get_legend_handles_labels(), strict=True)}
    if len(uniq) > 1:  # several arms: one legend above both panels, clear of the data and p-values
        fig.legend(uniq.values(), uniq.keys(), loc="outside upper center", ncols=len(uniq), fontsize=9)
    if labels:
        axes[0].set_yticks(range(len(labels)), labels)
        axes[0].set_ylim(len(labels) - 0.5, -0.5)
        for tick, label in zip(axes[0].get_yticklabels(), labels, strict=True):
            if "mixed model" in label:
                tick.set_fontweight("bold")
    fig.supxlabel(
        f"diamond: task role, mixed-model whole seed-variance ratio ({1 - alpha:.0%} profile CI, bootstrap "
        f"p); circle: single task, raw variances ({1 - alpha:.0%} seed-bootstrap CI, Brown-Forsythe p); "
        f"* p < {alpha:g}; dashed: r0 = {margin:g}",
        fontsize=8,
    )
    return fig


def plot_variance_components(data: FigureData) -> Figure:
    """Whole seed variance per arm and role with its profile CI (log x), its shared part as a triangle and
    its seed x task part as a cross, and the whole ratio arm / reference with its CI, for dJ (top row)
    and KL (bottom row)."""
    stats = data.stats
    model = stats.get("mixed_model") or {}
    cfg = stats.get("config") or {}
    if not cfg:
        fig, ax = plt.subplots(figsize=(6, 3), layout="constrained")
        placeholder(ax, "no stats.json content")
        return fig
    r0 = float(cfg["variance_ratio_margin"])
    roles = list(model)
    arms = list(stats.get("precisions") or [])
    fig, axes = plt.subplots(
        2,
        2,
        figsize=(11, 2.0 + 0.9 * max(len(roles) * len(arms), 2)),
        layout="constrained",
        squeeze=False,
        gridspec_kw={"width_ratios": [3, 2]},
    )
    palette = data.palette()
    for row, (quantity, name) in enumerate((("dJ", "dJ"), ("kl", kl_name(stats)))):
        ax, axr = axes[row]
        ax.set_title(f"whole seed variance of {name} (95% profile CI)", fontsize=10)
        axr.set_title(f"ratio arm / {stats.get('reference') or 'reference'} ({name})", fontsize=10)
        labels, ratio_labels, drawn = [], [], False
        for role in roles:
            block = (model.get(role) or {}).get(quantity) or {}
            for arm in arms:
                fit = (block.get("arms") or {}).get(arm) or {}
                y = len(labels)
                labels.append(f"{ROLE_LABEL.get(role, role)}: {arm}")
                if fit.get("status") != "ok":
                    ax.text(
                        0.02,
                        y,
                        f"n/a ({fit.get('reason') or block.get('reason') or 'no fit'})",
                        fontsize=7,
                        va="center",
                        color="0.4",
                        transform=blended_transform_factory(ax.transAxes, ax.transData),
                    )
                    continue
                lo, hi = fit["whole_var_ci"]
                v = fit["whole_var"]
                color = palette.get(arm, "C0")
                parts = (fit.get("shared_var"), fit.get("task_var"))
                scales = [x for x in (v, lo, hi, *parts, fit.get("noise_var_mean")) if _positive(x)]
                if not scales:  # zero spread and zero noise: nothing to place on a log axis
                    ax.text(
                        0.02,
                        y,
                        "0 (seed variance 0, CI [0, 0]; no eval noise)",
                        fontsize=7,
                        va="center",
                        color="0.4",
                        transform=blended_transform_factory(ax.transAxes, ax.transData),
                    )
                    continue
                floor = max(min(scales), 1e-12)
                ax.plot(
                    [max(lo or floor / 10, floor / 10), hi if hi and math.isfinite(hi) else floor * 1e4],
                    [y, y],
                    color=color,
                    lw=2,
                )
                ax.plot([max(v, floor / 10)], [y], "D", color=color, mec="black", mew=0.6)
                if _positive(fit.get("shared_var")):
                    ax.plot([fit["shared_var"]], [y], "^", color="0.3", ms=5)
                if _positive(fit.get("task_var")):
                    ax.plot([fit["task_var"]], [y], "x", color="0.3")
                drawn = True
            for arm, comp in (block.get("comparisons") or {}).items():
                y = len(ratio_labels)
                ratio_labels.append(f"{ROLE_LABEL.get(role, role)}: {arm}")
                if comp.get("status") != "ok" or not comp.get("ratio") or not math.isfinite(comp["ratio"]):
                    why = comp.get("reason")
                    axr.text(
                        0.02,
                        y,
                        f"n/a ({why})" if why else "n/a",
                        fontsize=7,
                        va="center",
                        color="0.4",
                        transform=blended_transform_factory(axr.transAxes, axr.transData),
                    )
                    continue
                lo, hi = comp["ratio_ci"]
                axr.plot(
                    [max(lo or 1e-3, 1e-3), min(hi or 1e3, 1e3)], [y, y], color=palette.get(arm, "C0"), lw=2
                )
                axr.plot([comp["ratio"]], [y], "D", color=palette.get(arm, "C0"), mec="black", mew=0.6)
        if labels:
            ax.set_yticks(range(len(labels)), labels)
            ax.set_ylim(len(labels) - 0.5, -0.5)
        if drawn:
            ax.set_xscale("log")
            ax.set_xlabel("variance (log); diamond: whole, triangle: shared part, x: seed x task part")
        elif not labels:
            placeholder(ax, f"no {name} variance components\n(fewer than two arms?)")
        else:
            ax.set_xticks([])
        if ratio_labels:
            axr.set_xscale("log")
            axr.set_xlim(1e-2, 1e2)
            for x, ls in ((1.0, "-"), (r0, "--"), (1 / r0, "--")):
                axr.axvline(x, color="0.4", lw=1, ls=ls)
            axr.set_yticks(range(len(ratio_labels)), ratio_labels)
            axr.set_ylim(len(ratio_labels) - 0.5, -0.5)
            axr.set_xlabel(f"ratio (log); dashed: 1/r0, r0 = {r0:g}")
        else:
            placeholder(axr, "no comparison")
    return fig
