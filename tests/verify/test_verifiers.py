"""Verifier tables per kind (plenty of must-be-wrong near misses), timeouts, and the TRL reward API.

A verifier that always says "correct" (or always "wrong") fails these tables: every kind has both.
"""

from __future__ import annotations

import importlib.util
import json
import pickle
import time
from pathlib import Path

import pytest

from workflow_scripts.verify import verifiers as V
from workflow_scripts.verify import workers as verifier_workers
from workflow_scripts.verify.reward import make_reward_function
from workflow_scripts.verify.verifiers import (
    KINDS,
    Verdict,
    extract_answer,
    verify_batch,
    verify_one,
)

# ------------------------------------------------------------------------------------------ tables
# (completion, gold answer, expected correct)

INTEGER = [
    ("47", "47", True),
    ("47\n", "47", True),
    (" 47", "47", True),
    ("47</s>12+3=", "47", True),
    ("47;", "47", True),
    ("47abc", "47", True),
    ("47 48", "47", True),
    ("-5", "-5", True),
    ("-5", "5", False),
    ("5", "-5", False),
    ("48", "47", False),
    ("4", "47", False),
    ("471", "47", False),
    ("4 7", "47", False),
    ("47.5", "47", False),
    ("47.0", "47", True),
    ("47", "-47", False),
    ("--47", "47", False),
    ("", "47", False),
    ("   ", "47", False),
    ("abc", "47", False),
    ("The answer is 47", "47", True),
    ("The answer is 47.", "47", True),
    ("12+35 is 46", "47", False),
    ("99+1=100", "100", False),  # repeats the prompt: the leading number is 99
    ("\\boxed{47}", "47", True),
    ("I think 12+35 = \\boxed{47}", "47", True),
    ("\\boxed{46} wait, \\boxed{47}", "47", True),
    ("\\boxed{47} wait, \\boxed{46}", "47", False),
    ("\\boxed{-3}", "-3", True),
    ("1,000", "1000", True),
    ("0", "0", True),
    ("-0", "0", True),
    ("$47$", "47", True),
    ("x47", "47", True),
    ("0", "10", False),
]

MATH = [
    ("The answer is $\\boxed{\\frac{1}{2}}$", "\\frac{1}{2}", True),
    ("\\boxed{\\dfrac{1}{2}}", "\\frac12", True),
    ("\\boxed{0.5}", "\\frac{1}{2}", True),
    ("\\boxed{1/2}", "\\frac{1}{2}", True),
    ("\\boxed{2/4}", "\\frac{1}{2}", True),
    ("\\boxed{\\frac{1}{3}}", "\\frac{1}{2}", False),
    ("\\boxed{\\dfrac{3}{4}}", "0.75", True),
    ("\\boxed{1,000}", "1000", True),
    ("\\boxed{1000}", "1,000", True),
    ("\\boxed{1001}", "1,000", False),
    ("\\boxed{10\\text{ cm}}", "10", True),
    ("\\boxed{11\\text{ cm}}", "10", False),
    ("first \\boxed{3}, then correcting: \\boxed{5}", "5", True),
    ("first \\boxed{3}, then correcting: \\boxed{5}", "3", False),
    ("", "5", False),
    ("\\boxed{-3}", "3", False),
    ("\\boxed{-3}", "-3", True),
    ("\\boxed{\\sqrt{2}}", "\\sqrt 2", True),
    ("\\boxed{\\sqrt{3}}", "\\sqrt{2}", False),
    ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}", True),
    ("\\boxed{3.14}", "\\pi", False),
    ("\\boxed{\\pi}", "\\pi", True),
    ("\\boxed{x^2+2x+1}", "(x+1)^2", True),
    ("\\boxed{x^2+1}", "(x+1)^2", False),
    ("\\boxed{(1,2)}", "(1,2)", True),
    ("\\boxed{(2,1)}", "(1,2)", False),
    ("\\boxed{90^\\circ}", "90", True),
    ("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt3}{2}", True),
    ("\\boxed{\\{1,2,3\\}}", "\\{1,2,3\\}", True),
    ("So the final answer is 12.", "12", True),
    ("So the final answer is 13.", "12", False),
    ("\\boxed{3}", "\\boxed{3}", True),
    ("\\boxed{3x}", "3", False),
    ("\\boxed{10^6}", "1000000", True),
    ("\\boxed{10^5}", "1000000", False),
    ("no idea, sorry", "3", False),
]

