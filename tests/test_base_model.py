"""The warm start's stopping rule (model.tiny.stop): a held-out train-side probe, checked every N steps."""

import json

import pytest
import torch
from conftest import TEST_CONFIG, load_test_config

from workflow_scripts import base_model
from workflow_scripts.runtime.config import ConfigError, validate_config
from workflow_scripts.tasks.rows import make_row


def _rows() -> list:
    rows = [
        make_row(f"a{i}", "sft", "integer", f"{i}+1=", str(i + 1), {"family": "add_sub"}) for i in range(30)
    ]
    rows += [make_row(f"m{i}", "sft", "integer", f"{i}*2=", str(2 * i), {"family": "mul"}) for i in range(10)]
    return rows + rows[:5]  # the pool repeats problems


def test_the_probe_is_distinct_on_task_family_prompts_held_out_of_the_warm_start():
    probe, rest = base_model.stop_probe(_rows(), "add_sub", 8)
    assert len(probe) == 8 and len({r["prompt"] for r in probe}) == 8
    assert {r["meta"]["family"] for r in probe} == {"add_sub"}
    assert not {r["prompt"] for r in probe} & {r["prompt"] for r in rest}  # repeats removed too
    assert len(rest) == len(_rows()) - 8 - 5  # a0..a4 occur twice and are in the probe


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_batches_hold_the_ids_of_one_call_per_text(kind):
    """The pool is encoded once per distinct text in one batch call; every batch row must be exactly
    the prompt's ids and the (possibly near-missed) answer's ids + end, as one call per text gives."""
    from workflow_scripts.models.modeling import build_tiny_tokenizer

    rows = [*_rows(), make_row("w", "sft", "integer", "Sam has 17 apples. Total=", "23", {"family": "word"})]
    texts = [t for r in rows for t in (r["prompt"], r["answer"])]
    tok = build_tiny_tokenizer({"kind": kind, "vocab_size": 150}, texts)

    def one(text: str) -> tuple[int, ...]:
        return tuple(tok(text, add_special_tokens=False)["input_ids"])

    end = (tok.eos_token_id,)
    expected = {(one(r["prompt"]), one(r["answer"]) + end) for r in rows}
    add_sub = [r for r in rows if r["meta"]["family"] == "add_sub"]
    misses = [(r, m) for r in add_sub for m in base_model.near_misses(r["answer"], ["no_stop"])]
    expected |= {(one(r["prompt"]), one(m) + end) for r, m in misses}
    near_miss = {"rate": 0.5, "kinds": ["no_stop"], "families": ["add_sub"]}
    seen = set()
    for ids, mask, labels in base_model.sft_batches(rows, tok, 8, 40, 0, near_miss):
        assert ids.dtype == mask.dtype == labels.dtype == torch.long
        assert ids.shape == mask.shape == labels.shape
        for seq_ids, seq_mask, seq_labels in zip(ids.tolist(), mask.tolist(), labels.tolist(), strict=True):
            assert seq_mask == sorted(seq_mask) and seq_mask[-1] == 1  # left padding, as generate() pads
            padded = [(t, y) for t, y, m in zip(seq_ids, seq_labels, seq_mask, strict=True) if not m]
            assert all(t == tok.pad_token_id and y == -100 for t, y in padded)
            seq = [t for t, keep in zip(seq_ids, seq_mask, strict=True) if keep]
            answer = tuple(t for t in seq_labels if t != -100)
            seen.add((tuple(seq[: len(seq) - len(answer)]), answer))
    assert seen <= expected and len(seen) > len(rows) // 2
    assert seen & {(one(r["prompt"]), one(m) + end) for r, m in misses}  # near misses were drawn


@pytest.fixture()
def valid_config() -> dict:
    return validate_config(load_test_config(), source=str(TEST_CONFIG))


