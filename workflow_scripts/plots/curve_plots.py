"""The held-out learning-curve figures: pass@1 against step per task with seed bands, and the across-seed
variance of dJ against step per role beside each arm's eval noise.

Both read ``FigureData.heldout`` (the learning_curves stage's heldout_curves.parquet, repeats already
left out); the variance figure draws ``curve_tests.spread_by_step``, the numbers learning_curves.json
lists, so the figure and the statistics cannot disagree.
"""

import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import seaborn as sns
from matplotlib.figure import Figure

from workflow_scripts.plots.common import ROLE_LABEL, FigureData, placeholder
from workflow_scripts.statistics.curve_tests import ROLES, spread_by_step


def _seeds_label(data: FigureData, arms: list[str]) -> str:
    n = data.heldout.groupby("precision")["seed"].nunique()
    return ", ".join(f"{a} {n.get(a, 0)}" for a in arms)


def plot_heldout_curves(data: FigureData) -> Figure:
    """Held-out pass@1 against the optimizer step, one panel per task, one line per arm: the mean over
    seeds with a band of +-1 SD across seeds."""
    table = data.heldout
    if table.empty or "J" not in table.columns:
        fig, ax = plt.subplots(figsize=(6, 4), layout="constrained")
        placeholder(ax, "no held-out curves (heldout_curves.parquet is empty)")
        ax.set_title("Held-out pass@1 during training")
        return fig
    table = table.assign(precision=table["precision"].astype(str))
    tasks = list(dict.fromkeys(table["task"]))
    role = table.drop_duplicates("task").set_index("task")["role"]
    arms = [a for a in data.arms() if a in set(table["precision"])]
    ncols = min(3, len(tasks))
    nrows = math.ceil(len(tasks) / ncols)
    fig, axes = plt.subplots(
        nrows, ncols, figsize=(4.6 * ncols, 3.4 * nrows), layout="constrained", squeeze=False
    )
    for i, ax in enumerate(axes.ravel()):
        if i >= len(tasks):
            ax.set_visible(False)
            continue
        task = tasks[i]
        sns.lineplot(
            data=table[table["task"] == task],
            x="step",
            y="J",
            hue="precision",
            hue_order=arms,
            palette=data.palette(),
            errorbar="sd",
            marker="o",
            ax=ax,
            legend=i == 0,
        )
        ax.set_title(f"{task} ({ROLE_LABEL.get(role[task], role[task])})", fontsize=10)
        ax.set_xlabel("optimizer step")
        ax.set_ylabel("held-out pass@1")
    fig.suptitle(
        f"Held-out pass@1 during training: mean over seeds, band ±1 SD (seeds: {_seeds_label(data, arms)})"
    )
    return fig


def plot_heldout_variance(data: FigureData) -> Figure:
    """Across-seed variance of dJ against step per arm, pooled over the role's tasks (solid), with the
    arm's mean eval-noise variance (dashed, same colour): spread above the dashed line is training's."""
    fig, axes = plt.subplots(1, len(ROLES), figsize=(11, 4), layout="constrained", squeeze=False)
    table = data.heldout
    spread = spread_by_step(table, data.arms()) if not table.empty and "dJ" in table.columns else None
    palette = data.palette()
    for ax, role in zip(axes.ravel(), ROLES, strict=True):
        ax.set_title(f"{ROLE_LABEL[role]} tasks", fontsize=10)
        rows = spread[spread["role"] == role] if spread is not None else None
        if rows is None or rows["var"].notna().sum() == 0:
            placeholder(ax, f"no {ROLE_LABEL[role]} variance (no such task, or fewer than 2 seeds)")
            continue
        for arm in dict.fromkeys(rows["precision"]):
            sel = rows[rows["precision"] == arm]
            colour = palette.get(arm, "C0")
            ax.plot(sel["step"], sel["var"], marker="o", color=colour, label=f"{arm}: across seeds")
            ax.plot(sel["step"], sel["noise"], ls="--", color=colour, label=f"{arm}: eval noise")
        ax.set_xlabel("optimizer step")
        ax.set_ylabel("variance of dJ across seeds")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8, frameon=True)
    fig.suptitle(
        "Seed spread of held-out dJ against step (each task's variance across seeds, mean over the tasks)"
    )
    return fig
