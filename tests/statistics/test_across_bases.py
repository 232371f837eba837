"""The base as a factor (workflow_scripts/statistics/across_bases.py): each base's decomposition, from the
real decompose on tables with planted effects, pooled across bases by random effects."""

from __future__ import annotations

import functools
import json

import numpy as np
import pytest
from test_decompose import STALL, decomposed, table

from workflow_scripts.statistics import across_bases as ab


@functools.cache
def base_result(seed: int, stall_shift: float = 0.0, verdict: str = "smaller") -> dict:
    """One base's stats.json: the decomposition of a table whose bf16 arm's dJ moves by ``stall_shift``."""
    t = table(seed=seed)
    t.loc[t["precision"].isin(["bf16", "bf16_drop"]), "dJ"] += stall_shift
    by_arm = {"bf16": {"verdict": verdict}, "fp32_drop": {"verdict": "inconclusive"}}
    return {"decomposition": decomposed(t), "verdicts": {"H2": {"verdict": "-", "by_arm": by_arm}}}


def pooled_row(pooled: list[dict], arm: str, quantity: str) -> dict:
    return next(r for r in pooled if r["arm"] == arm and r["quantity"] == quantity)


def test_bases_that_agree_pool_to_the_planted_effect_with_no_between_base_spread():
    by_base = {f"base-s{k}": base_result(k) for k in range(3)}
    row = pooled_row(ab.pool(ab.effect_rows(by_base)), "bf16", "on_task_dJ")
    p = row["pooled"]
    assert p["status"] == "ok" and p["k"] == 3 and p["ci"][0] < STALL < p["ci"][1]
    assert p["q_p"] > 0.01 and row["same_side"] == 3
    assert p["tau"] < 0.01  # the planted effect is the same on every base


def test_bases_that_disagree_show_it_in_tau_q_and_a_wide_interval():
    agree = {f"base-s{k}": base_result(k) for k in range(3)}
    disagree = {f"base-s{k}": base_result(k, s) for k, s in enumerate((-0.1, 0.0, 0.1))}
    tight = pooled_row(ab.pool(ab.effect_rows(agree)), "bf16", "on_task_dJ")["pooled"]
    row = pooled_row(ab.pool(ab.effect_rows(disagree)), "bf16", "on_task_dJ")
    wide = row["pooled"]
    assert wide["q_p"] < 1e-6 and 0.05 < wide["tau"] < 0.2  # the shifts' SD is 0.1
    assert wide["ci"][1] - wide["ci"][0] > 10 * (tight["ci"][1] - tight["ci"][0])
    assert row["same_side"] == 2  # the base shifted to ~0 does not exclude 0
    # the bundle carries the same shift; an arm that did not move keeps agreeing
    assert pooled_row(ab.pool(ab.effect_rows(disagree)), "bf16_drop", "on_task_dJ")["pooled"]["q_p"] < 1e-6
    assert pooled_row(ab.pool(ab.effect_rows(disagree)), "fp32_drop", "on_task_dJ")["pooled"]["q_p"] > 0.01


def test_pooling_is_dersimonian_laird_weighted_by_variances_with_a_t_interval_on_k_minus_1_df():
    means, ses = np.array([-0.14, -0.09, -0.12]), np.array([0.005, 0.004, 0.006])
    w = 1 / ses**2
    fixed = np.sum(w * means) / w.sum()
    q = float(np.sum(w * (means - fixed) ** 2))
    tau2 = max(0.0, (q - 2) / (w.sum() - np.sum(w**2) / w.sum()))
    w_re = 1 / (ses**2 + tau2)
    mean = float(np.sum(w_re * means) / w_re.sum())
    hksj = np.sqrt(np.sum(w_re * (means - mean) ** 2) / (2 * w_re.sum()))
    out = ab.pool_one(means, ses, 0.05)
    assert out["mean"] == pytest.approx(mean) and out["tau"] == pytest.approx(np.sqrt(tau2))
    assert out["q"] == pytest.approx(q)
    assert out["ci"][1] - out["mean"] == pytest.approx(4.302653 * hksj, rel=1e-5)  # t(0.975, 2 df)
    assert ab.pool_one(means[:1], ses[:1], 0.05)["status"] == "skipped"
    assert ab.pool_one(means, np.array([0.005, 0.0, 0.006]), 0.05)["status"] == "skipped"


def test_the_command_writes_a_table_per_effect_and_the_verdicts_side_by_side(tmp_path):
    paths = []
    for k, verdict in ((10, "smaller"), (2, "smaller"), (1, "inconclusive")):
        path = tmp_path / "bases" / f"base-s{k}" / "results" / "analysis" / "stats.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(base_result(k, 0.0, verdict)))
        paths.append(str(path))
    out = tmp_path / "bases" / "across_bases.md"
    assert ab.main([*paths, "--out", str(out)]) == 0
    text = out.read_text()
    assert "| arm | effect | quantity | base-s1 | base-s2 | base-s10 | pooled [CI] |" in text  # natural order
    assert "| H2 | bf16 | inconclusive | smaller | smaller | 2 of 3 smaller |" in text
    numbers = json.loads(out.with_suffix(".json").read_text())
    assert numbers["bases"] == ["base-s1", "base-s2", "base-s10"]
    assert {(r["arm"], r["quantity"]) for r in numbers["effects"]} >= {("bf16", "off_task_log_kl")}


def test_bad_inputs_name_the_file_and_field(tmp_path):
    good = tmp_path / "a" / "results" / "analysis" / "stats.json"
    good.parent.mkdir(parents=True)
    good.write_text(json.dumps(base_result(0)))
    with pytest.raises(SystemExit, match=r"missing\.json: cannot read"):
        ab.load([good, tmp_path / "missing.json"])
    bad = tmp_path / "b" / "results" / "analysis" / "stats.json"
    bad.parent.mkdir(parents=True)
    bad.write_text(json.dumps({"decomposition": {"status": "skipped", "reason": "fewer than two arms"}}))
    with pytest.raises(SystemExit, match=r"b/results/analysis/stats\.json: field 'decomposition'.*two arms"):
        ab.load([good, bad])
    with pytest.raises(SystemExit, match="needs at least 2"):
        ab.load([good])
