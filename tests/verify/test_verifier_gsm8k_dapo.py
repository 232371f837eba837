"""gsm8k agrees with lm-evaluation-harness and dapo with DAPO's training reward (verl), case by case.

Each table's expected verdicts were read off the peer's rule; the peer's own code, copied below
from its source (the oracle), must give the same verdicts, so a table row cannot drift from the peer.
- lm-eval: EleutherAI/lm-evaluation-harness@4e7e0d47f33b, lm_eval/tasks/gsm8k/gsm8k.yaml
  (filter_list, metric_list), lm_eval/filters/extraction.py (RegexFilter.apply),
  lm_eval/api/metrics.py (exact_match_hf_evaluate).
- verl: volcengine/verl@b178a3cd56f5, verl/utils/reward_score/math_dapo.py (compute_score).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from workflow_scripts.verify.verifiers import extract_answer, verify_batch, verify_one

# ------------------------------------------------------------------------------ lm-eval oracle


def _lm_eval_regex_filter(resp: str, regex_pattern: str, group_select: int) -> str:
    """RegexFilter.apply on one response (fallback "[invalid]"), then take_first."""
    match = re.compile(regex_pattern).findall(resp)
    if match:
        match = match[group_select]
        if isinstance(match, tuple):
            match = [m for m in match if m]
            match = match[0] if match else "[invalid]"
        match = match.strip()
    else:
        match = "[invalid]"
    return match


def _lm_eval_exact_match(prediction: str, reference: str) -> bool:
    """exact_match_hf_evaluate with gsm8k.yaml's regexes_to_ignore and ignore_case."""
    for s in [",", "\\$", "(?s).*#### ", "\\.$"]:
        prediction = re.sub(s, "", prediction)
        reference = re.sub(s, "", reference)
    return prediction.lower() == reference.lower()


LM_EVAL_FILTERS = {
    "strict": (r"#### (\-?[0-9\.\,]+)", 0),  # strict-match
    "flexible": (r"(-?[$0-9.,]{2,})|(-?[0-9]+)", -1),  # flexible-extract
}


def lm_eval_gsm8k(completion: str, gold: str, mode: str) -> bool:
    pattern, group = LM_EVAL_FILTERS[mode]
    return _lm_eval_exact_match(_lm_eval_regex_filter(completion, pattern, group), gold)


GSM8K_SOLUTION = (
    "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
    "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72"
)  # openai/gsm8k train[0]'s answer field (what lm-eval uses as the reference)

# (completion, gold, strict-match verdict, flexible-extract verdict)
GSM8K = [
    ("#### -$5", "5", False, False),  # the sign before $ is kept: -5, not 5
    ("#### -$5", "-5", False, True),  # strict's class has no $: no match
    ("$1,000", "1000", False, True),
    ("#### $1,000", "1000", False, True),
    ("#### 1,000", "1000", True, True),
    ("#### -1,234.50", "-1234.50", True, True),
    ("#### -1,234.50", "-1234.5", False, False),  # string match: 1234.50 is not 1234.5
    ("-1,234.50", "-1234.50", False, True),
    ("The answer is 42.", "42", False, True),  # flexible reads "42." and drops the final "."
    ("The answer is 42.", "43", False, False),
    ("#### 42", "42", True, True),
    ("#### 42", "43", False, False),
    ("#### 42.0", "42", False, False),  # string match
    ("#### 13 #### 12", "12", False, True),  # strict takes the first, flexible the last
    ("#### 13 #### 12", "13", True, False),
    ("#### 42\n#### 43", "42", True, False),
    ("####42", "42", False, True),  # strict needs the space
    ("##### 42", "42", True, True),
    ("#### -5", "-5", True, True),
    ("#### -5", "5", False, False),
    ("#### 5", "5", True, True),  # a single digit: flexible's second group
    ("The answer is -5.", "-5", False, True),
    ("It costs $18.", "18", False, True),
    ("The answer is 18 dollars", "18", False, True),
    ("1,234,567 is the answer", "1234567", False, True),
    ("#### 1,234,567", "1,234,567", True, True),
    ("x = 12, y = 13", "13", False, True),
    ("x = 12, y = 13", "12", False, False),
    ("5 apples and 3 pears", "3", False, True),
    ("#### 3.50", "3.5", False, False),
    ("Answer: 1.5e3", "1500", False, False),  # flexible reads the exponent's 3
    ("", "12", False, False),
    ("no numbers here", "12", False, False),
    ("#### twelve", "12", False, False),
    (GSM8K_SOLUTION, "72", True, True),
    ("#### 72", GSM8K_SOLUTION, True, True),  # a gold that still carries the solution
    ("#### 72", " 72 ", True, True),  # gold whitespace: our one leniency (lm-eval's gold has none)
]


