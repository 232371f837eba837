r"""Verifiers: the one place that decides whether a completion is correct.

The same functions score the GRPO training reward (``make_reward_function``) and evaluation
(``verify_batch``), so what training optimises and what evaluation measures cannot drift apart.
A row's ``kind`` names its verifier.

| kind    | extraction (``extract_answer``)         | comparison                       | runs in             |
|---------|-----------------------------------------|----------------------------------|---------------------|
| integer | last ``\boxed{}``; else the number the  | numeric equality (Decimal):      | in-process, pure    |
|         | completion starts with; else the last   | ``1,000`` = 1000, ``47.0`` = 47, | Python (called every|
|         | number in it                            | ``47.5`` != 47                   | training step)      |
| math    | last ``\boxed{}`` (of several, the last | math-verify ``verify(gold,pred)``| worker process; each|
|         | one counts); else math-verify's own     | (gold first): fractions, LaTeX,  | check bounded by    |
|         | extraction from the whole text          | units, sets, symbolic equality   | ``timeout`` (killed)|
| gsm8k   | first number after the last ``####``;   | numeric equality (``$``, commas, | in-process          |
|         | else the last number                    | ``18.0`` = 18)                   |                     |
| mcq     | last "answer is X" / "Answer: X"; else  | letter equality; gold is a letter| in-process          |
|         | last ``\boxed{X}``; else a leading "B", | A-J or a 0-based index; the      |                     |
|         | "(B)", "B)", "B."; else the last "(B)"  | predicted letter is uppercase    |                     |
|         | ("A car ..." is an article, not "A")    | ("answer is a ..." is no answer) |                     |
| dapo    | text after the last "Answer:" (to end of| normalized strings equal, or     | in-process; the     |
|         | line), normalized: ``$``, ``\boxed``,   | numeric equality when both are   | math-verify fallback|
|         | ``\text``, units, trailing ``.``        | numbers; else math-verify        | in a worker process |
| code    | first fenced code block, else the raw   | stub + completion + test +       | ``sandbox`` (bounded|
|         | completion; one that redefines          | ``check(entry_point)``; correct  | contained           |
|         | ``entry_point`` replaces the stub's body| iff exit 0 and end token printed | subprocess)         |

Statuses: ``ok`` (checked; ``correct`` says the outcome), ``no_answer`` (nothing extractable, e.g.
empty output; scored wrong), ``timeout`` (the check ran past ``timeout`` and was killed; scored
wrong), ``error`` (the check itself failed, e.g. a worker crash or a row without test code; scored
wrong). A batch never raises for a bad completion and never hangs on one.

Code rows: the stub the completion continues is ``meta["prompt"]`` if present, else the row's
prompt passed as ``prompts=`` / ``prompt=`` (HumanEval rows keep the stub in ``prompt``). The program
must print a random per-run token after ``check(...)`` returns, so a completion that calls
``sys.exit(0)`` / ``os._exit(0)`` before the tests run is wrong, not right. (A program that reads the
token from its own source could still fake success; no in-process test harness can prevent that.)

math-verify's signal-based timeouts only work on the main thread, so it is called with
``parsing_timeout=None`` / ``timeout_seconds=None`` inside long-lived worker processes (started
once, reused; a worker whose check exceeds ``timeout`` is SIGKILLed and replaced). Workers die with
the process that started them (PR_SET_PDEATHSIG: a killed training job leaves no sympy computation
running), which is why they are spawned from one long-lived thread (the signal follows the spawning
thread); each has RLIMIT_AS of 4 GiB. ``status_counts`` counts (kind, status) pairs in this process;
the reward function also logs the timeout / no_answer / error fractions through TRL's ``log_metric``.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import json
import os
import re
import select
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path

KINDS: tuple[str, ...] = ("integer", "math", "gsm8k", "mcq", "dapo", "code")
STATUSES: tuple[str, ...] = ("ok", "no_answer", "timeout", "error")

# Statuses of every check made by this process, by kind (e.g. to report timeouts after an eval).
status_counts: collections.Counter = collections.Counter()
_COUNT_LOCK = threading.Lock()


@dataclass(frozen=True)
class Verdict:
    correct: bool
    extracted: str | None
    status: str  # one of STATUSES


# ----------------------------------------------------------------------------------- extraction

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
    # ``\boxed 5`` (no braces)
    m = None
    for m in re.finditer(r"\\boxed\s+([^\s$]+)", text):  # noqa: B007 - keep the last match
        pass
    return m.group(1) if m else None


def _to_decimal(text: str | None) -> Decimal | None:
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


def _extract_integer(text: str) -> str | None:
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    m = _LEADING_NUM_RE.match(text)
    if m:
        return m.group(1)
    nums = _NUM_RE.findall(text)
    return nums[-1] if nums else None


def _extract_gsm8k(text: str) -> str | None:
    if "####" in text:
        tail = text.rsplit("####", 1)[1]
        m = _NUM_RE.search(tail.replace("$", " "))
        if m:
            return m.group(0)
    nums = _NUM_RE.findall(text)
    return nums[-1] if nums else None


_LETTERS = "ABCDEFGHIJ"
_MCQ_ANSWER_RE = re.compile(
    r"(?i:\banswer\b)(?:\s+(?i:is|would\s+be|should\s+be))?\s*[:\-]?\s*(?:(?i:option|choice)\s*)?"
    r"[\*\s]*[\(\[\{]?\s*(?:\\boxed\{|\\text(?:bf)?\{)?\s*\(?([A-J])(?![A-Za-z0-9])"
)
_MCQ_BOXED_RE = re.compile(r"\\boxed\{\s*(?:\\text(?:bf)?\{)?\s*\(?([A-J])\)?\s*\}")
_MCQ_LEADING_RE = re.compile(r"\s*[\(\[]?([A-J])(?![A-Za-z0-9])(?!\s+[a-z])")
_MCQ_PAREN_RE = re.compile(r"\(([A-J])\)")


def _extract_mcq(text: str) -> str | None:
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


def _gold_letter(answer: str) -> str:
    s = str(answer).strip().strip("()").strip().upper()
    if s.isdigit() and int(s) < len(_LETTERS):
        return _LETTERS[int(s)]  # cais/mmlu style 0-based index
    return s


_DAPO_ANSWER_RE = re.compile(r"(?i)answer\s*:\s*([^\n]+)")
_MAX_ANSWER_LINE = 500  # a final-answer line longer than this is cut (bounds normalization cost)
_UNIT_WORDS = (
    "square", "ways", "integers", "dollars", "mph", "inches", "ft", "hours", "km", "units", "points",
    "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters", "meals", "edges",
    "students", "childrentickets", "multiples", "sq", "unit", "sides", "seconds", "days", "people",
)  # fmt: skip


_UNITS_RE = re.compile(rf"(?<=[\d\s}}])(?:{'|'.join(_UNIT_WORDS)})(?:es|s)?\s*$")


def normalize_final_answer(answer: str) -> str:
    """Minerva/DAPO-style normalization of a (short) final answer string, for string comparison."""
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


def _extract_dapo(text: str) -> str | None:
    found = _DAPO_ANSWER_RE.findall(text)
    if not found:
        return None
    s = normalize_final_answer(found[-1][:_MAX_ANSWER_LINE])
    return s or None


def _extract_math(text: str) -> str | None:
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


_FENCE_RE = re.compile(r"```[ \t]*(?:(?:python3|python|py|Python)[ \t]*)?\n(.*?)(?:```|\Z)", re.DOTALL)


def _extract_code(text: str) -> str | None:
    if "```" in text:
        m = _FENCE_RE.search(text)
        if m and m.group(1).strip():
            return m.group(1)
    return text if text.strip() else None


def extract_answer(kind: str, completion: str) -> str | None:
    """The answer a verifier of ``kind`` reads from ``completion`` (None: nothing extractable)."""
    _check_kind(kind)
    text = _completion_text(completion)
    if not text.strip():
        return None
    return _EXTRACTORS[kind](text)


_EXTRACTORS: dict[str, Callable[[str], str | None]] = {
    "integer": _extract_integer,
    "math": _extract_math,
    "gsm8k": _extract_gsm8k,
    "mcq": _extract_mcq,
    "dapo": _extract_dapo,
    "code": _extract_code,
}


# ------------------------------------------------------------------------------- in-process checks


def _numeric_verdict(extracted: str | None, answer: str) -> Verdict:
    if extracted is None:
        return Verdict(False, None, "no_answer")
    gold = str(answer)
    if "####" in gold:
        gold = gold.rsplit("####", 1)[1]
    pred_v, gold_v = _to_decimal(extracted), _to_decimal(gold)
    if pred_v is not None and gold_v is not None:
        return Verdict(pred_v == gold_v, extracted, "ok")
    return Verdict(extracted.strip() == gold.strip(), extracted, "ok")


# --------------------------------------------------------------------------------- math workers

_WORKER_MEMORY_MB = 4096
_WORKER_STARTUP_S = 120.0
_MAX_IDLE_WORKERS = 16
_MAX_PRED_CHARS = 20_000  # math-verify sees at most the last this many characters of a completion


def _parse_gold(gold: str):
    from math_verify import parse

    gold = gold.strip()
    attempts = [gold] if ("\\boxed" in gold or "$" in gold) else []
    attempts += [f"${gold}$", f"\\boxed{{{gold}}}", gold]
    for text in attempts:
        parsed = parse(text, parsing_timeout=None)
        if parsed:
            return parsed
    return []


def _math_check(gold: str, pred: str) -> dict:
    """One math-verify comparison. Runs inside a worker process (no signal-based timeouts)."""
    from math_verify import parse, verify

    gold_parsed = _parse_gold(gold)
    if not gold_parsed:
        return {"correct": False, "extracted": None, "status": "error", "error": f"gold {gold!r} unparseable"}
    pred_parsed = parse(pred, parsing_timeout=None)
    if not pred_parsed:
        return {"correct": False, "extracted": None, "status": "no_answer"}
    correct = verify(gold_parsed, pred_parsed, timeout_seconds=None)
    extracted = str(pred_parsed[-1]) if len(pred_parsed) > 1 else str(pred_parsed[0])
    return {"correct": bool(correct), "extracted": extracted, "status": "ok"}


def _handle_request(req: dict) -> dict:
    op = req.get("op")
    if op == "math":
        return _math_check(req["gold"], req["pred"])
    if op == "sleep":  # test hook: a check that hangs
        time.sleep(float(req["seconds"]))
        return {"correct": True, "extracted": None, "status": "ok"}
    if op == "raise":  # test hook: a check that fails
        raise RuntimeError("requested failure")
    if op == "exit":  # test hook: a worker that dies mid-check
        os._exit(3)
    raise ValueError(f"unknown op {op!r}")


def _worker_main() -> None:
    """Entry point of a worker process: JSON requests on stdin, JSON replies on a private fd."""
    import logging
    import resource

    with contextlib.suppress(Exception):  # die with the parent even while stuck in a check
        import ctypes
        import signal

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    with contextlib.suppress(ValueError, OSError):
        limit = _WORKER_MEMORY_MB * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    logging.disable(logging.WARNING)
    reply = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # stray prints of libraries must not corrupt the protocol
    import math_verify  # noqa: F401 - pay the import before signalling readiness

    _math_check("1", "\\boxed{1}")  # warm up the LaTeX grammar
    reply.write('{"ready": true}\n')
    reply.flush()
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            out = _handle_request(json.loads(line))
        except Exception as exc:  # a check that raises is an error verdict, not a dead worker
            out = {"correct": False, "extracted": None, "status": "error", "error": repr(exc)[:500]}
        reply.write(json.dumps(out) + "\n")
        reply.flush()


class _WorkerDied(RuntimeError):
    pass


_SPAWNER: tuple[int, ThreadPoolExecutor] | None = None
_SPAWNER_LOCK = threading.Lock()


def _spawner() -> ThreadPoolExecutor:
    """A single thread that lives as long as this process (one per process, also after a fork)."""
    global _SPAWNER
    with _SPAWNER_LOCK:
        if _SPAWNER is None or _SPAWNER[0] != os.getpid():
            _SPAWNER = (os.getpid(), ThreadPoolExecutor(max_workers=1, thread_name_prefix="verifier-spawn"))
        return _SPAWNER[1]


class _Worker:
    def __init__(self) -> None:
        root = str(Path(__file__).resolve().parents[1])
        boot = (
            f"import sys; sys.path.insert(0, {root!r}); "
            "from workflow_scripts.verifiers import _worker_main; _worker_main()"
        )
        self.owner = os.getpid()
        # Spawned from one long-lived thread: the worker's PR_SET_PDEATHSIG fires when the *thread*
        # that forked it exits, so a worker started from a short-lived pool thread would be killed.
        started = _spawner().submit(
            subprocess.Popen,
            [sys.executable, "-c", boot],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            close_fds=True,
        )
        self.proc = started.result()
        self._buf = b""
        if not self._read_line(time.monotonic() + _WORKER_STARTUP_S):
            self.kill()
            raise _WorkerDied("math worker did not start")

    def _read_line(self, deadline: float) -> bytes | None:
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], remaining)
            if not ready:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                raise _WorkerDied(f"math worker exited (code {self.proc.poll()})")
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line

    def call(self, request: dict, timeout: float) -> dict | None:
        """The worker's reply, or None if it did not answer within ``timeout`` seconds."""
        try:
            self.proc.stdin.write((json.dumps(request) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            raise _WorkerDied(f"math worker gone: {exc!r}") from exc
        line = self._read_line(time.monotonic() + timeout)
        return None if line is None else json.loads(line)

    def alive(self) -> bool:
        return self.proc.poll() is None and self.owner == os.getpid()

    def kill(self) -> None:
        if self.owner != os.getpid():
            return  # inherited through fork: the parent owns it
        with contextlib.suppress(OSError):
            self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        for stream in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                stream.close()


class _WorkerPool:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []

    def acquire(self) -> _Worker:
        with self._lock:
            while self._idle:
                worker = self._idle.pop()
                if worker.alive():
                    return worker
                worker.kill()
        return _Worker()

    def release(self, worker: _Worker) -> None:
        with self._lock:
            if worker.alive() and len(self._idle) < _MAX_IDLE_WORKERS:
                self._idle.append(worker)
                return
        worker.kill()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for worker in idle:
            worker.kill()


_POOL = _WorkerPool()
atexit.register(_POOL.close)


def shutdown_workers() -> None:
    """Stop the idle math workers (they are restarted on demand)."""
    _POOL.close()


def _run_in_worker(request: dict, timeout: float) -> dict:
    """Run one request in a pooled worker; a timeout kills that worker and reports status timeout.

    A worker that dies before answering is replaced and the request retried once (an idle worker
    may have been killed from outside); a second death is reported as status error.
    """
    for attempt in range(2):
        try:
            worker = _POOL.acquire()
        except _WorkerDied as exc:
            return {"correct": False, "extracted": None, "status": "error", "error": str(exc)}
        try:
            reply = worker.call(request, timeout)
        except _WorkerDied as exc:
            worker.kill()
            if attempt == 0:
                continue
            return {"correct": False, "extracted": None, "status": "error", "error": str(exc)}
        except BaseException:
            worker.kill()
            raise
        if reply is None:
            worker.kill()
            return {"correct": False, "extracted": None, "status": "timeout"}
        _POOL.release(worker)
        return reply
    raise AssertionError("unreachable")


# ------------------------------------------------------------------------------------ planning


@dataclass(frozen=True)
class _Job:
    """A check that must run out of process: a math-verify request or a sandboxed program."""

    extracted: str | None
    request: dict | None = None
    program: str | None = None
    token: str | None = None


def _math_job(completion: str, answer: str) -> Verdict | _Job:
    boxed = last_boxed(completion)
    pred = f"\\boxed{{{boxed}}}" if boxed is not None else completion[-_MAX_PRED_CHARS:]
    return _Job(_extract_math(completion), request={"op": "math", "gold": str(answer), "pred": pred})


def _dapo_plan(completion: str, answer: str) -> Verdict | _Job:
    extracted = _extract_dapo(completion)
    if extracted is None:
        return Verdict(False, None, "no_answer")
    gold = normalize_final_answer(str(answer))
    pred_v, gold_v = _to_decimal(extracted), _to_decimal(gold)
    if pred_v is not None and gold_v is not None:
        return Verdict(pred_v == gold_v, extracted, "ok")
    if extracted == gold:
        return Verdict(True, extracted, "ok")
    return _Job(extracted, request={"op": "math", "gold": str(answer), "pred": f"${extracted}$"})


def _code_plan(completion: str, meta: dict, prompt: str | None) -> Verdict | _Job:
    code = _extract_code(completion)
    if code is None:
        return Verdict(False, None, "no_answer")
    if "test" not in meta or "entry_point" not in meta:
        return Verdict(False, code, "error")
    stub = meta.get("prompt", prompt) or ""
    entry = meta["entry_point"]
    if re.search(rf"^def\s+{re.escape(entry)}\s*\(", code, re.MULTILINE):
        program = stub.rstrip("\n") + "\n\n" + code  # a full definition replaces the stub's
    else:
        program = stub + code
    token = uuid.uuid4().hex
    program += (
        f"\n\n{meta['test']}\n\ncheck({entry})\n"
        f"import sys as _rlvr_sys\n_rlvr_sys.stdout.flush()\n_rlvr_sys.stderr.write('\\n{token}\\n')\n"
    )
    return _Job(code, program=program, token=token)


def _plan(kind: str, completion: str, answer: str, meta: dict, prompt: str | None) -> Verdict | _Job:
    if not completion.strip():
        return Verdict(False, None, "no_answer")
    if kind in ("integer", "gsm8k"):
        return _numeric_verdict(_EXTRACTORS[kind](completion), answer)
    if kind == "mcq":
        extracted = _extract_mcq(completion)
        if extracted is None:
            return Verdict(False, None, "no_answer")
        return Verdict(extracted == _gold_letter(answer), extracted, "ok")
    if kind == "dapo":
        return _dapo_plan(completion, answer)
    if kind == "math":
        return _math_job(completion, answer)
    return _code_plan(completion, meta, prompt)


def _execute(job: _Job, timeout: float) -> Verdict:
    if job.program is not None:
        from workflow_scripts.sandbox import run_sandboxed

        res = run_sandboxed(job.program, timeout=timeout)
        if res.timed_out:
            return Verdict(False, job.extracted, "timeout")
        if res.status == "error":
            return Verdict(False, job.extracted, "error")
        passed = res.returncode == 0 and job.token in res.stderr
        return Verdict(passed, job.extracted, "ok")
    reply = _run_in_worker(job.request, timeout)
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
) -> list[Verdict]:
    """Score ``completions`` against ``answers``; one Verdict each, in order.

    In-process kinds are checked directly; math-verify and code checks run out of process, up to
    ``workers`` at a time, each bounded by ``timeout`` seconds. A check that hangs is killed and
    scored ``timeout``; one that raises is scored ``error``; the rest of the batch is unaffected.
    """
    _check_kind(kind)
    n = len(completions)
    if len(answers) != n:
        raise ValueError(f"{n} completions but {len(answers)} answers")
    if metas is not None and len(metas) != n:
        raise ValueError(f"{n} completions but {len(metas)} metas")
    if prompts is not None and len(prompts) != n:
        raise ValueError(f"{n} completions but {len(prompts)} prompts")
    verdicts: list[Verdict | None] = [None] * n
    jobs: list[tuple[int, _Job]] = []
    for i in range(n):
        try:
            text = _completion_text(completions[i])
            meta = _as_meta(metas[i]) if metas is not None else {}
            prompt = prompts[i] if prompts is not None and isinstance(prompts[i], str) else None
            planned = _plan(kind, text, answers[i], meta, prompt)
        except Exception:
            planned = Verdict(False, None, "error")
        if isinstance(planned, Verdict):
            verdicts[i] = planned
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
) -> Verdict:
    """Score one completion (see ``verify_batch``)."""
    return verify_batch(kind, [completion], [answer], [meta or {}], timeout, prompts=[prompt])[0]