def test_the_warm_start_ends_at_the_first_check_that_reaches_the_target(monkeypatch, valid_config):
    from workflow_scripts.models.modeling import build_char_tokenizer, build_tiny_llama

    scripted = iter([0.1, 0.3, 0.6, 0.9])
    seen = []

    def fake_correct(model, tokenizer, rows, task, n, temperature, **kw):
        seen.append((len(rows), n, temperature))
        value = next(scripted)
        return [[i < value * len(rows)] for i in range(len(rows))]

    monkeypatch.setattr(base_model, "correct_matrix", fake_correct)
    tiny = {**valid_config["model"]["tiny"], "sft_steps": 40, "stop": {"greedy_accuracy": 0.5, "every": 3}}
    tok = build_char_tokenizer()
    model = build_tiny_llama(len(tok), tiny, tok)
    probe, pool = base_model.stop_probe(_rows(), "add_sub", 10)
    losses, trace = base_model.warm_start(model, tok, pool, tiny, probe, {"max_new_tokens": 4})
    assert len(losses) == 9 and trace == [[3, 0.1], [6, 0.3], [9, 0.6]]
    assert seen == [(10, 1, 0.0)] * 3  # greedy, one sample per probe problem
    assert not model.training


def test_without_a_target_the_warm_start_runs_every_step(valid_config):
    from workflow_scripts.models.modeling import build_char_tokenizer, build_tiny_llama

    tiny = {**valid_config["model"]["tiny"], "sft_steps": 5, "stop": None}
    tok = build_char_tokenizer()
    model = build_tiny_llama(len(tok), tiny, tok)
    losses, trace = base_model.warm_start(model, tok, _rows(), tiny, None, None)
    assert len(losses) == 5 and trace == []


def test_base_json_records_the_rule_and_its_checks(tmp_path, valid_config):
    from workflow_scripts.prepare_data import prepare

    config = json.loads(json.dumps(valid_config))
    config["model"]["tiny"].update(sft_steps=12, stop={"greedy_accuracy": 1.0, "every": 4, "probe_n": 6})
    config = validate_config(config)
    prepare(config["data"], tmp_path / "data")
    record = base_model.build_base(config, tmp_path / "data", tmp_path / "base", tmp_path / "base.json", 1)
    saved = json.loads((tmp_path / "base.json").read_text())
    assert saved == json.loads(json.dumps(record))
    rule = {"greedy_accuracy": 1.0, "every": 4, "probe_n": 6, "floors": {}}
    assert saved["sft"]["stop"] == {**rule, "floor_samples": 16, "floor_temperature": 0.7, "floor_top_p": 0.8}
    assert [s for s, _ in saved["sft"]["probe_trace"]] == [4, 8, 12]  # target not reached: all steps
    assert saved["sft"]["steps"] == 12 and saved["sft"]["stopped_early"] is False


@pytest.mark.parametrize(
    "stop, key",
    [({"every": 5}, "model.tiny.stop"), ({"greedy_accuracy": 0}, "model.tiny.stop.greedy_accuracy"),
     ({"greedy_accuracy": 0.3, "steps": 4}, "model.tiny.stop.steps")],
)  # fmt: skip
def test_a_bad_stopping_rule_is_refused_naming_the_key(valid_config, stop, key):
    config = json.loads(json.dumps(valid_config))
    config["model"]["tiny"]["stop"] = stop
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        validate_config(config, source="x.yaml")


def test_a_bpe_base_is_built_with_the_tokenizer_it_saves(tmp_path, valid_config):
    from workflow_scripts.models.modeling import load_model, load_tokenizer
    from workflow_scripts.prepare_data import prepare

    config = json.loads(json.dumps(valid_config))
    config["model"]["tiny"].update(sft_steps=4, stop=None, tokenizer={"kind": "bpe", "vocab_size": 200})
    config = validate_config(config)
    prepare(config["data"], tmp_path / "data")
    record = base_model.build_base(config, tmp_path / "data", tmp_path / "base", tmp_path / "base.json", 1)
    tok, model = load_tokenizer(tmp_path / "base"), load_model(tmp_path / "base", "float32")
    assert record["tokenizer"] == {"kind": "bpe", "vocab_size": len(tok)}
    assert 101 < len(tok) <= 200 and model.get_input_embeddings().num_embeddings == len(tok)
    assert " Ans" in tok.get_vocab()  # the test config's mcq rows were in the pool it was learnt from


