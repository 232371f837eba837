"""Synthetic arithmetic task families: a controllable on-task distribution and its shifts.

Every family is deterministic given a seed and verifiable by construction. The on-task family
(``add_sub``) is what RL trains on; the others shift the distribution in different ways so that
off-task evaluation (H2) can see what training did outside its own distribution.

Held out by construction: every problem lies on one ``side``, "eval" or "train", by a stable hash of its
normalized prompt (``on_side``). Evaluation sets draw eval-side problems only; the training set and the
warm-start pool draw train-side problems only. So no training or warm-start prompt can equal an
evaluation prompt, whatever tasks a config lists, and adding an evaluation task changes no training data
(no cross-task deduplication is needed for synthetic sets).

| family  | example prompt                                   | shift from add_sub            | kind    |
|---------|--------------------------------------------------|-------------------------------|---------|
| add_sub | ``47+12=``                                        | (on-task: operands 0-99)      | integer |
| add_sub_small | ``7+12=``                                   | easier: operands 0-19 (a      | integer |
|         |                                                  | curriculum's first phase)     |         |
| mul     | ``7*13=``                                         | operator not trained by RL    | integer |
| chain   | ``3+7-5=``                                        | multi-step (three operands)   | integer |
| long    | ``347+5=``                                        | longer (3-digit) operand      | integer |
| mcq     | ``47+12? A:59 B:58 C:69 D:49 Ans:``               | multiple-choice format        | mcq     |
| word    | ``Sam has 17 apples and buys 3 more. Total=``     | natural-language wording      | integer |
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Iterable

from workflow_scripts.tasks.rows import Row, make_row

Problem = tuple[str, str, dict]  # prompt, answer, meta


def _plus_minus(rng: random.Random, a_range: tuple[int, int], b_range: tuple[int, int]) -> Problem:
    a, b = rng.randint(*a_range), rng.randint(*b_range)
    if rng.random() < 0.5:
        return f"{a}+{b}=", str(a + b), {"op": "+"}
    return f"{a}-{b}=", str(a - b), {"op": "-"}


def _add_sub(rng: random.Random) -> Problem:
    return _plus_minus(rng, (0, 99), (0, 99))


def _add_sub_small(rng: random.Random) -> Problem:
    return _plus_minus(rng, (0, 19), (0, 19))


def _mul(rng: random.Random) -> Problem:
    a, b = rng.randint(0, 19), rng.randint(0, 19)
    return f"{a}*{b}=", str(a * b), {"op": "*"}


def _chain(rng: random.Random) -> Problem:
    a, b, c = (rng.randint(0, 9) for _ in range(3))
    op1, op2 = rng.choice("+-"), rng.choice("+-")
    value = a + (b if op1 == "+" else -b)
    value = value + (c if op2 == "+" else -c)
    return f"{a}{op1}{b}{op2}{c}=", str(value), {"op": op1 + op2}


def _long(rng: random.Random) -> Problem:
    return _plus_minus(rng, (100, 999), (0, 9))


def _mcq(rng: random.Random) -> Problem:
    prompt, answer, meta = _add_sub(rng)
    value = int(answer)
    distractors = rng.sample([value + 1, value - 1, value + 10, value - 10, value + 2], 3)
    options = [value, *distractors]
    rng.shuffle(options)
    letters = "ABCD"
    gold = letters[options.index(value)]
    listed = " ".join(f"{letter}:{opt}" for letter, opt in zip(letters, options, strict=True))
    return f"{prompt[:-1]}? {listed} Ans:", gold, {**meta, "choices": options}


_NAMES = ("Sam", "Ann", "Bob", "Eve", "Tom", "Kim")
_ITEMS = ("apples", "coins", "books", "cards")


def _word(rng: random.Random) -> Problem:
    a, b = rng.randint(0, 20), rng.randint(0, 20)
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    if rng.random() < 0.5:
        return f"{name} has {a} {item} and buys {b} more. Total=", str(a + b), {"op": "+"}
    return f"{name} has {a} {item} and loses {b}. Left=", str(a - b), {"op": "-"}


FAMILIES: dict[str, tuple[Callable[[random.Random], Problem], str]] = {
    "add_sub": (_add_sub, "integer"),
    "add_sub_small": (_add_sub_small, "integer"),
    "mul": (_mul, "integer"),
    "chain": (_chain, "integer"),
    "long": (_long, "integer"),
    "mcq": (_mcq, "mcq"),
    "word": (_word, "integer"),
}


SIDES = ("eval", "train")


def normalize_prompt(prompt: str) -> str:
    """The text identity used for deduplication: case- and whitespace-insensitive."""
    return " ".join(prompt.lower().split())


def on_side(prompt: str, side: str) -> bool:
    """Whether ``prompt`` belongs to ``side`` ("eval" or "train"): a stable ~50/50 hash split."""
    if side not in SIDES:
        raise ValueError(f"side must be one of {SIDES}, got {side!r}")
    digest = hashlib.blake2b(normalize_prompt(prompt).encode(), digest_size=1).digest()[0]
    return (digest & 1) == (side == "train")


def generate(
    family: str,
    n: int,
    seed: int,
    task: str,
    exclude: Iterable[str] = (),
    side: str = "eval",
    max_tries_factor: int = 50,
) -> list[Row]:
    """``n`` distinct ``side`` problems of ``family``, none whose normalized prompt is in ``exclude``.

    Stops early (with fewer rows) when the family has fewer distinct problems on that side than asked for.
    """
    if family not in FAMILIES:
        raise ValueError(f"unknown synthetic family {family!r}; known: {sorted(FAMILIES)}")
    make, kind = FAMILIES[family]
    rng = random.Random(f"{seed}:{family}:{task}")
    seen = {normalize_prompt(p) for p in exclude}
    rows: list[Row] = []
    for _ in range(n * max_tries_factor):
        if len(rows) == n:
            break
        prompt, answer, meta = make(rng)
        key = normalize_prompt(prompt)
        if key in seen or not on_side(prompt, side):
            continue
        seen.add(key)
        rows.append(
            make_row(f"{task}-{len(rows):05d}", task, kind, prompt, answer, {"family": family, **meta})
        )
    return rows


def sample_mix(
    mix: dict[str, float], n: int, seed: int, exclude: Iterable[str] = (), side: str = "train"
) -> list[Row]:
    """A warm-start pool of ``side`` problems drawn from several families by weight (duplicates allowed)."""
    families = [f for f, w in mix.items() if w > 0]
    if not families:
        raise ValueError("sft_mix has no family with positive weight")
    weights = [mix[f] for f in families]
    rng = random.Random(f"{seed}:sft_mix")
    excluded = {normalize_prompt(p) for p in exclude}
    rows: list[Row] = []
    tries = 0
    while len(rows) < n and tries < 50 * n:
        tries += 1
        family = rng.choices(families, weights)[0]
        make, kind = FAMILIES[family]
        prompt, answer, meta = make(rng)
        if not on_side(prompt, side) or normalize_prompt(prompt) in excluded:
            continue
        rows.append(make_row(f"sft-{len(rows):06d}", "sft", kind, prompt, answer, {"family": family, **meta}))
    return rows
