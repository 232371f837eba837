"""Tests of workflow_scripts.figures: every figure drawn as a PNG from the tables the workflow makes, also
on degenerate data (one seed, one arm, empty tables, zero spread).

Unit tests run on synthetic upstream files (tests/test_aggregate.py ``write_fake_results``) pushed
through the real aggregate and stats code, so the figures see exactly the tables the workflow makes.
The table builders here (``make_data``, ``flat_table``) are shared with test_report.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import matplotlib.image as mpimg
import numpy as np
import pandas as pd
import pytest
from conftest import once_per_session
from test_aggregate import run_aggregate, write_fake_results
from test_learning_curves import write_heldout

from workflow_scripts import figures, stats
from workflow_scripts.learning_curves import build_table
from workflow_scripts.plots import figure_list
from workflow_scripts.plots.common import FigureData
from workflow_scripts.plots.figure_list import FIGURES

REPO = Path(__file__).resolve().parents[1]
FAST = {"bootstrap": 100, "power_simulations": 10, "max_seeds": 8}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def make_data(
    root: Path, precisions=("fp32", "bf16"), seeds=(1, 2, 3), kl: bool = True, **fake
) -> FigureData:
    files = write_fake_results(root, precisions=precisions, seeds=seeds, kl=kl, **fake)
    metrics, curves, sparsity, _, overlap = run_aggregate(files, precisions=precisions)
    heldout, _ = build_table(write_heldout(root / "heldout", precisions, seeds), precisions=precisions)
    analysis = stats.analyze(metrics, FAST, precisions=precisions)
    return FigureData(metrics, curves, sparsity, analysis, precisions, overlap, heldout)


def assert_png(path: Path) -> None:
    assert path.read_bytes()[:8] == PNG_MAGIC, path
    assert path.stat().st_size > 5000, path
    height, width = mpimg.imread(path).shape[:2]
    assert height > 200 and width > 200


TABLES = ("metrics", "curves", "sparsity", "overlap", "heldout")  # FigureData's frames


def shared_table(tmp_path_factory, name: str, build: Callable[[Path], FigureData]) -> FigureData:
    """``build(folder)`` once per test session, across pytest-xdist's workers (conftest.once_per_session),
    written there as the stages write them (parquet tables, strict stats.json); every caller reads its own
    copy. test_figures.py and test_report.py read the same tables: the zero-spread table's stats fit
    alone is ~26 CPU-s (its power curves over 7 arms), so it is built once for both."""
    with once_per_session(tmp_path_factory, f"table-{name}") as folder:
        if not (folder / "done").exists():
            data = build(folder / "build")
            for table in TABLES:
                getattr(data, table).to_parquet(folder / f"{table}.parquet")
            (folder / "stats.json").write_text(json.dumps(data.stats, allow_nan=False))
            (folder / "precisions.json").write_text(json.dumps(list(data.precisions)))
            (folder / "done").touch()
    return FigureData(
        **{table: pd.read_parquet(folder / f"{table}.parquet") for table in TABLES},
        stats=json.loads((folder / "stats.json").read_text()),
        precisions=tuple(json.loads((folder / "precisions.json").read_text())),
    )


def shared_data(tmp_path_factory) -> FigureData:
    """``make_data``'s default table (2 arms x 3 seeds), built once per session (``shared_table``)."""
    return shared_table(tmp_path_factory, "default", make_data)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> FigureData:
    return shared_data(tmp_path_factory)


# ----------------------------------------------------------------------------- figures


@pytest.mark.slow
def test_cli_writes_every_figure_as_a_png(data, tmp_path):
    data.metrics.to_parquet(tmp_path / "metrics.parquet")
    data.curves.to_parquet(tmp_path / "curves.parquet")
    data.sparsity.to_parquet(tmp_path / "sparsity.parquet")
    data.overlap.to_parquet(tmp_path / "overlap.parquet")
    data.heldout.to_parquet(tmp_path / "heldout.parquet")
    (tmp_path / "stats.json").write_text(json.dumps(data.stats))
    outputs = {name: tmp_path / "figures" / f"{name}.png" for name in FIGURES}
    argv = [
        "--metrics",
        str(tmp_path / "metrics.parquet"),
        "--curves",
        str(tmp_path / "curves.parquet"),
        "--sparsity",
        str(tmp_path / "sparsity.parquet"),
        "--overlap",
        str(tmp_path / "overlap.parquet"),
        "--stats",
        str(tmp_path / "stats.json"),
        "--heldout",
        str(tmp_path / "heldout.parquet"),
        "--precisions",
        "fp32",
        "bf16",
        "--out",
        *(f"{n}={p}" for n, p in outputs.items()),
    ]
    assert figures.main(argv) == 0
    for path in outputs.values():
        assert_png(path)
    assert sorted(p.name for p in (tmp_path / "figures").iterdir()) == sorted(
        p.name for p in outputs.values()
    )


