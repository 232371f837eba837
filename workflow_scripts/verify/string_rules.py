r"""Extraction and comparison rules of the verifier kinds checked in-process (pure string work).

Each ``extract_<kind>`` reads the answer from a completion; each ``judge_<kind>`` returns
``(correct, extracted, status)``. No rule runs a model program or sympy: ``math`` (and the
math-verify fallback of ``dapo_lenient``) lives in ``verifier_math``, ``code`` in ``code_verdict``.
All regexes here stay linear on long adversarial text (no timeout protects in-process checks).

gsm8k is lm-evaluation-harness's gsm8k task (lm_eval/tasks/gsm8k/gsm8k.yaml, EleutherAI/
lm-evaluation-harness@4e7e0d4): ``strict`` = its "strict-match" filter (regex
``#### (\-?[0-9\.\,]+)``, take the first match), ``flexible`` = "flexible-extract" (regex
``(-?[$0-9.,]{2,})|(-?[0-9]+)``, the last match, its first non-empty group); then its exact_match
(remove ``,``, ``$``, everything up to ``#### ``, one trailing ``.``; ignore case; string equality),
applied to the gold too. So ``#### -$5`` is -5 in flexible mode and no answer in strict mode, and
``42.0`` is not ``42``. Leniencies beyond lm-eval: none in what is read from a completion; the gold
is stripped of surrounding whitespace (rows may carry it; lm-eval's gold is the dataset text).

dapo is verl's ``math_dapo.compute_score`` (verl/utils/reward_score/math_dapo.py,
volcengine/verl@b178a3c), the reward DAPO was trained with: the last 300 characters, the last
``(?i)Answer\s*:\s*([^\n]+)`` match, Minerva's ``normalize_final_answer`` on both sides, string
equality. Ported line by line below (Apache-2.0). DAPO's reward is +1/-1, ours 1/0: the same
verdict; GRPO's group-normalised advantages are the same under that affine map when the group std
is used for scaling (TRL's default), and half as large without it.

dapo_lenient is this project's earlier, more forgiving reading of "Answer:" lines (the whole
completion, units / ``%`` / trailing ``.`` dropped, numeric equality, then math-verify); not DAPO's.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

# ------------------------------------------------------------------------------------ shared pieces

_NUM = r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|-?\.\d+"
_NUM_RE = re.compile(rf"(?<![\d.])(?:{_NUM})(?![\d])")
_LEADING_NUM_RE = re.compile(rf"\s*(?:\$\s*)?({_NUM})(?![\d])")


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` / ``\\fbox{...}`` (braces matched), or None.

    One linear pass (completions can be long and adversarial): the last box that is closed wins.
    """
    openers = {m.end() - 1 for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text)}
    if openers:
        stack: list[int] = []
        best: tuple[int, int] | None = None
        for m in re.finditer(r"[{}]", text):
            if m.group() == "{":
                stack.append(m.start())
            elif stack:
                start = stack.pop()
                if start in openers and (best is None or start > best[0]):
                    best = (start, m.start())
        if best is not None:
            return text[best[0] + 1 : best[1]].strip()
    m = None
    for m in re.finditer(r"\\boxed\s+([^\s$]+)", text):  # noqa: B007 - ``\boxed 5``: keep the last
        pass
    return m.group(1) if m else None


def to_decimal(text: str | None) -> Decimal | None:
    """A number written plainly (``1,000``, ``$18``, ``18.0``, ``-5``, ``50%``) as a Decimal, else None."""
    if text is None:
        return None
    s = text.strip().strip("$").strip()
    s = re.sub(r"^\\\$|\\%$|%$|\.$", "", s).strip()
    s = s.replace("\\!", "").replace("{,}", ",").replace("\\,", "")
    if not re.fullmatch(_NUM, s):
        return None
    try:
        return Decimal(s.replace(",", ""))
    except InvalidOperation:
        return None


Judged = tuple[bool, str | None, str]  # (correct, extracted, status)


# ------------------------------------------------------------------------------------------ integer


def extract_integer(text: str) -> str | None:
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    m = _LEADING_NUM_RE.match(text)
    if m:
        return m.group(1)
    nums = _NUM_RE.findall(text)
    return nums[-1] if nums else None


def judge_integer(text: str, answer: str) -> Judged:
    extracted = extract_integer(text)
    if extracted is None:
        return False, None, "no_answer"
    pred_v, gold_v = to_decimal(extracted), to_decimal(str(answer))
    if pred_v is not None and gold_v is not None:
        return pred_v == gold_v, extracted, "ok"
    return extracted.strip() == str(answer).strip(), extracted, "ok"


