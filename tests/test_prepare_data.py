"""Synthetic generators, real-dataset loaders (on the fixtures in data/fixtures) and deduplication."""

from __future__ import annotations

import json

import pytest
from conftest import REPO

from workflow_scripts.prepare_data import deduplicate, prepare
from workflow_scripts.runtime.config import validate_config
from workflow_scripts.tasks import synthetic
from workflow_scripts.tasks.real_datasets import load_dataset_rows, read_local
from workflow_scripts.tasks.rows import (
    FIELDS,
    DataError,
    iter_records,
    make_row,
    read_json,
    read_jsonl,
    read_rows,
)

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
    # 20 x 20 operand pairs, split between the eval and the train side by a hash of the prompt
    sides = [synthetic.generate("mul", 10_000, seed=0, task="t", side=side) for side in synthetic.SIDES]
    assert sum(len(rows) for rows in sides) == 400 and all(150 < len(rows) < 250 for rows in sides)
    assert not {r["prompt"] for r in sides[0]} & {r["prompt"] for r in sides[1]}


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
        (tmp_path / "x.txt").write_text("a\n")
        read_local(tmp_path / "x.txt")


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


def dapo_hub_shaped(path, prompts: int, copies: int):
    """A DAPO-Math-17k-shaped parquet with the hub copy's defect: every prompt repeated ``copies`` times,
    interleaved (prompt 0, 1, ..., 0, 1, ...), as the hub's 1.79M rows repeat its 17,398 prompts ~100x;
    the last copy of prompt 0 carries another answer (a conflicting duplicate)."""
    import pandas as pd

    template = pd.read_parquet(FIXTURES / "dapo_math.parquet").iloc[0].to_dict()
    records = []
    for copy in range(copies):
        for i in range(prompts):
            content = f"Solve: what is {i} + {i}?  Put the answer after 'Answer:'."
            answer = str(2 * i) if (copy, i) != (copies - 1, 0) else "999"
            records.append({**template, "prompt": [{"content": content, "role": "user"}],
                            "reward_model": {"ground_truth": answer, "style": "rule"},
                            "extra_info": {"index": f"{i}-{copy}"}})  # fmt: skip
    pd.DataFrame(records).to_parquet(path)
    return path


@pytest.mark.parametrize("cap", [None, 100, 6])
def test_a_real_training_set_keeps_every_prompt_once_before_the_cap(tmp_path, test_config, cap):
    path = dapo_hub_shaped(tmp_path / "dapo.parquet", prompts=10, copies=20)
    train = {"source": "dapo_math", "kind": "dapo", "path": str(path), "n": cap or 17398}
    test_config["data"]["train"] = train
    test_config["data"]["tasks"]["add_sub"]["source"] = "synthetic"
    test_config["data"]["tasks"]["add_sub"]["family"] = "add_sub"
    cfg = validate_config(test_config)
    summary = prepare(cfg["data"], tmp_path / "out")
    train = read_rows(tmp_path / "out" / "train.jsonl")
    prompts = [r["prompt"] for r in train]
    want = min(cap or 10, 10)
    # cap 100: the first 100 rows of the copy hold 10 prompts x 10 copies; now each prompt once
    assert len(prompts) == len(set(prompts)) == want
    assert [r["answer"] for r in train] == [str(2 * i) for i in range(want)]  # first occurrence kept
    counts = {"records": 200, "repeats_dropped": 190, "conflicting_answers": 1, "distinct": 10}
    assert summary["train"]["source"] == counts
    assert summary["train"]["rows"] == want


# ------------------------------------------------------------------ local files: file:line, as written

MATH_OK = {"problem": "What is 10 + 23?", "answer": "033"}


