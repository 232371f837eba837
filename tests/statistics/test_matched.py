"""Movement matched by design (statistics/matched.py): snapshot run names, the matched step, and the
comparison at that step by the statistics every other comparison uses."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from conftest import REPO

from workflow_scripts import stats
from workflow_scripts.report import base_section, matched_section
from workflow_scripts.runtime import paths
from workflow_scripts.runtime.config import load_config
from workflow_scripts.statistics import matched, simulation, summary

FAST = {"bootstrap": 200, "power_simulations": 10, "max_seeds": 16, "null_splits": 20}


def test_snapshot_runs_are_named_by_step_and_live_in_their_runs_folder():
    parsed = paths.parse_run("fp32-s3@step12")
    assert (parsed.precision, parsed.seed, parsed.repeat, parsed.step) == ("fp32", 3, 1, 12)
    assert paths.snapshot_run("fp32", 3, 12) == "fp32-s3@step12"
    assert paths.model_dir("fp32-s3@step12") == paths.train_dir("fp32", 3) / "snapshots" / "step12"
    assert paths.stream_run("fp32-s3@step12") == "fp32-s3"  # common random numbers along the run
    assert paths.parse_run("fp32-s3").step is None
    config = load_config(REPO / "config.yaml", check_files=False)
    assert paths.snapshot_steps(config, "fp32") == [6, 12, 24]
    assert paths.snapshot_steps(config, "bf16") == []  # the reference only
    runs = paths.snapshot_runs(config)
    assert len(runs) == 16 * 3 and not set(runs) & set(paths.run_names(config))


def test_the_matched_step_is_the_nearest_on_the_log_scale_and_says_when_it_is_an_edge():
    curve = {6: 0.01, 12: 0.04, 24: 0.12, matched.FINAL: 0.3}
    m = matched.match_step(0.03, curve)
    assert m["step"] == 12 and m["outside"] is None and m["kl_ratio"] == pytest.approx(0.75)
    assert matched.match_step(0.019, curve)["step"] == 6  # log: 0.019/0.01 = 1.9 < 0.04/0.019 = 2.1
    assert matched.match_step(0.002, curve)["outside"] == "below"
    assert matched.match_step(0.9, curve)["step"] == matched.FINAL
    assert matched.match_step(0.9, curve)["outside"] == "above"
    assert matched.match_step(0.0, curve)["status"] == "skipped"


def snapshot_tables(rng: np.random.Generator, arm_sd: float) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(final metrics, reference snapshots): the reference moves with the step (KL x step / 24), its dJ
    spread the simulation's; the arm's KL is the reference's at step 12, its off-task dJ spread x arm_sd."""
    table = simulation.simulate_table(rng, n_seeds=16, arms=("fp32", "bf16"), n_off=3)
    table = table[~((table["precision"] == "bf16") & (table["seed"] > 8))].copy()
    off = table["role"] == "off_task"
    arm = (table["precision"] == "bf16") & off
    table.loc[arm, "dJ"] = table.loc[arm, "dJ"] * arm_sd
    table.loc[table["precision"] == "bf16", "kl_rb"] *= 0.5
    snaps = []
    for step in (6, 12, 24):
        ref = simulation.simulate_table(rng, n_seeds=16, arms=("fp32",), n_off=3)
        ref = ref[ref["role"] == "off_task"].copy()
        trained = ref["precision"].notna()
        ref.loc[trained, "kl_rb"] *= step / 24
        ref.loc[trained, "run"] = [f"{r}@step{step}" for r in ref.loc[trained, "run"]]
        snaps.append(ref if step == 6 else ref[trained])
    return table, pd.concat(snaps, ignore_index=True)