# -------------------------------------------------------------------------------- gsm8k (lm-eval)

GSM8K_MODES = ("strict", "flexible")
GSM8K_DEFAULT_MODE = "flexible"
_GSM8K_STRICT_RE = re.compile(r"#### (\-?[0-9\.\,]+)")
_GSM8K_FLEXIBLE_RE = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")


def extract_gsm8k(text: str, mode: str = GSM8K_DEFAULT_MODE) -> str | None:
    """lm-eval's filter output (None where lm-eval writes its "[invalid]" fallback)."""
    if mode == "strict":
        m = _GSM8K_STRICT_RE.search(text)  # take_first
        return m.group(1).strip() if m else None
    last = None
    for last in _GSM8K_FLEXIBLE_RE.finditer(text):  # noqa: B007 - group_select -1: the last match
        pass
    if last is None:
        return None
    return next(g for g in last.groups() if g).strip()


def gsm8k_normalize(s: str) -> str:
    """lm-eval's exact_match preprocessing (regexes_to_ignore in order, ignore_case).

    ``(?s).*#### `` (greedy: up to the last "#### ") is done with rsplit: the regex is quadratic
    on long text without "#### ".
    """
    s = s.replace(",", "").replace("$", "")
    if "#### " in s:
        s = s.rsplit("#### ", 1)[1]
    return re.sub(r"\.$", "", s).lower()


def judge_gsm8k(text: str, answer: str, mode: str = GSM8K_DEFAULT_MODE) -> Judged:
    extracted = extract_gsm8k(text, mode)
    if extracted is None:
        return False, None, "no_answer"
    return gsm8k_normalize(extracted) == gsm8k_normalize(str(answer).strip()), extracted, "ok"


# -------------------------------------------------------------------------------------------- mcq

_LETTERS = "ABCDEFGHIJ"
_MCQ_ANSWER_RE = re.compile(
    r"(?i:\banswer\b)(?:\s+(?i:is|would\s+be|should\s+be))?\s*[:\-]?\s*(?:(?i:option|choice)\s*)?"
    r"[\*\s]*[\(\[\{]?\s*(?:\\boxed\{|\\text(?:bf)?\{)?\s*\(?([A-J])(?![A-Za-z0-9])"
)
_MCQ_BOXED_RE = re.compile(r"\\boxed\{\s*(?:\\text(?:bf)?\{)?\s*\(?([A-J])\)?\s*\}")
_MCQ_LEADING_RE = re.compile(r"\s*[\(\[]?([A-J])(?![A-Za-z0-9])(?!\s+[a-z])")
_MCQ_PAREN_RE = re.compile(r"\(([A-J])\)")


def extract_mcq(text: str) -> str | None:
    text = " ".join(text.split())  # single spaces: keeps the regexes below linear on long inputs
    for regex in (_MCQ_ANSWER_RE, _MCQ_BOXED_RE):
        found = regex.findall(text)
        if found:
            return found[-1]
    m = _MCQ_LEADING_RE.match(text)
    if m:
        return m.group(1)
    found = _MCQ_PAREN_RE.findall(text)
    return found[-1] if found else None


def gold_letter(answer: str) -> str:
    s = str(answer).strip().strip("()").strip().upper()
    if s.isdigit() and int(s) < len(_LETTERS):
        return _LETTERS[int(s)]  # cais/mmlu style 0-based index
    return s


def judge_mcq(text: str, answer: str) -> Judged:
    extracted = extract_mcq(text)
    if extracted is None:
        return False, None, "no_answer"
    return extracted == gold_letter(answer), extracted, "ok"


# ----------------------------------------------------------------- dapo: verl's math_dapo, ported

