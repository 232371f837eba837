"""The unified row schema every dataset is mapped to: {id, task, kind, prompt, answer, meta}.

``kind`` names the verifier that scores the row (see ``verifiers``); ``meta`` carries what a
verifier or analysis needs beyond the answer (e.g. HumanEval's test code and entry point).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TypedDict

from workflow_scripts.atomic import write_jsonl

FIELDS = ("id", "task", "kind", "prompt", "answer", "meta")


class Row(TypedDict):
    id: str
    task: str
    kind: str
    prompt: str
    answer: str
    meta: dict


def make_row(id: str, task: str, kind: str, prompt: str, answer, meta: dict | None = None) -> Row:
    return Row(id=str(id), task=task, kind=kind, prompt=prompt, answer=str(answer), meta=dict(meta or {}))


def iter_rows(path: str | os.PathLike) -> Iterator[Row]:
    """Read rows from JSONL, failing with the file and line number on a malformed row."""
    path = Path(path)
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({err.msg})") from err
            missing = [f for f in FIELDS if f not in row]
            if missing:
                raise ValueError(f"{path}:{lineno}: row lacks field(s) {missing}")
            yield row


def read_rows(path: str | os.PathLike) -> list[Row]:
    return list(iter_rows(path))


def write_rows(path: str | os.PathLike, rows) -> int:
    return write_jsonl(path, rows)
