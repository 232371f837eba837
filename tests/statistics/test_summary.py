""" "What this run says": sentences generated from stats.json, for each verdict pattern (failed gate, larger,
smaller at one scale only, scales disagreeing, a failed null twin), and from a real analysis."""

from __future__ import annotations

import copy
import re

import numpy as np
import pandas as pd
from test_decompose import SPECS, STALL, table

from workflow_scripts import stats
from workflow_scripts.statistics import arms as am
from workflow_scripts.statistics import summary
from workflow_scripts.statistics.mismatch_report import gaps_by_arm

ARMS = am.arms_block(SPECS, list(SPECS))


def _comp(ratio: float, lo: float, hi: float) -> dict:
    return {"status": "ok", "ratio": ratio, "ratio_ci": [lo, hi]}


def _by_arm(finding: str, drift: str, agree: bool | None) -> dict:
    verdict = {"larger": "supported", "smaller": "contradicted"}.get(finding, "inconclusive")
    return {
        "verdict": verdict,
        "finding": finding,
        "matched_drift": {"scale": "log KL", "finding": drift, "ratio": 4.9, "ratio_ci": [1.9, 12.0]},
        "scales_agree": agree,
        "twins": {"fp32_twin": {"ratio": 1.3, "ratio_ci": [0.5, 3.1]}},
    }


def base_stats() -> dict:
    """A passed gate, the bundle taken apart (the stall carries most), every variance inconclusive."""
    c = {"status": "ok", "p": 0.5}
    contrast = lambda m: {**c, "mean": m, "ci": [m - 0.02, m + 0.02]}  # noqa: E731
    others = [a for a in SPECS if a not in ("fp32", "fp32_twin")]
    comps = {a: _comp(1.1, 0.4, 3.0) for a in SPECS}
    return {
        "reference": "fp32",
        "config": {"alpha": 0.05},
        "arms": ARMS,
        "gate": {"passed": True, "arm": "fp32", "mean": 0.313, "se": 0.005, "n_seeds": 8},
        "decomposition": {
            "status": "ok",
            "reference": "fp32",
            "main_effects": {
                "bf16": {"effect": ARMS["bf16"]["effects"][0], "on_task_dJ": contrast(-0.089)},
                "fp32_drop": {"effect": "dropout 0.1", "on_task_dJ": contrast(-0.078)},
                "bf16_sr": {"effect": ARMS["bf16_sr"]["effects"][0], "on_task_dJ": contrast(-0.003)},
            },
            "bundles": {
                "bf16_drop": {
                    "status": "ok",
                    "on_task_dJ": {
                        "bundle": contrast(-0.19),
                        "parts": {"bf16": contrast(-0.089), "fp32_drop": contrast(-0.078)},
                        "interaction": {**contrast(-0.023), "p": 0.3},
                        "largest_part": "bf16",
                    },
                }
            },
        },
        "mixed_model": {"off_task": {q: {"comparisons": dict(comps)} for q in ("dJ", "kl")}},
        "verdicts": {
            h: {"by_arm": {a: _by_arm("inconclusive", "inconclusive", None) for a in others}}
            for h in ("H2", "H3")
        },
        "controls": {"fp32_twin": {"kind": "negative", "passed": True}},
    }


def sentences(s: dict) -> list[str]:
    out = summary.summary_sentences(s)
    assert all(x.endswith(".") for x in out)
    return out


def test_the_summary_names_the_arms_the_largest_effect_and_the_factor_that_carries_it():
    out = sentences(base_stats())
    assert 3 <= len(out) <= 8
    assert out[0].startswith("Arms, each against the reference fp32")
    assert "bf16_drop = rounding stall (bf16 masters, round-to-nearest) + dropout 0.1 (a bundle)" in out[0]
    assert "fp32_twin = fp32 again with other seeds (a null twin)" in out[0]
    assert out[1].startswith("Training worked: fp32's on-task dJ is +0.313")
    largest = out[2]
    assert "bf16_drop's: dJ -0.19 [-0.21, -0.17]" in largest
    assert "rounding stall (bf16 masters, round-to-nearest) carries the most" in largest
    assert "the parts add up" in largest
    assert any("the null twin fp32_twin gets 1.3x [0.5, 3.1]" in x for x in out)
    assert out[-1].startswith("The null twin (fp32_twin) is not called larger")


