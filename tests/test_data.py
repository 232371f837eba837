"""Synthetic generators, real-dataset loaders (on the fixtures in data/fixtures) and deduplication."""

from __future__ import annotations

import json

import pytest
from conftest import REPO

from workflow_scripts import synthetic
from workflow_scripts.config import validate_config
from workflow_scripts.prepare_data import deduplicate, prepare
from workflow_scripts.real_datasets import load_dataset_rows, read_local
from workflow_scripts.rows import FIELDS, make_row, read_rows

FIXTURES = REPO / "data" / "fixtures"


def _eval_int(prompt: str) -> int:
    """Independent check of an arithmetic prompt's value (the generator must agree)."""
    expr = prompt.rstrip("=")
    assert set(expr) <= set("0123456789+-*"), prompt
    return eval(expr)


@pytest.mark.parametrize("family", ["add_sub", "mul", "chain", "long"])
def test_arithmetic_families_are_correct_and_distinct(family):
    rows = synthetic.generate(family, 150, seed=3, task=family)
    assert len(rows) == 150
    assert len({r["prompt"] for r in rows}) == 150
    for row in rows:
        assert int(row["answer"]) == _eval_int(row["prompt"])
        assert set(row) == set(FIELDS) and row["kind"] == "integer"


def test_families_shift_the_distribution():
    long_rows = synthetic.generate("long", 50, seed=0, task="t")
    assert all(len(r["prompt"].split("+")[0].split("-")[0]) == 3 for r in long_rows)
    chain = synthetic.generate("chain", 50, seed=0, task="t")
    assert all(sum(r["prompt"].count(op) for op in "+-") == 2 or "--" in r["prompt"] for r in chain)


def test_mcq_and_word_answers_are_verifiable():
    for row in synthetic.generate("mcq", 100, seed=1, task="mcq"):
        assert row["kind"] == "mcq"
        choices = row["meta"]["choices"]
        gold = choices["ABCD".index(row["answer"])]
        assert gold == _eval_int(row["prompt"].split("?")[0] + "=")
        assert len(set(choices)) == 4
    for row in synthetic.generate("word", 100, seed=1, task="word"):
        a, b = (int(tok.rstrip(".")) for tok in row["prompt"].split() if tok.rstrip(".").isdigit())
        assert int(row["answer"]) == (a + b if "buys" in row["prompt"] else a - b)


def test_generators_are_deterministic_given_the_seed():
    a = synthetic.generate("add_sub", 50, seed=5, task="x")
    b = synthetic.generate("add_sub", 50, seed=5, task="x")
    c = synthetic.generate("add_sub", 50, seed=6, task="x")
    assert a == b and a != c


def test_generate_excludes_and_caps_at_the_family_size():
    first = synthetic.generate("mul", 10, seed=0, task="t")
    again = synthetic.generate("mul", 10, seed=0, task="t", exclude=[r["prompt"] for r in first])
    assert not {r["prompt"] for r in first} & {r["prompt"] for r in again}
    assert len(synthetic.generate("mul", 10_000, seed=0, task="t")) == 400  # 20 x 20 operand pairs


def test_sft_mix_follows_the_weights_and_skips_eval_prompts():
    evals = [r["prompt"] for r in synthetic.generate("add_sub", 500, seed=0, task="v")]
    pool = synthetic.sample_mix({"add_sub": 0.8, "mul": 0.2}, 4000, seed=0, exclude=evals)
    share = sum(r["meta"]["family"] == "mul" for r in pool) / len(pool)
    assert 0.17 < share < 0.23
    assert not {synthetic.normalize_prompt(p) for p in evals} & {
        synthetic.normalize_prompt(r["prompt"]) for r in pool
    }


def test_dedup_drops_and_counts_by_normalized_text():
    train = [make_row(i, "train", "integer", p, 0) for i, p in enumerate(["1+1=", " 2+2= ", "3+3=", "X+Y="])]
    evals = {"a": [make_row(0, "a", "integer", "2+2=", 4)], "b": [make_row(0, "b", "integer", "x+y=", 0)]}
    kept, dropped = deduplicate(train, evals)
    assert [r["prompt"] for r in kept] == ["1+1=", "3+3="]
    assert dropped == {"a": 1, "b": 1}


