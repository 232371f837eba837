"""TRL's colocated vLLM rollouts through the project's trainer, against vLLM's real engine (CPU build).

Runs of 6 steps (3 generation rounds of 8 prompt groups) on a tiny base with heads of 32 (``VLLM_TINY``):
the fp32 arm with TRL's importance-sampling correction on, the bf16 arm with it off (and dropout 0, so that
its sampler gap is the engine's alone), the fp32 arm again without held-out curves, and an fp32 trainer
whose engine samples in bf16; dynamic sampling on in all; lr 1e-3, so the weights move far each step and
an engine left with stale weights would show at once.

Each run is its own process, as a train job forked from the workflow's warm server is
(``runtime.forkserver``): one parent imports the train stage and vLLM once (after ``prepare_process``, as a
job does before its first engine) and forks a child per run, one after another. The children share the
parent's vLLM cache folder, so vLLM inspects the model class once (in a subprocess that imports vLLM
again) instead of once per run. A fresh interpreter per run paid both every time: importing the stage and
vLLM alone is ~19 s of CPU. Unlike the workflow's server, the parent has vLLM imported (which leaves two
native threads; the children run with one thread and start their own engine).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import REPO, VLLM_TINY, build_tiny_base
from safetensors.torch import load_file

from workflow_scripts.training.grpo_trainer import vllm_seed
from workflow_scripts.training.metrics_log import read_metrics, rollout_rows

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

STEPS = 6
GROUPS = 8  # prompt groups per generation round: the test config's prompts_per_step x steps_per_generation
ENGINE = {"gpu_memory_utilization": 0.3, "kv_cache_gb": 0.25, "max_model_len": 128, "enforce_eager": True}
CORRECTION = {
    "fp32": {"correction": True, "mode": "token_truncate", "clip_min": None, "clip_max": 2.0},
    "bf16": {"correction": False, "mode": "token_truncate", "clip_min": None, "clip_max": 3.0},
    "fp32_bf16s": {"correction": False, "mode": "token_truncate", "clip_min": None, "clip_max": 3.0},
}


RUNNER = textwrap.dedent("""
    import json, os, sys, traceback
    from workflow_scripts.models.vllm_engine import import_vllm, prepare_process
    prepare_process()  # the engine's variables and this process's vLLM cache, before vllm is imported
    import_vllm().LLM  # vllm's engine modules, imported once for every run below
    import trl.generation.vllm_generation
    from workflow_scripts import train
    spec = json.load(open(sys.argv[1]))
    for run in spec["runs"]:
        pid = os.fork()
        if pid == 0:  # the run: its own process, forked after the imports (as forkserver jobs are)
            code = 1
            try:
                config = json.load(open(run["config"]))
                job = train.job_from_config(config, run["arm"], 1, spec["data"], spec["base"], run["out"],
                                            run["ckpt"])
                job["heldout"] = job["heldout"] if run["curves"] else None
                train.run(**job, threads=1)
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)  # no atexit: the shared cache folder is the parent's to remove
        _, status = os.waitpid(pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            sys.exit(f"run {run['name']} exited {os.waitstatus_to_exitcode(status)}")
""")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    base = build_tiny_base(tmp_path_factory.mktemp("vllm_base"), VLLM_TINY)
    plan = []
    for arm, curves in (("fp32", True), ("bf16", True), ("fp32", False), ("fp32_bf16s", False)):
        name = arm if curves or arm == "fp32_bf16s" else f"{arm}-no-curves"
        config = json.loads(json.dumps(base["config"]))
        config["precisions"]["bf16"]["dropout"] = 0.0
        # an fp32 trainer whose engine samples in bf16 (TRL's colocate default), correction off
        config["precisions"]["fp32_bf16s"] = {**config["precisions"]["fp32"], "sampler_dtype": "bfloat16"}
        config["train"].update(max_steps=STEPS, checkpoint_every=100, kl_every=100, learning_rate=1e-3,
                               use_vllm=True, vllm=ENGINE, importance_sampling=CORRECTION[arm],
                               dynamic_sampling=True)  # fmt: skip
        root = base["root"] / name
        root.mkdir()
        (root / "config.json").write_text(json.dumps(config))
        plan.append({"name": name, "arm": arm, "curves": curves, "config": str(root / "config.json"),
                     "out": str(root / "out"), "ckpt": str(root / "ckpt")})  # fmt: skip
    spec = base["root"] / "runs.json"
    spec.write_text(json.dumps({"runs": plan, "data": str(base["data_dir"]), "base": str(base["base_dir"])}))
    # all four runs (600 s each before): under pytest-timeout's 900 s, so that a hang shows the runs' stderr
    proc = subprocess.run([sys.executable, "-c", RUNNER, str(spec)], cwd=REPO, capture_output=True, text=True,
                          timeout=840)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = {}
    for run in plan:
        root = Path(run["out"])
        out[run["name"]] = {
            "run": json.loads((root / "run.json").read_text()),
            "heldout": read_metrics(root / "heldout.jsonl"),
            "metrics": read_metrics(root / "metrics.jsonl"),
            "weights": load_file(root / "model" / "model.safetensors"),
            "base": load_file(base["base_dir"] / "model.safetensors"),
        }
    return out


@pytest.mark.parametrize("arm,dtype", [("fp32", "float32"), ("bf16", "bfloat16")])
def test_the_engine_samples_in_the_arms_dtype_with_the_run_seed_and_its_settings(runs, arm, dtype):
    vllm = runs[arm]["run"]["vllm"]
    assert vllm["used"] and vllm["mode"] == "colocate" and vllm["platform"] == "cpu"
    assert vllm["seed"] == vllm["seed_given"] == vllm_seed(1, 0)  # not TRL's process index (0)
    assert vllm["model_dtype"] == vllm["kv_cache_dtype"] == vllm["lm_head_dtype"] == dtype
    # read from the engine's worker (vllm_engine.engine_record): its attention, KV-cache tensors, products
    assert (vllm["attention_backend"], vllm["attention_dtype"]) == ("CPU_ATTN", dtype)
    assert vllm["matmul_precision"] == "ieee" and vllm["batch_invariant"] is False
    assert vllm["deterministic_algorithms"] is runs[arm]["run"]["determinism"]["use_deterministic_algorithms"]
    assert vllm["kv_cache_memory_bytes"] == 2**28 and vllm["max_model_len"] == 128
    assert vllm["enforce_eager"] is True
    assert vllm["threads"] == 1 == runs[arm]["run"]["threads"]  # the job's pool, after the engine started
    contract = runs[arm]["run"]["precision_contract"]
    assert contract["checked"] and contract["observed"] == contract["expected"]
    assert contract["observed"]["sampler_lm_head_dtype"] == contract["observed"]["kv_cache_dtype"] == dtype


@pytest.mark.parametrize("arm,bound", [("fp32", 1e-5), ("bf16", 0.05)])
def test_weights_sync_every_round_so_the_engines_log_probs_follow_the_trainers(runs, arm, bound):
    rounds = rollout_rows(runs[arm]["metrics"])
    assert len(rounds) == STEPS // 2
    # vLLM's log-probs vs the trainer's, at every round: after the first the weights have moved by ~lr
    # per step (an engine whose sync was lost gave a mean of 0.6 nats in bf16 by the second round)
    assert all(r["sampler_gap_mean"] is not None and r["sampler_gap_mean"] < bound for r in rounds)
    base = runs[arm]["base"]
    moved = [k for k, w in runs[arm]["weights"].items() if not torch.equal(w, base[k].to(w.dtype))]
    assert len(moved) > len(runs[arm]["weights"]) // 2


def test_the_sampler_gap_is_measured_from_the_engines_log_probs_per_arm(runs):
    for arm in ("fp32", "bf16"):
        gap = runs[arm]["run"]["sampler_gap"]
        assert gap["rounds_measured"] == STEPS // 2 and gap["mean"] is not None
    fp32, bf16 = runs["fp32"]["run"]["sampler_gap"], runs["bf16"]["run"]["sampler_gap"]
    assert fp32["max"] < 1e-4 and fp32["outside_clip_mean"] == 0.0  # fp32, no dropout: kernel noise
    assert bf16["mean"] > 100 * fp32["mean"]  # bf16's rounding, in vLLM's kernels and the trainer's


def test_an_engine_in_another_dtype_than_the_trainer_gives_a_gap_the_matched_fp32_engine_does_not(runs):
    mismatched = runs["fp32_bf16s"]["run"]
    assert mismatched["vllm"]["model_dtype"] == "bfloat16" and mismatched["sampler"]["dtype"] == "bfloat16"
    assert mismatched["sampler"]["backend"] == "vllm" and mismatched["sampler"]["copies"] is False
    observed = mismatched["precision_contract"]["observed"]
    assert observed["params_body"] == "float32" and observed["rollout_dtype"] == "bfloat16"
    fp32 = runs["fp32"]["run"]["sampler_gap"]
    assert mismatched["sampler_gap"]["mean"] > 100 * fp32["mean"]  # bf16 engine vs fp32 trainer
    assert mismatched["sampler_gap"]["mean"] > 1e-3


def test_dynamic_sampling_filters_vllm_rollouts(runs):
    for arm in ("fp32", "bf16"):
        for row in rollout_rows(runs[arm]["metrics"]):
            assert row["rollouts_drawn"] >= row["groups_kept"] + row["groups_zero_spread"] - 1e-9
            assert row["groups_kept"] + row["groups_zero_spread"] == GROUPS


def test_the_importance_sampling_switch_acts_as_configured(runs):
    on, off = runs["fp32"], runs["bf16"]
    assert on["run"]["importance_sampling"] == {**CORRECTION["fp32"], "acts": True}
    assert off["run"]["importance_sampling"] == {**CORRECTION["bf16"], "acts": False}
    ratios = [r["vllm_is_ratio_max"] for r in rollout_rows(on["metrics"])]
    assert all(r is not None and r <= CORRECTION["fp32"]["clip_max"] for r in ratios)
    assert all(r.get("vllm_is_ratio_max") is None for r in rollout_rows(off["metrics"]))


@pytest.mark.parametrize("arm,dtype", [("fp32", "float32"), ("bf16", "bfloat16")])
def test_heldout_curve_is_sampled_by_the_colocated_engine_in_the_arms_dtype(runs, arm, dtype):
    lines = runs[arm]["heldout"]
    assert sorted({r["step"] for r in lines}) == [0, 3, 6]  # eval_every 3 (the test config) and the last
    assert {r["backend"] for r in lines} == {"vllm"} and {r["dtype"] for r in lines} == {dtype}
    assert all(len(r["correct_counts"]) == r["n_problems"] and r["eval_noise_var"] is not None for r in lines)


def test_heldout_sampling_through_the_engine_leaves_the_trajectory_unchanged(runs):
    """Its requests carry their own seeds and run under fork_rng: the rollouts after it are the same."""
    with_curves, without = runs["fp32"], runs["fp32-no-curves"]
    assert without["heldout"] == [] and without["run"]["heldout"] is None
    assert [r["reward"] for r in with_curves["metrics"]] == [r["reward"] for r in without["metrics"]]
    assert all(torch.equal(with_curves["weights"][k], w) for k, w in without["weights"].items())