class RewardFunction:
    """A TRL GRPOTrainer reward function: ``f(prompts, completions, answer, **kwargs) -> list[float]``.

    TRL passes every dataset column as a keyword list (``answer``, ``meta``, ``kind`` ...) and also
    ``trainer_state``, ``log_metric``, ``log_extra``. Reward is 1.0 if correct else 0.0. The fractions
    of timeouts / no-answers / errors are logged through ``log_metric`` when TRL provides it.
    A module-level class (not a closure) so that the reward function pickles.
    """

    def __init__(self, kind: str, timeout: float = 5.0, workers: int = 1) -> None:
        _check_kind(kind)
        self.kind = kind
        self.timeout = timeout
        self.workers = workers
        self.__name__ = f"{kind}_reward"

    def __call__(self, prompts=None, completions=None, answer=None, **kwargs) -> list[float]:
        if completions is None:
            raise ValueError(f"{self.__name__}: no completions passed")
        if answer is None:
            raise ValueError(f"{self.__name__}: the dataset needs an 'answer' column")
        kinds = kwargs.get("kind")
        if kinds is not None and any(k != self.kind for k in kinds):
            raise ValueError(f"{self.__name__}: batch has rows of kind {sorted(set(kinds))}")
        metas = kwargs.get("meta")
        verdicts = verify_batch(
            self.kind,
            list(completions),
            [str(a) for a in answer],
            list(metas) if metas is not None else None,
            timeout=self.timeout,
            workers=self.workers,
            prompts=list(prompts) if prompts is not None else None,
        )
        log_metric = kwargs.get("log_metric")
        if callable(log_metric) and verdicts:
            for status in ("timeout", "no_answer", "error"):
                frac = sum(v.status == status for v in verdicts) / len(verdicts)
                log_metric(f"verifier/{self.kind}/{status}_frac", frac)
        return [1.0 if v.correct else 0.0 for v in verdicts]

    def __repr__(self) -> str:
        return f"RewardFunction(kind={self.kind!r}, timeout={self.timeout}, workers={self.workers})"


def make_reward_function(kind: str, timeout: float = 5.0, workers: int = 1) -> Callable[..., list[float]]:
    """The TRL reward function for ``kind`` (named ``f"{kind}_reward"`` in TRL's logs)."""
    return RewardFunction(kind, timeout=timeout, workers=workers)
