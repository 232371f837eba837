"""Tests of workflow_scripts.report (and the stats stage's stats.json that it reads), and one end-to-end
run of the whole DAG on tests/config.test.yaml followed by ``snakemake --report``.

The unit tests use test_figures.py's synthetic tables (``make_data``): real aggregate and stats code on
synthetic upstream files; the default and zero-spread tables are built once per session for both modules
(test_figures.shared_table). The analysis rules (aggregate -> stats -> learning_curves -> figures ->
report, each rule's ``script:`` its stage module) are checked through snakemake in the end-to-end run.
"""

from __future__ import annotations

import json
import re
import statistics
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from test_aggregate import _add_repeat, run_aggregate, write_fake_results
from test_figures import FAST, REPO, SIX_ARMS, assert_png, make_data, shared_data, shared_flat_table

from workflow_scripts import figures, report, stats
from workflow_scripts.plots import figure_list
from workflow_scripts.plots.common import FigureData, seeds_only
from workflow_scripts.plots.figure_list import FIGURES
from workflow_scripts.runtime import paths
from workflow_scripts.runtime.config import validate_config


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> FigureData:
    return shared_data(tmp_path_factory)  # the same table as test_figures.py's, built once per session


@pytest.fixture(scope="module")
def flat_data(tmp_path_factory) -> FigureData:
    return shared_flat_table(tmp_path_factory)  # test_figures.flat_table, built once per session


# ----------------------------------------------------------------------------- stats.json and report.md

# FAST without the power simulations, for tests whose claims are outcomes and texts that do not depend on
# power (a verdict's rule reads the fits; power only adds its sentence): the controls table's fit takes
# ~9 CPU-s with them, ~1 without. Power's rendering is checked on ``data`` (test_report_states_...).
NO_POWER = {**FAST, "power_simulations": 0}


def test_stats_stage_writes_strict_json_with_gate_and_verdicts(data, tmp_path):
    """The stage's command line on tests/config.test.yaml (its analysis section and precisions) with FAST's
    power settings (its max_seeds 128 default makes the seeds-needed search ~10x the fit): one fit; the CLI
    calls ``stats.run``, which writes the file."""
    import yaml

    config = yaml.safe_load((REPO / "tests" / "config.test.yaml").read_text())
    config["analysis"].update({k: FAST[k] for k in ("power_simulations", "max_seeds")})
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    data.metrics.to_parquet(tmp_path / "metrics.parquet")
    out = tmp_path / "stats.json"
    argv = [
        "--metrics",
        str(tmp_path / "metrics.parquet"),
        "--out",
        str(out),
        "--config",
        str(tmp_path / "config.yaml"),
    ]
    assert stats.main(argv) == 0

    def no_constants(name: str):
        raise AssertionError(f"non-standard JSON constant {name}")

    result = json.loads(out.read_text(), parse_constant=no_constants)
    assert set(result["verdicts"]) == {"H1", "H2", "H3"} and "passed" in result["gate"]
    assert result["reference"] == "fp32" and result["source"]["rows"] == len(data.metrics)
    defaults = stats.analysis_defaults()
    assert result["config"]["bootstrap"] == 200 != defaults["bootstrap"]  # config.test.yaml's
    assert result["config"]["max_seeds"] == FAST["max_seeds"] != defaults["max_seeds"]
    assert result["arms"]["bf16"]["kind"] == "bundle"  # the config's precisions section was read
    comparisons = result["by_task_type"]["off_task"]["comparisons"]  # power blocks in the strict JSON too
    assert comparisons and all(c["dJ_power"]["status"] == "ok" for c in comparisons.values())


