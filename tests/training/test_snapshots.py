"""The reference's snapshots (config snapshots; training/checkpoints.Snapshots): the policy at a step is
saved into the run's snapshot folder and the run trains as it would without them."""

from __future__ import annotations

import json

import pytest
from conftest import bit_identical
from safetensors.torch import load_file

from workflow_scripts import train as train_stage
from workflow_scripts.runtime import paths
from workflow_scripts.train import job_from_config

STEPS = 6


def config_of(tiny_base, steps: list[int]) -> dict:
    config = json.loads(json.dumps(tiny_base["config"]))
    config["train"].update(
        max_steps=STEPS,
        checkpoint_every=STEPS,
        kl_every=STEPS,
        kl_prompts=4,
        kl_samples=2,
        learning_rate=1e-3,
    )
    config["snapshots"] = {"steps": steps}
    return config


@pytest.mark.slow
def test_snapshots_are_the_policy_at_their_steps_and_change_no_trajectory(tiny_base, tmp_path):
    """~10 s: two 6-step runs of the test config's tiny model."""
    config = config_of(tiny_base, [2, 4, STEPS])  # STEPS: not a snapshot of the workflow (its final is)
    data, base = tiny_base["data_dir"], tiny_base["base_dir"]
    job = job_from_config(config, "fp32", 1, data, base, tmp_path / "a" / "out", tmp_path / "a" / "ckpt")
    assert sorted(map(int, job["snapshots"])) == [2, 4]  # the steps before the last, the reference only
    assert job["snapshots"]["2"] == str(paths.snapshot_in(tmp_path / "a" / "out", 2))
    bf16 = job_from_config(
        config, "bf16", 1, tiny_base["data_dir"], tiny_base["base_dir"], tmp_path, tmp_path
    )
    assert bf16["snapshots"] == {}
    job["snapshots"][str(STEPS)] = str(tmp_path / "a" / "at_last")  # the last step: must be the final model
    record = train_stage.run(**job, threads=1)
    assert record["snapshots"] == [2, 4, STEPS]
    out = tmp_path / "a" / "out"
    final = load_file(out / "model" / "model.safetensors")
    assert bit_identical(load_file(tmp_path / "a" / "at_last" / "model.safetensors"), final)
    s2, s4 = (load_file(paths.snapshot_in(out, k) / "model.safetensors") for k in (2, 4))
    assert not bit_identical(s2, s4) and not bit_identical(s4, final)
    assert (paths.snapshot_in(out, 2) / "tokenizer.json").is_file()
    assert not (tmp_path / "a" / "ckpt").exists()  # the checkpoint folder (and its snapshots) is gone

    plain = job_from_config(config_of(tiny_base, []), "fp32", 1, tiny_base["data_dir"], tiny_base["base_dir"],
                            tmp_path / "b" / "out", tmp_path / "b" / "ckpt")  # fmt: skip
    assert plain["snapshots"] == {}
    train_stage.run(**plain, threads=1)
    assert bit_identical(load_file(tmp_path / "b" / "out" / "model" / "model.safetensors"), final)
