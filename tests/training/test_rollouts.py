"""Rollouts as at paper scale (eval-mode sampling) and DAPO dynamic sampling, on a few tiny steps.

Dynamic sampling on two processes (every rank joins every refill draw) is checked on the 2-process runs
of tests/training/test_distributed.py, which train with it on: a launch of its own here cost ~20 s of
process start-up for 2 steps."""

from __future__ import annotations

import contextlib
import json

import pytest
import torch
from conftest import bit_identical
from safetensors.torch import load_file
from trl import GRPOTrainer

from workflow_scripts import train
from workflow_scripts.train import train_run
from workflow_scripts.training import grpo_trainer
from workflow_scripts.training.grpo_trainer import group_has_spread, merge_groups, sampling_mode
from workflow_scripts.training.metrics_log import read_metrics

DROPOUT_ARM = {"param_dtype": "float32", "autocast": None, "deterministic": True, "dropout": 0.1}


def config_for(tiny_base, **train) -> dict:
    config = json.loads(json.dumps(tiny_base["config"]))
    config["train"].update(kl_every=100, kl_prompts=2, kl_samples=1, learning_rate=1e-3, checkpoint_every=100)
    config["train"].update(train)
    config["precisions"]["fp32_dropout"] = dict(DROPOUT_ARM)
    return config


def run(tiny_base, tmp_path, name: str, precision: str = "fp32", **train) -> dict:
    root = tmp_path / name
    train_run(
        config_for(tiny_base, **train), precision, 1, tiny_base["data_dir"], tiny_base["base_dir"],
        root / "out", root / "ckpt",
    )  # fmt: skip
    return {
        "metrics": read_metrics(root / "out" / "metrics.jsonl"),
        "run": json.loads((root / "out" / "run.json").read_text()),
        "weights": load_file(root / "out" / "model" / "model.safetensors"),
        "out": root / "out",
    }


@pytest.fixture
def rollouts(monkeypatch) -> list[dict]:
    """Every TRL rollout (completion ids, advantages) and whether any submodule was in train mode."""
    seen: list[dict] = []
    original = GRPOTrainer._generate_and_score_completions

    def spy(self, inputs):
        training = any(m.training for m in list(self.model.modules())[1:])
        out = original(self, inputs)
        seen.append({"ids": out["completion_ids"].clone(), "submodules_training": training})
        return out

    monkeypatch.setattr(GRPOTrainer, "_generate_and_score_completions", spy)
    return seen


@pytest.fixture
def loss_batches(monkeypatch) -> list[torch.Tensor]:
    """The advantages of every micro-batch the loss sees."""
    seen: list[torch.Tensor] = []
    original = GRPOTrainer._compute_loss

    def spy(self, model, inputs):
        seen.append(inputs["advantages"].detach().clone())
        return original(self, model, inputs)

    monkeypatch.setattr(GRPOTrainer, "_compute_loss", spy)
    return seen


def test_sampling_mode_turns_every_submodule_off_and_restores(tiny_base):
    from workflow_scripts.models.modeling import load_model

    model = load_model(tiny_base["base_dir"], "float32", dropout=0.1).train()
    with sampling_mode(model):
        assert model.training  # TRL reads the root flag to pick its train path
        assert not any(m.training for m in list(model.modules())[1:])
    assert all(m.training for m in model.modules())


def test_dropout_does_not_change_step1_rollouts_but_changes_the_loss(tiny_base, tmp_path, rollouts):
    plain = run(tiny_base, tmp_path, "plain", "fp32", max_steps=1)
    plain_ids = rollouts[0]["ids"]
    dropout = run(tiny_base, tmp_path, "dropout", "fp32_dropout", max_steps=1)
    assert not any(r["submodules_training"] for r in rollouts)
    assert torch.equal(plain_ids, rollouts[1]["ids"])  # identical step-1 rollouts
    assert dropout["run"]["dropout"] == {"attention_dropout": 0.1}
    # the loss forward runs with dropout: the policy ratio differs from 1, the loss differs
    assert plain["metrics"][0]["loss"] != dropout["metrics"][0]["loss"]