def test_each_arm_is_compared_at_the_step_where_the_reference_moved_as_far():
    final, snaps = snapshot_tables(np.random.default_rng(3), arm_sd=1.0)
    out = stats.analyze(final, FAST, precisions=["fp32", "bf16"], snapshots=snaps)
    block = out["matched"]
    assert block["status"] == "ok" and block["reference_seeds"]["12"] == 16
    assert block["reference_kl"]["12"] == pytest.approx(block["reference_kl"]["final"] / 2, rel=0.2)
    b = block["arms"]["bf16"]
    assert b["match"]["step"] == "12" and b["match"]["outside"] is None
    assert b["seeds"] == [8, 16]  # the arm's 8 against all 16 reference seeds at step 12
    for q in matched.QUANTITIES:
        assert b[q]["status"] == "ok"
        assert b[q]["finding"] in ("larger", "smaller", "inconclusive")
        assert 0 <= b[q]["p_adjusted"] <= 1
    assert b["dJ"]["finding"] == "inconclusive"  # the same spread: no claim
    json.dumps(out, allow_nan=False)
    text = matched_section(out)
    assert "## Movement-matched comparison" in text and "bf16 vs fp32 at step 12" in text
    # the summary reads this very block: an arm found "smaller" is read at its matched step
    out["verdicts"]["H2"]["by_arm"]["bf16"]["finding"] = "smaller"
    bullet = summary.matched_bullet(out)
    ratio = f"{summary.fmt(b['dJ']['ratio'])}x {summary.ci(b['dJ']['ratio_ci'])}"
    assert bullet.startswith("At equal movement") and "bf16 (reference at step 12, KL ratio" in bullet
    assert f"off-task dJ {b['dJ']['finding']}, {ratio}" in bullet and "not compared" not in bullet
    # every variance finding stands beside its null yardstick: splits of the reference at the matched step
    for q, word in (("dJ", "dJ"), ("kl", "KL")):
        yard = b[q]["yardstick"]
        assert yard["status"] == "ok" and yard["n_ref_seeds"] == 16 and yard["n_arm_seeds"] == 8
        assert yard["q05"] < 1 < yard["q95"]
        words = summary.yardstick_words(yard)
        assert words.startswith("chance [") and "of splits as extreme" in words
        assert f"{word} seed-variance ratio" in text and words in text.split(f"{word} seed-variance ratio")[1]
    assert f"{ratio} ({summary.yardstick_words(b['dJ']['yardstick'])})" in bullet


def test_a_larger_spread_at_equal_movement_is_found_larger():
    final, snaps = snapshot_tables(np.random.default_rng(4), arm_sd=4.0)
    block = matched.matched(*(stats._prepare(t, [], "rb")[0] for t in (final, snaps)), ["fp32", "bf16"],
                            ["off0", "off1", "off2"], {**stats.analysis_defaults(), **FAST})  # fmt: skip
    b = block["arms"]["bf16"]["dJ"]
    assert b["direction"] == "larger" and b["finding"] == "larger" and b["ratio"] > 4
    assert not math.isnan(b["p_adjusted"])


def test_without_snapshots_the_block_says_why():
    final, _ = snapshot_tables(np.random.default_rng(5), arm_sd=1.0)
    rows = stats._prepare(final, [], "rb")[0]
    block = matched.matched(rows, rows.iloc[:0], ["fp32", "bf16"], ["off0"], stats.analysis_defaults())
    assert block["status"] == "skipped" and "snapshots" in block["reason"]
    assert "not made" in matched.summary_lines(block)[0]


def test_the_report_says_the_conclusions_are_conditional_on_the_shipped_base():
    manifest = json.loads((REPO / "data" / "base" / "manifest.json").read_text())
    record = {
        "source": "tiny",
        "shipped": {"path": "data/base", "files": manifest["files"], "built": manifest["built"]},
    }
    text = base_section(record)
    assert "conditional on this one base" in text and manifest["files"]["model.safetensors"][:16] in text
    assert "built on this machine" in base_section({"source": "tiny", "shipped": None})
    assert base_section(None) == ""
