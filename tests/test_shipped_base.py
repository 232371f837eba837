"""The shipped base (data/base, config model.shipped): the default uses it, its files are the manifest's,
and the checks refuse a changed file or another recipe (workflow_scripts/runtime/shipped_base.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import REPO

from workflow_scripts.runtime.config import load_config
from workflow_scripts.runtime.shipped_base import (
    MANIFEST,
    check_shipped,
    recipe,
    recipe_diff,
    sha256_file,
    ship,
    shipped_dir,
    shipped_files,
)


@pytest.fixture(scope="module")
def default() -> dict:
    return load_config(REPO / "config.yaml")


def test_the_default_starts_from_the_shipped_base_whose_files_match_the_manifest(default):
    assert default["model"]["shipped"] == "data/base"
    folder = shipped_dir(default["model"]["shipped"])
    assert folder == REPO / "data" / "base"
    manifest = json.loads((folder / MANIFEST).read_text())
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= set(manifest["files"])
    for name, digest in manifest["files"].items():  # the same bits on any machine
        assert sha256_file(folder / name) == digest, name
    checked = check_shipped(folder, recipe(default["model"], default["data"]))
    assert checked["unchecked_keys"] == [], "the default's recipe has keys the shipped base was built without"
    assert checked["recipe"]["model"]["tiny"] == default["model"]["tiny"]
    assert shipped_files(folder) == sorted(manifest["files"])


def test_a_changed_file_is_refused_naming_it(tmp_path, default):
    folder = tmp_path / "base"
    shutil.copytree(REPO / "data" / "base", folder)
    with open(folder / "tokenizer.json", "a", encoding="utf-8") as fh:
        fh.write(" ")
    with pytest.raises(ValueError, match=r"manifest\.json: files\.tokenizer\.json: sha256"):
        check_shipped(folder, recipe(default["model"], default["data"]))
    (folder / "tokenizer.json").unlink()
    with pytest.raises(ValueError, match=r"files\.tokenizer\.json: .* is missing"):
        check_shipped(folder, recipe(default["model"], default["data"]))


def test_another_recipe_is_refused_naming_the_keys_that_differ(default):
    model = {**default["model"], "tiny": {**default["model"]["tiny"], "seed": 3}}
    data = {**default["data"], "sft_n": 5}
    with pytest.raises(ValueError, match=r"differs in data\.sft_n, model\.tiny\.seed\).*make base"):
        check_shipped(REPO / "data" / "base", recipe(model, data))


def test_the_recipe_leaves_out_shipped_and_synthetic_off_task_tasks_only(default):
    r = recipe(default["model"], default["data"])
    assert "shipped" not in r["model"]
    assert set(r["data"]["tasks"]) == {"add_sub"}  # the on-task; the default's off-task tasks are synthetic
    real = {**default["data"]["tasks"], "gsm8k": {"source": "gsm8k", "role": "off_task"}}
    assert set(recipe(default["model"], {**default["data"], "tasks": real})["data"]["tasks"]) == {
        "add_sub",
        "gsm8k",
    }


def test_keys_newer_than_the_recipe_are_reported_not_refused():
    differ, new = recipe_diff({"model": {"a": 1}}, {"model": {"a": 1, "b": 2}, "data": {}})
    assert (differ, new) == ([], ["data", "model.b"])
    assert recipe_diff({"model": {"a": 1}}, {"model": {}}) == (["model.a"], [])


def test_ship_writes_the_files_and_a_manifest_that_check_shipped_accepts(tmp_path, default):
    built, dest = tmp_path / "built", tmp_path / "dest"
    built.mkdir()
    (built / "model.safetensors").write_bytes(b"weights")
    (built / "config.json").write_text("{}")
    (built / ".snakemake_timestamp").write_text("")  # not a model file: not shipped
    record = tmp_path / "base.json"
    record.write_text(json.dumps({"device": "cpu", "sft": {"steps": 700}, "versions": {"torch": "x"}}))
    dest.mkdir()
    (dest / "stale.safetensors").write_bytes(b"old")
    r = recipe(default["model"], default["data"])
    manifest = ship(built, record, dest, r)
    assert sorted(p.name for p in dest.iterdir()) == ["config.json", MANIFEST, "model.safetensors"]
    assert manifest["built"]["sft"] == {"steps": 700}
    assert check_shipped(dest, r)["files"]["model.safetensors"] == sha256_file(built / "model.safetensors")


def test_the_shipped_weights_load_as_stored(default):
    """What the base_model stage loads is the shipped tensors, bit for bit (the record's sha256s cover it)."""
    import torch
    from safetensors.torch import load_file

    from workflow_scripts.models.modeling import load_model, load_tokenizer

    folder = Path(REPO / "data" / "base")
    model = load_model(folder, default["model"]["dtype"])
    stored = load_file(folder / "model.safetensors")
    state = model.state_dict()
    for name, tensor in stored.items():
        assert torch.equal(state[name], tensor), name
    assert len(load_tokenizer(folder)) == model.config.vocab_size
