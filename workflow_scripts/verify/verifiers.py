r"""Verifiers: the one entry point that decides whether a completion is correct.

The same functions score the GRPO training reward (``reward.make_reward_function``) and evaluation
(``verify_batch``), so what training optimises and what evaluation measures cannot drift apart.
A row's ``kind`` names its verifier; a task's ``verifier`` config block tunes it: ``settings`` =
``{"math": {MathSettings options}, "gsm8k": {"mode": "strict" | "flexible"}}`` (defaults:
math-verify's options, gsm8k ``flexible``), passed whole to ``verify_batch`` / the reward function.
Each kind is declared once, in ``VERIFIERS`` (extractor, judge, where it runs, its timeout key, its
settings, its reference); the schema's kind enums and evaluation read or are tied to it.

kind         | extracts                                 | compares                        | reference
-------------|------------------------------------------|---------------------------------|----------
integer      | last ``\boxed{}``; else the leading      | numeric (``1,000`` = 1000,      | the project's
             | number; else the last number             | ``47.0`` = 47)                  | (synthetic tasks)
math         | math-verify ``parse``; one-value gold:   | math-verify ``verify(gold,      | huggingface/
             | from the last box on; several parts: the | pred)`` with the task's options | Math-Verify (its
             | boxes together (``verifier_math``)       |                                 | test cases agree)
gsm8k        | ``strict``: first ``#### N``; ``flexible | lm-eval exact_match: drop ``,`` | lm-eval
             | `` (default): last number-like token     | ``$``, final ``.``; strings     | gsm8k.yaml
mcq          | last "answer is X" / "Answer: X"; else   | letter equality (gold: a letter | the project's
             | last ``\boxed{X}``; else a leading "B"   | or a 0-based index)             |
dapo         | last "Answer:" line in the last 300      | Minerva-normalized strings      | verl math_dapo
             | characters                               | equal                           | (DAPO's reward)
dapo_lenient | last "Answer:" line anywhere; units, %,  | numeric, string, then           | the project's
             | final "." dropped                        | math-verify                     | (not DAPO's)
code         | first fenced block, else the completion  | ``code_verdict``: the dataset's | HumanEval's
             |                                          | test in a separate sandbox      | ``check()``

Where each runs: integer, gsm8k, mcq, dapo and most dapo_lenient checks in-process, pure Python
(``verifier_rules``); math (and dapo_lenient's fallback) in worker processes, each check bounded
by ``timeout`` (``verifier_workers``); code in sandboxes (``code_verdict``).

Statuses: ``ok`` (checked; ``correct`` says the outcome), ``no_answer`` (nothing extractable;
scored wrong), ``timeout`` (killed after ``timeout`` s; scored wrong), ``error`` (the check itself
failed, e.g. an unparseable gold, a code row without tests, a math box too long to check; scored
wrong). A batch never raises for a bad completion and never hangs on one. ``status_counts`` counts
(kind, status) pairs made by this process.
"""

from __future__ import annotations

import collections
import json
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from workflow_scripts.verify import math_rule as VM
from workflow_scripts.verify import string_rules as R
from workflow_scripts.verify.workers import WorkerPool


@dataclass(frozen=True)
class Kind:
    """One verifier kind: the single declaration the checks, the schema's enums (tied by a test),
    evaluation's timeout and the docs (the table above) read."""

    extract: Callable[..., str | None]  # completion text -> answer (None: nothing extractable)
    judge: Callable[..., tuple] | None  # in-process (correct, extracted, status); None: out of process
    runs: str  # "in_process", "workers" (math-verify, bounded) or "sandbox" (code)
    timeout_key: str  # the eval config key that bounds one check
    settings: tuple[str, ...]  # options of the task's verifier.<kind> block
    reference: str  # whose behaviour it follows (its tests agree with that reference's cases)


