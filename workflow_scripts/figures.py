"""The figures stage: draws every figure of ``figure_list.FIGURES`` (one function each, ``PLOTS``).

| name                | shows                                                         | module            |
| ------------------- | ------------------------------------------------------------- | ----------------- |
| dJ_by_task          | strip plot of seed-level dJ per arm and task, mean + 95% CI   | here              |
| variance_components | mixed-model seed variance per arm and role with CIs; ratios   | figures_variance  |
| variance_ratios     | forest plot of variance ratios (roles: model; tasks: raw)     | figures_variance  |
| kl_by_task          | KL(pi_theta || pi_0) k3 per task, one dot per seed            | here              |
| sparsity_by_module  | changed fraction per module type at each eta; bf16-equal;     | figures_sparsity  |
|                     | representable update at step 0                                |                   |
| sparsity_vs_eta     | whole-model changed fraction against eta (log x)              | figures_sparsity  |
| overlap             | cross-seed Jaccard / chance of the changed masks against eta  | figures_sparsity  |
| training_curves     | reward, informative fraction, clip fraction, KL, entropy,     | here              |
|                     | grad norm per step: mean over seeds, band +-1 SD              |                   |
| mismatch            | sampler-trainer mean |Δ log p| per round (log y), and by      | here              |
|                     | position bin of the completion                                |                   |
| heldout_curves      | held-out pass@1 against step per task: mean over seeds, band  | curve_plots       |
|                     | +-1 SD                                                        |                   |
| heldout_variance    | across-seed variance of dJ against step per role, beside the  | curve_plots       |
|                     | eval noise (dashed)                                           |                   |

mismatch: both axes log scale; an exact 0 (identical numerics) is drawn on a dotted floor line a decade
below the smallest positive value, an axis without a positive value stays linear, and arms without a
measured gap are named in the panel.

Every function takes a ``FigureData`` (figures_common) and returns a matplotlib Figure. FigureData
holds each (arm, seed) once: repeats (config ``repeats``, the noise floor) are not seeds, so no dot,
curve, bar or seed count includes them (``plots.common.seeds_only``; report.md shows the repeats).
"""

from workflow_scripts.runtime import startup  # noqa: F401  first: no garbage collection during imports

# isort: split

import argparse
import math
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from workflow_scripts.plots.common import DPI, FigureData, dots_by_task, placeholder
from workflow_scripts.plots.curve_plots import plot_heldout_curves, plot_heldout_variance
from workflow_scripts.plots.figure_list import FIGURES
from workflow_scripts.plots.sparsity_plots import plot_overlap, plot_sparsity_by_module, plot_sparsity_vs_eta
from workflow_scripts.plots.variance_plots import plot_variance_components, plot_variance_ratios
from workflow_scripts.runtime import paths
from workflow_scripts.runtime.atomic import atomic_path
from workflow_scripts.runtime.smk import main_from, parse_pairs
from workflow_scripts.tasks.rows import read_json, read_parquet
from workflow_scripts.training.metrics_log import GAP_POSITION_KEYS, position_bin_label

# training-curve panels: column, title, rows used (generation steps for rollout statistics), smoothed
CURVE_PANELS = (
    ("reward", "training reward", "generation", True),
    ("informative_frac", "informative group fraction", "generation", True),
    ("clip_region", "clip fraction (tokens)", "all", True),
    ("kl_k3", "KL to base (k3, training prompts)", "kl", False),
    ("entropy", "entropy", "all", True),
    ("grad_norm", "grad norm", "all", True),
)


def plot_dj_by_task(data: FigureData) -> Figure:
    return dots_by_task(
        data, "dJ", "dJ = pass@1(trained) − pass@1(base)", "Change in pass@1 per task", zero_line=True
    )


def plot_kl_by_task(data: FigureData) -> Figure:
    """KL by the estimator the analysis read (stats.json ``kl_estimator``; files without it: k3)."""
    estimator = data.stats.get("kl_estimator") or "k3"
    return dots_by_task(
        data,
        f"kl_{estimator}",
        f"KL(π_θ ‖ π_0), {estimator} estimate (nats/sequence)",
        "KL to the base policy per task",
        zero_line=False,
    )


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
            placeholder(ax, "no training metrics")
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
            placeholder(ax, f"{col} not logged")
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


# ----------------------------------------------------------------------------- mismatch