def test_report_states_gate_verdicts_power_and_figures(data, tmp_path):
    figs = {name: tmp_path / "figures" / f"{name}.png" for name in FIGURES}
    text = report.render(
        data.stats, data.metrics, figs, tmp_path / "report.md", ["fp32", "bf16"], data.overlap
    )
    gate = data.stats["gate"]
    assert "## Gate: did training improve the on-task score?" in text
    assert ("**Passed.**" if gate["passed"] else "**Not passed.**") in text and gate["reason"] in text
    assert "| seeds per arm needed |" in text
    for h in ("H1", "H2", "H3"):
        v = data.stats["verdicts"][h]
        assert f"### {h}: {v['verdict']}" in text and f"- Why: {v['reason']}" in text
        b = v["by_arm"]["bf16"]
        assert f"| {h} | bf16 vs fp32 | **{b['finding']}** ({b['verdict']}) |" in text
    assert "## Seed-variance components (mixed model)" in text
    assert "| on_task (add_sub) | bf16 | 3 |" in text
    assert "representable update (step 0)" in text and "changed (η=1e-04)" in text
    assert "## Cross-seed overlap of the update masks" in text and "| bf16 | 0.001 | 3 |" in text
    assert "None of the 6 trained runs diverged" in text
    for name in FIGURES:
        assert f"[{name}](figures/{name}.png): {figure_list.note(name)}" in text
    assert "design.md" not in text and "## Warnings" in text


def test_report_says_when_the_learning_curves_part(data, tmp_path):
    """The report stage reads learning_curves.json (the learning_curves stage's output) into its section."""
    from test_learning_curves import run_stage, write_heldout

    _, curves = run_stage(tmp_path, write_heldout(tmp_path / "results", seeds=tuple(range(1, 9))))
    data.metrics.to_parquet(tmp_path / "metrics.parquet")
    (tmp_path / "stats.json").write_text(json.dumps(data.stats))
    (tmp_path / "curves.json").write_text(json.dumps(curves))
    files = {
        name: str(tmp_path / name) for name in ("stats.json", "metrics.parquet", "curves.json", "report.md")
    }
    argv = ["--stats", files["stats.json"], "--metrics", files["metrics.parquet"],
            "--learning-curves", files["curves.json"], "--out", files["report.md"]]  # fmt: skip
    assert report.main(argv) == 0
    text = (tmp_path / "report.md").read_text()
    section = text.split("## Learning curves (held-out pass@1 during training)")[1].split("\n## ")[0]
    assert "against fp32" in section and "Measured at steps 0, 4, 8" in section
    first = curves["comparisons"]["bf16"]["on_task_mean"]["first_differ"]["step"]
    assert f"| bf16 | {'do not differ' if first is None else f'step {first} ('}" in section
    assert "Step-0 check" in section and "- fp32: on-task" in section
    assert "## Learning curves" not in report.render(data.stats, data.metrics, {}, tmp_path / "r.md")


def test_report_lists_diverged_runs_and_how_the_verdicts_treat_them(tmp_path):
    data = make_data(tmp_path / "r", diverged=("bf16-s2",))
    assert data.stats["excluded_runs"]["diverged"] == ["bf16-s2"]
    text = report.render(data.stats, data.metrics, {}, tmp_path / "report.md", ["fp32", "bf16"])
    assert "1 of 6 trained runs diverged and are **excluded** from every test and verdict" in text
    assert "- bf16-s2: entropy collapsed" in text
    assert "Seeds per arm (after exclusions): fp32 3, bf16 2" in text


def test_report_on_results_without_health_records_says_so(tmp_path):
    data = make_data(tmp_path / "r", health=False)
    text = report.render(data.stats, data.metrics, {}, tmp_path / "report.md", ["fp32", "bf16"])
    assert "Not checked: these results predate the training health record" in text
    assert "predates the representable-update record" in text