def test_without_sampling_mode_dropout_would_change_the_rollouts(tiny_base, tmp_path, rollouts, monkeypatch):
    # the control that shows the test above can fail: TRL's own train-mode sampling
    run(tiny_base, tmp_path, "plain", "fp32", max_steps=1)
    monkeypatch.setattr(grpo_trainer, "sampling_mode", lambda model: contextlib.nullcontext())
    run(tiny_base, tmp_path, "dropout", "fp32_dropout", max_steps=1)
    assert rollouts[1]["submodules_training"]
    assert not torch.equal(rollouts[0]["ids"], rollouts[1]["ids"])


def test_group_spread_matches_trl_zero_std():
    rewards = torch.tensor([[1.0], [1.0], [0.0], [1.0], [0.0], [0.0], [float("nan")], [1.0]])
    assert group_has_spread(rewards, torch.ones(1), 2).tolist() == [False, True, False, False]


def test_merge_groups_repads_and_trims():
    a = {
        "prompt_ids": torch.tensor([[9, 1], [9, 1], [2, 3], [2, 3]]),
        "prompt_mask": torch.tensor([[0, 1], [0, 1], [1, 1], [1, 1]]),
        "completion_ids": torch.tensor([[5, 9], [6, 9], [7, 8], [7, 9]]),
        "completion_mask": torch.tensor([[1, 0], [1, 0], [1, 1], [1, 0]]),
        "advantages": torch.tensor([1.0, -1.0, 0.0, 0.0]),
        "num_items_in_batch": torch.tensor(5),
    }
    b = {
        "prompt_ids": torch.tensor([[4], [4]]),
        "prompt_mask": torch.tensor([[1], [1]]),
        "completion_ids": torch.tensor([[1], [2]]),
        "completion_mask": torch.tensor([[1], [1]]),
        "advantages": torch.tensor([0.5, -0.5]),
        "num_items_in_batch": torch.tensor(2),
    }
    merged = merge_groups([a, b], [(0, 0), (1, 0)], group_size=2, pad_id=9)
    # a's group 0 needs one prompt column, b's one: the all-padding left column is gone
    assert merged["prompt_ids"].tolist() == [[1], [1], [4], [4]]
    assert merged["completion_ids"].tolist() == [[5], [6], [1], [2]]  # all-padding right column gone
    assert merged["advantages"].tolist() == [1.0, -1.0, 0.5, -0.5]
    assert int(merged["num_items_in_batch"]) == 4


def test_dynamic_sampling_off_is_bit_identical_to_plain_trl(tiny_base, tmp_path, monkeypatch):
    off = run(tiny_base, tmp_path, "off", max_steps=4, dynamic_sampling=False)

    def pre_change_class(*args, **kwargs):  # make_trainer_class's signature
        ours = grpo_trainer.make_trainer_class(False, 0)

        class PreChange(ours):  # only the epoch-aware sampler, as before the change
            _generate_and_score_completions = GRPOTrainer._generate_and_score_completions
            _calculate_rewards = GRPOTrainer._calculate_rewards

        return PreChange

    monkeypatch.setattr(train, "make_trainer_class", pre_change_class)
    before = run(tiny_base, tmp_path, "before", max_steps=4, dynamic_sampling=False)
    assert bit_identical(off["weights"], before["weights"])
    skip = {"wall_time_s", "step_time_s", "rollouts_drawn", "groups_kept", "groups_zero_spread"}
    skip.add("dynamic_cap_hit")
    strip = [{k: v for k, v in r.items() if k not in skip} for r in off["metrics"]]
    assert strip == [{k: v for k, v in r.items() if k not in skip} for r in before["metrics"]]
    assert all(r["rollouts_drawn"] == 8 for r in off["metrics"])  # 4 prompts x 2 steps per round