DAPO_WINDOW = 300  # compute_score: solution_str[-300:]
DAPO_ANSWER_PATTERN = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")
_DAPO_SUBSTITUTIONS = [
    ("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), (r"\ ", ""), (" ", ""), ("mbox", "text"),
    (",\\text{and}", ","), ("\\text{and}", ","), ("\\text{m}", "\\text{}"),
]  # fmt: skip
_DAPO_REMOVED = [
    "square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "\\ldots", "sue",
    "points", "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters", "meals",
    "edges", "students", "childrentickets", "multiples", "\\text{s}", "\\text{.}", "\\text{\ns}",
    "\\text{}^2", "\\text{}^3", "\\text{\n}", "\\text{}", r"\mathrm{th}", r"^\circ", r"^{\circ}", r"\;",
    r",\!", "{,}", '"', "\\dots",
]  # fmt: skip


def dapo_normalize(final_answer: str) -> str:
    """verl math_dapo.normalize_final_answer, verbatim in behaviour."""
    final_answer = final_answer.split("=")[-1]
    for before, after in _DAPO_SUBSTITUTIONS:
        final_answer = final_answer.replace(before, after)
    for expr in _DAPO_REMOVED:
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


def extract_dapo(text: str) -> str | None:
    """The normalized last "Answer:" line of the last 300 characters (None: no such line)."""
    found = DAPO_ANSWER_PATTERN.findall(text[-DAPO_WINDOW:])
    return dapo_normalize(found[-1]) if found else None


def judge_dapo(text: str, answer: str) -> Judged:
    """verl math_dapo.compute_score (strict_box_verify=False) as a verdict."""
    extracted = extract_dapo(text)
    if extracted is None:
        return False, None, "no_answer"
    return extracted == dapo_normalize(str(answer)), extracted, "ok"


# --------------------------------------------------------------------- dapo_lenient (project's own)

_MAX_ANSWER_LINE = 500  # a final-answer line longer than this is cut (bounds normalization cost)
_UNIT_WORDS = (
    "square", "ways", "integers", "dollars", "mph", "inches", "ft", "hours", "km", "units", "points",
    "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters", "meals", "edges",
    "students", "childrentickets", "multiples", "sq", "unit", "sides", "seconds", "days", "people",
)  # fmt: skip
_UNITS_RE = re.compile(rf"(?<=[\d\s}}])(?:{'|'.join(_UNIT_WORDS)})(?:es|s)?\s*$")


def lenient_normalize(answer: str) -> str:
    """A forgiving Minerva-style normalization of a short final answer, for string comparison."""
    s = answer.strip()
    boxed = last_boxed(s)
    if boxed is not None:
        s = boxed
    s = s.split("=")[-1].strip()
    for before, after in (("\\dfrac", "\\frac"), ("\\tfrac", "\\frac"), ("\\left", ""), ("\\right", ""),
                          ("\\!", ""), ("\\,", ""), ("\\;", ""), ("^{\\circ}", ""), ("^\\circ", ""),
                          ("\\%", ""), ("%", ""), ("\\$", ""), ("$", "")):  # fmt: skip
        s = s.replace(before, after)
    s = re.sub(r"\\(?:text|textbf|mathrm|mbox|overline)\{([^{}]*)\}", r"\1", s)
    s = s.strip().rstrip(".").strip()
    s = _UNITS_RE.sub("", s).strip()
    s = s.replace(" ", "")
    if re.fullmatch(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?", s):
        s = s.replace(",", "")
    return s


def extract_dapo_lenient(text: str) -> str | None:
    found = DAPO_ANSWER_PATTERN.findall(text)
    if not found:
        return None
    return lenient_normalize(found[-1][:_MAX_ANSWER_LINE]) or None


def judge_dapo_lenient(text: str, answer: str) -> Judged | str:
    """A verdict, or the extracted answer when only math-verify can decide (the caller asks it)."""
    extracted = extract_dapo_lenient(text)
    if extracted is None:
        return False, None, "no_answer"
    gold = lenient_normalize(str(answer))
    pred_v, gold_v = to_decimal(extracted), to_decimal(gold)
    if pred_v is not None and gold_v is not None:
        return pred_v == gold_v, extracted, "ok"
    if extracted == gold:
        return True, extracted, "ok"
    return extracted


# ------------------------------------------------------------------------------------ code (text)

_FENCE_RE = re.compile(r"```[ \t]*(?:(?:python3|python|py|Python)[ \t]*)?\n(.*?)(?:```|\Z)", re.DOTALL)


def extract_code(text: str) -> str | None:
    """The first fenced code block, else the raw completion (the program is ``code_verdict``'s)."""
    if "```" in text:
        m = _FENCE_RE.search(text)
        if m and m.group(1).strip():
            return m.group(1)
    return text if text.strip() else None


def extract_math(text: str) -> str | None:
    """A readable guess of the ``math`` answer for ``extract_answer`` (math-verify decides the verdict)."""
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    m = None
    for m in re.finditer(r"(?i)(?:final answer|answer)\s*(?:is|:)\s*\$?([^\n$]+)", text):  # noqa: B007
        pass
    if m:
        return m.group(1).strip().rstrip(".").strip() or None
    dollars = re.findall(r"\$([^$]+)\$", text)
    if dollars:
        return dollars[-1].strip()
    nums = _NUM_RE.findall(text)
    return nums[-1] if nums else None