@pytest.mark.parametrize("mode", ["strict", "flexible"])
def test_gsm8k_table_is_lm_evals_verdict(mode):
    col = 2 if mode == "strict" else 3
    oracle = [lm_eval_gsm8k(c, g.strip(), mode) for c, g, *_ in GSM8K]
    assert oracle == [row[col] for row in GSM8K]
    verdicts = verify_batch(
        "gsm8k", [r[0] for r in GSM8K], [r[1] for r in GSM8K], settings={"gsm8k": {"mode": mode}}
    )
    wrong = [(r[0], r[1], r[col], v) for r, v in zip(GSM8K, verdicts, strict=True) if v.correct != r[col]]
    assert not wrong, wrong
    assert sum(r[col] for r in GSM8K) >= 12 and sum(not r[col] for r in GSM8K) >= 12


def test_gsm8k_default_mode_is_flexible_and_no_match_is_no_answer():
    assert verify_one("gsm8k", "The answer is 42.", "42").correct
    assert (
        verify_one("gsm8k", "The answer is 42.", "42", settings={"gsm8k": {"mode": "strict"}}).status
        == "no_answer"
    )
    assert extract_answer("gsm8k", "#### -$5") == "-$5"
    assert extract_answer("gsm8k", "#### 13 #### 12", settings={"gsm8k": {"mode": "strict"}}) == "13"
    with pytest.raises(ValueError, match="mode"):
        verify_one("gsm8k", "#### 1", "1", settings={"gsm8k": {"mode": "loose"}})


# --------------------------------------------------------------------------------- verl oracle
# verl/utils/reward_score/math_dapo.py, the functions compute_score uses, copied (Apache-2.0).