def test_dynamic_sampling_feeds_the_loss_only_groups_with_spread(tiny_base, tmp_path, loss_batches):
    off = run(tiny_base, tmp_path, "off", max_steps=4, dynamic_sampling=False)
    zero_rows_off = sum(int((a == 0).sum()) for a in loss_batches)
    assert zero_rows_off > 0  # the base has zero-spread groups: the check below can fail
    assert sum(r["groups_zero_spread"] for r in off["metrics"] if r["generation_step"]) * 4 == zero_rows_off
    loss_batches.clear()
    on = run(tiny_base, tmp_path, "on", max_steps=4, dynamic_sampling=True, dynamic_sampling_max_rounds=8)
    assert loss_batches and all(bool((a != 0).all()) for a in loss_batches)
    fresh = [r for r in on["metrics"] if r["generation_step"]]
    assert all(r["groups_kept"] == 8 and r["groups_zero_spread"] == 0 for r in fresh)
    assert not any(r["dynamic_cap_hit"] for r in fresh)
    assert any(r["rollouts_drawn"] > 8 for r in fresh)  # refills happened
    assert on["run"]["dynamic_sampling"]["enabled"] is True
    assert on["run"]["dynamic_sampling"]["rollouts_drawn"] == sum(r["rollouts_drawn"] for r in fresh)


def test_dynamic_sampling_cap_fills_with_zero_spread_groups_and_counts_them(
    tiny_base, tmp_path, loss_batches
):
    capped = run(
        tiny_base, tmp_path, "cap", max_steps=4, dynamic_sampling=True, dynamic_sampling_max_rounds=0
    )
    fresh = [r for r in capped["metrics"] if r["generation_step"]]
    assert all(r["rollouts_drawn"] == 8 for r in fresh)  # no refill allowed
    hit = [r for r in fresh if r["dynamic_cap_hit"]]
    assert hit and all(r["groups_zero_spread"] > 0 for r in hit)
    zero_rows = sum(int((a == 0).sum()) for a in loss_batches)
    assert zero_rows == 4 * sum(r["groups_zero_spread"] for r in fresh)
    assert capped["run"]["dynamic_sampling"]["cap_hits"] == len(hit)


class _Stop(Exception):
    pass