# name, fixture, expected (first row's answer, kind), number of rows
LOADERS = [
    ("dapo_math", "dapo_math.parquet", "55", "dapo", 4),
    ("math500", "math500.jsonl", "\\left( 3, \\frac{\\pi}{2} \\right)", "math", 3),
    ("aime24", "aime24.jsonl", "204", "math", 2),
    ("aime25", "aime25.jsonl", "70", "math", 2),
    ("amc23", "amc23.jsonl", "27.0", "math", 2),
    ("gsm8k", "gsm8k.jsonl", "72", "gsm8k", 3),
    ("mmlu_stem", "mmlu.parquet", "C", "mcq", 3),
    ("humaneval", "humaneval.jsonl", None, "code", 2),
]


@pytest.mark.parametrize(("name", "fixture", "answer", "kind", "n"), LOADERS)
def test_real_dataset_loader_maps_its_fixture(name, fixture, answer, kind, n):
    rows = load_dataset_rows(name, name, str(FIXTURES / fixture))
    assert len(rows) == n
    for row in rows:
        assert set(row) == set(FIELDS) and row["kind"] == kind and row["task"] == name and row["prompt"]
    if answer is not None:
        assert rows[0]["answer"] == answer
    assert len({r["id"] for r in rows}) == n


def test_loader_details():
    dapo = load_dataset_rows("dapo_math", "t", str(FIXTURES / "dapo_math.parquet"))
    assert "Answer: $Answer" in dapo[0]["prompt"] and dapo[0]["id"] == "9a9b6eb4-a1cb-49d1-8c1e-62eaf2f74079"
    gsm = load_dataset_rows("gsm8k", "t", str(FIXTURES / "gsm8k.jsonl"))
    assert gsm[2]["answer"] == "14400" and "####" in gsm[0]["meta"]["solution"]
    mmlu = load_dataset_rows("mmlu_stem", "t", str(FIXTURES / "mmlu.parquet"))
    assert "philosophy" not in {r["meta"]["subject"] for r in mmlu}  # STEM subjects only
    assert "\nC. 2\n" in mmlu[0]["prompt"] and mmlu[1]["answer"] == "B"
    he = load_dataset_rows("humaneval", "t", str(FIXTURES / "humaneval.jsonl"))
    assert he[0]["id"] == "HumanEval/0" and he[0]["meta"]["entry_point"] == "has_close_elements"
    assert "def check(candidate)" in he[0]["meta"]["test"]
    math = load_dataset_rows("math500", "t", str(FIXTURES / "math500.jsonl"), limit=2)
    assert len(math) == 2 and "\\boxed{}" in math[0]["prompt"]


def test_loader_errors_name_the_file_and_column(tmp_path):
    bad = tmp_path / "gsm.jsonl"
    bad.write_text(json.dumps({"query": "q", "answer": "#### 1"}) + "\n")
    with pytest.raises(ValueError, match=r"gsm\.jsonl: gsm8k needs column\(s\) \['question'\]"):
        load_dataset_rows("gsm8k", "t", str(bad))
    with pytest.raises(FileNotFoundError, match=r"nope\.parquet"):
        read_local(tmp_path / "nope.parquet")
    with pytest.raises(ValueError, match="unsupported dataset format"):
        (tmp_path / "x.csv").write_text("a\n")
        read_local(tmp_path / "x.csv")


def test_hub_loading_offline_gives_a_clear_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(RuntimeError, match="set the task's `path`"):
        load_dataset_rows("gsm8k", "t", None)


def test_prepare_writes_every_output(tmp_path, test_config):
    test_config["data"]["tasks"]["gsm"] = {
        "source": "gsm8k",
        "kind": "gsm8k",
        "role": "off_task",
        "path": str(FIXTURES / "gsm8k.jsonl"),
    }
    cfg = validate_config(test_config)
    summary = prepare(cfg["data"], tmp_path)
    train = read_rows(tmp_path / "train.jsonl")
    assert summary["train"]["rows"] == len(train) == 400 - summary["train"]["dropped_total"]
    assert summary["eval"] == {"add_sub": 40, "mul": 30, "mcq": 30, "gsm": 3}
    for task, n in summary["eval"].items():
        rows = read_rows(tmp_path / "eval" / f"{task}.jsonl")
        assert len(rows) == n and all(r["task"] == task for r in rows)
    eval_prompts = {r["prompt"] for t in summary["eval"] for r in read_rows(tmp_path / "eval" / f"{t}.jsonl")}
    assert not eval_prompts & {r["prompt"] for r in train}
    assert len(read_rows(tmp_path / "sft.jsonl")) == 2000
