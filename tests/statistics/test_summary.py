""" "What this run says": bullets generated from stats.json, for each pattern (failed gate, carries the most
shown or not, smaller with and without the movement-matched comparison, inconclusive after Holm, no
yardstick), and from a real analysis."""

from __future__ import annotations

import copy
import re

import pandas as pd
from test_decompose import SPECS, table

from workflow_scripts import stats
from workflow_scripts.statistics import arms as am
from workflow_scripts.statistics import summary
from workflow_scripts.statistics.mismatch_report import gaps_by_arm

ARMS = am.arms_block(SPECS, list(SPECS))


def _comp(ratio: float, lo: float, hi: float) -> dict:
    return {"status": "ok", "ratio": ratio, "ratio_ci": [lo, hi]}


YARD = {"status": "ok", "q05": 0.41, "q95": 2.6, "share_as_extreme": 0.3, "splits": 200}
POWER = {"status": "ok", "target": 0.8, "mde_ratio": 6.0, "seeds_needed_r0": 32, "max_seeds": 128}


def _by_arm(finding: str, holm_p: float | None = None, reason: str = "") -> dict:
    verdict = {"larger": "supported", "smaller": "contradicted"}.get(finding, "inconclusive")
    return {
        "verdict": verdict,
        "finding": finding,
        "reason": reason,
        "holm_p": holm_p,
        "yardstick": YARD,
        "twins": {},
    }


def base_stats() -> dict:
    """A passed gate, the bundle taken apart (the stall shown to carry most), every variance
    inconclusive, a 16-seed reference (yardstick) and 8-seed arms."""
    c = {"status": "ok", "p": 0.5}
    contrast = lambda m: {**c, "mean": m, "ci": [m - 0.02, m + 0.02]}  # noqa: E731
    others = [a for a in SPECS if a not in ("fp32", "fp32_twin")]
    comps = {a: {**_comp(1.1, 0.4, 3.0), "power": POWER, "yardstick": YARD} for a in others}
    diff = {"first": "bf16", "second": "fp32_drop", **contrast(0.03)}
    return {
        "reference": "fp32",
        "config": {
            "alpha": 0.05,
            "variance_ratio_margin": 2.0,
            "decisive": {"config": "config.decisive.yaml", "seeds": 48, "mde_ratio": 2.0},
        },
        "n": {"seeds": {"fp32": 16, **{a: 8 for a in others}}},
        "primary": {"family_size": 8},
        "arms": ARMS,
        "gate": {"passed": True, "arm": "fp32", "mean": 0.313, "se": 0.005, "n_seeds": 16},
        "decomposition": {
            "status": "ok",
            "reference": "fp32",
            "quantities": {
                "on_task_dJ": "on-task dJ",
                "off_task_dJ": "off-task dJ",
                "off_task_log_kl": "log off-task KL",
            },
            "main_effects": {
                "bf16": {
                    "effect": ARMS["bf16"]["effects"][0],
                    "on_task_dJ": contrast(-0.089),
                    "off_task_dJ": contrast(-0.01),
                },
                "fp32_drop": {"effect": "dropout 0.1", "on_task_dJ": contrast(-0.058)},
                "bf16_sr": {"effect": ARMS["bf16_sr"]["effects"][0], "on_task_dJ": contrast(-0.003)},
            },
            "bundles": {
                "bf16_drop": {
                    "status": "ok",
                    "parts": {"masters": "bf16", "dropout": "fp32_drop"},
                    "on_task_dJ": {
                        "bundle": contrast(-0.19),
                        "parts": {"bf16": contrast(-0.089), "fp32_drop": contrast(-0.058)},
                        "interaction": {**contrast(-0.023), "p": 0.3},
                        "largest_part": "bf16",
                        "part_differences": {"bf16|fp32_drop": diff},
                        "carries_most": {"arm": "bf16", "supported": True},
                    },
                    "off_task_dJ": {"bundle": contrast(-0.02), "interaction": contrast(-0.011)},
                    "off_task_log_kl": {"bundle": contrast(-2.1), "interaction": contrast(-0.54)},
                }
            },
        },
        "mixed_model": {"off_task": {q: {"comparisons": copy.deepcopy(comps)} for q in ("dJ", "kl")}},
        "verdicts": {h: {"by_arm": {a: _by_arm("inconclusive") for a in others}} for h in ("H2", "H3")},
        "controls": {},
    }


