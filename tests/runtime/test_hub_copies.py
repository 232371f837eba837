"""Hub copies (runtime/hub_copies.py, rules/fetch.smk): the hub is read only by the local fetch rules, and
the copies give the compute jobs the records and model the hub would have.

No network here: a "hub" dataset is a local folder laid out like the hub repository (data files and a
README whose YAML names the configs), which ``datasets.load_dataset`` reads as it reads a hub id; a hub
model is a hub cache folder (``models--org--name/refs/main``, ``snapshots/<sha>/``) that
``huggingface_hub.snapshot_download`` serves offline.
"""

import dataclasses
import json
import os

import pytest

from workflow_scripts import prepare_data
from workflow_scripts.runtime import hub_copies
from workflow_scripts.tasks import real_datasets
from workflow_scripts.tasks.real_datasets import DATASETS, load_dataset_rows

AIME_README = """---
configs:
- config_name: AIME2025-I
  data_files:
  - split: test
    path: aime2025-I.jsonl
- config_name: AIME2025-II
  data_files:
  - split: test
    path: aime2025-II.jsonl
---
"""


def _write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")


@pytest.fixture
def aime_repo(tmp_path):
    """A two-config dataset repository like opencompass/AIME2025 (15 problems a part)."""
    repo = tmp_path / "AIME2025"
    repo.mkdir()
    (repo / "README.md").write_text(AIME_README, encoding="utf-8")
    for part, offset in (("I", 0), ("II", 100)):
        _write_jsonl(repo / f"aime2025-{part}.jsonl",
                     [{"question": f"part {part} problem {i}: 2+{i}?", "answer": str(offset + i)}
                      for i in range(15)])  # fmt: skip
    return repo


def test_a_dataset_copy_holds_the_hub_records_in_hub_order(aime_repo, tmp_path, monkeypatch):
    """The copy read as a local path gives exactly the rows the hub gives (both configs, in order,
    each record's part kept in ``_config``), so a capped eval set is the same problems either way."""
    out = hub_copies.dataset_copy("aime25", tmp_path / "results")
    assert hub_copies.fetch_dataset("aime25", out, repo=aime_repo) == 30
    monkeypatch.setitem(DATASETS, "aime25", dataclasses.replace(DATASETS["aime25"], hub_id=str(aime_repo)))
    from_hub = load_dataset_rows("aime25", "aime25", None, limit=20)
    from_copy = load_dataset_rows("aime25", "aime25", str(out), limit=20)
    assert from_copy == from_hub
    assert [r["meta"]["part"] for r in from_copy] == ["AIME2025-I"] * 15 + ["AIME2025-II"] * 5
    assert not list(out.parent.glob(".*"))  # written atomically: no temp file left


def test_prepare_reads_a_tasks_copy_and_never_the_hub(aime_repo, tmp_path, monkeypatch):
    """prepare_eval's job passes its `hub` inputs as ``copies``: the task (no `path`) is read from its copy;
    without one it would go to the hub, which this offline test makes fail."""
    copy = hub_copies.dataset_copy("aime25", tmp_path / "results")
    hub_copies.fetch_dataset("aime25", copy, repo=aime_repo)
    task = {"source": "aime25", "kind": "math", "role": "off_task", "path": None}
    data = {"seed": 0, "on_bad_row": "error", "tasks": {"aime25": task}}

    def no_hub(spec):
        raise AssertionError(f"read the hub for {spec.hub_id}")

    monkeypatch.setattr(real_datasets, "read_hub", no_hub)
    copies = hub_copies.copies_by_source([copy])
    assert copies == {"aime25": str(copy)}
    rows = prepare_data.build_eval_set(data, "aime25", copies=copies)
    assert len(rows) == 30 and rows[0]["answer"] == "0" and rows[-1]["answer"] == "114"
    with pytest.raises(AssertionError, match="read the hub"):
        prepare_data.build_eval_set(data, "aime25")


def test_a_missing_hub_dataset_is_an_error_that_says_what_to_do(tmp_path):
    with pytest.raises(RuntimeError, match=r"fetch math500: could not load .*local `path`"):
        hub_copies.fetch_dataset("math500", tmp_path / "m.parquet", repo=tmp_path / "nothing-here")
    assert not (tmp_path / "m.parquet").exists()


