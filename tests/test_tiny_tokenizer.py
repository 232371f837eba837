"""The tiny model's tokenizers (model.tiny.tokenizer): char-level, and a BPE learnt from the warm-start pool.

The BPE must change what the model reads only where a real subword tokenizer would: numbers stay digit by
digit (Qwen2's pre-tokenization), text round-trips exactly, and the same pool gives the same tokenizer
in any process, saved and loaded alike."""

import json
import os
import subprocess
import sys

import pytest
from conftest import TEST_CONFIG, load_test_config

from workflow_scripts.models.modeling import (
    build_bpe_tokenizer,
    build_char_tokenizer,
    build_tiny_tokenizer,
    load_tokenizer,
)
from workflow_scripts.runtime.config import ConfigError, validate_config
from workflow_scripts.tasks.synthetic import FAMILIES, sample_mix

MIX = {family: 1.0 for family in FAMILIES}


def _texts(rows) -> list[str]:
    return [t for r in rows for t in (r["prompt"], r["answer"])]


@pytest.fixture(scope="module")
def pool():
    return sample_mix(MIX, 3000, seed=7)


@pytest.fixture(scope="module")
def bpe(pool):
    return build_bpe_tokenizer(_texts(pool), 256)


def test_every_prompt_and_answer_of_every_family_round_trips(bpe):
    held_out = sample_mix(MIX, 600, seed=8, side="eval")  # problems the BPE never saw
    for r in held_out:
        for text in (r["prompt"], r["answer"], r["prompt"] + r["answer"]):
            ids = bpe(text, add_special_tokens=False)["input_ids"]
            assert bpe.unk_token_id not in ids
            assert bpe.decode(ids) == text


def test_digits_are_never_merged_and_template_words_are_one_token(bpe):
    digit_tokens = [t for t in bpe.get_vocab() if any(c.isdigit() for c in t)]
    assert sorted(digit_tokens) == list("0123456789")
    tokens = bpe.convert_ids_to_tokens(bpe("Eve has 14 books and loses 17. Left=")["input_ids"])
    words = ["Eve", " has", " ", "1", "4", " books", " and", " loses", " ", "1", "7", ".", " Left", "="]
    assert tokens == words
    assert bpe.convert_ids_to_tokens(bpe("40+4=")["input_ids"]) == ["4", "0", "+", "4", "="]


def test_the_bpe_is_shorter_than_characters_on_words_only(pool, bpe):
    def tokens(family: str) -> float:
        rows = [r for r in pool if r["meta"]["family"] == family]
        n = sum(len(bpe(r["prompt"])["input_ids"]) for r in rows)
        return n / sum(len(r["prompt"]) for r in rows)

    assert tokens("add_sub") == tokens("mul") == tokens("chain") == 1.0
    assert tokens("word") < 0.45 and tokens("mcq") < 0.85


def test_an_unseen_printable_character_is_still_a_token(bpe):
    ids = bpe("~|{", add_special_tokens=False)["input_ids"]
    assert len(ids) == 3 and bpe.unk_token_id not in ids and bpe.decode(ids) == "~|{"


def test_the_special_tokens_and_padding_match_the_char_tokenizer(bpe):
    char = build_char_tokenizer()
    for name in ("pad_token_id", "bos_token_id", "eos_token_id", "unk_token_id"):
        assert getattr(bpe, name) == getattr(char, name)
    assert bpe.padding_side == "left"
    batch = bpe(["1+1=", "Sam has 2 cards and buys 3 more. Total="], padding=True)
    assert batch["input_ids"][0][0] == bpe.pad_token_id and batch["attention_mask"][0][0] == 0


def test_saved_and_loaded_it_encodes_and_decodes_the_same(tmp_path, pool, bpe):
    bpe.save_pretrained(tmp_path)
    loaded = load_tokenizer(tmp_path)
    texts = _texts(pool[:300])
    assert [loaded(t)["input_ids"] for t in texts] == [bpe(t)["input_ids"] for t in texts]
    assert len(loaded) == len(bpe) and loaded.padding_side == "left"
    assert loaded.decode(bpe("Tom has 6 coins and buys 3 more. Total=9")["input_ids"]).endswith("Total=9")


@pytest.mark.slow
def test_the_same_pool_gives_the_same_tokenizer_in_any_process(tmp_path, pool, bpe):
    """The BPE trainer counts pairs in parallel (Rayon): its result must not depend on the threads."""
    texts = tmp_path / "texts.json"
    texts.write_text(json.dumps(_texts(pool)))
    code = (
        "import json, sys; from workflow_scripts.models.modeling import build_bpe_tokenizer; "
        f"print(build_bpe_tokenizer(json.load(open({str(texts)!r})), 256).backend_tokenizer.to_str())"
    )
    env = {**os.environ, "RAYON_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == json.loads(bpe.backend_tokenizer.to_str())


def test_the_config_names_the_kind():
    assert len(build_tiny_tokenizer(None)) == len(build_char_tokenizer())
    assert len(build_tiny_tokenizer({"kind": "bpe", "vocab_size": 120}, ["Sam has 1 apples"] * 5)) <= 120
    config = load_test_config()
    config["model"]["tiny"]["tokenizer"] = {"kind": "words"}
    with pytest.raises(ConfigError, match="tokenizer"):
        validate_config(config, source=str(TEST_CONFIG))
