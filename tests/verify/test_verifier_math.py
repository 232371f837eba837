"""The ``math`` kind agrees with Math-Verify's own test cases, and its two project rules hold.

tests/data/math_verify_cases.json vendors every gold/prediction case of Math-Verify's tests/
folder (huggingface/Math-Verify@5d148cf: test_all.py, test_boxed.py, test_numina_cases.py,
test_open_thoughts.py, test_strict.py, test_yujianll.py; 270 cases) with the settings that test uses
and the test's verdict as the expected value.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workflow_scripts.verify import math_rule as VM
from workflow_scripts.verify.verifiers import verify_batch, verify_one

DATA = json.loads((Path(__file__).resolve().parents[1] / "data" / "math_verify_cases.json").read_text())
CASES = DATA["cases"]
DEFAULT_COMPARISON = {"float_rounding": 6, "strict": True, "allow_set_relation_comp": False}


def _uses_defaults(case: dict) -> bool:
    """Default extraction targets and comparison (its box priority 0 vs 50 changes no verdict)."""
    s = case["settings"]
    return s["extraction"] == ["latex", "expr"] and all(s[k] == v for k, v in DEFAULT_COMPARISON.items())


def _disagreements(cases: list[dict], settings_of) -> list:
    groups: dict[str, list[dict]] = {}
    for c in cases:  # one batch per settings value, checked two at a time
        groups.setdefault(json.dumps(settings_of(c), sort_keys=True), []).append(c)
    out = []
    for key, group in groups.items():
        verdicts = verify_batch(
            "math", [c["pred"] for c in group], [c["gold"] for c in group], timeout=30.0, workers=2,
            settings={"math": json.loads(key)},
        )  # fmt: skip
        for c, v in zip(group, verdicts, strict=True):
            if v.correct != c["expected"] or v.status not in ("ok", "no_answer"):
                out.append((c["test"], c["gold"][:80], c["pred"][-120:], c["expected"], v))
    return out


def test_the_vendored_table_is_the_whole_suite():
    assert DATA["commit"] == "5d148cfaaf99214c2e4ffb4bc497ab042c592a7a"
    assert len(CASES) == 270
    assert sum(c["expected"] for c in CASES) == 232 and sum(not c["expected"] for c in CASES) == 38


@pytest.mark.slow
def test_every_default_settings_case_agrees_with_default_settings():
    cases = [c for c in CASES if _uses_defaults(c)]
    assert len(cases) == 149
    assert _disagreements(cases, lambda c: {}) == []


def test_every_case_agrees_when_the_task_sets_the_tests_options():
    cases = [c for c in CASES if not _uses_defaults(c)]
    assert len(cases) == 121
    assert _disagreements(cases, lambda c: c["settings"]) == []


def test_non_default_cases_need_their_options():
    """The options are real: at math-verify's defaults, these cases' verdicts flip."""
    flipped = {
        ("$9$", "Answer $ \n 9 \n $"),  # latex-only: expr would read the 9
        ("$f(x)$", "$f(y)$"),  # strict=False
        ("$x \\in [-2,7]$", "$-2 \\\\le x \\\\le 7$"),  # allow_set_relation_comp
        ("$(\\frac{3}{5},\\frac{8}{3}]$", "$(0.6,2.6667]$"),  # float_rounding=2
    }
    cases = [c for c in CASES if (c["gold"], c["pred"]) in flipped and not _uses_defaults(c)]
    cases = [c for c in cases if c["expected"]] + [c for c in cases if c["pred"] == "Answer $ \n 9 \n $"]
    assert len(cases) == 4
    assert len(_disagreements(cases, lambda c: {})) == 4


# ------------------------------------------------------------------- the project's own rules
# (completion, gold, expected, why): every intended difference from math-verify alone is a row.

PROJECT_RULES = [
    ("\\boxed{46} wait, \\boxed{47}", "47", True, "one-value gold: the last box counts (MV: {46, 47})"),
    ("\\boxed{46} wait, \\boxed{47}", "46", False, "a corrected answer stays corrected"),
    ("\\boxed{47} wait, \\boxed{46}", "47", False, "the last box counts, not any box"),
    ("first \\boxed{3}, then correcting: \\boxed{5}", "5", True, "same with text between boxes"),
    ("$$\\boxed{k = 45} \\quad \\text{and} \\quad \\boxed{n = 2}$$", "k = 45, n = 2", True,
     "several-part gold: the boxes together"),
    ("$$\\boxed{k = 45} \\quad \\text{and} \\quad \\boxed{n = 3}$$", "k = 45, n = 2", False, "one wrong"),
    ("The roots are \\boxed{-2} and \\boxed{1}.", "-2,1", True, "bare MATH-500 gold -2,1 is two roots"),
    ("The roots are \\boxed{-2} and \\boxed{3}.", "-2,1", False, "wrong second root"),
    ("\\boxed{-2,1}", "-2,1", True, "the set in one box"),
    ("\\boxed{1.22}", "1,22", True, "no set reading of 1,22 unless the prediction is a set"),
    ("\\boxed{1.23}", "1,22", False, "the number reading still compares values"),
    ("\\boxed{-2.1}", "-2,1", True, "leniency: an ambiguous gold also accepts its number reading"),
    ("so \\boxed{200}. Final Answer: The final answer is $10,455$. I hope it is correct.", "10455", True,
     "a closing 'final answer is' outranks an earlier box"),
    ("so \\boxed{200}. Final Answer: The final answer is $10,455$. I hope it is correct.", "200", False,
     "the earlier box is not the answer"),
    ("\\boxed{10,455}", "10,455", True, "bare thousands gold is a number"),
    ("\\boxed{\\frac{14}{3}}", "\\frac{14}{3}", True, "bare LaTeX gold is read as $gold$"),
    ("\\boxed{(3, \\frac{\\pi}{2})}", "\\left( 3, \\frac{\\pi}{2} \\right)", True, "bare tuple gold"),
    ("\\boxed{3\\sqrt{13}}", "3\\sqrt{13}", True, "bare gold starting with a digit is not just the digit"),
    ("\\boxed{3}", "3\\sqrt{13}", False, "... so 3 is wrong"),
]  # fmt: skip


@pytest.mark.parametrize(("completion", "gold", "expected", "why"), PROJECT_RULES)
def test_project_rule(completion, gold, expected, why):
    v = verify_one("math", completion, gold, timeout=30.0)
    assert (v.correct, v.status) == (expected, "ok"), why


def test_math_settings_are_checked_and_reach_the_worker():
    with pytest.raises(ValueError, match="extraction"):
        VM.MathSettings(extraction=("latex", "words"))
    with pytest.raises(ValueError, match="unknown option"):
        verify_one("math", "\\boxed{1}", "1", settings={"math": {"precision": 2}})
    # float_rounding changes the verdict, so it must arrive in the worker
    two = {"math": {"float_rounding": 2}}
    assert verify_one("math", "$(0.6,2.6667]$", "$(\\frac{3}{5},\\frac{8}{3}]$", settings=two).correct
    assert not verify_one("math", "$(0.6,2.6667]$", "$(\\frac{3}{5},\\frac{8}{3}]$").correct


def test_the_last_box_stays_in_view_and_a_huge_one_is_not_checked():
    filler = " and so on" * 3000  # 30k characters after the box: beyond math-verify's window
    assert verify_one("math", "\\boxed{5}" + filler, "5", timeout=30.0).correct
    assert not verify_one("math", "\\boxed{6}" + filler, "5", timeout=30.0).correct
    huge = "\\boxed{" + "\\frac{1}{" * 3000 + "2" + "}" * 3000 + "}"  # = 2; its innermost part is 1/2
    v = verify_one("math", huge, "\\frac{1}{2}", timeout=30.0)
    assert (v.correct, v.status) == (False, "error")