def _hub_cache_model(cache, repo_id: str, with_weights: bool = True):
    """A hub cache entry of ``repo_id``: a tiny Qwen2 (config, safetensors, tokenizer) under a snapshot."""
    import torch
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    sha = "0123456789abcdef0123456789abcdef01234567"
    root = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = root / "snapshots" / sha
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(sha)
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)  # fmt: skip
    model = Qwen2ForCausalLM(cfg)
    model.save_pretrained(snapshot, safe_serialization=True)
    vocab = {f"t{i}": i for i in range(31)} | {"<eos>": 31}
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="t0")),
                                  eos_token="<eos>")  # fmt: skip
    tok.save_pretrained(snapshot)
    if not with_weights:
        for f in snapshot.glob("*.safetensors"):
            f.unlink()
    return model


def test_a_model_copy_comes_from_the_hub_cache_offline_and_loads_as_the_model(tmp_path):
    from workflow_scripts.models.modeling import load_model, load_tokenizer

    assert os.environ.get("HF_HUB_OFFLINE") == "1"  # the suite's setting: snapshot_download may not go online
    original = _hub_cache_model(tmp_path / "cache", "org/tiny-qwen")
    out = hub_copies.model_copy("org/tiny-qwen", tmp_path / "results")
    assert out.name == "org--tiny-qwen"
    files = hub_copies.fetch_model("org/tiny-qwen", out, cache_dir=tmp_path / "cache")
    assert "config.json" in files and "model.safetensors" in files and "tokenizer.json" in files
    loaded = load_model(out, "float32")
    assert all((a == b).all() for a, b in zip(original.state_dict().values(), loaded.state_dict().values(),
                                              strict=True))  # fmt: skip
    assert load_tokenizer(out).eos_token == "<eos>"


def test_a_model_snapshot_without_safetensors_is_refused_and_leaves_nothing(tmp_path):
    _hub_cache_model(tmp_path / "cache", "org/no-weights", with_weights=False)
    out = hub_copies.model_copy("org/no-weights", tmp_path / "results")
    with pytest.raises(RuntimeError, match=r"fetch model org/no-weights: .*lacks \['\*.safetensors'\]"):
        hub_copies.fetch_model("org/no-weights", out, cache_dir=tmp_path / "cache")
    assert not out.exists()
    with pytest.raises(RuntimeError, match=r"fetch model org/absent: .*set model\.source to a local folder"):
        hub_copies.fetch_model("org/absent", out, cache_dir=tmp_path / "cache")


def test_which_sources_are_fetched(tmp_path):
    """Real datasets without `path` (not those a package ships: HumanEval) and a hub model id; not
    synthetic sets, not a local copy, not the tiny model or a local model folder."""
    data = {"train": {"source": "dapo_math", "path": None},
            "tasks": {"m": {"source": "math500"}, "a": {"source": "amc23", "path": "amc.jsonl"},
                      "s": {"source": "synthetic"}, "v": {"source": "train_val"},
                      "h": {"source": "humaneval"}}}  # fmt: skip
    phases = [{"source": "train"}, {"source": "gsm8k"}, {"source": "math500"}]
    names = hub_copies.hub_datasets(data, phases)
    expected = ["math500", "dapo_math", "gsm8k"]
    if real_datasets.bundled_copy(DATASETS["humaneval"]) is None:  # the humaneval extra not installed
        expected.insert(1, "humaneval")
    assert names == expected
    with pytest.raises(ValueError, match="source 'nope' is not a known dataset"):
        hub_copies.hub_datasets({"tasks": {"x": {"source": "nope"}}})
    assert hub_copies.hub_model({"source": "Qwen/Qwen2.5-Math-7B"}) == "Qwen/Qwen2.5-Math-7B"
    assert hub_copies.hub_model({"source": "tiny"}) is None
    assert hub_copies.hub_model({"source": str(tmp_path)}) is None
    assert hub_copies.local_path({"source": "math500", "path": None}, {"math500": "c.parquet"}) == "c.parquet"
    assert (
        hub_copies.local_path({"source": "math500", "path": "mine.jsonl"}, {"math500": "c"}) == "mine.jsonl"
    )


def test_a_fetch_job_goes_online_as_the_run_started(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # what rules/common.smk sets for every job
    monkeypatch.delenv(hub_copies.OFFLINE_ENV, raising=False)
    hub_copies.go_online_as_started()
    assert os.environ["HF_HUB_OFFLINE"] == "0"
    monkeypatch.setenv(hub_copies.OFFLINE_ENV, "1")  # the user ran offline (a filled hub cache): stay so
    hub_copies.go_online_as_started()
    assert os.environ["HF_HUB_OFFLINE"] == "1"
