"""Figures of the analysis (seaborn), one function per figure over the aggregate tables and stats.json.

| name               | shows                                                         | reads            |
| ------------------ | ------------------------------------------------------------- | ---------------- |
| dJ_by_task         | dJ per task, one dot per seed, by precision (mean +- SE)      | metrics.parquet  |
| variance_ratios    | forest plot: Var(arm)/Var(reference) of dJ and KL k3, with    | stats.json       |
|                    | bootstrap CIs and BF p-values, per task type and per task     |                  |
| kl_by_task         | KL(pi_theta || pi_0) k3 per task, one dot per seed            | metrics.parquet  |
| sparsity_by_module | changed fraction per module type at each eta; bf16-equal      | sparsity.parquet |
| sparsity_vs_eta    | whole-model changed fraction against eta (log x)              | sparsity.parquet |
| training_curves    | reward, informative fraction, clip fraction, KL, entropy,     | training_curves  |
|                    | grad norm per step: mean over seeds, band +-1 SD              | .parquet         |

Every function takes a ``FigureData`` and returns a matplotlib Figure; degenerate data (one seed, no KL,
no sparsity, zero variance) gives a panel that says what is missing instead of an exception, because a
declared output must exist for the report to build. Colours are fixed per precision (config order), so
an arm has one colour in every figure.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.transforms import blended_transform_factory

from workflow_scripts.atomic import atomic_path

DPI = 150
ROLE_LABEL = {"on_task": "on-task", "off_task": "off-task"}
# training-curve panels: column, title, rows used (generation steps for rollout statistics), smoothed
CURVE_PANELS = (
    ("reward", "training reward", "generation", True),
    ("informative_frac", "informative group fraction", "generation", True),
    ("clip_region", "clip fraction (tokens)", "all", True),
    ("kl_k3", "KL to base (k3, training prompts)", "kl", False),
    ("entropy", "entropy", "all", True),
    ("grad_norm", "grad norm", "all", True),
)


@dataclass
class FigureData:
    """What the figures read: the aggregate tables, stats.json content and the precision order."""

    metrics: pd.DataFrame
    curves: pd.DataFrame = field(default_factory=pd.DataFrame)
    sparsity: pd.DataFrame = field(default_factory=pd.DataFrame)
    stats: Mapping[str, Any] = field(default_factory=dict)
    precisions: Sequence[str] = ()

    def arms(self) -> list[str]:
        """Precision order: configured first (reference first), then any other present in the data."""
        present: list[str] = []
        for frame in (self.metrics, self.curves, self.sparsity):
            if "precision" in frame.columns:
                present += [p for p in frame["precision"].dropna().astype(str).unique() if p not in present]
        return [p for p in self.precisions if p in present] + [p for p in present if p not in self.precisions]

    def palette(self) -> dict[str, Any]:
        arms = list(self.precisions) + [a for a in self.arms() if a not in self.precisions]
        return dict(zip(arms, sns.color_palette("colorblind", max(len(arms), 1)), strict=False))


# ----------------------------------------------------------------------------- helpers


def _placeholder(ax, message: str) -> None:
    ax.text(
        0.5,
        0.5,
        message,
        ha="center",
        va="center",
        transform=ax.transAxes,
        fontsize=10,
        color="0.35",
        wrap=True,
    )
    ax.set_xticks([])
    ax.set_yticks([])


def _trained(metrics: pd.DataFrame) -> pd.DataFrame:
    rows = metrics[metrics["precision"].notna()].copy()
    rows["precision"] = rows["precision"].astype(str)
    return rows


def _task_order(metrics: pd.DataFrame) -> list[str]:
    """On-task tasks first, then off-task, each in table (config) order."""
    first = metrics.drop_duplicates("task")
    rank = {"on_task": 0, "off_task": 1}
    return sorted(first["task"], key=lambda t: rank.get(first.set_index("task").at[t, "role"], 2))


def _task_labels(metrics: pd.DataFrame, tasks: Sequence[str]) -> list[str]:
    role = metrics.drop_duplicates("task").set_index("task")["role"]
    return [f"{t}\n({ROLE_LABEL.get(role.get(t), role.get(t))})" for t in tasks]


def _dots_by_task(data: FigureData, column: str, ylabel: str, title: str, zero_line: bool) -> Figure:
    """One dot per seed per (task, precision), dodged by precision, with the mean +- SE across seeds."""
    rows = _trained(data.metrics) if len(data.metrics) else data.metrics
    tasks = _task_order(data.metrics) if len(data.metrics) else []
    fig, ax = plt.subplots(figsize=(max(5.0, 1.5 * len(tasks) + 2.5), 4.2), layout="constrained")
    if column not in rows.columns or rows.empty or rows[column].notna().sum() == 0:
        _placeholder(ax, f"no {column} values (not measured for any trained run)")
        ax.set_title(title)
        return fig
    rows = rows[rows[column].notna()]
    arms = [a for a in data.arms() if a in set(rows["precision"])]
    sns.stripplot(
        data=rows,
        x="task",
        y=column,
        hue="precision",
        order=tasks,
        hue_order=arms,
        palette=data.palette(),
        dodge=True,
        jitter=0.08,
        size=6,
        alpha=0.75,
        ax=ax,
    )
    width = 0.8 / len(arms)
    for i, arm in enumerate(arms):
        offset = (i - (len(arms) - 1) / 2) * width
        g = rows[rows["precision"] == arm].groupby("task")[column]
        mean, sd, n = g.mean(), g.std(ddof=1), g.count()
        xs = [k + offset for k, t in enumerate(tasks) if t in mean.index]
        ys = [mean[t] for t in tasks if t in mean.index]
        se = [sd[t] / math.sqrt(n[t]) if n[t] > 1 else 0.0 for t in tasks if t in mean.index]
        ax.errorbar(
            xs,
            ys,
            yerr=se,
            fmt="_",
            markersize=18,
            markeredgewidth=2.2,
            color="black",
            elinewidth=1.2,
            capsize=3,
            zorder=5,
            label="mean ± SE" if i == 0 else None,
        )
    if zero_line:
        ax.axhline(0.0, color="0.4", lw=0.8, ls="--", zorder=0)
    ax.set_xticks(range(len(tasks)), _task_labels(data.metrics, tasks))
    ax.set_xlabel("")
    ax.set_ylabel(ylabel)
    n_seeds = rows.groupby("precision")["run"].nunique()
    ax.set_title(title + "  (seeds: " + ", ".join(f"{a} {n_seeds.get(a, 0)}" for a in arms) + ")")
    ax.legend(title="precision", loc="best", fontsize=9, title_fontsize=9, frameon=True)
    return fig


# ----------------------------------------------------------------------------- figures


def plot_dj_by_task(data: FigureData) -> Figure:
    return _dots_by_task(
        data, "dJ", "dJ = pass@1(trained) − pass@1(base)", "Change in pass@1 per task", zero_line=True
    )


def plot_kl_by_task(data: FigureData) -> Figure:
    return _dots_by_task(
        data,
        "kl_k3",
        "KL(π_θ ‖ π_0), k3 estimate (nats/sequence)",
        "KL to the base policy per task",
        zero_line=False,
    )


def _forest_rows(stats: Mapping, block: str) -> list[dict]:
    """Rows of the forest plot: task types, then tasks, for each non-reference arm."""
    rows = []
    scopes = [
        (f"{ROLE_LABEL.get(t, t)} (mean over tasks)", v, True)
        for t, v in (stats.get("by_task_type") or {}).items()
    ]
    scopes += [
        (f"{task} ({ROLE_LABEL.get(v.get('role'), v.get('role'))})", v, False)
        for task, v in (stats.get("by_task") or {}).items()
    ]
    for label, scope, is_type in scopes:
        for arm, comp in (scope.get("comparisons") or {}).items():
            var = comp.get(block) or {}
            boot = var.get("bootstrap") or {}
            bf = var.get("brown_forsythe") or {}
            ok = boot.get("status") == "ok"
            rows.append(
                {
                    "label": label,
                    "arm": arm,
                    "type": is_type,
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
    finite = [v for r in rows for v in (r["ratio"], r["lo"], r["hi"]) if v is not None and v > 0]
    lo_lim, hi_lim = min([*finite, 1 / margin]) / 1.6, max([*finite, margin]) * 1.6
    hi_lim *= (hi_lim / lo_lim) ** 0.2  # room for the p-values inside the axes
    y_text = blended_transform_factory(ax.transAxes, ax.transData)
    small = {"va": "center", "fontsize": 8, "transform": y_text}
    for r in rows:
        y = labels.index(r["label"]) + (arms.index(r["arm"]) - (len(arms) - 1) / 2) * step
        color = palette.get(r["arm"], "C0")
        if r["ratio"] is None or r["ratio"] <= 0:
            ax.text(0.02, y, "n/a" + (" (zero variance)" if r["ratio"] == 0 else ""), color="0.4", **small)
            continue
        if r["lo"] is not None and r["hi"] is not None:
            ax.plot([max(r["lo"], lo_lim), min(r["hi"], hi_lim)], [y, y], color=color, lw=2)
        marker = {"marker": "D", "ms": 8} if r["type"] else {"marker": "o", "ms": 6}
        ax.plot([r["ratio"]], [y], color=color, mec="black", mew=0.6, zorder=4, label=r["arm"], **marker)
        if r["p"] is not None:
            sig = "*" if r["p"] < alpha else ""
            ax.text(0.99, y, f"p={r['p']:.2g}{sig}", ha="right", **small)
    ax.axvline(1.0, color="0.3", lw=1)
    ax.axvline(margin, color="0.5", lw=1, ls="--")
    x_text = blended_transform_factory(ax.transData, ax.transAxes)
    ax.text(margin, 0.01, f" {margin:g}x", transform=x_text, va="bottom", fontsize=8, color="0.4")
    ax.set_xscale("log")
    ax.set_xlim(lo_lim, hi_lim)
    ax.set_xlabel("variance ratio (log scale)")


def plot_variance_ratios(data: FigureData) -> Figure:
    """Forest plot of Var(arm)/Var(reference) across seeds, for dJ and KL k3 (log x, CI = bootstrap)."""
    stats = data.stats
    cfg = stats.get("config") or {}
    ref = stats.get("reference") or (data.arms()[0] if data.arms() else "reference")
    others = [a for a in stats.get("precisions") or [] if a != ref]
    margin, alpha = float(cfg.get("variance_ratio_margin") or 2.0), float(cfg.get("alpha") or 0.05)
    labels = list(dict.fromkeys(r["label"] for r in _forest_rows(stats, "dJ_var")))
    size = (11, max(3.0, 0.45 * len(labels) + 2.0))
    fig, axes = plt.subplots(1, 2, figsize=size, sharey=True, layout="constrained")
    arm = others[0] if len(others) == 1 else "arm"
    for ax, (block, name) in zip(axes, (("dJ_var", "dJ"), ("kl_var", "KL k3")), strict=True):
        rows = _forest_rows(stats, block)
        ax.set_title(f"Var[{name}] across seeds: {arm} / {ref}")
        if not labels:
            _placeholder(ax, "no comparisons in stats.json\n(fewer than two precision arms?)")
        elif not any(r["ratio"] for r in rows):
            need = ",\nKL for every run" if block == "kl_var" else ""
            why = f"needs >= 2 seeds per arm{need}\nand a non-zero variance in the reference arm"
            _placeholder(ax, f"no {name} variance ratio\n({why})")
        else:
            _forest_panel(ax, rows, labels, data.palette(), margin, alpha)
    uniq = {n: h for ax in axes for h, n in zip(*ax.get_legend_handles_labels(), strict=True)}
    if len(uniq) > 1:  # several arms: one legend above both panels, clear of the data and p-values
        fig.legend(uniq.values(), uniq.keys(), loc="outside upper center", ncols=len(uniq), fontsize=9)
    if labels:
        axes[0].set_yticks(range(len(labels)), labels)
        axes[0].set_ylim(len(labels) - 0.5, -0.5)
        for tick, label in zip(axes[0].get_yticklabels(), labels, strict=True):
            if "mean over tasks" in label:
                tick.set_fontweight("bold")
    fig.supxlabel(
        f"diamond: task type (the verdicts' unit), circle: single task; bar: {1 - alpha:.0%} bootstrap CI; "
        f"p: Brown-Forsythe (* < {alpha:g}); dashed: margin {margin:g}x",
        fontsize=8,
    )
    return fig


def plot_sparsity_by_module(data: FigureData) -> Figure:
    """Changed fraction per module type at every eta, and the bf16-equal fraction (mean +- SD over seeds)."""
    sp = data.sparsity
    mod = sp[sp["scope"] == "module"] if "scope" in sp.columns else sp
    etas = sorted(mod["eta"].dropna().unique(), reverse=True) if len(mod) else []
    fig, axes = plt.subplots(
        1,
        len(etas) + 1,
        figsize=(3.6 * (len(etas) + 1) + 0.8, 4.2),
        sharey=True,
        layout="constrained",
        squeeze=False,
    )
    axes = axes[0]
    if mod.empty:
        _placeholder(axes[0], "no sparsity summaries")
        return fig
    mod = mod.assign(precision=mod["precision"].astype(str))
    arms = [a for a in data.arms() if a in set(mod["precision"])]
    order = list(dict.fromkeys(mod.sort_values("group")["group"]))
    kw = {
        "x": "group",
        "hue": "precision",
        "order": order,
        "hue_order": arms,
        "palette": data.palette(),
        "errorbar": "sd",
        "capsize": 0.1,
        "err_kws": {"linewidth": 1},
    }
    for ax, eta in zip(axes, etas, strict=False):
        sns.barplot(data=mod[mod["eta"] == eta], y="changed_fraction", ax=ax, **kw)
        ax.set_title(f"changed: |Δw| > {eta:.0e}·max(|w|,|w'|)", fontsize=10)
    equal = mod.drop_duplicates(["run", "group"])
    sns.barplot(data=equal, y="equal_bf16_fraction", ax=axes[-1], **kw)
    axes[-1].set_title("unchanged in bf16 bits (bf16-equal)", fontsize=10)
    for i, ax in enumerate(axes):
        ax.set_xlabel("module type")
        ax.set_ylabel("fraction of elements" if i == 0 else "")
        ax.set_ylim(0, 1.05)
        ax.tick_params(axis="x", rotation=45)
        if ax.get_legend() is not None and i > 0:
            ax.get_legend().remove()
    if axes[0].get_legend() is not None:
        axes[0].legend(title="precision", fontsize=8, title_fontsize=8, loc="upper right")
    return fig


def plot_sparsity_vs_eta(data: FigureData) -> Figure:
    """Whole-model changed fraction against eta; dotted: the fraction not bf16-equal (mean over seeds)."""
    sp = data.sparsity
    model = sp[sp["scope"] == "model"] if "scope" in sp.columns else sp
    fig, ax = plt.subplots(figsize=(6.2, 4.2), layout="constrained")
    if model.empty or model["changed_fraction"].notna().sum() == 0:
        _placeholder(ax, "no sparsity summaries")
        return fig
    model = model.assign(precision=model["precision"].astype(str))
    arms = [a for a in data.arms() if a in set(model["precision"])]
    palette = data.palette()
    sns.lineplot(
        data=model,
        x="eta",
        y="changed_fraction",
        hue="precision",
        hue_order=arms,
        palette=palette,
        errorbar="sd",
        marker="o",
        ax=ax,
    )
    sns.scatterplot(
        data=model,
        x="eta",
        y="changed_fraction",
        hue="precision",
        hue_order=arms,
        palette=palette,
        s=14,
        alpha=0.5,
        legend=False,
        ax=ax,
    )
    bf16 = model.drop_duplicates("run").groupby("precision")["equal_bf16_fraction"].mean()
    for arm in arms:
        if pd.notna(bf16.get(arm)):
            ax.axhline(1 - bf16[arm], color=palette.get(arm), ls=":", lw=1.2)
    ax.plot([], [], color="0.4", ls=":", label="not bf16-equal")
    ax.set_xscale("log")
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("η (relative tolerance, log)")
    ax.set_ylabel("fraction changed: |Δw| > η·max(|w|,|w'|)")
    ax.set_title("Update density against tolerance (whole model)")
    ax.legend(title="precision", fontsize=8, title_fontsize=8)
    return fig


def _smooth(frame: pd.DataFrame, column: str, window: int) -> pd.DataFrame:
    if window <= 1:
        return frame
    frame = frame.sort_values(["run", "step"]).copy()
    frame[column] = frame.groupby("run")[column].transform(lambda s: s.rolling(window, min_periods=1).mean())
    return frame


def plot_training_curves(data: FigureData) -> Figure:
    """Per-step training statistics per precision: mean over seeds with a +-1 SD band (smoothed)."""
    curves = data.curves
    fig, axes = plt.subplots(2, 3, figsize=(14, 7.2), layout="constrained")
    axes = axes.ravel()
    if curves.empty:
        for ax in axes:
            _placeholder(ax, "no training metrics")
        return fig
    curves = curves.assign(precision=curves["precision"].astype(str))
    arms = [a for a in data.arms() if a in set(curves["precision"])]
    legend_done = False
    for ax, (col, title, subset, smooth) in zip(axes, CURVE_PANELS, strict=True):
        rows = curves
        if subset == "generation" and "generation_step" in rows.columns and rows["generation_step"].any():
            rows = rows[rows["generation_step"].astype(bool)]
        rows = rows[rows[col].notna()] if col in rows.columns else rows.iloc[0:0]
        if rows.empty:
            ax.set_title(title, fontsize=10)
            _placeholder(ax, f"{col} not logged")
            continue
        # ~50 points per run survive the smoothing: a 400-step run is readable, a 6-step one is untouched
        window = max(1, int(rows.groupby("run").size().max()) // 50) if smooth else 1
        rows = _smooth(rows, col, window)
        ax.set_title(title + (f" (rolling mean of {window})" if window > 1 else ""), fontsize=10)
        sns.lineplot(
            data=rows,
            x="step",
            y=col,
            hue="precision",
            hue_order=arms,
            palette=data.palette(),
            errorbar="sd",
            marker="o" if subset == "kl" else None,
            ax=ax,
            legend=not legend_done,
        )
        legend_done = True
        ax.set_xlabel("optimizer step")
        ax.set_ylabel(col)
    n_seeds = curves.groupby("precision")["run"].nunique()
    fig.suptitle(
        "Training curves: mean over seeds, band ±1 SD (seeds: "
        + ", ".join(f"{a} {n_seeds.get(a, 0)}" for a in arms)
        + ")"
    )
    return fig


FIGURES: dict[str, Callable[[FigureData], Figure]] = {
    "dJ_by_task": plot_dj_by_task,
    "variance_ratios": plot_variance_ratios,
    "kl_by_task": plot_kl_by_task,
    "sparsity_by_module": plot_sparsity_by_module,
    "sparsity_vs_eta": plot_sparsity_vs_eta,
    "training_curves": plot_training_curves,
}


def save_figure(fig: Figure, path: str | os.PathLike) -> None:
    """PNG at DPI, written atomically; the figure is closed (many figures in one process)."""
    try:
        with atomic_path(path, suffix=".png") as tmp:
            fig.savefig(tmp, dpi=DPI, format="png")
    finally:
        plt.close(fig)


def make_figures(data: FigureData, outputs: Mapping[str, str | os.PathLike]) -> None:
    """Draw each requested figure (name -> path); an unknown name is an error before anything is drawn."""
    unknown = sorted(set(outputs) - set(FIGURES))
    if unknown:
        raise ValueError(f"unknown figure(s) {unknown}; known: {sorted(FIGURES)}")
    sns.set_theme(style="whitegrid", context="notebook", font_scale=0.9)
    for name, path in outputs.items():
        save_figure(FIGURES[name](data), path)


# ----------------------------------------------------------------------------- CLI


def _read_parquet(path: str | None) -> pd.DataFrame:
    return pd.read_parquet(path) if path else pd.DataFrame()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m workflow_scripts.figures", description="Draw the analysis figures."
    )
    p.add_argument("--metrics", required=True, help="results/analysis/metrics.parquet")
    p.add_argument("--curves", help="results/analysis/training_curves.parquet")
    p.add_argument("--sparsity", help="results/analysis/sparsity.parquet")
    p.add_argument("--stats", help="results/analysis/stats.json")
    p.add_argument("--precisions", nargs="*", default=[], help="precision order (reference first)")
    p.add_argument(
        "--out", nargs="+", required=True, metavar="NAME=PATH", help=f"figures: {', '.join(FIGURES)}"
    )
    args = p.parse_args(argv)
    outputs = {}
    for item in args.out:
        name, sep, path = item.partition("=")
        if not sep:
            raise SystemExit(f"--out: expected NAME=PATH, got {item!r}")
        outputs[name] = path
    stats: dict = {}
    if args.stats:
        with open(args.stats, encoding="utf-8") as fh:
            stats = json.load(fh)
    data = FigureData(
        _read_parquet(args.metrics),
        _read_parquet(args.curves),
        _read_parquet(args.sparsity),
        stats,
        args.precisions,
    )
    make_figures(data, outputs)
    print(f"figures: {len(outputs)} written ({', '.join(outputs)})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