def test_a_failed_gate_says_nothing_is_testable_and_stops_there():
    s = base_stats()
    s["gate"] = {"passed": False, "reason": "fp32 on-task dJ -0.01 ± 0.02"}
    for v in s["verdicts"].values():
        for b in v["by_arm"].values():
            b.update(verdict="not testable", finding="not testable")
    out = sentences(s)
    assert "every verdict is 'not testable'" in out[1] and "fp32 on-task dJ -0.01" in out[1]
    assert not any("Seed variance" in x or "null twin (" in x for x in out)


def test_smaller_only_in_absolute_terms_is_said_with_what_not_to_conclude():
    s = base_stats()
    s["verdicts"]["H3"]["by_arm"]["bf16_drop"] = _by_arm("smaller", "inconclusive", None)
    s["mixed_model"]["off_task"]["kl"]["comparisons"]["bf16_drop"] = _comp(0.02, 0.009, 0.049)
    out = " ".join(sentences(s))
    assert "smaller for bf16_drop (0.02x [0.009, 0.049])" in out
    assert "bf16_drop's off-task KL is smaller only in absolute terms, inconclusive at matched drift" in out
    assert "Do not read a smaller absolute variance as more stable training" in out
    assert "bf16_drop also learns less on-task" in out


def test_scales_that_disagree_are_flagged():
    s = base_stats()
    s["verdicts"]["H3"]["by_arm"]["bf16_drop"] = _by_arm("smaller", "larger", False)
    out = " ".join(sentences(s))
    assert "The scales disagree: bf16_drop's off-task KL is smaller in absolute terms but larger at " in out
    assert "log KL ratio 4.9x [1.9, 12]" in out


def test_a_larger_finding_and_a_failed_null_twin_are_both_said():
    s = base_stats()
    s["verdicts"]["H2"]["by_arm"]["fp32_drop"] = _by_arm("larger", "larger", True)
    s["mixed_model"]["off_task"]["dJ"]["comparisons"]["fp32_drop"] = _comp(2.73, 1.35, 5.05)
    s["controls"]["fp32_twin"]["passed"] = False
    out = sentences(s)
    assert any("larger for fp32_drop (2.73x [1.35, 5.05])" in x for x in out)
    assert out[-1].startswith("The null twin fp32_twin was called larger than the reference")
    assert len(out) <= 8


def test_without_arm_descriptions_or_decomposition_the_summary_still_reads():
    s = copy.deepcopy(base_stats())
    del s["arms"], s["decomposition"]
    out = sentences(s)
    assert out[0].startswith("Training worked") and len(out) >= 3


def test_the_summary_of_a_real_analysis_reads_its_numbers_from_stats():
    """analyze() on a table with planted effects (stall -0.09, dropout -0.08, additive): the summary says
    the bundle's on-task effect with the interval stats.json has and that the stall carries the most."""
    t = table().rename(columns={"noise": "eval_noise_var", "kl": "kl_rb", "kl_var": "kl_rb_mc_var"})
    cfg = {"bootstrap": 50, "power_simulations": 0, "permutations": 50}
    out = stats.json_safe(stats.analyze(t, cfg, precisions=SPECS))
    text = " ".join(summary.summary_sentences(out))
    bundle = out["decomposition"]["bundles"]["bf16_drop"]["on_task_dJ"]["bundle"]
    assert f"bf16_drop's: dJ {summary._effect(bundle)}" in text
    assert bundle["ci"][0] < 2 * STALL < bundle["ci"][1] + 0.03
    assert "rounding stall (bf16 masters, round-to-nearest) carries the most" in text
    assert re.search(r"Seed variance of off-task KL .*null twin fp32_twin gets", text)
    for h in ("H2", "H3"):
        for b in out["verdicts"][h]["by_arm"].values():
            assert b["scale"] == "absolute" and b["matched_drift"]["scale"].startswith("off-task")
            assert b["finding"] in ("larger", "smaller", "inconclusive") or b["finding"].startswith(
                "not larger"
            )
    assert np.isfinite(out["mixed_model"]["off_task"]["log_kl"]["comparisons"]["bf16"]["ratio"])
    report_md = summary.arms_section(out) + summary.decomposition_section(out)
    assert "| **bf16_drop** | bundle | bf16 round-to-nearest |" in report_md
    assert "| interaction | bf16_drop − (bf16 + fp32_drop) + 1 x fp32 |" in report_md