def _jsonl(path, records, raw_lines=()):
    lines = [json.dumps(r) for r in records] + list(raw_lines)
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_malformed_line_is_an_error_naming_file_and_line(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text(json.dumps(MATH_OK) + "\n\n" + '{"problem": "x", "answer": "1"\n')
    with pytest.raises(DataError, match=r"m\.jsonl:3: not valid JSON"):
        load_dataset_rows("math500", "t", str(path))
    (tmp_path / "a.json").write_text(
        '[\n  {"problem": "p", "answer": "1"},\n  {"problem": "q" "answer": "2"}\n]'
    )
    with pytest.raises(DataError, match=r"a\.json:3: not valid JSON"):
        load_dataset_rows("math500", "t", str(tmp_path / "a.json"))
    (tmp_path / "c.csv").write_text("problem,answer\np,1\nq,2,extra\n")
    with pytest.raises(DataError, match=r"c\.csv:3: "):
        load_dataset_rows("math500", "t", str(tmp_path / "c.csv"))


@pytest.mark.parametrize("answer", [None, "", "   ", "absent"])
def test_a_row_without_an_answer_is_an_error_naming_file_line_and_field(tmp_path, answer):
    bad = {"problem": "p"} if answer == "absent" else {"problem": "p", "answer": answer}
    path = _jsonl(tmp_path / "m.jsonl", [MATH_OK, MATH_OK, bad])
    with pytest.raises(DataError, match=r"m\.jsonl:3: math500: field 'answer' is (missing|empty)"):
        load_dataset_rows("math500", "t", str(path))


def test_bad_records_of_every_dataset_name_their_field(tmp_path):
    gsm = _jsonl(tmp_path / "g.jsonl", [{"question": "q", "answer": "no final answer"}])
    with pytest.raises(DataError, match=r"g\.jsonl:1: gsm8k: field 'answer' has no '####'"):
        load_dataset_rows("gsm8k", "t", str(gsm))
    mmlu = _jsonl(
        tmp_path / "u.jsonl", [{"question": "q", "choices": ["a", "b"], "answer": 5, "subject": "anatomy"}]
    )
    with pytest.raises(DataError, match=r"u\.jsonl:1: mmlu_stem: field 'answer' must be an index"):
        load_dataset_rows("mmlu_stem", "t", str(mmlu))
    dapo = _jsonl(tmp_path / "d.jsonl", [{"prompt": "p", "reward_model": {"ground_truth": ""}}])
    with pytest.raises(DataError, match=r"d\.jsonl:1: dapo_math: field 'reward_model.ground_truth'"):
        load_dataset_rows("dapo_math", "t", str(dapo))
    code = _jsonl(
        tmp_path / "h.jsonl", [{"task_id": "x", "prompt": "def f():\n", "test": "", "entry_point": "f"}]
    )
    with pytest.raises(DataError, match=r"h\.jsonl:1: humaneval: field 'test' is empty"):
        load_dataset_rows("humaneval", "t", str(code))


def test_answers_are_kept_exactly_as_written_in_every_format(tmp_path):
    import pandas as pd

    records = [MATH_OK, {"problem": "p2", "answer": "1,000"}, {"problem": "p3", "answer": "0.50"}]
    files = [
        _jsonl(tmp_path / "a.jsonl", records),
        tmp_path / "a.json",
        tmp_path / "a.csv",
        tmp_path / "a.parquet",
    ]
    files[1].write_text(json.dumps(records, indent=2))
    files[2].write_text("problem,answer\n" + "".join(f'{r["problem"]},"{r["answer"]}"\n' for r in records))
    pd.DataFrame(records).to_parquet(files[3])
    for path in files:
        rows = load_dataset_rows("math500", "t", str(path))
        assert [r["answer"] for r in rows] == ["033", "1,000", "0.50"], path
    numbers = tmp_path / "n.jsonl"
    numbers.write_text(
        '{"problem": "p", "answer": 1e3}\n{"problem": "q", "answer": 27.0}\n{"problem": "r", "answer": 7}\n'
    )
    assert [r["answer"] for r in load_dataset_rows("math500", "t", str(numbers))] == ["1e3", "27.0", "7"]


def test_json_records_know_their_line(tmp_path):
    path = tmp_path / "a.json"
    path.write_text('[\n  {"a": 1},\n\n  {"a": 2}, {"a": 3}\n]\n')
    assert [(w.rsplit(":", 1)[1], r["a"]) for w, r in iter_records(path)] == [("2", 1), ("4", 2), ("4", 3)]


def test_skip_policy_leaves_bad_rows_out_and_prepare_counts_them(tmp_path, test_config):
    path = _jsonl(
        tmp_path / "m.jsonl", [MATH_OK, {"problem": "p"}, {"problem": "q", "answer": "4"}], ["{oops"]
    )
    skipped: list[str] = []
    with pytest.raises(DataError, match=r"m\.jsonl:4: not valid JSON"):  # unparseable: never skipped
        load_dataset_rows("math500", "t", str(path), on_bad_row="skip", skipped=skipped)
    path = _jsonl(tmp_path / "m.jsonl", [MATH_OK, {"problem": "p"}, {"problem": "q", "answer": "4"}])
    rows = load_dataset_rows("math500", "t", str(path), on_bad_row="skip", skipped=skipped)
    assert [r["answer"] for r in rows] == ["033", "4"]
    assert len(skipped) == 1 and "m.jsonl:2: math500: field 'answer' is missing" in skipped[0]

    test_config["data"]["tasks"]["m5"] = {
        "source": "math500",
        "kind": "math",
        "role": "off_task",
        "path": str(path),
    }
    cfg = validate_config(test_config)
    assert cfg["data"]["on_bad_row"] == "error"
    with pytest.raises(DataError, match=r"m\.jsonl:2: math500: field 'answer'"):
        prepare(cfg["data"], tmp_path / "out")
    cfg["data"]["on_bad_row"] = "skip"
    summary = prepare(cfg["data"], tmp_path / "out")
    written = read_json(tmp_path / "out" / "prepare.json")
    assert summary["bad_rows"]["skipped"] == written["bad_rows"]["skipped"] == 1
    assert written["bad_rows"]["by_task"] == {"m5": 1} and "m.jsonl:2" in written["bad_rows"]["first"][0]
    assert summary["eval"]["m5"] == 2
    # the workflow's split: prepare_eval (one task) then prepare_train; prepare.json still counts them
    from workflow_scripts.prepare_data import run

    run(cfg["data"], tmp_path / "wf", tasks=["m5"], train=False)
    summary = run(cfg["data"], tmp_path / "wf", tasks=[])
    assert summary["bad_rows"]["by_task"] == {"m5": 1} and "m.jsonl:2" in summary["bad_rows"]["first"][0]


def test_schema_refuses_an_unknown_bad_row_policy(test_config):
    test_config["data"]["on_bad_row"] = "ignore"
    with pytest.raises(Exception, match="on_bad_row"):
        validate_config(test_config)


def test_result_readers_name_the_file(tmp_path):
    from workflow_scripts.tasks.rows import read_parquet

    (tmp_path / "r.json").write_text('{"a": 1,\n "b": }')
    with pytest.raises(DataError, match=r"r\.json:2: not valid JSON"):
        read_json(tmp_path / "r.json")
    (tmp_path / "m.jsonl").write_text('{"step": 1}\n{"step": 2\n')
    with pytest.raises(DataError, match=r"m\.jsonl:2: not valid JSON"):
        read_jsonl(tmp_path / "m.jsonl")
    (tmp_path / "s.parquet").write_bytes(b"PAR1 truncated")
    with pytest.raises(DataError, match=r"s\.parquet: not a readable parquet file"):
        read_parquet(tmp_path / "s.parquet")
    with pytest.raises(FileNotFoundError, match=r"gone\.json"):
        read_json(tmp_path / "gone.json")
