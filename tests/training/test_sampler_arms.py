"""The sampler's numerics as part of an arm, trained for real on the tiny model (HF sampler, CPU).

An fp32 trainer whose sampler holds its own bf16 copy (what TRL's colocate mode does by default) gets a
nonzero sampler-trainer gap that its matched twin (fp32 sampling fp32) does not; the arm's importance
correction acts on the copy's log-probs through TRL's own code; the fp16 arm (fp32 masters, fp16 autocast
with a loss scaler, an fp16 sampler) trains with its scaler active on CPU. One run per arm, 4 steps (two
generation rounds), shared through a module fixture.
"""

from __future__ import annotations

import json

import pytest

from workflow_scripts.train import train_run
from workflow_scripts.training.metrics_log import read_metrics, rollout_rows
from workflow_scripts.training.precision import PrecisionMode
from workflow_scripts.training.sampler import arm_train_config, plan

STEPS = 4
ARMS = {
    "fp32": {"param_dtype": "float32"},
    "fp32_bf16s": {"param_dtype": "float32", "sampler_dtype": "bfloat16"},
    "fp32_bf16s_tis": {
        "param_dtype": "float32",
        "sampler_dtype": "bfloat16",
        "importance_correction": "token_truncate",
    },
    "fp16": {"param_dtype": "float32", "autocast": "float16", "sampler_dtype": "float16"},
}


def _config(tiny_base) -> dict:
    config = json.loads(json.dumps(tiny_base["config"]))
    short = dict(max_steps=STEPS, checkpoint_every=STEPS, kl_every=STEPS, kl_prompts=2, kl_samples=1)
    config["train"].update(short)
    config["precisions"] = {k: {"deterministic": True, **v} for k, v in ARMS.items()}
    return config


@pytest.fixture(scope="module")
def sampler_runs(tiny_base) -> dict:
    out = {}
    for arm in ARMS:
        root = tiny_base["root"] / "sampler_runs" / arm
        train_run(_config(tiny_base), arm, 1, tiny_base["data_dir"], tiny_base["base_dir"],
                  root / "out", root / "ckpt", threads=1)  # fmt: skip
        out[arm] = {
            "run": json.loads((root / "out" / "run.json").read_text()),
            "metrics": read_metrics(root / "out" / "metrics.jsonl"),
        }
    return out


def _gaps(result: dict) -> list[float]:
    """The gap of each generation round (measured at its first step)."""
    return [m["sampler_gap_mean"] for m in rollout_rows(result["metrics"])]


@pytest.mark.slow  # trains four runs (the module fixture)
def test_a_sampler_in_another_dtype_than_the_trainer_gives_a_gap_its_matched_twin_does_not(sampler_runs):
    matched, mismatched = _gaps(sampler_runs["fp32"]), _gaps(sampler_runs["fp32_bf16s"])
    assert len(matched) == len(mismatched) == STEPS // 2  # one measurement per generation round
    assert max(matched) == 0.0  # same weights, same dtype, eval mode: bit-identical log-probs
    assert min(mismatched) > 1e-4  # bf16 weights and products against fp32 ones
    record = sampler_runs["fp32_bf16s"]["run"]["sampler"]
    assert record == {"backend": "hf", "dtype": "bfloat16", "trainer_dtype": "float32", "copies": True,
                      "correction": "off", "correction_acts": False, "reason": None}  # fmt: skip
    assert sampler_runs["fp32"]["run"]["sampler"]["copies"] is False
    observed = sampler_runs["fp32_bf16s"]["run"]["precision_contract"]["observed"]
    assert observed["rollout_dtype"] == "bfloat16"  # the copy computed in bf16 (its own probe)
    assert observed["params_body"] == "float32"