MCQ = [
    ("Answer: B", "B", True),
    ("Answer: B", "C", False),
    ("The answer is (C).", "C", True),
    ("The answer is C", "C", True),
    ("(B)", "B", True),
    ("B)", "B", True),
    ("B", "B", True),
    ("B", "A", False),
    (" D", "D", True),
    ("D. because it is", "D", True),
    ("A car travels 5 km.", "A", False),  # an article, not an answer
    ("", "A", False),
    ("I think the answer is B", "B", True),
    ("I think it is B", "I", False),
    ("Between (A) and (C), the answer is (C)", "C", True),
    ("Between (A) and (C), the answer is (C)", "A", False),
    ("\\boxed{D}", "D", True),
    ("\\boxed{D}", "B", False),
    ("**Answer:** C", "C", True),
    ("Answer: (A)", "A", True),
    ("the answer is a prime number", "A", False),
    ("The answer is B. Wait, actually the answer is D.", "D", True),
    ("The answer is B. Wait, actually the answer is D.", "B", False),
    ("B", "1", True),  # cais/mmlu 0-based index
    ("A", "0", True),
    ("A", "1", False),
    ("C", "(C)", True),
    ("E", "E", True),
    ("J", "J", True),
    ("K", "K", False),
    ("B:58", "B", True),  # synthetic mcq family: "... A:59 B:58 C:69 D:49 Ans:"
    ("C:69 D:49", "C", True),
    ("Bob", "B", False),
    ("The correct option is (B)", "B", True),
    ("Answer: Both A and B", "A", False),
    ("answer is D", "d", True),
]

# The project's earlier dapo reading, kept as kind dapo_lenient; DAPO's own rule (kind dapo) is
# tested against verl in test_verifier_gsm8k_dapo.py.
DAPO_LENIENT = [
    ("Let me compute.\nAnswer: 34", "34", True),
    ("Answer: 35", "34", False),
    ("Answer: $34$", "34", True),
    ("Answer: \\boxed{34}", "34", True),
    ("Answer: 34.", "34", True),
    ("answer: 34", "34", True),
    ("Answer: 1,000", "1000", True),
    ("Answer: 34\nAnswer: 35", "35", True),
    ("Answer: 34\nAnswer: 35", "34", False),
    ("The answer is 34", "34", False),  # DAPO's format requires "Answer:"
    ("", "34", False),
    ("Answer: -7", "-7", True),
    ("Answer: 7", "-7", False),
    ("Answer: \\frac{8}{2}", "4", True),  # math-verify fallback
    ("Answer: \\frac{1}{2}", "4", False),
    ("Answer: 34 degrees", "34", True),
    ("Answer: 34^\\circ", "34", True),
    ("Answer: x = 34", "34", True),
    ("Answer: \\text{34}", "34", True),
    ("Answer: 34.0", "34", True),
    ("Answer: 340", "34", False),
    ("Answer: 3.4", "34", False),
    ("Answer: \\sqrt{2}", "\\sqrt{2}", True),
    ("Answer: \\sqrt{3}", "\\sqrt{2}", False),
    ("Answer: 2\\sqrt{2}", "\\sqrt{8}", True),
    ("Answer: $\\boxed{1,000}$", "1000", True),
    ("Answer: 34 \nmore text after", "34", True),
    ("Answer: 17 dollars", "17", True),
    ("Answer: 1/2", "\\frac{1}{2}", True),
    ("Answer: 0.5", "\\frac{1}{2}", True),
    ("Answer: 0.6", "\\frac{1}{2}", False),
    ("no final line at all 34", "34", False),
]