SUBSTITUTIONS = [
    ("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), (r"\ ", ""), (" ", ""), ("mbox", "text"),
    (",\\text{and}", ","), ("\\text{and}", ","), ("\\text{m}", "\\text{}"),
]  # fmt: skip
REMOVED_EXPRESSIONS = [
    "square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "\\ldots", "sue",
    "points", "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters", "meals",
    "edges", "students", "childrentickets", "multiples", "\\text{s}", "\\text{.}", "\\text{\ns}",
    "\\text{}^2", "\\text{}^3", "\\text{\n}", "\\text{}", r"\mathrm{th}", r"^\circ", r"^{\circ}", r"\;",
    r",\!", "{,}", '"', "\\dots",
]  # fmt: skip


def normalize_final_answer(final_answer: str) -> str:
    final_answer = final_answer.split("=")[-1]
    for before, after in SUBSTITUTIONS:
        final_answer = final_answer.replace(before, after)
    for expr in REMOVED_EXPRESSIONS:
        final_answer = final_answer.replace(expr, "")
    final_answer = re.sub(r"(.*?)(\$)(.*?)(\$)(.*)", "$\\3$", final_answer)
    final_answer = re.sub(r"(\\text\{)(.*?)(\})", "\\2", final_answer)
    final_answer = re.sub(r"(\\textbf\{)(.*?)(\})", "\\2", final_answer)
    final_answer = re.sub(r"(\\overline\{)(.*?)(\})", "\\2", final_answer)
    final_answer = re.sub(r"(\\boxed\{)(.*)(\})", "\\2", final_answer)
    final_answer = re.sub(r"(frac)([^{])(.)", "frac{\\2}{\\3}", final_answer)
    final_answer = re.sub(r"(sqrt)([^{])", "sqrt{\\2}", final_answer)
    final_answer = final_answer.replace("$", "")
    if final_answer.replace(",", "").isdigit():
        final_answer = final_answer.replace(",", "")
    return final_answer.strip()


def is_correct_minerva(solution_str, gt, answer_pattern=r"(?i)Answer\s*:\s*([^\n]+)"):
    match = re.findall(answer_pattern, solution_str)
    extracted_answer = match[-1] if match else "[INVALID]"
    pred = normalize_final_answer(extracted_answer)
    gt = normalize_final_answer(gt)
    return (pred == gt), pred


def verl_compute_score(solution_str: str, ground_truth: str) -> bool:
    solution_str = solution_str[-300:]
    correct, _ = is_correct_minerva(solution_str, ground_truth)
    return correct


# (completion, gold, DAPO's verdict, why). The near misses of issue 14 are rows.
DAPO = [
    ("Let me compute.\nAnswer: 34", "34", True, ""),
    ("Answer: 35", "34", False, ""),
    ("answer: 34", "34", True, "case-insensitive"),
    ("Answer: $34$", "34", True, ""),
    ("Answer: \\boxed{34}", "34", True, ""),
    ("Answer: $\\boxed{1,000}$", "1000", True, "digits with commas"),
    ("Answer: 1,000", "1000", True, ""),
    ("Answer: 1,000.5", "1000.5", False, "commas only dropped from whole numbers"),
    ("Answer: 34.", "34", False, "near miss: a trailing period"),
    ("Answer: 34%", "34", False, "near miss: percent"),
    ("Answer: 034", "34", False, "near miss: leading zero"),
    ("Answer: 2^{10}", "1024", False, "near miss: no symbolic equality"),
    ("Answer: \\frac{8}{2}", "4", False, "near miss: no symbolic equality"),
    ("Answer: 34.0", "34", False, "near miss: string comparison"),
    ("Answer: 1/2", "\\frac{1}{2}", False, "string comparison"),
    ("Answer: 17 apples", "17", False, "near miss: a unit not in Minerva's list"),
    ("Answer: 34 degrees", "34", True, "a unit in Minerva's list"),
    ("Answer: 17 dollars", "17", True, ""),
    ("Answer: 34^\\circ", "34", True, ""),
    ("Answer: x = 34", "34", True, "the text after the last '='"),
    ("Answer: \\text{34}", "34", True, ""),
    ("Answer: \\frac12", "\\frac{1}{2}", True, "shorthand \\frac"),
    ("Answer: \\dfrac{1}{2}", "\\frac{1}{2}", False, "\\dfrac is not rewritten"),
    ("Answer: 34\nAnswer: 35", "35", True, "the last Answer: line"),
    ("Answer: 34\nAnswer: 35", "34", False, ""),
    ("Answer: 34 \nmore text after", "34", True, ""),
    ("The answer is 34", "34", False, "needs 'Answer:'"),
    ("Answer: -7", "-7", True, ""),
    ("Answer: 7", "-7", False, ""),
    ("Answer: 34\n" + "x" * 300, "34", False, "near miss: outside the last 300 characters"),
    ("Answer: 34\n" + "x" * 280, "34", True, "inside the last 300 characters"),
    ("", "34", False, ""),
    ("no final line at all 34", "34", False, ""),
]


def test_dapo_table_is_verls_verdict():
    assert [verl_compute_score(c, g) for c, g, _, _ in DAPO] == [e for _, _, e, _ in DAPO]
    verdicts = verify_batch("dapo", [c for c, *_ in DAPO], [g for _, g, *_ in DAPO])
    wrong = [(c, g, e, why, v) for (c, g, e, why), v in zip(DAPO, verdicts, strict=True) if v.correct != e]
    assert not wrong, wrong
    assert sum(e for _, _, e, _ in DAPO) >= 12 and sum(not e for _, _, e, _ in DAPO) >= 12


def test_dapo_runs_in_process_and_marks_no_answer(monkeypatch):
    from workflow_scripts.verify import verifiers as V

    monkeypatch.setattr(V.MATH_POOL, "run", lambda *a, **k: pytest.fail("dapo must not start a worker"))
    assert verify_one("dapo", "The answer is 34", "34").status == "no_answer"
    assert verify_one("dapo", "Answer: $\\boxed{1,000}$.", "1000").correct
    assert extract_answer("dapo", "work\nAnswer: $\\boxed{1,000}$.") == "1000"


def test_the_paper_config_trains_on_dapos_reward():
    import yaml

    paper = yaml.safe_load((Path(__file__).resolve().parents[2] / "config.paper.yaml").read_text())
    assert paper["data"]["train"]["kind"] == "dapo"


@pytest.mark.parametrize(
    "text", ["a #### b #### 7", "42.\n", "4.\n.", "$1,000.", "#### ", "x ####  5", "-$5", "1.5.", "AbC"]
)
def test_gsm8k_normalization_is_lm_evals_regex_chain(text):
    from workflow_scripts.verify.string_rules import gsm8k_normalize

    expected = text
    for s in [",", "\\$", "(?s).*#### ", "\\.$"]:
        expected = re.sub(s, "", expected)
    assert gsm8k_normalize(text) == expected.lower()


# Intended differences of dapo_lenient from DAPO's rule (why the paper config must not train on it).
LENIENT_VS_DAPO = [
    ("Answer: 34.", "34"),  # trailing period
    ("Answer: 34%", "34"),  # percent
    ("Answer: 034", "34"),  # leading zero
    ("Answer: 2^{10}", "1024"),  # math-verify fallback
    ("Answer: 17 apples", "17"),  # not a Minerva unit; the math-verify fallback reads 17
    ("Answer: 34\n" + "x" * 300, "34"),  # the whole completion, not the last 300 characters
]


def test_dapo_lenient_accepts_dapos_near_misses():
    completions, golds = [c for c, _ in LENIENT_VS_DAPO], [g for _, g in LENIENT_VS_DAPO]
    assert not any(v.correct for v in verify_batch("dapo", completions, golds))
    lenient = [v.correct for v in verify_batch("dapo_lenient", completions, golds, timeout=30.0)]
    assert lenient == [True] * len(LENIENT_VS_DAPO)