VERIFIERS: dict[str, Kind] = {
    "integer": Kind(R.extract_integer, R.judge_integer, "in_process", "verify_timeout", (), "the project's"),
    "math": Kind(R.extract_math, None, "workers", "verify_timeout", VM.MathSettings.keys(),
                 "huggingface/Math-Verify"),
    "gsm8k": Kind(R.extract_gsm8k, R.judge_gsm8k, "in_process", "verify_timeout", ("mode",),
                  "lm-eval gsm8k.yaml"),
    "mcq": Kind(R.extract_mcq, R.judge_mcq, "in_process", "verify_timeout", (), "the project's"),
    "dapo": Kind(R.extract_dapo, R.judge_dapo, "in_process", "verify_timeout", (), "verl math_dapo"),
    "dapo_lenient": Kind(R.extract_dapo_lenient, R.judge_dapo_lenient, "in_process", "verify_timeout", (),
                         "the project's (math-verify fallback in workers)"),
    "code": Kind(R.extract_code, None, "sandbox", "code_timeout", (), "HumanEval check()"),
}  # fmt: skip
KINDS: tuple[str, ...] = tuple(VERIFIERS)
STATUSES: tuple[str, ...] = ("ok", "no_answer", "timeout", "error")
SETTINGS: dict[str, tuple[str, ...]] = {k: v.settings for k, v in VERIFIERS.items() if v.settings}

status_counts: collections.Counter = collections.Counter()
_COUNT_LOCK = threading.Lock()
MATH_POOL = WorkerPool(
    "workflow_scripts.verify.math_rule:handle", warm_up="workflow_scripts.verify.math_rule:warm_up"
)


@dataclass(frozen=True)
class Verdict:
    correct: bool
    extracted: str | None
    status: str  # one of STATUSES


def check_settings(kind: str, settings: Mapping | None) -> dict:
    """The options of ``kind`` from a task's ``verifier`` block ({kind: {option: value}}), checked.

    ``settings`` may hold blocks for other kinds (the schema fills every block's defaults); those
    are ignored. ValueError names an unknown kind block, option or a bad value.
    """
    _check_kind(kind)
    settings = dict(settings or {})
    unknown = sorted(set(settings) - set(SETTINGS))
    if unknown:
        raise ValueError(f"verifier settings for {unknown}: only {sorted(SETTINGS)} take settings")
    own = dict(settings.get(kind) or {})
    allowed = SETTINGS.get(kind, ())
    bad = sorted(set(own) - set(allowed))
    if bad:
        raise ValueError(f"verifier.{kind}: unknown option(s) {bad} (known: {list(allowed)})")
    if kind == "math":
        VM.MathSettings(**own)
    if own.get("mode", R.GSM8K_DEFAULT_MODE) not in R.GSM8K_MODES:
        raise ValueError(f"verifier.gsm8k.mode must be one of {R.GSM8K_MODES}, got {own['mode']!r}")
    return own


# ------------------------------------------------------------------------------------ planning


@dataclass(frozen=True)
class _Job:
    """A check that runs out of process: a math-verify request or a code verdict."""

    extracted: str | None
    math: dict | None = None
    code: dict | None = None


def extract_answer(kind: str, completion, settings: Mapping | None = None) -> str | None:
    """The answer a verifier of ``kind`` reads from ``completion`` (None: nothing extractable)."""
    settings = check_settings(kind, settings)
    text = _completion_text(completion)
    if not text.strip():
        return None
    return VERIFIERS[kind].extract(text, **_options(kind, settings))


def _options(kind: str, settings: Mapping) -> dict:
    """The keyword options a kind's extract/judge take (gsm8k's mode; math's go to math-verify)."""
    return {"mode": settings.get("mode", R.GSM8K_DEFAULT_MODE)} if kind == "gsm8k" else {}


def _code_job(completion: str, meta: dict, prompt: str | None) -> Verdict | _Job:
    code = R.extract_code(completion)
    if code is None:
        return Verdict(False, None, "no_answer")
    if "test" not in meta or "entry_point" not in meta:
        return Verdict(False, code, "error")
    stub = meta.get("prompt", prompt) or ""
    return _Job(
        code, code={"code": code, "stub": stub, "test": meta["test"], "entry_point": meta["entry_point"]}
    )


def _plan(
    kind: str, text: str, answer: str, meta: dict, prompt: str | None, settings: dict
) -> Verdict | _Job:
    if not text.strip():
        return Verdict(False, None, "no_answer")
    spec = VERIFIERS[kind]
    if spec.runs == "sandbox":
        return _code_job(text, meta, prompt)
    if spec.runs == "workers":
        math_settings = VM.MathSettings(**settings)
        box = VM.oversized_box(text, math_settings)
        if box is not None:  # not checkable (see verifier_math.MAX_BOX_CHARS): scored wrong
            return Verdict(False, box[:200], "error")
        return _Job(spec.extract(text), math=VM.request(text, answer, math_settings))
    judged = spec.judge(text, answer, **_options(kind, settings))
    if isinstance(judged, str):  # dapo_lenient: only math-verify can decide
        return _Job(judged, math=VM.request(f"${judged}$", answer, VM.MathSettings()))
    return Verdict(*judged)