def sentences(s: dict) -> list[str]:
    out = summary.summary_sentences(s)
    assert all(x.endswith(".") for x in out)
    return out


def test_the_summary_is_bullets_in_the_issue_order_with_short_factor_names():
    out = sentences(base_stats())
    assert 5 <= len(out) <= 8
    assert out[0] == (
        "What this run can detect: at 8 seeds per arm against 16 of fp32, the smallest off-task "
        "seed-variance ratio found with 80% power is 6x (Holm over the 8 variance claims of the primary "
        "family); the variance questions are answered by `config.decisive.yaml` (48 seeds per arm, "
        "measured MDE 2x)."
    )
    assert out[1].startswith("Training worked (fp32 on-task dJ +0.313 ± 0.005 SE, 16 seeds). Mean dJ")
    assert "stall (bf16) -0.089 [-0.109, -0.069] / -0.01 [-0.03, 0.01]" in out[1]
    assert "SR noise (bf16_sr) -0.003" in out[1] and "dropout (fp32_drop) -0.058" in out[1]
    assert "stall + dropout (bf16_drop) -0.19 [-0.21, -0.17]" in out[1]
    assert out[2] == (
        "Which factor carries the most, tested as the difference of their effects: bf16_drop on-task: "
        "stall carries the most (|stall| − |dropout| +0.03 [0.01, 0.05])."
    )
    assert out[3] == (
        "Interaction [95% CI]: bf16_drop − stall − dropout: on-task -0.023 [-0.043, -0.003], off-task "
        "-0.011 [-0.031, 0.009], log KL -0.54 [-0.56, -0.52]."
    )
    assert out[4].startswith("Seed variance of off-task dJ against fp32 (H2, absolute scale, Holm over 8): ")
    assert "bf16_drop inconclusive, 1.1x [0.4, 3] (chance [0.41, 2.6]x, 0.3 of splits as extreme)" in out[4]
    assert out[5].startswith("Seed variance of off-task KL")
    assert out[-1] == (
        "Seeds per arm needed to find a 2x ratio with 80% power: off-task dJ 32; off-task KL 32."
    )
    assert not any("add up" in x or "matched drift" in x for x in out)


def test_carries_the_most_is_not_said_where_the_difference_is_not_shown():
    s = base_stats()
    b = s["decomposition"]["bundles"]["bf16_drop"]["on_task_dJ"]
    b["part_differences"]["bf16|fp32_drop"].update(mean=0.003, ci=[-0.01, 0.016])
    b["carries_most"] = {"arm": "bf16", "supported": False}
    out = " ".join(sentences(s))
    assert "carries the most (" not in out
    assert (
        "bf16_drop on-task: no factor is shown to carry more (|stall| − |dropout| +0.003 [-0.01, 0.016])"
        in out
    )


def test_a_failed_gate_says_nothing_is_testable_and_stops_there():
    s = base_stats()
    s["gate"] = {"passed": False, "reason": "fp32 on-task dJ -0.01 ± 0.02"}
    for v in s["verdicts"].values():
        for b in v["by_arm"].values():
            b.update(verdict="not testable", finding="not testable")
    out = sentences(s)
    assert len(out) == 2 and "every verdict is 'not testable'" in out[1]
    assert not any("Seed variance" in x for x in out)


