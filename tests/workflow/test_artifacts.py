"""Corrupt result files are reported with their path, whichever loader meets them first."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from workflow_scripts.runtime.atomic import write_json, write_jsonl, write_parquet
from workflow_scripts.tasks.rows import DataError, read_json, read_jsonl, read_parquet

TINY = {
    "hidden_size": 16,
    "num_layers": 1,
    "num_heads": 2,
    "intermediate_size": 32,
    "max_position_embeddings": 64,
    "seed": 0,
}


def _truncate(path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def test_a_truncated_model_safetensors_names_its_path(tmp_path):
    from workflow_scripts.models.modeling import build_char_tokenizer, build_tiny_llama, load_model

    tok = build_char_tokenizer()
    folder = tmp_path / "models" / "fp32-s1"
    build_tiny_llama(len(tok), TINY, tok).save_pretrained(folder, safe_serialization=True)
    tok.save_pretrained(folder)
    assert load_model(folder, "float32") is not None  # intact: loads
    for keep in (0.5, 0.0001):  # cut in the tensors / in the header
        weights = folder / "model.safetensors"
        intact = weights.read_bytes()
        _truncate(weights, keep)
        with pytest.raises(ValueError, match=str(weights).replace(".", r"\.")):
            load_model(folder, "float32")
        weights.write_bytes(intact)


@pytest.mark.parametrize("keep", [0.5, 0.9])
def test_truncated_json_jsonl_and_parquet_results_name_their_path(tmp_path, keep):
    write_json(tmp_path / "run.json", {"precision": "bf16", "seed": 1, "steps": list(range(50))})
    write_jsonl(tmp_path / "metrics.jsonl", [{"step": i, "loss": 0.5} for i in range(50)])
    write_parquet(tmp_path / "t.samples.parquet", pd.DataFrame({"id": range(500), "correct": [True] * 500}))
    _truncate(tmp_path / "run.json", keep)
    with pytest.raises(DataError, match=r"run\.json:\d+: not valid JSON"):
        read_json(tmp_path / "run.json")
    # a jsonl cut mid-line: the broken last line is named (a killed writer's signature)
    text = (tmp_path / "metrics.jsonl").read_text()
    (tmp_path / "metrics.jsonl").write_text(text[: int(len(text) * keep)].rstrip("\n")[:-3])
    with pytest.raises(DataError, match=r"metrics\.jsonl:\d+: not valid JSON"):
        read_jsonl(tmp_path / "metrics.jsonl")
    _truncate(tmp_path / "t.samples.parquet", keep)
    with pytest.raises(DataError, match=r"t\.samples\.parquet: not a readable parquet file"):
        read_parquet(tmp_path / "t.samples.parquet")


def test_intact_results_round_trip(tmp_path):
    write_json(tmp_path / "a.json", {"x": 1.5})
    write_jsonl(tmp_path / "b.jsonl", [{"x": 1}, {"x": 2}])
    write_parquet(tmp_path / "c.parquet", pd.DataFrame({"x": [1, 2]}))
    assert read_json(tmp_path / "a.json") == {"x": 1.5}
    assert read_jsonl(tmp_path / "b.jsonl") == [{"x": 1}, {"x": 2}]
    assert read_parquet(tmp_path / "c.parquet")["x"].tolist() == [1, 2]
    assert json.loads((tmp_path / "a.json").read_text()) == {"x": 1.5}