TABLES = {"integer": INTEGER, "math": MATH, "mcq": MCQ, "dapo_lenient": DAPO_LENIENT}
CASES = [(kind, *case) for kind, table in TABLES.items() for case in table]


def test_tables_are_big_and_balanced():
    for kind, table in TABLES.items():
        assert len(table) >= 30, kind
        n_right = sum(expected for _, _, expected in table)
        # both outcomes are well represented: "always correct" and "always wrong" both fail
        assert 8 <= n_right <= len(table) - 8, (kind, n_right, len(table))


@pytest.mark.parametrize("kind", ["integer", "mcq"])
def test_in_process_tables(kind):
    table = TABLES[kind]
    verdicts = [verify_one(kind, c, a) for c, a, _ in table]
    wrong = [(c, a, e, v) for (c, a, e), v in zip(table, verdicts, strict=True) if v.correct != e]
    assert not wrong, wrong
    for (c, _, _), v in zip(table, verdicts, strict=True):
        assert v.status in ("ok", "no_answer")
        if not c.strip():
            assert v.status == "no_answer" and v.extracted is None


@pytest.mark.parametrize("kind", ["math", "dapo_lenient"])
def test_math_verify_tables(kind):
    table = TABLES[kind]
    verdicts = verify_batch(kind, [c for c, _, _ in table], [a for _, a, _ in table], timeout=20.0, workers=2)
    wrong = [(c, a, e, v) for (c, a, e), v in zip(table, verdicts, strict=True) if v.correct != e]
    assert not wrong, wrong
    assert all(v.status in ("ok", "no_answer") for v in verdicts), verdicts


def test_mix_of_right_and_wrong_is_reported_exactly():
    completions = ["47", "48", "\\boxed{47}", "", "47.5", "-47", "The answer is 47."]
    got = [v.correct for v in verify_batch("integer", completions, ["47"] * len(completions))]
    assert got == [True, False, True, False, False, False, True]
    got = [v.correct for v in verify_batch("mcq", ["B", "C", "Answer: (B)", "A car"], ["B"] * 4)]
    assert got == [True, False, True, False]


def test_always_correct_verifier_would_fail_the_tables(monkeypatch):
    """Sanity check of the test design itself."""
    for table in TABLES.values():
        assert any(not expected for _, _, expected in table)
        assert any(expected for _, _, expected in table)


def test_extract_answer_per_kind():
    assert extract_answer("integer", " 47\n12+3=") == "47"
    assert extract_answer("integer", "\\boxed{12} then \\boxed{13}") == "13"
    assert extract_answer("integer", "") is None
    assert extract_answer("math", "so \\boxed{\\frac{a}{\\sqrt{b}}} and \\boxed{7}") == "7"
    assert extract_answer("math", "\\boxed{\\frac{1}{\\sqrt{2}}}") == "\\frac{1}{\\sqrt{2}}"
    assert extract_answer("gsm8k", "blah 3 #### $1,200.50 dollars") == "$1,200.50"  # lm-eval's filter output
    assert extract_answer("mcq", "**Answer:** (C)") == "C"
    assert extract_answer("dapo", "work\nAnswer: $\\boxed{1,000}$.") == "1000"
    assert (
        extract_answer("code", "Here:\n```python\ndef f():\n    return 1\n```\nDone")
        == "def f():\n    return 1\n"
    )
    assert extract_answer("code", "    return 1\n") == "    return 1\n"
    assert extract_answer("mcq", "no letter here") is None
    with pytest.raises(ValueError):
        extract_answer("nope", "1")


def test_kinds_constant():
    assert KINDS == ("integer", "math", "gsm8k", "mcq", "dapo", "dapo_lenient", "code")
    assert Verdict(True, "1", "ok").correct