def _zero_floor(ax: Axes, values: pd.Series) -> float | None:
    """Log scale with zeros drawn at a floor a decade below the smallest positive value (returned); None:
    nothing positive, the axis stays linear."""
    positive = values[values > 0]
    if positive.empty:
        return None
    floor = 10 ** (math.floor(math.log10(float(positive.min()))) - 1)
    ax.set_yscale("log")
    if (values == 0).any():
        ax.axhline(floor, ls=":", color="0.4", lw=1)
        ax.annotate("exactly 0", (0.01, floor), xycoords=("axes fraction", "data"), fontsize=8, va="bottom")
    return floor


def _unmeasured(ax: Axes, arms: list[str], measured: set[str]) -> None:
    missing = [a for a in arms if a not in measured]
    if missing:
        label = "not measured: " + ", ".join(missing)
        ax.text(0.99, 0.99, label, transform=ax.transAxes, ha="right", va="top", fontsize=8, color="0.3")


def _rounds(data: FigureData) -> pd.DataFrame:
    curves = data.curves
    if curves.empty or "sampler_gap_mean" not in curves.columns:
        return curves.iloc[0:0]
    if "generation_step" in curves.columns and curves["generation_step"].any():
        curves = curves[curves["generation_step"].astype(bool)]
    return curves.assign(precision=curves["precision"].astype(str))


def _over_steps(ax: Axes, rounds: pd.DataFrame, arms: list[str], data: FigureData) -> None:
    ax.set_title("mean |Δ log p| at each round's first step", fontsize=10)
    rows = rounds[rounds["sampler_gap_mean"].notna()] if not rounds.empty else rounds
    if rows.empty:
        placeholder(ax, "sampler gap not measured (no sampler log-probs, or older results)")
        return
    floor = _zero_floor(ax, rows["sampler_gap_mean"])
    if floor is not None:
        rows = rows.assign(
            sampler_gap_mean=rows["sampler_gap_mean"].where(rows["sampler_gap_mean"] > 0, floor)
        )
    sns.lineplot(
        data=rows,
        x="step",
        y="sampler_gap_mean",
        hue="precision",
        hue_order=[a for a in arms if a in set(rows["precision"])],
        palette=data.palette(),
        errorbar="sd",
        marker="o",
        ax=ax,
    )
    ax.set_xlabel("optimizer step (generation rounds)")
    ax.set_ylabel("mean |log p_sampler − log p_trainer| (nats)")
    _unmeasured(ax, arms, set(rows["precision"]))


def _by_position(ax: Axes, rounds: pd.DataFrame, arms: list[str], data: FigureData) -> None:
    ax.set_title("mean |Δ log p| by position in the completion", fontsize=10)
    keys = [k for k in GAP_POSITION_KEYS if k in rounds.columns and rounds[k].notna().any()]
    if rounds.empty or not keys:
        placeholder(ax, "gap by position not logged")
        return
    means = rounds.groupby("precision")[keys].mean()  # over rounds and seeds
    long = means.reset_index().melt(id_vars="precision", var_name="key", value_name="gap").dropna()
    long["bin"] = long["key"].map(GAP_POSITION_KEYS.index)
    floor = _zero_floor(ax, long["gap"])
    if floor is not None:
        long["gap"] = long["gap"].where(long["gap"] > 0, floor)
    palette = data.palette()
    for arm in [a for a in arms if a in set(long["precision"])]:
        sel = long[long["precision"] == arm].sort_values("bin")
        ax.plot(sel["bin"], sel["gap"], marker="o", color=palette.get(arm, "C0"), label=arm)
    bins = sorted(long["bin"].unique())
    ax.set_xticks(bins, [position_bin_label(int(b)) for b in bins], rotation=45, fontsize=8)
    ax.set_xlabel("completion token position (log2 bins)")
    ax.set_ylabel("mean |Δ log p| (nats), mean over rounds and seeds")
    ax.legend(fontsize=8, frameon=True)
    _unmeasured(ax, arms, set(long["precision"]))