def test_report_stage_and_data_warnings(data, tmp_path):
    metrics = data.metrics.copy()
    metrics.loc[metrics["run"] == "bf16-s1", "timeout_frac"] = 0.25
    metrics.loc[metrics["task"] == "mcq", "truncated_frac"] = 0.9
    metrics.loc[(metrics["run"] == "fp32-s2") & (metrics["task"] == "mul"), "kl_k3"] = float("nan")
    metrics.to_parquet(tmp_path / "metrics.parquet")
    (tmp_path / "stats.json").write_text(json.dumps(data.stats))
    out = tmp_path / "report.md"
    argv = [
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
    assert "hit max_new_tokens in 8 run x task(s) (tasks ['mcq'])" in text
    assert "KL k3 missing for 1 trained run x task(s)" in text
    assert "[dJ_by_task](figures/dJ_by_task.png)" in text


def test_report_on_one_seed_says_why_nothing_was_decided(tmp_path):
    data = make_data(tmp_path / "r", seeds=(1,), kl=False)
    text = report.render(data.stats, data.metrics, {}, tmp_path / "report.md")
    assert text.count("not testable") >= 3 and "**Not passed.**" in text
    assert "fp32 has 1 seed(s): a gain across seeds cannot be tested" in text
    assert "KL k3 missing for 6 trained run x task(s)" in text


def test_report_has_a_controls_section_saying_whether_each_came_out_as_it_must(data, tmp_path):

    from workflow_scripts.statistics import simulation

    arms = ("fp32", "bf16", "fp32_copy", "fp32_noisy")
    # 36x: a control is judged as one more arm of the Holm family (here bf16 and itself), at 100 permutations
    _, task_var = simulation.structure("task", 36.0, 4e-4, 1e-4, arm="fp32_noisy")
    kl_seed_var = {("fp32_noisy", "off_task"): 36 * (simulation.KL_SEED_VAR + simulation.KL_TASK_VAR)}
    table = simulation.simulate_table(np.random.default_rng(61), n_seeds=8, arms=arms, task_var=task_var,
                                      kl_seed_var=kl_seed_var)  # fmt: skip
    specs = {
        "fp32": {},
        "bf16": {},
        "fp32_copy": {"control": "negative"},
        "fp32_noisy": {"control": "positive"},
    }
    result = stats.analyze(table, NO_POWER, precisions=specs)
    text = report.render(result, table, {}, tmp_path / "report.md", list(arms))
    assert "## Controls" in text
    copy, noisy = result["controls"]["fp32_copy"], result["controls"]["fp32_noisy"]
    outcomes = f"{copy['outcome']} | {copy['kl_outcome']}"
    row = f"| fp32_copy | negative | not supported | {outcomes} | **as it must** |"
    assert row in text and "supported" not in (copy["outcome"], copy["kl_outcome"])
    assert "| fp32_noisy | positive | supported | supported | supported | **as it must** |" in text
    assert noisy["reason"] in text and noisy["kl_reason"] in text
    assert "| H2 | bf16 vs fp32 |" in text and "| H2 | fp32_noisy vs fp32 |" not in text  # judged apart
    plain = report.render(data.stats, data.metrics, {}, tmp_path / "plain.md", ["fp32", "bf16"])
    assert "## Controls" not in plain


def test_report_gives_noise_shares_and_warns_when_a_verdict_rests_on_more_than_half(tmp_path):

    from workflow_scripts.statistics import simulation

    table = simulation.simulate_table(np.random.default_rng(62), n_seeds=6, n_problems=20, n_samples=4)
    result = stats.analyze(table, NO_POWER, precisions=["fp32", "bf16"])
    text = report.render(result, table, {}, tmp_path / "report.md", ["fp32", "bf16"])
    assert "## Eval-noise share of the across-seed variance" in text
    share = result["noise_share"]["by_role"]["off_task"]["dJ"]["fp32"]["share"]
    assert share > 0.5 and f"| off_task | dJ | fp32 | {share:.2g} |" in text
    h2 = result["verdicts"]["H2"]["verdict"]
    assert f"**Warning: H2 ({h2}) rests on an eval-noise share above 0.5**" in text
    assert "Warning: H3" not in text  # KL noise is small here
    quiet = simulation.simulate_table(np.random.default_rng(62), n_seeds=6)
    quiet_text = report.render(stats.analyze(quiet, NO_POWER), quiet, {}, tmp_path / "q.md", ["fp32", "bf16"])
    assert "Warning: H2" not in quiet_text


# ----------------------------------------------------------------------------- repeats (noise floor)

REPEATS = {("bf16-s1", 2): 0.05, ("bf16-s1", 3): -0.02, ("fp32-s2", 2): 0.0}  # (run, k) -> shift


def _analysis(root: Path, repeats: bool) -> tuple[FigureData, pd.DataFrame]:
    """aggregate -> stats of the fake results, with or without the repeats of ``REPEATS`` (shifted
    values: a repeat that leaked into a seed-level table would move its numbers); (figure data, metrics)."""
    files = write_fake_results(root)
    for (run, k), shift in REPEATS.items() if repeats else ():
        _add_repeat(files, root, run, k, shift)
    metrics, curves, sparsity, _, overlap = run_aggregate(files)
    result = stats.analyze(metrics, FAST, precisions=["fp32", "bf16"])
    return FigureData(metrics, curves, sparsity, result, ["fp32", "bf16"], overlap), metrics


def _without_section(text: str, title: str) -> str:
    return re.sub(rf"## {re.escape(title)}\n.*?(?=\n## )", "", text, flags=re.S).replace("\n\n\n", "\n\n")


def test_repeats_change_no_seed_count_verdict_input_table_or_figure_and_get_a_noise_floor_section(tmp_path):
    plain, plain_metrics = _analysis(tmp_path / "plain", repeats=False)
    rep, rep_metrics = _analysis(tmp_path / "rep", repeats=True)
    assert rep_metrics["run"].nunique() == plain_metrics["run"].nunique() + len(REPEATS)  # in the table
    assert rep.stats["n"]["seeds"] == plain.stats["n"]["seeds"] == {"fp32": 3, "bf16": 3}
    assert {k: v for k, v in rep.stats.items() if k != "noise_floor"} == {
        k: v for k, v in plain.stats.items() if k != "noise_floor"
    }  # gate, mixed model, classical tests, verdicts, controls: the same inputs, the same numbers
    for table in ("metrics", "curves", "sparsity"):  # the figures see each (arm, seed) once
        got, want = getattr(rep, table), getattr(plain, table)
        pd.testing.assert_frame_equal(got.reset_index(drop=True), want.reset_index(drop=True))
    assert len(seeds_only(rep_metrics)) == len(plain_metrics)
    for name in ("dJ_by_task", "training_curves", "sparsity_by_module"):
        outs = {}
        for label, data in (("plain", plain), ("rep", rep)):
            outs[label] = tmp_path / label / f"{name}.png"
            np.random.seed(0)  # seaborn's strip-plot jitter draws from numpy's global stream
            figures.make_figures(data, {name: outs[label]})
        assert outs["rep"].read_bytes() == outs["plain"].read_bytes(), name

    kw = {"figures": {}, "report_path": tmp_path / "report.md", "precisions": ["fp32", "bf16"]}
    with_repeats = report.render(rep.stats, rep_metrics, overlap=rep.overlap, **kw)
    without = report.render(plain.stats, plain_metrics, overlap=plain.overlap, **kw)
    assert "Numerical noise floor" not in without
    assert _without_section(with_repeats, "Numerical noise floor (repeats)") == without
    assert "None of the 6 trained runs diverged" in with_repeats
    assert re.search(r"\| bf16 \| 3 \| 20 \|", with_repeats)  # training table: 3 seeds, 20 steps
    floor = with_repeats.split("## Numerical noise floor (repeats)")[1].split("\n## ")[0]
    assert "| bf16-s1 | bf16-s1 (first run), bf16-s1-r2 (repeat 2), bf16-s1-r3 (repeat 3) | no |" in floor
    assert "| fp32-s2 | fp32-s2 (first run), fp32-s2-r2 (repeat 2) | yes | 0 |" in floor
    spread = report.fmt(statistics.variance([0.0, 0.05, -0.02]))  # every task shifted alike
    seed_var = report.fmt(rep.stats["by_task_type"]["off_task"]["arms"]["bf16"]["dJ"]["pooled_var"])
    assert f"| bf16 | off_task | 1 | {spread} (df 4) | {seed_var} |" in floor  # 2 tasks x 2 df
    assert "| fp32 | on_task | 1 | 0 (df 1) |" in floor


def test_the_numerics_provenance_names_a_repeat_as_a_repeat(tmp_path):
    data, metrics = _analysis(tmp_path / "r", repeats=True)
    metrics.to_parquet(tmp_path / "metrics.parquet")
    (tmp_path / "stats.json").write_text(json.dumps(data.stats))
    records = [tmp_path / "r" / "train" / "bf16" / d / "run.json" for d in ("seed1", "seed1-r2")]
    text = report.run(stats=tmp_path / "stats.json", metrics=tmp_path / "metrics.parquet",
                      out=tmp_path / "report.md", figures={}, records=records)  # fmt: skip
    assert "2: bf16-s1, bf16-s1-r2 (repeat 2) |" in text


# ----------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def finished_workflow(tmp_path_factory) -> Path:
    """The whole DAG on tests/config.test.yaml (train, evaluate, kl, sparsity, analysis): a minute or more.
    It starts from a copy of the session's data, base model and base evaluation (conftest.base_evaluated,
    shared with tests/test_evaluate.py and tests/workflow/test_workflow_foundation.py); this run does every
    job after them, so the fork server starts in it (the fork-server test below needs its train, evaluate
    and analysis jobs)."""
    from conftest import base_evaluated, copy_workflow, run_snakemake

    wf = copy_workflow(base_evaluated(tmp_path_factory), tmp_path_factory.mktemp("e2e") / "wf")
    proc = run_snakemake(wf, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return wf


@pytest.mark.slow
def test_full_workflow_writes_the_analysis_and_an_html_report(finished_workflow):
    from conftest import load_test_config, run_snakemake

    wf, config = finished_workflow, load_test_config()
    analysis = wf / "results" / "analysis"
    metrics = pd.read_parquet(analysis / "metrics.parquet")
    runs = paths.run_names(validate_config(config, check_files=False))
    assert set(metrics["run"]) == set(runs) and len(metrics) == len(runs) * len(config["data"]["tasks"])
    trained = metrics[metrics["precision"].notna()]
    assert trained[["J", "dJ", "kl_k3", "train_steps", "equal_bf16_frac"]].notna().all().all()
    assert set(trained.loc[trained["precision"] == "bf16", "dtype"]) == {"bfloat16"}
    # the aggregate rule reads each run's run.json (health record): no run diverged, none excluded
    assert trained["diverged"].eq(False).all() and len(pd.read_parquet(analysis / "overlap.parquet")) > 0
    result = json.loads((analysis / "stats.json").read_text())
    assert set(result["verdicts"]) == {"H1", "H2", "H3"} and "gate" in result
    assert result["excluded_runs"]["diverged"] == []
    assert result["config"]["bootstrap"] == config["analysis"]["bootstrap"]  # the stats rule's params
    for name in FIGURES:
        assert_png(analysis / "figures" / f"{name}.png")
    text = (analysis / "report.md").read_text()
    assert all(f"### {h}: " in text for h in ("H1", "H2", "H3"))
    n_trained = trained["run"].nunique()
    assert f"None of the {n_trained} trained runs diverged" in text and "## Cross-seed overlap" in text
    # the first screen: what each arm is, then what the run says, before any rule or table of ratios
    first = text[: text.index("## Gate")]
    assert first.index("## Arms") < first.index("## What this run says")
    row = "| **bf16** | bundle | bf16 round-to-nearest | bf16 | bf16, eval mode | 0.1 (loss forward only) |"
    assert row in first
    assert "Arms, each against the reference fp32" in first and "dropout 0.1" in first
    # the bf16 arm's gap, measured by its runs, is said to be its dropout's (HF sampler in its own dtype)
    gap = r"bf16 = .*\(a bundle; mean sampler-trainer gap [0-9.e-]+ nats.*from dropout \(train-mode loss, "
    assert re.search(gap + r"eval-mode sampler\), not numerics\)", first)
    assert result["arms"]["bf16"]["kind"] == "bundle" and result["schema_version"] == 6
    for rule in ("aggregate", "stats", "learning_curves", "figures", "report"):
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
        assert jobs == {"stats": 1, "learning_curves": 1, "figures": 1, "report": 1, "all": 1}, jobs
    finally:
        cfg.write_text(original)


def _result_fields(path: Path):
    """What a job computed, without its clock readings and cache keys (they differ between any two runs)."""

    def strip(obj):
        if isinstance(obj, dict):
            return {k: strip(v) for k, v in obj.items() if not re.search(r"time|_s$|^s_per_|run_key", k)}
        return [strip(v) for v in obj] if isinstance(obj, list) else obj

    if path.suffix == ".json":
        return strip(json.loads(path.read_text()))
    if path.suffix == ".jsonl":
        return [strip(json.loads(line)) for line in path.read_text().splitlines()]
    if path.suffix == ".parquet":
        frame = pd.read_parquet(path)
        frame = frame[[c for c in frame.columns if not re.search(r"time|_s$|^s_per_", c)]]
        return frame.astype(object).where(frame.notna(), None).to_dict("list")  # NaN == NaN here
    return path.read_bytes()


@pytest.mark.slow
def test_jobs_the_fork_server_ran_wrote_what_fresh_processes_write(finished_workflow, tmp_path, monkeypatch):
    """The run's jobs ran in children of the fork server (runtime/forkserver.py) once it listened; a forked
    train job and a forked evaluate job, rerun as fresh processes, write the same files, and so do the
    analysis jobs downstream of them (forked too in the run: the server was up)."""
    import shutil

    from conftest import run_snakemake

    def forked(rule: str) -> list[Path]:
        logs = sorted((finished_workflow / "logs" / rule).rglob("*.log"))
        return [log for log in logs if '"forked": true' in log.read_text()]

    train, evaluate = forked("train"), forked("evaluate")
    assert train and evaluate, "no train or evaluate job ran in the fork server"
    analysis_rules = ("aggregate", "stats", "learning_curves", "figures", "report")
    assert all(forked(rule) for rule in analysis_rules), "analysis ran fresh"
    # a forked job records its own CPU and memory (Snakemake's benchmark: measured the waiting client)
    usage = json.loads(re.findall(r"USAGE (\{.*\})", train[0].read_text())[-1])
    client_cpu = pd.read_csv(finished_workflow / "benchmarks" / "train" / train[0].parent.name /
                             f"{train[0].stem}.tsv", sep="\t")["cpu_time"].iloc[0]  # fmt: skip
    assert usage["forked"] is True and usage["cpu_s"] > 2 * client_cpu and usage["max_rss_mb"] > 100, usage
    precision, seed = train[0].parent.name, train[0].stem  # logs/train/<precision>/seed<seed>.log
    run, task = evaluate[0].parent.name, evaluate[0].stem  # logs/evaluate/<run>/<task>.log
    train_run = paths.train_dir(precision, seed.removeprefix("seed")) / "run.json"
    wf = tmp_path / "wf"
    shutil.copytree(finished_workflow, wf, symlinks=True)
    monkeypatch.setenv("RLVR_FORK_SERVER", "off")

    def rerun_fresh(targets: list[str], *rules: str) -> None:
        started = time.time()
        proc = run_snakemake(wf, *targets, "--forcerun", *rules, timeout=900)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        rewritten = [p for p in (wf / "results").rglob("*") if p.is_file() and p.stat().st_mtime > started]
        assert {str(wf / t) for t in targets} <= {str(p) for p in rewritten}
        for path in rewritten:
            original = finished_workflow / path.relative_to(wf)
            assert _result_fields(path) == _result_fields(original), path.relative_to(wf)

    rerun_fresh(["results/analysis/stats.json", "results/analysis/report.md"], "aggregate")  # and downstream
    rerun_fresh([str(train_run), str(paths.eval_summary(run, task))], "train", "evaluate")
    fresh = json.loads(
        re.findall(r"USAGE (\{.*\})", (wf / train[0].relative_to(finished_workflow)).read_text())[-1]
    )
    assert fresh["forked"] is False and fresh["cpu_s"] > 0, fresh


# ----------------------------------------------------------------------------- degenerate but legal tables


def test_report_on_zero_spread_says_not_testable_and_shows_n_a_not_nan(flat_data, tmp_path):
    """The few-step factorial's table (config.factorial.yaml's arms, every dJ and KL 0, no noise) through
    the analysis stages in-process (test_figures.flat_table: aggregate, stats; its figures in test_figures);
    the rules that run these stages are run through snakemake above, on another table."""
    text = report.render(flat_data.stats, flat_data.metrics, {}, tmp_path / "report.md", SIX_ARMS)
    assert "**Not passed.**" in text and text.count("**not testable**") == 3 * (len(SIX_ARMS) - 1)
    assert "the gate did not pass" in text and "n/a" in text
    assert "| undefined (both 0) [0, ∞] |" in text  # 0/0 ratio: said, not shown as a number
    assert not re.search(r"\bnan\b|\| *(None|inf) *\||\[None|None\]", text, flags=re.IGNORECASE)
    assert "autocast_drop" in text
