"""report.md's learning-curves section says, per arm, the first step at which the curves part with its
resolution and bootstrap, or that they do not differ at any measured step, and flags an odd step-0 spread."""

from __future__ import annotations

from workflow_scripts.statistics.curve_report import first_differ_text, learning_curves_section

BOOT = {"n": 200, "level": 0.95, "ci_low": 12, "ci_high": 36, "never_share": 0.05, "share": {}}


def block(step, after=None, p=None, boot=BOOT) -> dict:
    by_step = [{"step": s, "diff": 0.06 * (s >= 24), "ci_low": 0.01, "ci_high": 0.1, "p": 0.001,
                "ratio": 3.0, "ratio_ci_low": 1.5, "ratio_ci_high": 6.0, "ratio_raw": 2.5}
               for s in (12, 24, 36, 48)]  # fmt: skip
    first = {"step": step, "after_step": after, "p": p, "bootstrap": boot}
    return {"status": "ok", "ci_level": 0.9875, "by_step": by_step, "first_differ": first}


def test_the_first_step_reads_with_its_resolution_and_bootstrap():
    text = first_differ_text(block(24, 12, 0.001))
    assert text == ("step 24 (parted in (12, 24], p 0.001; seed bootstrap 95%: 12 to 36; never in 5% of 200 "
                    "resamples)")  # fmt: skip
    never = {**BOOT, "ci_low": 48, "ci_high": None, "never_share": 0.6}
    assert first_differ_text(block(None, boot=never)) == (
        "do not differ at any measured step (seed bootstrap 95%: 48 to never; never in 60% of 200 resamples)"
    )
    assert (
        first_differ_text({"status": "skipped", "reason": "no off-task task"})
        == "not tested (no off-task task)"
    )


def test_the_section_tables_each_arm_and_checks_step_zero():
    curves = {
        "reference": "fp32", "steps": [0, 12, 24, 36, 48], "tested_steps": [12, 24, 36, 48],
        "level_per_step": 0.0125,
        "comparisons": {"bf16": {"on_task_mean": block(24, 12, 0.001), "off_task_variance": block(None)}},
        "noise_check": {"fp32": {"on_task": {"ratio": 1.1}, "off_task": {"ratio": 0.9}},
                        "bf16": {"on_task": {"ratio": 0.0}, "off_task": {"ratio": 1.0}}},
    }  # fmt: skip
    text = learning_curves_section(curves)
    assert text.startswith("## Learning curves") and "alpha / 4 = 0.0125" in text
    assert "| bf16 | step 24 (parted in (12, 24]" in text and "| do not differ at any measured step" in text
    assert "| bf16 | step 24: 0.06 [0.01, 0.1] (98.8%) | step 48: ratio 3 [1.5, 6] (98.8%), raw 2.5 |" in text
    assert "- fp32: on-task 1.1, off-task 0.9\n" in text
    assert "- bf16: on-task 0, off-task 1 (outside 0.5-2.0 for on-task: near 0" in text
    assert learning_curves_section(None) == "" and learning_curves_section({}) == ""