def test_a_largest_effect_whose_interval_contains_zero_is_said_to_be_none():
    s = base_stats()
    s["decomposition"] = {
        "status": "ok",
        "reference": "fp32",
        "main_effects": {
            "bf16_sr": {
                "effect": ARMS["bf16_sr"]["effects"][0],
                "on_task_dJ": {"status": "ok", "mean": -0.002, "ci": [-0.008, 0.003], "p": 0.4},
            }
        },
        "bundles": {},
    }
    (largest,) = [x for x in sentences(s) if x.startswith("The largest on-task effect")]
    assert "bf16_sr's: dJ -0.002 [-0.008, 0.003]" in largest
    assert "its interval contains 0: no arm changes the on-task mean detectably" in largest


def test_each_arm_says_where_its_sampler_trainer_gap_comes_from():
    """The report's per-arm gaps (``gaps_by_arm`` of a metrics table, setups from the arms' config
    entries) in the arms sentence: a dropout arm's gap is said to be dropout's, not numerics; a vLLM
    reference's is numerics; an arm whose numerics predict no gap and that has none says nothing."""
    gaps = {"fp32": 0.0, "bf16_drop": 0.574, "bf16": 0.0, "fp32_drop": 0.55, "bf16_sr": 0.0, "fp32_twin": 0.0}
    rows = [
        {"run": f"{arm}-s1", "precision": arm, "seed": 1, "repeat": 1, "task": task,
         "sampler_gap_mean": gap, "sampler_gap_outside_clip": 0.36 if gap else 0.0}
        for arm, gap in gaps.items() for task in ("add_sub", "mul")
    ]  # fmt: skip
    setups = {f"{arm}-s1": am.arm_setup(SPECS[arm]) for arm in SPECS}
    by_arm = gaps_by_arm(pd.DataFrame(rows), list(SPECS), setups)
    s = base_stats()
    out = summary.summary_sentences(s, by_arm)
    assert len(out) == len(sentences(s))  # the gaps add no sentence
    arms = out[0]
    assert (
        "bf16_drop = rounding stall (bf16 masters, round-to-nearest) + dropout 0.1 (a bundle; mean "
        "sampler-trainer gap 0.574 nats, 36% of tokens outside the clip range, from dropout (train-mode "
        "loss, eval-mode sampler), not numerics)" in arms
    )
    assert "fp32_drop = dropout 0.1 (mean sampler-trainer gap 0.55 nats, 36% of tokens" in arms
    assert "bf16 = rounding stall (bf16 masters, round-to-nearest);" in arms  # none expected, none seen
    assert "fp32_twin = fp32 again with other seeds (a null twin)." in arms
    vllm = {run: {**v, "backend": "vllm"} for run, v in setups.items()}
    by_arm = gaps_by_arm(pd.DataFrame(rows).assign(sampler_gap_mean=5.5e-7, sampler_gap_outside_clip=0.0),
                         list(SPECS), vllm)  # fmt: skip
    arms = summary.arms_sentence(s, by_arm)
    assert arms.startswith(
        "Arms, each against the reference fp32 (fp32 masters, dropout 0; mean sampler-trainer gap 5.5e-07 "
        "nats, from numerics)"
    )
    assert "outside the clip range" not in arms and "from numerics and dropout" in arms
    setups["bf16-s1"] = None  # a run.json without its setup: nothing is claimed for it
    assert "bf16 = rounding stall (bf16 masters, round-to-nearest);" in summary.arms_sentence(
        s, gaps_by_arm(pd.DataFrame(rows), list(SPECS), setups)
    )