def test_smaller_is_read_against_the_movement_matched_comparison_or_says_it_is_missing():
    s = base_stats()
    s["verdicts"]["H3"]["by_arm"]["bf16_drop"] = _by_arm("smaller")
    s["mixed_model"]["off_task"]["kl"]["comparisons"]["bf16_drop"].update(_comp(0.02, 0.009, 0.049))
    out = " ".join(sentences(s))
    assert "bf16_drop smaller, 0.02x [0.009, 0.049]" in out
    assert "the movement-matched comparison is not available in this run" in out
    at = {"status": "ok", "step": "6", "kl_ratio": 0.99}  # statistics.matched.matched's shape
    yard = {"status": "ok", "q05": 0.43, "q95": 2.5, "share_as_extreme": 0.155}  # splits at the matched step
    s["matched"] = {"status": "ok", "arms": {"bf16_drop": {
        "match": at, "dJ": {"status": "ok", "finding": "inconclusive", "ratio": 0.6, "ratio_ci": [0.26, 1.6],
                            "yardstick": yard},
        "kl": {"status": "ok", "finding": "smaller", "ratio": 0.2, "ratio_ci": [0.08, 0.58]}}}}  # fmt: skip
    out = " ".join(sentences(s))
    assert "bf16_drop (reference at step 6, KL ratio 0.99): off-task dJ inconclusive, 0.6x [0.26, 1.6] " \
        "(chance [0.43, 2.5]x, 0.15 of splits as extreme); off-task KL still smaller, 0.2x [0.08, 0.58] " \
        "(no yardstick)." in out  # fmt: skip
    s["verdicts"]["H2"]["by_arm"]["bf16_drop"] = _by_arm("smaller")
    out = " ".join(sentences(s))
    assert "off-task dJ inconclusive, 0.6x [0.26, 1.6] (chance [0.43, 2.5]x, 0.15 of splits as extreme): " \
        "not shown smaller once movement is matched" in out  # fmt: skip
    s["matched"]["arms"]["bf16_drop"]["match"] = {"status": "skipped", "reason": "no positive mean"}
    assert "bf16_drop not compared (no positive mean)" in " ".join(sentences(s))


def test_an_inconclusive_not_after_holm_gives_its_adjusted_p_and_no_yardstick_is_said():
    s = base_stats()
    s["verdicts"]["H2"]["by_arm"]["fp32_drop"] = _by_arm(
        "inconclusive", 0.056, "...; its interval lies above 1 uncorrected, but not after Holm ..."
    )
    why = "the reference has 8 seeds, fewer than twice the arm's 8: no null yardstick"
    s["verdicts"]["H2"]["by_arm"]["fp32_drop"]["yardstick"] = {"status": "skipped", "reason": why}
    out = " ".join(sentences(s))
    assert "fp32_drop inconclusive (not after Holm, adjusted p 0.056), 1.1x [0.4, 3] (no yardstick: the " \
        "reference has 8 seeds, fewer than twice the arm's 8)" in out  # fmt: skip


def test_without_arm_descriptions_or_decomposition_the_summary_still_reads():
    s = copy.deepcopy(base_stats())
    del s["arms"], s["decomposition"]
    out = sentences(s)
    assert out[1].startswith("Training worked") and 4 <= len(out) <= 8


def test_the_summary_of_a_real_analysis_reads_its_numbers_from_stats():
    """analyze() on a table with planted effects (stall -0.09, dropout -0.08, additive, 10 seeds a arm,
    20 of the reference): bullets with stats.json's intervals, the stall shown to carry the most, the
    null yardstick beside every variance ratio."""
    t = table(n_seeds=20).rename(columns={"noise": "eval_noise_var", "kl": "kl_rb", "kl_var": "kl_rb_mc_var"})
    t = t[(t["precision"] == "fp32") | (t["seed"] <= 10)]
    cfg = {"bootstrap": 50, "power_simulations": 0, "null_splits": 30}
    out = stats.json_safe(stats.analyze(t, cfg, precisions=SPECS))
    bullets = summary.summary_sentences(out)
    assert 5 <= len(bullets) <= 8
    text = " ".join(bullets)
    bundle = out["decomposition"]["bundles"]["bf16_drop"]["on_task_dJ"]["bundle"]
    assert f"stall + dropout (bf16_drop) {summary._effect(bundle)}" in text
    assert "bf16_drop on-task: stall carries the most" in text
    assert re.search(r"Seed variance of off-task KL .*bf16_drop \w.*\(chance \[", text)
    for h in ("H2", "H3"):
        for b in out["verdicts"][h]["by_arm"].values():
            assert b["scale"] == "absolute" and "matched_drift" not in b
            assert b["yardstick"]["status"] == "ok" and b["yardstick"]["n_ref_seeds"] == 20
    assert out["primary"]["family_size"] == 2 * 4
    assert "log_kl" not in out["mixed_model"]["off_task"]
    report_md = summary.arms_section(out) + summary.decomposition_section(out)
    assert "| **bf16_drop** | bundle | bf16 round-to-nearest |" in report_md
    assert "| interaction | bf16_drop − (bf16 + fp32_drop) + 1 x fp32 |" in report_md


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
    arms = summary.arms_sentence(s, by_arm)
    assert arms in summary.arms_section(s, by_arm)  # said under the arm table, not in the bullets
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
