"""bench/readme_answer.py: the README's answer is the script's output on the example report, and the script
reads the report format that workflow_scripts/report.py writes now (a synthetic report made by its code)."""

from __future__ import annotations

import copy
import sys

import pytest
from conftest import REPO, bench_module

sys.path.insert(0, str(REPO / "tests" / "statistics"))  # the summary tests' stats.json fixture
from test_summary import _comp, base_stats

from workflow_scripts import report
from workflow_scripts.statistics import summary

readme_answer = bench_module("readme_answer")


def test_the_readme_block_is_the_scripts_answer_on_the_example_report():
    block = readme_answer.block((REPO / "README.md").read_text())
    assert block is not None, "README.md has no generated block of bench/readme_answer.py"
    expected = readme_answer.answer(readme_answer.REPORT.read_text())
    assert block == expected, "README's answer is stale: run python bench/readme_answer.py --write"


def synthetic_stats() -> dict:
    """The summary tests' stats with what the verdict table reads: arms, scopes, a twin, one 'larger'."""
    s = copy.deepcopy(base_stats())
    s["precisions"] = ["fp32", "bf16_drop", "bf16", "fp32_drop", "bf16_sr"]
    s["decomposition"]["bundles"]["bf16_drop"]["effects"] = s["arms"]["bf16_drop"]["effects"]
    for scope in s["mixed_model"]["off_task"].values():
        for comp in scope["comparisons"].values():
            comp["power"] = {**comp["power"], "r0": 2.0, "power_at_r0": 0.2}
    for h, (role, q) in {"H1": ("on_task", "dJ"), "H2": ("off_task", "dJ"), "H3": ("off_task", "kl")}.items():
        s["verdicts"].setdefault(h, {"by_arm": {}})["scope"] = {"role": role, "quantity": q}
    twin = {"fp32_twin": {"ratio": 1.3, "ratio_ci": [0.5, 3.1]}}
    for h in ("H2", "H3"):
        for by_arm in s["verdicts"][h]["by_arm"].values():
            by_arm["twins"] = twin
    s["verdicts"]["H3"]["by_arm"]["fp32_drop"].update(finding="larger", verdict="supported")
    s["mixed_model"]["off_task"]["kl"]["comparisons"]["fp32_drop"].update(_comp(4.2, 1.6, 11.0))
    return s


def synthetic_report(s: dict) -> str:
    seeds = ", ".join(f"{a} {n}" for a, n in s["n"]["seeds"].items())
    head = f"# report\n\nReference arm **fp32**; Seeds per arm (after exclusions): {seeds}.\n"
    parts = [head, summary.summary_section(s), report.gate_section(s), report.verdict_section(s),
             summary.decomposition_section(s)]  # fmt: skip
    return "\n".join(parts)


def test_the_answer_reads_the_format_report_py_writes_now():
    text = synthetic_report(synthetic_stats())
    means, variance, detect = readme_answer.answer(text).splitlines()
    assert means.startswith("Training works (fp32's on-task dJ +0.313 ± 0.005 SE, 16 seeds); against fp32")
    assert (
        "stall + dropout (bf16_drop, the source experiment's bf16 arm) -0.19 / -0.02 (interval holds 0)"
        in means
    )
    assert "stall (bf16) -0.089 / -0.01 (interval holds 0)" in means
    assert "SR noise (bf16_sr)" in means and "dropout (fp32_drop)" in means
    assert variance.startswith("Seed variance found larger than fp32's: fp32_drop on H3")
    assert "fp32_drop inconclusive (1.1x) / larger (4.2x)" in variance
    assert "a null twin, fp32 again with other seeds, gets 1.3 [0.5, 3.1]" in variance
    assert detect.startswith("With 8 seeds per arm against 16 of fp32, this run detects only")
    assert "ratios of 6x or more at 80% power" in detect
    assert (
        "(`config.decisive.yaml`, 48 seeds per arm, measured MDE 2x, answers the variance questions)"
        in detect
    )
    assert "shipped base model" in detect and "miniature scale" in detect


def test_without_a_larger_finding_the_answer_says_none_is_found_larger():
    s = synthetic_stats()
    s["verdicts"]["H3"]["by_arm"]["fp32_drop"].update(finding="inconclusive", verdict="inconclusive")
    variance = readme_answer.answer(synthetic_report(s)).splitlines()[1]
    assert variance.startswith(
        "No arm's seed variance (the spread across training seeds) of off-task dJ or KL"
    )


def test_a_report_without_its_tables_is_refused_by_name():
    with pytest.raises(readme_answer.ReportError, match="reference gain"):
        readme_answer.answer("# report\n\n## What this run says\n\n- nothing\n")
    text = synthetic_report(synthetic_stats())
    no_table = text.replace("## Which factor did what", "## Something else")
    with pytest.raises(readme_answer.ReportError, match="decomposition"):
        readme_answer.answer(no_table)


def test_write_replaces_only_the_block(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"# t\n\nbefore\n{readme_answer.START}\nold\n{readme_answer.END}\nafter\n")
    readme_answer.write(readme, "new answer")
    assert (
        readme.read_text()
        == f"# t\n\nbefore\n{readme_answer.START}\nnew answer\n{readme_answer.END}\nafter\n"
    )
    assert readme_answer.block(readme.read_text()) == "new answer"