@pytest.mark.slow
@pytest.mark.parametrize("case", ["one_seed_no_kl_no_sparsity", "single_arm", "empty_tables"])
def test_degenerate_data_still_draws_every_figure(case, tmp_path):
    if case == "one_seed_no_kl_no_sparsity":
        data = make_data(tmp_path / "r", seeds=(1,), kl=False)
        data.sparsity = data.sparsity.iloc[0:0]
        data.curves = data.curves.assign(kl_k3=float("nan"))
    elif case == "single_arm":
        data = make_data(tmp_path / "r", precisions=("fp32",), seeds=(1, 2))
    else:
        data = make_data(tmp_path / "r", seeds=(1,))
        data = FigureData(
            data.metrics[data.metrics["precision"].isna()], pd.DataFrame(), pd.DataFrame(), {}, ()
        )
    outputs = {name: tmp_path / f"{name}.png" for name in FIGURES}
    figures.make_figures(data, outputs)
    for path in outputs.values():
        assert_png(path)


def test_unknown_figure_name_is_an_error_before_drawing(data, tmp_path):
    with pytest.raises(ValueError, match=r"unknown figure\(s\) \['nope'\]"):
        figures.make_figures(data, {"dJ_by_task": tmp_path / "a.png", "nope": tmp_path / "b.png"})
    assert not (tmp_path / "a.png").exists()


def test_colours_are_fixed_per_precision(data):
    palette = data.palette()
    assert list(palette) == ["fp32", "bf16"] and palette["fp32"] != palette["bf16"]
    assert data.arms() == ["fp32", "bf16"]


def test_one_figure_list_drives_the_rule_the_code_and_the_captions():
    assert set(figures.PLOTS) == set(FIGURES)
    captions = {p.stem for p in (REPO / "report").glob("*.rst")} - {
        "report",
        "stats",
        "learning_curves",
        "workflow",
    }
    assert captions == set(FIGURES), "report/<figure>.rst for every figure and no other"
    assert all(figure_list.note(name) for name in FIGURES)
    rule = (REPO / "rules" / "analysis.smk").read_text()
    assert "from workflow_scripts.plots.figure_list import FIGURES" in rule and "figures/{name}.png" in rule


# config.factorial.yaml's arms: the six crossing storage, compute and dropout, and stochastic rounding
SIX_ARMS = ("fp32", "fp32_drop", "bf16", "bf16_drop", "autocast", "autocast_drop", "bf16_sr")


def flat_table(root: Path) -> FigureData:
    """6 arms (autocast names) x 2 seeds, every dJ and KL exactly 0, no eval noise: a few-step tiny run."""
    data = make_data(root, precisions=SIX_ARMS, seeds=(1, 2), flat=True)
    trained = data.metrics[data.metrics["precision"].notna()]
    assert (trained["dJ"] == 0).all() and (data.metrics["eval_noise_var"] == 0).all()
    assert (trained["kl_k3"] == 0).all()
    data.stats = stats.json_safe(data.stats)  # as the figures and report read it from stats.json
    return data


def shared_flat_table(tmp_path_factory) -> FigureData:
    """``flat_table``, built once per session (``shared_table``): its stats fit is the costly part."""
    return shared_table(tmp_path_factory, "flat", flat_table)


@pytest.fixture(scope="module")
def flat_data(tmp_path_factory) -> FigureData:
    return shared_flat_table(tmp_path_factory)


@pytest.mark.parametrize("name", list(FIGURES))
def test_zero_spread_and_zero_noise_still_draw_every_figure(flat_data, name, tmp_path):
    figures.make_figures(flat_data, {name: tmp_path / f"{name}.png"})
    assert_png(tmp_path / f"{name}.png")


def test_a_redraw_is_byte_identical(data, tmp_path):
    """The strip plots' jitter is seeded: the same tables draw the same PNG (reruns change no file)."""
    for name in ("dJ_by_task", "kl_by_task"):
        a, b = tmp_path / f"{name}.a.png", tmp_path / f"{name}.b.png"
        figures.make_figures(data, {name: a})
        np.random.random(7)  # whatever else drew from numpy's global stream in between
        figures.make_figures(data, {name: b})
        assert a.read_bytes() == b.read_bytes(), name


