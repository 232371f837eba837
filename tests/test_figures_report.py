"""Tests of workflow_scripts.figures and workflow_scripts.report (stats.json + report.md), and one end-to-end
run of the whole DAG on tests/config.test.yaml followed by ``snakemake --report``.

Unit tests run on synthetic upstream files (tests/test_aggregate.py ``write_fake_results``) pushed
through the real aggregate and stats code, so the figures see exactly the tables the workflow makes.
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.image as mpimg
import pandas as pd
import pytest
from test_aggregate import run_aggregate, write_fake_results

from workflow_scripts import figures, report, stats
from workflow_scripts.figures import FIGURES, FigureData

FAST = {"bootstrap": 100, "power_simulations": 10, "max_seeds": 8, "mixed_model": False}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def make_data(root: Path, precisions=("fp32", "bf16"), seeds=(1, 2, 3), kl: bool = True) -> FigureData:
    paths = write_fake_results(root, precisions=precisions, seeds=seeds, kl=kl)
    metrics, curves, sparsity, _ = run_aggregate(paths, precisions=precisions)
    return FigureData(
        metrics, curves, sparsity, stats.analyze(metrics, FAST, precisions=precisions), precisions
    )


def assert_png(path: Path) -> None:
    assert path.read_bytes()[:8] == PNG_MAGIC, path
    assert path.stat().st_size > 5000, path
    height, width = mpimg.imread(path).shape[:2]
    assert height > 200 and width > 200


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> FigureData:
    return make_data(tmp_path_factory.mktemp("results"))


# ----------------------------------------------------------------------------- figures


def test_cli_writes_every_figure_as_a_png(data, tmp_path):
    data.metrics.to_parquet(tmp_path / "metrics.parquet")
    data.curves.to_parquet(tmp_path / "curves.parquet")
    data.sparsity.to_parquet(tmp_path / "sparsity.parquet")
    (tmp_path / "stats.json").write_text(json.dumps(data.stats))
    outputs = {name: tmp_path / "figures" / f"{name}.png" for name in FIGURES}
    argv = [
        "--metrics",
        str(tmp_path / "metrics.parquet"),
        "--curves",
        str(tmp_path / "curves.parquet"),
        "--sparsity",
        str(tmp_path / "sparsity.parquet"),
        "--stats",
        str(tmp_path / "stats.json"),
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
        data = FigureData(data.metrics[data.metrics["run"] == "base"], pd.DataFrame(), pd.DataFrame(), {}, ())
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


# ----------------------------------------------------------------------------- stats.json and report.md


def test_stats_cli_writes_strict_json_with_verdicts(data, tmp_path):
    data.metrics.to_parquet(tmp_path / "metrics.parquet")
    out = tmp_path / "stats.json"
    argv = [
        "stats",
        "--metrics",
        str(tmp_path / "metrics.parquet"),
        "--out",
        str(out),
        "--config",
        json.dumps(FAST),
        "--precisions",
        "fp32",
        "bf16",
    ]
    assert report.main(argv) == 0

    def no_constants(name: str):
        raise AssertionError(f"non-standard JSON constant {name}")

    result = json.loads(out.read_text(), parse_constant=no_constants)
    assert set(result["verdicts"]) == {"H1", "H2", "H3"}
    assert result["reference"] == "fp32" and result["source"]["rows"] == len(data.metrics)


def test_report_states_every_verdict_with_reason_power_and_figures(data, tmp_path):
    figs = {name: tmp_path / "figures" / f"{name}.png" for name in FIGURES}
    text = report.render(data.stats, data.metrics, figs, tmp_path / "report.md", ["fp32", "bf16"])
    for h in ("H1", "H2", "H3"):
        v = data.stats["verdicts"][h]
        assert f"### {h}: {v['verdict']}" in text
        assert f"- Reason: {v['reason']}" in text
    assert text.count("- power (bf16, ") == 3
    assert "seeds per arm for 80%" in text
    assert "| on_task (add_sub) | bf16 | 3 |" in text
    assert "## Training and update sparsity" in text and "changed (η=1e-04)" in text
    for name in FIGURES:
        assert f"[{name}](figures/{name}.png)" in text
    assert "## Warnings" in text


def test_report_cli_and_data_warnings(data, tmp_path):
    metrics = data.metrics.copy()
    metrics.loc[metrics["run"] == "bf16-s1", "timeout_frac"] = 0.25
    metrics.loc[metrics["task"] == "mcq", "truncated_frac"] = 0.9
    metrics.loc[(metrics["run"] == "fp32-s2") & (metrics["task"] == "mul"), "kl_k3"] = float("nan")
    metrics.to_parquet(tmp_path / "metrics.parquet")
    (tmp_path / "stats.json").write_text(json.dumps(data.stats))
    out = tmp_path / "report.md"
    argv = [
        "markdown",
        "--stats",
        str(tmp_path / "stats.json"),
        "--metrics",
        str(tmp_path / "metrics.parquet"),
        "--out",
        str(out),
        "--figure",
        f"dJ_by_task={tmp_path / 'figures' / 'dJ_by_task.png'}",
    ]
    assert report.main(argv) == 0
    text = out.read_text()
    assert "verifier timeouts in 3 run x task(s) (worst bf16-s1/" in text
    assert "hit max_new_tokens in 7 run x task(s) (tasks ['mcq'])" in text
    assert "KL k3 missing for 1 trained run x task(s)" in text
    assert "[dJ_by_task](figures/dJ_by_task.png)" in text


def test_report_on_one_seed_says_why_nothing_was_decided(tmp_path):
    data = make_data(tmp_path / "r", seeds=(1,), kl=False)
    text = report.render(data.stats, data.metrics, {}, tmp_path / "report.md")
    assert text.count("inconclusive") >= 3
    assert "power (bf16, on-task dJ): not computed" in text
    assert "KL k3 missing for 6 trained run x task(s)" in text


# ----------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def finished_workflow(tmp_path_factory) -> Path:
    """The whole DAG on tests/config.test.yaml (train, evaluate, kl, sparsity, analysis): minutes."""
    from conftest import load_test_config, make_workflow_dir, run_snakemake

    wf = make_workflow_dir(tmp_path_factory.mktemp("e2e") / "wf", load_test_config())
    proc = run_snakemake(wf, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return wf


@pytest.mark.slow
def test_full_workflow_writes_the_analysis_and_an_html_report(finished_workflow):
    from conftest import load_test_config, run_snakemake

    wf, config = finished_workflow, load_test_config()
    analysis = wf / "results" / "analysis"
    metrics = pd.read_parquet(analysis / "metrics.parquet")
    n_runs = 1 + len(config["precisions"]) * len(config["seeds"])
    assert len(metrics) == n_runs * len(config["data"]["tasks"])
    trained = metrics[metrics["precision"].notna()]
    assert trained[["J", "dJ", "kl_k3", "train_steps", "equal_bf16_frac"]].notna().all().all()
    assert set(trained.loc[trained["precision"] == "bf16", "dtype"]) == {"bfloat16"}
    result = json.loads((analysis / "stats.json").read_text())
    assert set(result["verdicts"]) == {"H1", "H2", "H3"}
    for name in FIGURES:
        assert_png(analysis / "figures" / f"{name}.png")
    text = (analysis / "report.md").read_text()
    assert all(f"### {h}: " in text for h in ("H1", "H2", "H3"))
    for rule in ("aggregate", "analysis_stats", "analysis_figures", "analysis_report"):
        assert (wf / "logs" / rule / f"{rule}.log").exists()
        assert (wf / "benchmarks" / rule / f"{rule}.tsv").exists()
    proc = run_snakemake(wf, "--report", "report.html", timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    html = wf / "report.html"
    assert html.exists() and html.stat().st_size > 10_000


@pytest.mark.slow
def test_analysis_settings_rerun_only_the_analysis(finished_workflow):
    from conftest import planned_jobs, set_key

    cfg = finished_workflow / "config.yaml"
    original = cfg.read_text()
    try:
        assert planned_jobs(finished_workflow) == {}
        set_key(cfg, "analysis.alpha", 0.01)
        jobs = planned_jobs(finished_workflow)
        assert jobs == {"analysis_stats": 1, "analysis_figures": 1, "analysis_report": 1, "all": 1}, jobs
    finally:
        cfg.write_text(original)