def _execute(job: _Job, timeout: float) -> Verdict:
    if job.code is not None:
        from workflow_scripts.verify.code_verdict import code_verdict

        correct, status = code_verdict(timeout=timeout, **job.code)
        return Verdict(correct, job.extracted, status)
    reply = MATH_POOL.run(job.math, timeout)
    status = reply.get("status", "error")
    if status not in STATUSES:
        status = "error"
    extracted = reply.get("extracted") or job.extracted
    return Verdict(bool(reply.get("correct")) and status == "ok", extracted, status)


# ----------------------------------------------------------------------------------- public API


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"unknown verifier kind {kind!r}; known: {KINDS}")


def _completion_text(completion) -> str:
    """A completion as text: plain strings, or TRL's conversational [{'role', 'content'}, ...]."""
    if completion is None:
        return ""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        return str(completion.get("content", ""))
    if isinstance(completion, Sequence):
        parts = [m.get("content", "") for m in completion if isinstance(m, dict)]
        return str(parts[-1]) if parts else ""
    return str(completion)


def _as_meta(meta) -> dict:
    if meta is None:
        return {}
    if isinstance(meta, str):
        meta = json.loads(meta) if meta.strip() else {}
    return dict(meta)


def verify_batch(
    kind: str,
    completions: list[str],
    answers: list[str],
    metas: list[dict] | None = None,
    timeout: float = 5.0,
    workers: int = 1,
    *,
    prompts: list[str] | None = None,
    settings: Mapping | None = None,
) -> list[Verdict]:
    """Score ``completions`` against ``answers``; one Verdict each, in order.

    ``settings``: the task's ``verifier`` config block (see ``check_settings``; None = defaults).
    In-process kinds are checked directly; math-verify and code checks run out of process, up to
    ``workers`` at a time, each bounded by ``timeout`` seconds. A check that hangs is killed and
    scored ``timeout``; one that raises is scored ``error``; the rest of the batch is unaffected.
    """
    settings = check_settings(kind, settings)
    n = len(completions)
    for name, other in (("answers", answers), ("metas", metas), ("prompts", prompts)):
        if other is not None and len(other) != n:
            raise ValueError(f"{n} completions but {len(other)} {name}")
    verdicts: list[Verdict | None] = [None] * n
    jobs: list[tuple[int, _Job]] = []
    # An in-process verdict depends on (text, answer) alone (_plan reads neither meta nor prompt), and a
    # problem's samples repeat (128 samples of a tiny model: ~10 distinct texts): judge each pair once.
    in_process = VERIFIERS[kind].runs == "in_process"
    judged: dict[tuple[str, str], Verdict] = {}
    for i in range(n):
        key = None
        try:
            text = _completion_text(completions[i])
            meta = _as_meta(metas[i]) if metas is not None else {}
            key = (text, str(answers[i])) if in_process else None
            if key in judged:
                verdicts[i] = judged[key]
                continue
            prompt = prompts[i] if prompts is not None and isinstance(prompts[i], str) else None
            planned = _plan(kind, text, str(answers[i]), meta, prompt, settings)
        except Exception:
            planned = Verdict(False, None, "error")
        if isinstance(planned, Verdict):
            verdicts[i] = planned
            if key is not None:
                judged[key] = planned
        else:
            jobs.append((i, planned))

    def run(job: _Job) -> Verdict:
        try:
            return _execute(job, timeout)
        except Exception:
            return Verdict(False, job.extracted, "error")

    if workers <= 1 or len(jobs) <= 1:
        for i, job in jobs:
            verdicts[i] = run(job)
    else:
        with ThreadPoolExecutor(max_workers=min(workers, len(jobs))) as pool:
            for (i, _), verdict in zip(jobs, pool.map(run, [job for _, job in jobs]), strict=True):
                verdicts[i] = verdict
    with _COUNT_LOCK:
        status_counts.update((kind, v.status) for v in verdicts)
    return verdicts  # type: ignore[return-value]


def verify_one(
    kind: str,
    completion: str,
    answer: str,
    meta: dict | None = None,
    timeout: float = 5.0,
    *,
    prompt: str | None = None,
    settings: Mapping | None = None,
) -> Verdict:
    """Score one completion (see ``verify_batch``)."""
    return verify_batch(
        kind, [completion], [answer], [meta or {}], timeout, prompts=[prompt], settings=settings
    )[0]