@pytest.mark.slow  # trains four runs (the module fixture)
def test_the_arms_importance_correction_acts_on_the_copys_log_probs_through_trl(sampler_runs):
    corrected = sampler_runs["fp32_bf16s_tis"]
    assert corrected["run"]["importance_sampling"]["acts"] is True
    assert corrected["run"]["importance_sampling"]["mode"] == "token_truncate"
    ratios = [m["vllm_is_ratio_mean"] for m in rollout_rows(corrected["metrics"])]
    assert all(r is not None and r != 1.0 for r in ratios)  # TRL's ratio p_trainer / p_sampler
    assert sampler_runs["fp32_bf16s"]["run"]["importance_sampling"]["acts"] is False
    assert all(m.get("vllm_is_ratio_mean") is None for m in sampler_runs["fp32_bf16s"]["metrics"])
    # the same rollouts (same seed, same sampler) up to the first update: the first round's gap agrees
    assert _gaps(corrected)[0] == _gaps(sampler_runs["fp32_bf16s"])[0]


@pytest.mark.slow  # trains four runs (the module fixture)
def test_the_fp16_arm_trains_fp32_masters_under_fp16_autocast_with_an_active_loss_scaler_on_cpu(sampler_runs):
    run = sampler_runs["fp16"]["run"]
    assert run["trainer"]["fp16"] is True and run["device"] == "cpu"
    observed = run["autocast"]["observed"]
    assert observed["enabled"] is True and observed["dtype"] == "float16"
    contract = run["precision_contract"]["observed"]
    assert contract["params_body"] == "float32" and contract["optimizer_state_body"] == "float32"
    assert contract["rollout_dtype"] == "float16"  # the fp16 copy sampled
    scales = [m["loss_scale"] for m in sampler_runs["fp16"]["metrics"]]
    assert all(s is not None and s > 1.0 for s in scales)  # the GradScaler scaled every step
    assert run["loss_scale"] is not None
    assert min(_gaps(sampler_runs["fp16"])) > 0.0  # the fp16 copy against fp16 autocast over fp32 masters
    assert all(m.get("loss_scale") is None for m in sampler_runs["fp32"]["metrics"])


def test_an_fp16_sampler_with_vllm_on_cpu_falls_back_to_the_hf_sampler_and_says_why(tiny_base):
    train = _config(tiny_base)["train"]
    mode = PrecisionMode.from_config("fp16", ARMS["fp16"])
    sampler = plan(mode, {**train, "use_vllm": True}, "cpu")
    assert sampler["backend"] == "hf" and sampler["copies"] and "no float16" in sampler["reason"]
    assert arm_train_config({**train, "use_vllm": True}, mode, sampler)["use_vllm"] is False
    assert plan(mode, {**train, "use_vllm": True}, "cuda")["backend"] == "vllm"
    bf16_sampler = PrecisionMode.from_config("x", ARMS["fp32_bf16s"])
    on_vllm = plan(bf16_sampler, {**train, "use_vllm": True}, "cpu")
    assert on_vllm["backend"] == "vllm" and not on_vllm["copies"]  # the engine itself runs in bf16


def test_the_copys_log_probs_are_the_sampled_tokens_log_probs_at_the_sampling_temperature(tiny_base):
    """An fp32 copy scores left-padded prompts + right-padded completions exactly as a plain forward of
    the model does, token by token (log_softmax(logits / T) at each completion token), and a bf16 copy
    within bf16's rounding of it."""
    import torch

    from workflow_scripts.models.modeling import load_model
    from workflow_scripts.training.sampler import OwnSampler

    policy = load_model(tiny_base["base_dir"], "float32")
    prompts, completions, temperature = [[5, 6, 7], [8, 9]], [[10, 11], [12, 13, 14]], 0.7
    expected = []
    for p, c in zip(prompts, completions, strict=True):
        with torch.no_grad():
            logits = policy(input_ids=torch.tensor([p + c])).logits[0, len(p) - 1 : -1] / temperature
        expected.append(torch.log_softmax(logits.float(), -1)[torch.arange(len(c)), torch.tensor(c)].tolist())
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 0.1)):
        own = OwnSampler(policy, dtype)
        own.attach(temperature, False, "cpu")
        got = own.logps(prompts, completions, pad_id=0)
        assert [len(g) for g in got] == [2, 3]
        for g, e in zip(got, expected, strict=True):
            assert max(abs(a - b) for a, b in zip(g, e, strict=True)) < tol, (dtype, g, e)
        assert own.model.dtype == dtype and next(own.model.parameters()).requires_grad is False
