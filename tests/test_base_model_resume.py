"""base_model's headroom resumes per chunk of prompts after a kill (a loaded model: 7B at 3072 tokens
samples for hours under a job limit). Uses the session's tiny base (conftest.tiny_base, a few seconds)."""

import json

import pytest
import torch

from workflow_scripts import base_model
from workflow_scripts.models.modeling import load_model, load_tokenizer
from workflow_scripts.tasks.rows import read_rows


@pytest.fixture
def loaded(tiny_base, monkeypatch):
    """The tiny base loaded as a hub/local model is, its on-task rows and task, chunks of 8 prompts."""
    monkeypatch.setattr(base_model, "HEADROOM_CHUNK", 8)
    config = tiny_base["config"]
    task = next(t for t, spec in config["data"]["tasks"].items() if spec["role"] == "on_task")
    rows = read_rows(tiny_base["data_dir"] / "eval" / f"{task}.jsonl")
    model = load_model(tiny_base["base_dir"], "float32")
    return model, load_tokenizer(tiny_base["base_dir"]), rows, config["data"]["tasks"][task]


def test_a_killed_headroom_resumes_from_its_saved_chunks_and_draws_the_same(loaded, tmp_path, monkeypatch):
    model, tok, rows, task = loaded
    chunks = -(-len(rows) // 8)
    assert chunks >= 4  # the test config's on-task set: 40 prompts
    whole = base_model.headroom(model, tok, rows, task, resume=tmp_path / "whole")
    assert whole.pop("chunks_restored") == 0

    calls = []
    real = base_model.correct_matrix

    def killed_after_3(*args, **kwargs):
        if len(calls) == 3:
            raise KeyboardInterrupt("SIGTERM at the job's limit")
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(base_model, "correct_matrix", killed_after_3)
    with pytest.raises(KeyboardInterrupt):
        base_model.headroom(model, tok, rows, task, resume=tmp_path / "killed")
    assert len(list((tmp_path / "killed").glob("*.json"))) == 3  # greedy 0, sampled 0, greedy 1

    calls.clear()
    monkeypatch.setattr(base_model, "correct_matrix", lambda *a, **k: calls.append(1) or real(*a, **k))
    resumed = base_model.headroom(model, tok, rows, task, resume=tmp_path / "killed")
    assert len(calls) == 2 * chunks - 3  # only what the killed attempt had not saved
    assert resumed.pop("chunks_restored") == 3
    assert resumed == whole  # chunk i's samples are seeded by i: a resume draws what an unbroken run does


def test_the_stage_loads_a_local_model_restores_chunks_and_clears_them(tiny_base, tmp_path, monkeypatch):
    """build_base on a loaded model: a chunk saved under the job's key is used (a planted all-correct
    greedy chunk shows in the record), and the resume folder is gone once the record is written."""
    monkeypatch.setattr(base_model, "HEADROOM_CHUNK", 8)
    config = {
        **tiny_base["config"],
        "model": {**tiny_base["config"]["model"], "source": str(tiny_base["base_dir"])},
    }
    task = next(t for t, spec in config["data"]["tasks"].items() if spec["role"] == "on_task")
    record = tmp_path / "results" / "models" / "base.json"
    eval_file = tiny_base["data_dir"] / "eval" / f"{task}.jsonl"
    key_dir = base_model.headroom_resume_dir(
        record, config["model"], config["data"]["tasks"][task], [str(tiny_base["base_dir"]), eval_file]
    )
    key_dir.mkdir(parents=True)
    (key_dir / "greedy-00000.json").write_text(json.dumps([[True]] * 8))
    torch.manual_seed(0)
    base_model.build_base(
        config, tiny_base["data_dir"], tmp_path / "results" / "models" / "base", record, threads=1
    )
    on_task = json.loads(record.read_text())["on_task"]
    assert on_task["chunks_restored"] == 1
    model, tok = load_model(tiny_base["base_dir"], "float32"), load_tokenizer(tiny_base["base_dir"])
    rows, spec = read_rows(eval_file), config["data"]["tasks"][task]
    rest = [
        c[0]
        for s in range(8, len(rows), 8)
        for c in base_model.correct_matrix(model, tok, rows[s : s + 8], spec, 1, 0.0)
    ]
    assert on_task["greedy_accuracy"] == (8 + sum(rest)) / len(rows)  # the planted chunk, the others scored
    assert not key_dir.exists()


def test_a_loaded_models_job_limit_grows_with_its_on_task_problems(tmp_path):
    """resources.base_model_minutes: greedy + 8 samples a problem at half the token budget, at the assumed
    HF rate, plus start-up, times the margin; the rule's runtime reads its on-task file (60 min x attempt
    before it exists: a dry run), and the tiny model keeps the profile's default."""
    from conftest import REPO

    from workflow_scripts.runtime import resources
    from workflow_scripts.runtime.config import load_config

    config = load_config(REPO / "config.paper.yaml", check_files=False)
    tokens = 500 * 9 * 3072 * resources.EVAL_MEAN_LENGTH
    seconds = tokens / config["resources"]["evaluate"]["kl_tokens_per_s"]
    assert resources.base_model_minutes(config, 500) == -(-resources.EVAL_MARGIN * (10 + seconds / 60) // 1)
    assert resources.base_model_minutes(config, 1000) > 1.9 * resources.base_model_minutes(config, 500)
    per_attempt = resources.snakemake_resources(config, "base_model")["runtime"]
    on_task = tmp_path / "math500.jsonl"
    assert per_attempt(None, input=type("I", (), {"on_task": str(on_task)})(), attempt=2) == 120
    on_task.write_text("{}\n" * 500)
    limit = per_attempt(None, input=type("I", (), {"on_task": str(on_task)})(), attempt=2)
    assert limit == 2 * resources.base_model_minutes(config, 500)
    tiny = load_config(REPO / "config.yaml", check_files=False)
    assert "runtime" not in resources.snakemake_resources(tiny, "base_model")
