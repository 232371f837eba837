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
| heldout_curves      | held-out pass@1 against step per task: mean over seeds, band  | curve_plots       |
|                     | +-1 SD                                                        |                   |
| heldout_variance    | across-seed variance of dJ against step per role, beside the  | curve_plots       |
|                     | eval noise (dashed)                                           |                   |

Every function takes a ``FigureData`` (figures_common) and returns a matplotlib Figure. FigureData
holds each (arm, seed) once: repeats (config ``repeats``, the noise floor) are not seeds, so no dot,
curve, bar or seed count includes them (``plots.common.seeds_only``; report.md shows the repeats).
"""

from workflow_scripts.runtime import startup  # noqa: F401  first: no garbage collection during imports

# isort: split

import argparse
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns
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


PLOTS: dict[str, Callable[[FigureData], Figure]] = {
    "dJ_by_task": plot_dj_by_task,
    "variance_components": plot_variance_components,
    "variance_ratios": plot_variance_ratios,
    "kl_by_task": plot_kl_by_task,
    "sparsity_by_module": plot_sparsity_by_module,
    "sparsity_vs_eta": plot_sparsity_vs_eta,
    "overlap": plot_overlap,
    "training_curves": plot_training_curves,
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