def plot_mismatch(data: FigureData) -> Figure:
    """The mismatch figure (module docstring): the gap over rounds per arm, and by completion position."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.4), layout="constrained")
    rounds = _rounds(data)
    arms = data.arms()
    _over_steps(axes[0], rounds, arms, data)
    _by_position(axes[1], rounds, arms, data)
    fig.suptitle("Sampler-trainer mismatch before any update on a round (log scale; seeds: mean, band ±1 SD)")
    return fig


PLOTS: dict[str, Callable[[FigureData], Figure]] = {
    "dJ_by_task": plot_dj_by_task,
    "variance_components": plot_variance_components,
    "variance_ratios": plot_variance_ratios,
    "kl_by_task": plot_kl_by_task,
    "sparsity_by_module": plot_sparsity_by_module,
    "sparsity_vs_eta": plot_sparsity_vs_eta,
    "overlap": plot_overlap,
    "training_curves": plot_training_curves,
    "mismatch": plot_mismatch,
    "heldout_curves": plot_heldout_curves,
    "heldout_variance": plot_heldout_variance,
}


def save_figure(fig: Figure, path: str | os.PathLike) -> None:
    """PNG at DPI, written atomically; the figure is closed (many figures in one process)."""
    try:
        with atomic_path(path, suffix=".png") as tmp:
            fig.savefig(tmp, dpi=DPI, format="png")
    finally:
        plt.close(fig)


def make_figures(data: FigureData, outputs: Mapping[str, str | os.PathLike]) -> None:
    """Draw each requested figure (name -> path); a name outside ``figure_list.FIGURES`` (or one without a
    drawing function) is an error before anything is drawn."""
    unknown = sorted(set(outputs) - (set(FIGURES) & set(PLOTS)))
    if unknown:
        raise ValueError(f"unknown figure(s) {unknown}; known: {sorted(FIGURES)}")
    sns.set_theme(style="whitegrid", context="notebook", font_scale=0.9)
    for name, path in outputs.items():
        save_figure(PLOTS[name](data), path)


# ----------------------------------------------------------------------------- stage


def _table(path: str | os.PathLike | None) -> pd.DataFrame:
    return read_parquet(path) if path else pd.DataFrame()


def run(
    *,
    metrics: str | os.PathLike,
    outputs: Mapping[str, str | os.PathLike],
    curves: str | None = None,
    sparsity: str | None = None,
    overlap: str | None = None,
    stats: str | None = None,
    precisions: Sequence[str] = (),
    heldout: str | None = None,
) -> None:
    """The figures stage: one PNG per entry of ``outputs`` (figure name -> path); ``heldout``: the
    learning_curves stage's heldout_curves.parquet."""
    content: dict[str, Any] = read_json(stats) if stats else {}
    data = FigureData(
        _table(metrics),
        _table(curves),
        _table(sparsity),
        content,
        list(precisions),
        _table(overlap),
        _table(heldout),
    )
    make_figures(data, outputs)
    print(f"figures: {len(outputs)} written ({', '.join(outputs)})", file=sys.stderr)


def from_snakemake(smk: Any) -> None:
    inp = smk.input
    run(
        metrics=inp.metrics,
        curves=inp.curves,
        sparsity=inp.sparsity,
        overlap=inp.overlap,
        stats=inp.stats,
        heldout=inp.heldout,
        precisions=list(smk.params.precisions),
        outputs={name: smk.output[name] for name in FIGURES},
    )


def main(argv: list[str] | None = None) -> int:
    analysis = paths.analysis_dir()
    p = argparse.ArgumentParser(
        prog="python -m workflow_scripts.figures", description="Draw the analysis figures."
    )
    p.add_argument("--metrics", default=str(analysis / "metrics.parquet"))
    p.add_argument("--curves", help="training_curves.parquet")
    p.add_argument("--sparsity", help="sparsity.parquet")
    p.add_argument("--overlap", help="overlap.parquet")
    p.add_argument("--stats", help="stats.json")
    p.add_argument("--heldout", help="heldout_curves.parquet")
    p.add_argument("--precisions", nargs="*", default=[], help="precision order (reference first)")
    p.add_argument(
        "--out",
        nargs="+",
        metavar="NAME=PATH",
        help=f"figures to draw (default: all to {analysis}/figures/): {', '.join(FIGURES)}",
    )
    args = p.parse_args(argv)
    try:
        outputs = (
            parse_pairs(args.out, "NAME=PATH")
            if args.out
            else {n: str(analysis / "figures" / f"{n}.png") for n in FIGURES}
        )
    except ValueError as err:
        raise SystemExit(f"--out: {err}") from None
    run(
        metrics=args.metrics,
        curves=args.curves,
        sparsity=args.sparsity,
        overlap=args.overlap,
        stats=args.stats,
        heldout=args.heldout,
        precisions=args.precisions,
        outputs=outputs,
    )
    return 0


if __name__ == "__main__":
    main_from(globals())
