r"""The ``math`` kind's rule: math-verify's extraction and comparison, with the task's settings.

The completion goes to math-verify's ``parse`` as written (its priorities decide: a "final answer
is ... I hope" statement outranks a box, several boxes joined by "," / "and" form one set), and the
gold to ``parse`` with the same settings, then ``verify(gold, pred)`` (gold first). These rules are
the project's own, each a row in tests/verify/test_verifier_math.py:

- **one-value gold, last box counts**: when the gold is one value (not a set of several parts), the
  prediction is read from its last ``\boxed`` on, so a corrected ``\boxed{46} ... \boxed{47}`` is 47
  (math-verify alone reads the set {46, 47}). A "final answer is" statement after that box still
  outranks it; when the gold has several parts (``k = 45, n = 2``, a set, several roots) the boxes
  together form the answer, as in math-verify.
- **bare gold** (MATH-500 writes ``\frac{1}{2}``, not ``$\frac{1}{2}$``): with LaTeX extraction on,
  a gold without ``$`` / ``\boxed`` is read as ``$gold$`` (``10,455`` = 10455, ``0,111`` = 0.111,
  math-verify's LaTeX reading); with it off, as written. A plain number with one comma that LaTeX
  reads as a pair (``1,22``, ``-2,1``) is ambiguous: MATH-500 writes two roots that way, math-verify's
  expression grammar reads a decimal comma. No set reading unless the gold is a set: it is the set
  when the prediction has several parts, else the number (so ``-2,1`` also accepts ``-2.1``).
- **bounds**: math-verify reads the last 20,000 characters, or 20,000 from the last box on when that
  box starts earlier (the last box stays in view); a last box over 1,000 characters is not checked
  (status ``error``; see ``MAX_BOX_CHARS``).

Settings (``MathSettings``; the task's ``verifier`` config block, defaults as math-verify's):
``extraction`` (``latex`` / ``expr``), ``boxed_match_priority`` (50; 0 = a box outranks a
"final answer is" statement; -1 = boxes are ignored), ``float_rounding`` (6), ``strict`` (True),
``allow_set_relation_comp`` (False).

``handle`` runs inside a worker process (``verifier_workers``): math-verify's own signal-based
timeouts only work on a main thread, so they are off here and the pool bounds each check instead.
"""

from __future__ import annotations

import functools
import re
from dataclasses import asdict, dataclass, fields

from workflow_scripts.verify.string_rules import last_boxed

MAX_PRED_CHARS = 20_000  # math-verify reads at most the last this many characters of a completion
# A final box longer than this is not checked (status error): real answers are short (MATH-500's
# longest is 159 characters), and on a huge one sympy fails deep inside while math-verify quietly
# falls back to a fragment (3000 nested \frac{1}{...} would be read as its innermost 1/2).
MAX_BOX_CHARS = 1_000
_COMMA_NUMBER_RE = re.compile(r"-?\d+,\d+")
_INTEGER_RE = re.compile(r"(\$?)(-?(?:0|[1-9]\d*))\1")
_BOX_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")


@dataclass(frozen=True)
class MathSettings:
    """math-verify's extraction and comparison options (defaults are math-verify's)."""

    extraction: tuple[str, ...] = ("latex", "expr")
    boxed_match_priority: int = 50
    float_rounding: int = 6
    strict: bool = True
    allow_set_relation_comp: bool = False

    def __post_init__(self) -> None:
        extraction = tuple(self.extraction)
        object.__setattr__(self, "extraction", extraction)
        if not extraction or any(e not in ("latex", "expr") for e in extraction):
            raise ValueError(
                f"verifier.extraction must be a non-empty list of latex/expr, got {list(extraction)}"
            )
        if self.boxed_match_priority < -1:
            raise ValueError(f"verifier.boxed_match_priority must be >= -1, got {self.boxed_match_priority}")
        if self.float_rounding < 0:
            raise ValueError(f"verifier.float_rounding must be >= 0, got {self.float_rounding}")

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    def as_dict(self) -> dict:
        out = asdict(self)
        out["extraction"] = list(self.extraction)
        return out


def last_box_start(text: str) -> int | None:
    """Where the last ``\\boxed{`` / ``\\fbox{`` starts, or None."""
    start = None
    for m in _BOX_RE.finditer(text):
        start = m.start()
    return start


def oversized_box(completion: str, settings: MathSettings) -> str | None:
    """The last box's content if it is too long to check (``MAX_BOX_CHARS``), else None."""
    if "latex" not in settings.extraction or settings.boxed_match_priority < 0:
        return None
    start = last_box_start(completion)
    box = last_boxed(completion[start:]) if start is not None else None
    return box if box is not None and len(box) > MAX_BOX_CHARS else None