def test_the_kl_figures_follow_the_analysis_estimator(data, monkeypatch):
    """kl_by_task plots the estimator stats.json names, and the captions of the figures that show the
    analysis' KL name that setting, not a fixed estimator."""
    from workflow_scripts.plots.figure_list import REPORT_DIR

    seen = {}

    def record(frame, column, label, *args, **kwargs):
        seen.update(c=column, l=label)

    monkeypatch.setattr(figures, "dots_by_task", record)
    for estimator in ("rb", "k3", "k1"):
        figures.plot_kl_by_task(FigureData(metrics=data.metrics, stats={"kl_estimator": estimator}))
        assert seen == {"c": f"kl_{estimator}", "l": f"KL(π_θ ‖ π_0), {estimator} estimate (nats/sequence)"}
    for name in ("kl_by_task", "variance_components", "variance_ratios"):
        caption = (REPORT_DIR / f"{name}.rst").read_text()
        assert "analysis.kl_estimator" in caption and "k3" not in caption, name


def test_the_heldout_figures_draw_a_panel_per_task_and_noise_beside_each_arm(data, tmp_path):
    """heldout_curves: one panel per task with a line per arm; heldout_variance: per role, each arm's
    across-seed variance (solid) and its eval noise (dashed), the numbers learning_curves.json lists."""
    from workflow_scripts.plots import curve_plots

    repeat = data.heldout[data.heldout["run"] == "bf16-s1"].assign(run="bf16-s1-r2", repeat=2, J=1.0)
    data = FigureData(data.metrics, precisions=data.precisions, heldout=pd.concat([data.heldout, repeat]))
    assert (data.heldout["repeat"] == 1).all()  # repeats are not seeds: no band includes them
    fig = curve_plots.plot_heldout_curves(data)
    visible = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in visible] == ["add_sub (on-task)", "mul (off-task)", "chain (off-task)"]
    assert "band ±1 SD" in fig.get_suptitle()
    fig = curve_plots.plot_heldout_variance(data)
    for ax in fig.axes:
        styles = sorted(line.get_linestyle() for line in ax.get_lines())
        assert styles == ["-", "-", "--", "--"], ax.get_title()  # 2 arms: spread and noise each
        noise = next(line for line in ax.get_lines() if line.get_linestyle() == "--")
        assert np.allclose(noise.get_ydata(), 1e-3)
    empty = FigureData(data.metrics)
    for name in ("heldout_curves", "heldout_variance"):
        figures.make_figures(empty, {name: tmp_path / f"{name}.png"})
        assert_png(tmp_path / f"{name}.png")


def test_the_mismatch_figure_draws_zero_null_and_positive_gaps_on_a_log_axis(data, tmp_path):
    """fp32's gap is exactly 0 (on the floor line), bf16's positive and growing with position, a third arm
    never measured (named in the panel); all-zero or all-null gaps still draw."""
    from workflow_scripts.training.metrics_log import GAP_POSITION_KEYS

    fresh = data.curves["generation_step"].astype(bool)
    bf16 = data.curves["precision"] == "bf16"
    curves = data.curves.assign(sampler_gap_mean=(bf16 * 0.05).where(fresh))
    for k, key in enumerate(GAP_POSITION_KEYS[:4]):  # positions 0 .. 7: an 8-token completion
        curves[key] = (bf16 * 0.01 * 2**k).where(fresh)
    unmeasured = curves[curves["precision"] == "fp32"].assign(
        precision="fp16", run=lambda f: f["run"].str.replace("fp32", "fp16"), sampler_gap_mean=float("nan")
    )
    cases = {
        "mixed": pd.concat([curves, unmeasured]),
        "zero": curves.assign(sampler_gap_mean=curves["sampler_gap_mean"] * 0),
        "null": data.curves,  # older results: no gap columns at all
    }
    for case, table in cases.items():
        figure_data = FigureData(data.metrics, table, precisions=("fp32", "bf16", "fp16"))
        fig = figures.plot_mismatch(figure_data)
        over_steps, by_position = fig.axes[:2]
        if case == "mixed":
            assert over_steps.get_yscale() == by_position.get_yscale() == "log"
            texts = [t.get_text() for ax in fig.axes for t in ax.texts]
            assert "exactly 0" in texts and "not measured: fp16" in texts
            labels = [t.get_text() for t in by_position.get_xticklabels()]
            assert labels == ["0", "1", "2-3", "4-7"]
        if case == "zero":
            assert over_steps.get_yscale() == "linear"  # nothing positive: no log axis
        figures.save_figure(fig, tmp_path / f"{case}.png")
        assert_png(tmp_path / f"{case}.png")
