"""Update-sparsity figures: changed fraction per module type and against eta, and cross-seed mask overlap.

Read sparsity.parquet (per run, scope, group and eta; plus the representable-update fraction per module
type from run.json) and overlap.parquet (per precision, seed pair and eta).
"""

import pandas as pd
import seaborn as sns
from matplotlib import pyplot as plt
from matplotlib.figure import Figure

from workflow_scripts.plots.common import FigureData, placeholder


def plot_sparsity_by_module(data: FigureData) -> Figure:
    """Changed fraction per module type at every eta, and the bf16-equal fraction (mean +- SD over seeds)."""
    sp = data.sparsity
    mod = sp[sp["scope"] == "module"] if "scope" in sp.columns else sp
    rep = sp[sp["scope"] == "representable"] if "scope" in sp.columns else sp.iloc[0:0]
    rep = (
        rep[rep["representable_fraction"].notna()]
        if "representable_fraction" in rep.columns
        else rep.iloc[0:0]
    )
    etas = sorted(mod["eta"].dropna().unique(), reverse=True) if len(mod) else []
    panels = len(etas) + 1 + (1 if len(rep) else 0)
    fig, axes = plt.subplots(
        1,
        panels,
        figsize=(3.6 * panels + 0.8, 4.2),
        sharey=True,
        layout="constrained",
        squeeze=False,
    )
    axes = axes[0]
    if mod.empty:
        placeholder(axes[0], "no sparsity summaries")
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
    sns.barplot(data=equal, y="equal_bf16_fraction", ax=axes[len(etas)], **kw)
    axes[len(etas)].set_title("unchanged in bf16 bits (bf16-equal)", fontsize=10)
    if len(rep):  # what one step of size lr could change at step 0, in the arm's param dtype (run.json)
        sns.barplot(
            data=rep.assign(precision=rep["precision"].astype(str)),
            y="representable_fraction",
            ax=axes[-1],
            **kw,
        )
        axes[-1].set_title("representable update at step 0 (one step of size lr)", fontsize=10)
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
        placeholder(ax, "no sparsity summaries")
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


def plot_overlap(data: FigureData) -> Figure:
    """Cross-seed Jaccard of the changed masks over its chance value, against eta (log x), per precision."""
    ov = data.overlap
    fig, ax = plt.subplots(figsize=(6.2, 4.2), layout="constrained")
    if ov.empty or "ratio" not in ov.columns or ov["ratio"].notna().sum() == 0:
        placeholder(ax, "no overlap tables (needs >= 2 seeds per precision)")
        return fig
    ov = ov.assign(precision=ov["precision"].astype(str))
    arms = [a for a in data.arms() if a in set(ov["precision"])] or sorted(set(ov["precision"]))
    palette = data.palette()
    sns.lineplot(
        data=ov,
        x="eta",
        y="ratio",
        hue="precision",
        hue_order=arms,
        palette=palette,
        errorbar=None,
        marker="o",
        ax=ax,
    )
    sns.stripplot(
        data=ov,
        x="eta",
        y="ratio",
        hue="precision",
        hue_order=arms,
        palette=palette,
        native_scale=True,
        dodge=False,
        jitter=False,
        size=4,
        alpha=0.5,
        legend=False,
        ax=ax,
    )
    ax.axhline(1.0, color="0.4", lw=1, ls="--")
    ax.set_xscale("log")
    ax.set_xlabel("η (relative tolerance, log)")
    ax.set_ylabel("Jaccard / chance Jaccard (seed pairs)")
    ax.set_title("Do seeds of one arm move the same weights?")
    ax.legend(title="precision", fontsize=8, title_fontsize=8)
    return fig