def test_with_floors_the_warm_start_goes_on_until_the_off_task_probes_reach_them(monkeypatch, valid_config):
    """The floors are scored only at checks that reach the on-task target, and both must hold."""
    from workflow_scripts.models.modeling import build_char_tokenizer, build_tiny_llama

    greedy = iter([0.1, 0.6, 0.2, 0.7, 0.8])
    mul = iter([0.0, 0.2])
    calls = []

    def fake_correct(model, tokenizer, rows, task, n, temperature, **kw):
        family = rows[0]["meta"]["family"]
        calls.append((family, n, temperature, kw.get("top_p")))
        value = next(greedy) if family == "add_sub" else next(mul)
        return [[i < value * len(rows)] * n for i in range(len(rows))]

    monkeypatch.setattr(base_model, "correct_matrix", fake_correct)
    stop = {"greedy_accuracy": 0.5, "every": 2, "floors": {"mul": 0.15}, "floor_samples": 4,
            "floor_temperature": 0.7, "floor_top_p": 0.8}  # fmt: skip
    tiny = {**valid_config["model"]["tiny"], "sft_steps": 40, "stop": stop}
    tok = build_char_tokenizer()
    model = build_tiny_llama(len(tok), tiny, tok)
    probe, pool = base_model.stop_probe(_rows(), "add_sub", 10)
    floor_probe, pool = base_model.stop_probe(pool, "mul", 5)
    floors = {"mul": floor_probe}
    losses, trace = base_model.warm_start(model, tok, pool, tiny, probe, {"max_new_tokens": 4}, floors)
    assert trace == [[2, 0.1], [4, 0.6, {"mul": 0.0}], [6, 0.2], [8, 0.7, {"mul": 0.2}]]
    assert len(losses) == 8
    assert [c for c in calls if c[0] == "mul"] == [("mul", 4, 0.7, 0.8)] * 2


def test_a_floor_whose_probe_would_empty_its_family_is_refused(tmp_path, valid_config):
    """mul has ~200 train-side problems in all: a held-out probe of 60 would take over a quarter."""
    from workflow_scripts.prepare_data import prepare

    config = json.loads(json.dumps(valid_config))
    config["model"]["tiny"].update(
        sft_steps=4, stop={"greedy_accuracy": 0.5, "probe_n": 60, "floors": {"mul": 0.1}}
    )
    config = validate_config(config)
    prepare(config["data"], tmp_path / "data")
    with pytest.raises(
        ValueError, match=r"model\.tiny\.stop\.floors\.mul: the warm-start pool has \d+ distinct"
    ):
        base_model.build_base(config, tmp_path / "data", tmp_path / "base", tmp_path / "base.json", 1)


@pytest.mark.parametrize("std", [None, 0.05])
def test_initializer_range_sets_the_std_of_every_weight_matrix(valid_config, std):
    """model.tiny.initializer_range reaches the model's initialization; null keeps transformers' 0.02."""
    from workflow_scripts.models.modeling import build_char_tokenizer, build_tiny_llama

    tiny = {**valid_config["model"]["tiny"], "hidden_size": 64, "intermediate_size": 256}
    tiny["initializer_range"] = std
    tok = build_char_tokenizer()
    model = build_tiny_llama(len(tok), tiny, tok)
    expected = 0.02 if std is None else std
    assert model.config.initializer_range == expected
    matrices = [p for n, p in model.named_parameters() if p.dim() == 2]
    assert matrices and all(abs(p.std().item() - expected) < 0.15 * expected for p in matrices)


def test_initializer_range_must_be_positive():
    config = load_test_config()
    config["model"]["tiny"]["initializer_range"] = 0.0
    with pytest.raises(ConfigError, match="initializer_range"):
        validate_config(config, source="c.yaml")