def test_integer_is_fast_and_in_process(monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("integer kind must not start a worker")

    monkeypatch.setattr(V.MATH_POOL, "run", boom)
    monkeypatch.setattr(verifier_workers.subprocess, "Popen", boom)
    t0 = time.perf_counter()
    completions = [str(i) for i in range(2000)]
    verdicts = verify_batch("integer", completions, [str(i) for i in range(2000)])
    assert all(v.correct for v in verdicts)
    assert time.perf_counter() - t0 < 1.0


def test_gsm8k_mcq_dapo_numeric_need_no_worker(monkeypatch):
    monkeypatch.setattr(V.MATH_POOL, "run", lambda *a, **k: pytest.fail("unexpected worker call"))
    assert verify_one("gsm8k", "#### 5", "5").correct
    assert verify_one("mcq", "B", "B").correct
    assert verify_one("dapo", "Answer: 5", "5").correct
    assert not verify_one("dapo", "Answer: 6", "5").correct
    assert verify_one("dapo_lenient", "Answer: 5.", "5").correct
    assert not verify_one("dapo_lenient", "Answer: 6", "5").correct


EVIL_INPUTS = {
    "spaces after answer": "answer" + " " * 50_000,
    "unclosed boxes": "\\boxed{" * 7_000,
    "box then spaces": "\\boxed{" + " " * 50_000,
    "open braces": "{" * 50_000,
    "digits": "1" * 200_000,
    "comma digits": "1," * 50_000,
    "hashes": "####" * 12_000,
    "answer colons": "Answer:" * 7_000,
    "unclosed text": "Answer: " + "\\text{" * 8_000,
    "parens": "(" * 50_000,
    "dollars": "$" * 50_000,
    "fence then spaces": "```" + " " * 50_000,
    "many fences": "```\n" * 12_000,
    "leading spaces": " " * 50_000 + "x",
    "stars": "answer" + "*" * 50_000,
    "answer is, repeated": "answer is " * 5_000,
}


@pytest.mark.parametrize("name", sorted(EVIL_INPUTS))
def test_in_process_extraction_is_linear_on_adversarial_text(name):
    """In-process checks have no timeout, so no regex may backtrack badly on long junk."""
    text = EVIL_INPUTS[name]
    t0 = time.perf_counter()
    for kind in KINDS:
        extract_answer(kind, text)
    for kind in ("integer", "gsm8k", "mcq", "dapo"):
        verify_one(kind, text, "1")
    verify_one("gsm8k", text, "1", settings={"gsm8k": {"mode": "strict"}})
    assert time.perf_counter() - t0 < 2.0


# ---------------------------------------------------------------------------------- bad input


def test_bad_rows_give_error_verdicts():
    # an unparseable gold answer, a code row without tests, a meta that is not JSON
    v = verify_one("math", "\\boxed{1}", "\\frac{", timeout=10)
    assert not v.correct and v.status in ("error", "ok")
    assert verify_one("code", "    return 1\n", "", {}).status == "error"
    bad = verify_batch("code", ["    return 1\n"], [""], ["{not json"])
    assert bad == [Verdict(False, None, "error")]


def test_length_mismatch_raises():
    with pytest.raises(ValueError):
        verify_batch("integer", ["1", "2"], ["1"])


# ---------------------------------------------------------------------------------------- code

STUB = 'def add(a, b):\n    """Return a + b."""\n'
META = {
    "test": "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(-1, 1) == 0\n",
    "entry_point": "add",
}
HE0_PROMPT = (
    "from typing import List\n\n\ndef has_close_elements(numbers: List[float], threshold: float) -> bool:\n"
    '    """ Check if in given list of numbers, are any two numbers closer to each other than\n'
    '    given threshold."""\n'
)
HE0_META = {
    "entry_point": "has_close_elements",
    "test": (
        "def check(candidate):\n"
        "    assert candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.3) == True\n"
        "    assert candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.05) == False\n"
        "    assert candidate([1.0, 2.0, 5.9, 4.0, 5.0], 0.95) == True\n"
    ),
}
HE0_RIGHT = (
    "    for i, a in enumerate(numbers):\n        for j, b in enumerate(numbers):\n"
    "            if i != j and abs(a - b) < threshold:\n                return True\n    return False\n"
)

CODE = [
    ("    return a + b\n", True, "ok"),
    ("    return a - b\n", False, "ok"),
    ("    return a +\n", False, "ok"),  # syntax error
    ("```python\ndef add(a, b):\n    return a + b\n```\nThis adds.", True, "ok"),
    ("```python\ndef add(a, b):\n    return a * b\n```", False, "ok"),
    ("    while True:\n        pass\n", False, "timeout"),
    ("    import sys\n    sys.exit(0)\n", False, "ok"),  # exits before the tests: not a pass
    ("    return a + b\nimport os\nos._exit(0)\n", False, "ok"),
    ("    raise ValueError('no')\n", False, "ok"),
    ("    print('x' * 200000)\n    return a + b\n", True, "ok"),  # lots of output, still a pass
    ("", False, "no_answer"),
]


def test_code_table():
    completions = [c for c, _, _ in CODE]
    verdicts = verify_batch(
        "code", completions, [""] * len(CODE), [META] * len(CODE), timeout=2.0, workers=2,
        prompts=[STUB] * len(CODE),
    )  # fmt: skip
    got = [(v.correct, v.status) for v in verdicts]
    assert got == [(e, s) for _, e, s in CODE], list(zip(completions, got, strict=True))


def test_code_humaneval_style_and_meta_forms():
    assert verify_one("code", HE0_RIGHT, "", HE0_META, prompt=HE0_PROMPT).correct
    wrong = HE0_RIGHT.replace("< threshold", "> threshold")
    assert not verify_one("code", wrong, "", HE0_META, prompt=HE0_PROMPT).correct
    # the stub may also travel in meta["prompt"]; meta may be a JSON string (parquet / TRL columns)
    meta = json.dumps({**HE0_META, "prompt": HE0_PROMPT})
    assert verify_batch("code", [HE0_RIGHT], [""], [meta])[0].correct


# --------------------------------------------------------------------------------- TRL reward API


def _trl_call(fn, prompts, completions, **columns):
    """Call ``fn`` exactly as TRL 1.16's GRPOTrainer._calculate_rewards does."""
    logged = {}
    reward_kwargs = dict(columns)
    reward_kwargs["trainer_state"] = object()
    reward_kwargs["log_extra"] = lambda column, values: None
    reward_kwargs["log_metric"] = lambda name, value: logged.__setitem__(name, value)
    ids = [[1, 2, 3] for _ in completions]
    out = fn(prompts=prompts, completions=completions, completion_ids=ids, **reward_kwargs)
    return out, logged


def test_reward_function_trl_convention():
    f = make_reward_function("integer")
    assert f.__name__ == "integer_reward"
    prompts = ["12+35=", "12+35=", "3-5=", "3-5="]
    completions = ["47", "46", "-2", ""]
    out, logged = _trl_call(
        f, prompts, completions, answer=["47", "47", "-2", "-2"], id=["a", "a", "b", "b"],
        task=["t"] * 4, kind=["integer"] * 4, meta=[{}, {}, "{}", None],
    )  # fmt: skip
    assert out == [1.0, 0.0, 1.0, 0.0]
    assert all(isinstance(x, float) for x in out)
    assert logged["verifier/integer/no_answer_frac"] == 0.25


def test_reward_function_conversational_and_pickle():
    f = pickle.loads(pickle.dumps(make_reward_function("mcq")))
    assert f.__name__ == "mcq_reward"
    completions = [[{"role": "assistant", "content": "Answer: B"}], [{"role": "assistant", "content": "C"}]]
    prompts = [[{"role": "user", "content": "q?"}]] * 2
    out, _ = _trl_call(f, prompts, completions, answer=["B", "B"])
    assert out == [1.0, 0.0]


def test_reward_function_math_logs_timeouts():
    f = make_reward_function("math", timeout=1.0)
    out, logged = _trl_call(f, ["p"] * 3, ["\\boxed{9^{9^{9^{9}}}}", "\\boxed{7}", "8"], answer=["7"] * 3)
    assert out == [0.0, 1.0, 0.0]
    assert logged["verifier/math/timeout_frac"] == pytest.approx(1 / 3)


def test_reward_function_code_uses_prompts_and_json_meta():
    f = make_reward_function("code", timeout=5.0)
    meta = json.dumps(META)
    out, _ = _trl_call(
        f, [STUB, STUB], ["    return a + b\n", "    return b\n"], answer=["", ""], meta=[meta, meta]
    )
    assert out == [1.0, 0.0]


def test_reward_function_rejects_mixed_kinds_and_missing_answer():
    f = make_reward_function("integer")
    with pytest.raises(ValueError):
        f(prompts=["1+1="], completions=["2"], answer=["2"], kind=["mcq"])
    with pytest.raises(ValueError):
        f(prompts=["1+1="], completions=["2"])
    with pytest.raises(ValueError):
        make_reward_function("nope")


def test_trl_still_calls_reward_functions_this_way():
    """Guard the calling convention above against a TRL upgrade (reads the source; no slow import)."""
    spec = importlib.util.find_spec("trl")
    assert spec is not None and spec.origin is not None
    source = (Path(spec.origin).parent / "trainer" / "grpo_trainer.py").read_text()
    assert (
        "prompts=prompts, completions=completions, completion_ids=completion_ids_list, **reward_kwargs"
        in source
    )
    assert 'reward_kwargs["log_metric"] = self._log_metric' in source
    assert "get_callable_name(reward_funcs[i])" in source


# ------------------------------------------------------------------------------- fixture files

FIXTURES = Path(__file__).resolve().parents[2] / "data" / "fixtures"


def _jsonl(name: str) -> list[dict]:
    return [json.loads(line) for line in (FIXTURES / name).read_text().splitlines() if line.strip()]


@pytest.mark.slow
def test_adversarial_code_completions_are_wrong_and_leave_nothing():
    from workflow_scripts.verify.sandbox import capabilities

    rows = _jsonl("adversarial_completions.jsonl")
    if capabilities()["mode"] == "basic":  # there a program may signal this very process
        rows = [r for r in rows if r["id"] != "kill-parent"]
    escapes = [Path("/tmp/rlvr_adversarial_escape"), Path("/var/tmp/rlvr_adversarial_escape")]
    for path in escapes:
        path.unlink(missing_ok=True)
    verdicts = verify_batch(
        "code", [r["completion"] for r in rows], [r["answer"] for r in rows], [r["meta"] for r in rows],
        timeout=5.0, workers=4,  # a bound, not a speed claim; the 4 programs that run to it overlap
    )  # fmt: skip
    got = {r["id"]: (v.correct, v.status) for r, v in zip(rows, verdicts, strict=True)}
    want = {r["id"]: (r["expect_correct"], r["expect_status"]) for r in rows}
    # a memory bomb on a loaded machine may hit the wall clock before the memory limit: wrong either way
    if got.get("memory-bomb") == (False, "timeout"):
        want["memory-bomb"] = (False, "timeout")
    assert got == want
    assert sum(not r["expect_correct"] for r in rows) >= 10
    if capabilities()["mode"] != "basic":
        assert not any(path.exists() for path in escapes)


def test_real_dataset_fixtures_score_their_own_solutions():
    """The raw HumanEval / GSM8K / MATH-500 fixture rows: reference solutions right, swapped ones wrong."""
    he = _jsonl("humaneval.jsonl")
    metas = [{"test": r["test"], "entry_point": r["entry_point"]} for r in he]
    prompts = [r["prompt"] for r in he]
    right = verify_batch(
        "code", [r["canonical_solution"] for r in he], [""] * len(he), metas, prompts=prompts
    )
    swapped = [he[-1]["canonical_solution"], *[r["canonical_solution"] for r in he[:-1]]]
    wrong = verify_batch("code", swapped, [""] * len(he), metas, prompts=prompts)
    assert all(v.correct for v in right) and not any(v.correct for v in wrong)

    gsm = _jsonl("gsm8k.jsonl")
    finals = [r["answer"].rsplit("####", 1)[1].strip().replace(",", "") for r in gsm]
    assert all(v.correct for v in verify_batch("gsm8k", [r["answer"] for r in gsm], finals))
    rotated = finals[1:] + finals[:1]
    assert not any(v.correct for v in verify_batch("gsm8k", [r["answer"] for r in gsm], rotated))

    m5 = [r for r in _jsonl("math500.jsonl") if "\\boxed" in r["solution"]]
    assert m5
    assert all(
        v.correct for v in verify_batch("math", [r["solution"] for r in m5], [r["answer"] for r in m5])
    )
    if len(m5) > 1:
        rotated = [r["answer"] for r in m5[1:] + m5[:1]]
        assert not any(v.correct for v in verify_batch("math", [r["solution"] for r in m5], rotated))


def test_each_verifier_kind_is_declared_once_and_the_schema_and_evaluation_read_that_table():
    from workflow_scripts.runtime.config import load_schema

    def kind_enums(node) -> list:
        """Every enum of the schema that lists verifier kinds (the task's and the training set's)."""
        if isinstance(node, dict):
            own = [node["enum"]] if "code" in node.get("enum", []) else []
            return own + [e for v in node.values() for e in kind_enums(v)]
        return [e for v in node for e in kind_enums(v)] if isinstance(node, list) else []

    schema = load_schema()
    enums = kind_enums(schema)
    assert len(enums) == 2 and all(e == list(KINDS) == list(V.VERIFIERS) for e in enums), enums
    eval_keys = set(schema["properties"]["eval"]["properties"])
    for name, kind in V.VERIFIERS.items():
        assert kind.timeout_key in eval_keys, name  # evaluation bounds each check by this key
        assert kind.runs in {"in_process", "workers", "sandbox"}, name
        assert (kind.judge is None) == (kind.runs != "in_process"), name
        assert kind.extract("no answer here at all") is None or name in {"code", "gsm8k"}, name
        assert name in V.__doc__ and kind.reference, name  # the docs' table has a row per kind
    assert set(V.SETTINGS) == {"math", "gsm8k"}


def test_a_repeated_completion_is_judged_once_per_answer_and_counted_every_time(monkeypatch):
    """Samples of a problem repeat: each distinct (text, answer) pair is judged once, and every sample
    still gets its verdict (the same as judging it alone) and its count."""
    import dataclasses

    calls = []
    spec = V.VERIFIERS["integer"]

    def judge(text, answer, **kw):
        calls.append((text, answer))
        return spec.judge(text, answer, **kw)

    monkeypatch.setitem(V.VERIFIERS, "integer", dataclasses.replace(spec, judge=judge))
    texts = ["7", "7", "8", "7", "", "7"]
    answers = ["7", "7", "7", "8", "7", "7"]
    before = V.status_counts[("integer", "ok")]
    got = V.verify_batch("integer", texts, answers)
    assert sorted(calls) == sorted({("7", "7"), ("8", "7"), ("7", "8")})
    alone = [V.verify_one("integer", t, a) for t, a in zip(texts, answers, strict=True)]
    assert got == alone and [v.correct for v in got] == [True, True, False, False, False, True]
    assert V.status_counts[("integer", "ok")] - before == 2 * 5  # both batches: five judged texts each
