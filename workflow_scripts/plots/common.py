"""What every analysis figure shares: the data it reads (``FigureData``, repeats left out: ``seeds_only``),
colours per precision, helpers.

Figures are drawn with seaborn/matplotlib (Agg backend). Degenerate data (one seed, no KL, no sparsity,
zero variance) gives a panel that says what is missing instead of an exception, because a declared
output must exist for the report to build. Colours are fixed per precision (config order), so an arm
has one colour in every figure.
"""

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure
from scipy import stats as st

from workflow_scripts.runtime import paths
from workflow_scripts.statistics.noise_floor import without_repeats

DPI = 150
ROLE_LABEL = {"on_task": "on-task", "off_task": "off-task"}


@dataclass
class FigureData:
    """What the figures read: the aggregate tables (each (arm, seed) once: ``seeds_only``), stats.json
    content, the precision order and the held-out curves (learning_curves' heldout_curves.parquet)."""

    metrics: pd.DataFrame
    curves: pd.DataFrame = field(default_factory=pd.DataFrame)
    sparsity: pd.DataFrame = field(default_factory=pd.DataFrame)
    stats: Mapping[str, Any] = field(default_factory=dict)
    precisions: Sequence[str] = ()
    overlap: pd.DataFrame = field(default_factory=pd.DataFrame)
    heldout: pd.DataFrame = field(default_factory=pd.DataFrame)

    def __post_init__(self) -> None:
        tables = (self.metrics, self.curves, self.sparsity, self.heldout)
        self.metrics, self.curves, self.sparsity, self.heldout = map(seeds_only, tables)

    def arms(self) -> list[str]:
        """Precision order: configured first (reference first), then any other present in the data."""
        present: list[str] = []
        for frame in (self.metrics, self.curves, self.sparsity, self.heldout):
            if "precision" in frame.columns:
                present += [p for p in frame["precision"].dropna().astype(str).unique() if p not in present]
        return [p for p in self.precisions if p in present] + [p for p in present if p not in self.precisions]

    def palette(self) -> dict[str, Any]:
        arms = list(self.precisions) + [a for a in self.arms() if a not in self.precisions]
        return dict(zip(arms, sns.color_palette("colorblind", max(len(arms), 1)), strict=False))


def _first_run(run: str) -> bool:
    try:
        return (paths.parse_run(run).repeat or 1) <= 1
    except ValueError:  # not a run name: not a repeat
        return True


def seeds_only(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows of base runs and of each (arm, seed)'s first run. A repeat (config ``repeats``, run
    ``<arm>-s<seed>-r<k>``) is not a seed, so no figure counts or averages it; the report's noise-floor
    section shows the repeats. By the ``repeat`` column (metrics), else by the run name (curves,
    sparsity)."""
    if "repeat" in frame.columns:
        return without_repeats(frame)
    if frame.empty or "run" not in frame.columns:
        return frame
    return frame.loc[frame["run"].astype(str).map(_first_run).astype(bool)]


def placeholder(ax, message: str) -> None:
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


def trained(metrics: pd.DataFrame) -> pd.DataFrame:
    rows = metrics[metrics["precision"].notna()].copy()
    rows["precision"] = rows["precision"].astype(str)
    return rows


def task_order(metrics: pd.DataFrame) -> list[str]:
    """On-task tasks first, then off-task, each in table (config) order."""
    first = metrics.drop_duplicates("task")
    rank = {"on_task": 0, "off_task": 1}
    return sorted(first["task"], key=lambda t: rank.get(first.set_index("task").at[t, "role"], 2))


def task_labels(metrics: pd.DataFrame, tasks: Sequence[str]) -> list[str]:
    role = metrics.drop_duplicates("task").set_index("task")["role"]
    return [f"{t}\n({ROLE_LABEL.get(role.get(t), role.get(t))})" for t in tasks]


def dots_by_task(data: FigureData, column: str, ylabel: str, title: str, zero_line: bool) -> Figure:
    """Strip plot: one dot per seed per (task, precision), dodged by precision, with the mean and its 95%
    t-interval across seeds; diverged runs (excluded from the statistics) are open circles."""
    rows = trained(data.metrics) if len(data.metrics) else data.metrics
    tasks = task_order(data.metrics) if len(data.metrics) else []
    fig, ax = plt.subplots(figsize=(max(5.0, 1.5 * len(tasks) + 2.5), 4.2), layout="constrained")
    if column not in rows.columns or rows.empty or rows[column].notna().sum() == 0:
        placeholder(ax, f"no {column} values (not measured for any trained run)")
        ax.set_title(title)
        return fig
    rows = rows[rows[column].notna()]
    bad = (
        rows["diverged"].fillna(False).astype(bool)
        if "diverged" in rows.columns
        else rows[column] != rows[column]
    )
    arms = [a for a in data.arms() if a in set(rows["precision"])]
    # seaborn draws the jitter from numpy's global stream: seeded, so a rerun draws the same figure
    state = np.random.get_state()
    np.random.seed(0)
    sns.stripplot(
        data=rows[~bad],
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
    np.random.set_state(state)
    width = 0.8 / len(arms)
    labelled = False
    for i, arm in enumerate(arms):
        offset = (i - (len(arms) - 1) / 2) * width
        sel = rows[(rows["precision"] == arm) & ~bad]
        g = sel.groupby("task")[column]
        mean, sd, n = g.mean(), g.std(ddof=1), g.count()
        shown = [t for t in tasks if t in mean.index]
        xs = [tasks.index(t) + offset for t in shown]
        half = [
            float(st.t.ppf(0.975, n[t] - 1) * sd[t] / math.sqrt(n[t])) if n[t] > 1 else 0.0 for t in shown
        ]
        ax.errorbar(
            xs,
            [mean[t] for t in shown],
            yerr=half,
            fmt="_",
            markersize=18,
            markeredgewidth=2.2,
            color="black",
            elinewidth=1.2,
            capsize=3,
            zorder=5,
            label="mean, 95% CI" if i == 0 else None,
        )
        out = rows[(rows["precision"] == arm) & bad]
        if len(out):
            ax.scatter(
                [tasks.index(t) + offset for t in out["task"]],
                out[column],
                facecolors="none",
                edgecolors=data.palette().get(arm, "C0"),
                s=40,
                zorder=4,
                label=None if labelled else "diverged (excluded)",
            )
            labelled = True
    if zero_line:
        ax.axhline(0.0, color="0.4", lw=0.8, ls="--", zorder=0)
    ax.set_xticks(range(len(tasks)), task_labels(data.metrics, tasks))
    ax.set_xlabel("")
    ax.set_ylabel(ylabel)
    n_seeds = rows[~bad].groupby("precision")["run"].nunique()
    ax.set_title(title + "  (seeds: " + ", ".join(f"{a} {n_seeds.get(a, 0)}" for a in arms) + ")")
    ax.legend(title="precision", loc="best", fontsize=9, title_fontsize=9, frameon=True)
    return fig