def request(completion: str, gold: str, settings: MathSettings) -> dict:
    """The worker request that checks ``completion`` against ``gold``.

    math-verify sees the last ``MAX_PRED_CHARS`` characters, or, when the last box starts before
    them, that many from the box on (so the last box is always in view).
    """
    start = last_box_start(completion)
    if start is not None and len(completion) - start > MAX_PRED_CHARS:
        pred = completion[start : start + MAX_PRED_CHARS]
    else:
        pred = completion[-MAX_PRED_CHARS:]
    return {"gold": str(gold), "pred": pred, "settings": settings.as_dict()}


# ------------------------------------------------------------------------ runs in a worker process


@functools.lru_cache(maxsize=16)
def _targets(settings: MathSettings) -> tuple:
    from math_verify import ExprExtractionConfig, LatexExtractionConfig

    made = {
        "latex": lambda: LatexExtractionConfig(boxed_match_priority=settings.boxed_match_priority),
        "expr": ExprExtractionConfig,
    }
    return tuple(made[name]() for name in settings.extraction)


def _parse(text: str, settings: MathSettings) -> list:
    from math_verify import parse

    return parse(text, _targets(settings), parsing_timeout=None)


@functools.lru_cache(maxsize=256)  # the 16 samples of a prompt share their gold
def parse_gold(gold: str, settings: MathSettings) -> tuple[tuple, tuple]:
    """(the gold as math-verify objects, its one-value reading if a comma makes it ambiguous).

    Empty first element: unparseable. See the module docstring.
    """
    gold = gold.strip()
    integer = _INTEGER_RE.fullmatch(gold)
    if integer and "latex" in settings.extraction:  # AIME/AMC golds: math-verify's own reading, 10x faster
        import sympy

        return (sympy.Integer(integer.group(2)), integer.group(2)), ()
    bare = "$" not in gold and "\\boxed" not in gold
    attempts = (
        [f"${gold}$", f"\\boxed{{{gold}}}", gold] if bare and "latex" in settings.extraction else [gold]
    )
    found: list = []
    for text in attempts:
        parsed = _parse(text, settings)
        if parsed and not all(isinstance(p, str) for p in parsed):
            found = parsed
            break
        found = found or parsed  # a string-only reading is math-verify's fallback: keep the first
    number: list = []
    if bare and found and _COMMA_NUMBER_RE.fullmatch(gold) and _several_parts(found[0]):
        from math_verify import ExprExtractionConfig, parse

        number = parse(gold, [ExprExtractionConfig()], parsing_timeout=None)
    return tuple(found), tuple(number)


def _several_parts(value) -> bool:
    """A set of two or more answers (math-verify joins several boxes / "a and b" into a FiniteSet)."""
    from sympy import FiniteSet

    return isinstance(value, FiniteSet) and len(value.args) > 1


def check(gold: str, pred: str, settings: MathSettings) -> dict:
    """One math-verify comparison: {"correct", "extracted", "status"}."""
    from math_verify import verify

    gold_parsed, gold_number = parse_gold(gold, settings)
    if not gold_parsed:
        return {"correct": False, "extracted": None, "status": "error", "error": f"gold {gold!r} unparseable"}
    reads_boxes = "latex" in settings.extraction and settings.boxed_match_priority >= 0
    start = last_box_start(pred) if reads_boxes else None
    if start is not None and not _several_parts(gold_parsed[0]):
        pred = pred[start:]
    pred_parsed = _parse(pred, settings)
    if not pred_parsed:
        return {"correct": False, "extracted": None, "status": "no_answer"}
    if gold_number and not _several_parts(pred_parsed[0]):
        gold_parsed = gold_number
    correct = verify(
        list(gold_parsed),
        pred_parsed,
        float_rounding=settings.float_rounding,
        strict=settings.strict,
        allow_set_relation_comp=settings.allow_set_relation_comp,
        timeout_seconds=None,
    )
    return {"correct": bool(correct), "extracted": str(pred_parsed[-1]), "status": "ok"}


def handle(req: dict) -> dict:
    """Worker entry point for one request built by ``request``."""
    settings = MathSettings(**req.get("settings", {}))
    return check(req["gold"], req["pred"], settings)


def warm_up() -> None:
    """Pay math-verify's import and grammar build before the worker reports ready."""
    import logging

    logging.getLogger("math_verify").setLevel(logging.ERROR)
    check("1", "\\boxed{1}", MathSettings())