@pytest.mark.slow
def test_dynamic_sampling_resumes_bit_identically(tiny_base, tmp_path):
    from transformers import TrainerCallback

    class StopAfterCheckpoint(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step == 3:  # checkpoint-2 is complete; step 3 is half done
                raise _Stop

    keys = dict(max_steps=4, checkpoint_every=2, dynamic_sampling=True, dynamic_sampling_max_rounds=8)
    whole = run(tiny_base, tmp_path, "whole", **keys)
    config = config_for(tiny_base, **keys)
    out, ckpt = tmp_path / "resumed" / "out", tmp_path / "resumed" / "ckpt"
    args = (config, "fp32", 1, tiny_base["data_dir"], tiny_base["base_dir"], out, ckpt)
    with pytest.raises(_Stop):
        train_run(*args, callbacks=[StopAfterCheckpoint()])
    torch.manual_seed(999)  # the RNG state must come from the checkpoint
    record = train_run(*args)
    assert record["resumed_from_step"] == 2
    assert bit_identical(load_file(out / "model" / "model.safetensors"), whole["weights"])
    resumed = read_metrics(out / "metrics.jsonl")
    for key in ("loss", "rollouts_drawn", "groups_kept", "reward"):
        assert [r[key] for r in resumed] == [r[key] for r in whole["metrics"]], key


def test_the_colocated_vllm_engine_is_built_in_the_arms_rollout_dtype_not_vllms_auto(monkeypatch):
    """vLLM's dtype "auto" casts a float32 checkpoint to 16 bits; TRL passes no dtype."""
    import trl
    from trl.generation import vllm_generation

    from workflow_scripts.training.grpo_trainer import make_trainer_class
    from workflow_scripts.training.precision import PrecisionMode

    built = []
    monkeypatch.setattr(vllm_generation, "LLM", lambda **kw: built.append(kw) or "engine", raising=False)

    def fake_init(self, *args, **kwargs):  # where TRL builds the engine: VLLMGeneration in __init__
        self.engine = vllm_generation.LLM(model="base")

    monkeypatch.setattr(trl.GRPOTrainer, "__init__", fake_init)
    arm = PrecisionMode.from_config
    assert arm("a", {"param_dtype": "float32"}).sampler_compute_dtype == "float32"
    assert arm("a", {"param_dtype": "float32", "autocast": "bfloat16"}).sampler_compute_dtype == "bfloat16"
    assert arm("a", {"param_dtype": "bfloat16"}).sampler_compute_dtype == "bfloat16"
    own = arm("a", {"param_dtype": "float32", "sampler_dtype": "bfloat16"})
    assert own.sampler_compute_dtype == "bfloat16" and own.sampler_copies
    make_trainer_class(vllm_dtype="float32")()
    make_trainer_class()()  # without vLLM nothing is wrapped: vLLM's own default
    assert built == [{"model": "base", "dtype": "float32"}, {"model": "base"}]
    assert not hasattr(vllm_generation.LLM, "keywords")  # unwrapped again after __init__


def test_the_colocated_vllm_engine_is_seeded_by_the_run_seed_and_rank_not_by_the_rank_alone(monkeypatch):
    """TRL 1.16 builds the engine with seed=process_index // tp: every run seed would share one stream.
    TRL's own VLLMGeneration builds it here (a fake LLM records what it was given)."""
    import types

    import trl
    from trl.generation import vllm_generation

    from workflow_scripts.training.grpo_trainer import make_trainer_class, vllm_seed

    built = []

    class FakeLLM:
        def __init__(self, **kwargs):
            built.append(kwargs)

    monkeypatch.setattr(vllm_generation, "LLM", FakeLLM, raising=False)
    monkeypatch.setattr(vllm_generation, "is_vllm_available", lambda: True)
    monkeypatch.setattr(vllm_generation, "DistributedBackend", lambda accelerator: None)
    monkeypatch.setattr(vllm_generation, "ensure_master_addr_port", lambda: None)
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):  # TRL sets them for vLLM: restored afterwards
        monkeypatch.setenv(name, "0")

    def fake_init(self, *args, rank, **kwargs):  # TRL's __init__, reduced to where it builds the engine
        accelerator = types.SimpleNamespace(
            process_index=rank, local_process_index=rank, num_processes=4, wait_for_everyone=lambda: None
        )
        model = types.SimpleNamespace(name_or_path="base", named_modules=lambda: [])
        self.vllm_generation = vllm_generation.VLLMGeneration(model, accelerator, None, mode="colocate")

    monkeypatch.setattr(trl.GRPOTrainer, "__init__", fake_init)
    trainer_class = make_trainer_class(vllm_dtype="bfloat16")
    seeds = {}
    for run_seed in (1, 2):
        for rank in (0, 3):
            trainer = trainer_class(args=types.SimpleNamespace(seed=run_seed), rank=rank)
            seeds[run_seed, rank] = built[-1]["seed"]
            assert trainer.vllm_engine_args == {"dtype": "bfloat16", "seed": built[-1]["seed"]}
    assert seeds == {(s, r): vllm_seed(s, r) for s in (1, 2) for r in (0, 3)}
    assert len(set(seeds.values())) == 4  # TRL alone: {0, 3}, the same for both run seeds
    assert all(kw["dtype"] == "bfloat16" for kw in built)
    assert vllm_generation.LLM is FakeLLM  # unwrapped after __init__


def test_vllm_seeds_pair_arms_by_seed_share_a_tensor_parallel_group_and_fit_numpy():
    from workflow_scripts.training.grpo_trainer import VLLM_SEED_STRIDE, vllm_seed

    assert vllm_seed(3, 2) == 3 * VLLM_SEED_STRIDE + 2  # the same for every arm of seed 3
    assert len({vllm_seed(s, g) for s in range(4) for g in range(8)}) == 32
    with pytest.raises(ValueError, match="2\\*\\*32"):
        vllm_seed(2**32 // VLLM_SEED_STRIDE + 1, 0)
    with pytest.raises(ValueError, match="group index"):
        vllm_seed(1, VLLM_SEED_STRIDE)
