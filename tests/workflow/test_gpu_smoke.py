"""The GPU smoke check's CPU twin: config.gpu-smoke.yaml at tiny dimensions, HF sampler, no vLLM (its vLLM
twin: test_gpu_smoke_vllm.py).

It runs the script a GPU run uses (bench/gpu_smoke.sh -> Snakemake -> bench/gpu_smoke.py) into a
temporary folder and reads its JSON: every check that does not need CUDA passes (dtypes, autocast,
determinism, base-vs-base KL, the SIGKILL + resume bit-identity of the fp32 arm), and every GPU-only
one says "skipped (no GPU)", never "pass", with what could be read (the memory plan per arm, the gap
of every round and the tokens/s of the HF sampler). The unit tests below show the checks can fail, the
driver preflight refuses a driver the torch wheel cannot use, and the plan is compared within 15%.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import REPO, log_workflow_run

pytestmark = pytest.mark.slow

GPU_ONLY = ("device.fp32", "device.bf16", "peak_gpu_memory", "time_budget", "driver", "engine_start.fp32",
            "engine_start.bf16", "memory_plan.fp32", "memory_plan.bf16", "vllm_deterministic", "sleep_cycle",
            "engine_numerics", "rollout_gap.fp32", "rollout_gap.bf16")  # fmt: skip
NO_GPU = "skipped (no GPU)"
VLLM_ONLY = ("vllm_train.fp32", "vllm_train.bf16", "vllm_eval", "vllm_seed.fp32", "vllm_seed.bf16",
             "hf_vs_vllm_pass1")  # fmt: skip
EVERYWHERE = ("workflow", "dtypes.fp32", "dtypes.bf16", "autocast.fp32", "autocast.bf16",
              "determinism.fp32", "determinism.bf16", "base_kl_zero", "resume_bit_identical",
              "sampler_gap.fp32", "sampler_gap.bf16", "importance_sampling.fp32",
              "importance_sampling.bf16")  # fmt: skip


def load_smoke():
    spec = importlib.util.spec_from_file_location("gpu_smoke", REPO / "bench" / "gpu_smoke.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def twin_config() -> dict:
    """config.gpu-smoke.yaml with tiny dimensions and data, the HF sampler and no GPU: nothing else."""
    config = yaml.safe_load((REPO / "config.gpu-smoke.yaml").read_text())
    config["model"]["tiny"].update(
        hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64,
        sft_steps=100, sft_lr=3e-3, sft_batch_size=32,
    )  # fmt: skip
    config["data"]["train"].update(n=200, val_n=40)
    config["data"]["sft_n"] = 2000
    config["train"].update(use_vllm=False, prompts_per_step=4, num_generations=4, kl_prompts=4, kl_samples=2)
    config["train"].pop("vllm", None)
    config["eval"].pop("vllm", None)
    config["eval"].update(backend="hf", n_samples=2, kl_prompts=8, kl_samples=2)
    config["resources"] = {rule: {"gpus": 0, "cpus": 1} for rule in config["resources"]}
    return config


def run_smoke(root: Path, config: dict) -> dict:
    """bench/gpu_smoke.sh on ``config`` in ``root``: the process, its JSON, the work folder, the config."""
    config_path = root / "config.gpu-smoke-twin.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    workdir = root / "work"
    env = {**os.environ, "GPU_SMOKE_CONFIG": str(config_path), "GPU_SMOKE_CORES": "2",
           "PYTHON": sys.executable, "PYTHONWARNINGS": "ignore"}  # fmt: skip
    log_workflow_run(["--configfile", str(config_path), "--cores", "2", "--resources", "gpu=1"],
                     via="bench/gpu_smoke.sh")  # fmt: skip
    proc = subprocess.run(["bash", str(REPO / "bench" / "gpu_smoke.sh"), str(workdir)], env=env, cwd=root,
                          capture_output=True, text=True, timeout=1500)  # fmt: skip
    out = workdir / "gpu_smoke.json"
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    return {"proc": proc, "json": json.loads(out.read_text()), "workdir": workdir, "config": config_path}


@pytest.fixture(scope="module")
def smoke(tmp_path_factory) -> dict:  # its own run: config.gpu-smoke.yaml's twin, through gpu_smoke.sh
    return run_smoke(tmp_path_factory.mktemp("gpu_smoke"), twin_config())


def test_cpu_twin_passes_every_check_that_needs_no_gpu(smoke):
    report, proc = smoke["json"], smoke["proc"]
    log = (smoke["workdir"] / "snakemake.log").read_text()[-3000:]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:] + log
    assert report["passed"] is True and report["failed"] == []
    assert set(report["checks"]) == set(GPU_ONLY) | set(VLLM_ONLY) | set(EVERYWHERE)
    for name in EVERYWHERE:
        assert report["checks"][name]["status"] == "pass", (name, report["checks"][name])


def test_gpu_only_checks_say_not_applicable_never_pass(smoke):
    for name in GPU_ONLY:
        assert smoke["json"]["checks"][name]["status"] == NO_GPU, name
    for name in VLLM_ONLY:  # this twin samples with HF; tests/workflow/test_gpu_smoke_vllm.py runs them
        assert smoke["json"]["checks"][name]["status"] == "not applicable without vLLM", name


def test_every_check_says_why_and_the_cpu_twin_says_there_is_no_gpu(smoke):
    checks, out = smoke["json"]["checks"], smoke["proc"].stdout
    assert all(isinstance(c["reason"], str) and c["reason"] for c in checks.values())
    assert "no GPU" in out and "built for CUDA" in out  # the preflight's lines
    assert smoke["json"]["figures"]["device"]["verdict"]["status"] == NO_GPU
    assert checks["driver"]["value"]["driver"] is None


def test_memory_plan_is_printed_per_arm_with_no_measured_peak_on_cpu(smoke):
    from workflow_scripts.runtime.memory_plan import TRAIN_TERMS

    for arm in ("fp32", "bf16"):
        value = smoke["json"]["checks"][f"memory_plan.{arm}"]["value"]
        assert value["measured"] == "no measured GPU peak"
        assert set(value["plan_gib"]) == {*TRAIN_TERMS, "total"} and value["plan_gib"]["total"] >= 1.0
        assert f"memory plan {arm} (GiB): weights" in smoke["proc"].stdout
    assert "measured fp32: no measured GPU peak" in smoke["proc"].stdout  # the tiny model: 1 GiB of context
    # compared at the data's longest sequence (prompt + completion), the config's worst case beside it
    from workflow_scripts.models.modeling import load_tokenizer

    results = smoke["workdir"] / "results"
    tokenizer = load_tokenizer(results / "models" / "base")
    rows = (results / "data" / "train.jsonl").read_text().splitlines()
    prompts = [json.loads(line)["prompt"] for line in rows]
    config = yaml.safe_load(smoke["config"].read_text())
    longest = max(len(tokenizer(p)["input_ids"]) for p in prompts) + config["train"]["max_completion_length"]
    value = smoke["json"]["checks"]["memory_plan.fp32"]["value"]
    assert value["tokens"] == longest < value["config_plan"]["tokens"]
    assert value["config_plan"]["total_gib"] >= value["plan_gib"]["total"]


def test_rollout_gap_and_tokens_per_s_are_read_on_cpu_too(smoke):
    for arm in ("fp32", "bf16"):
        value = smoke["json"]["checks"][f"rollout_gap.{arm}"]["value"]
        assert value["engine"] == "hf" and len(value["per_round"]) == 4
        assert all(r["mean"] is not None for r in value["per_round"])
        assert value["rollout_tokens_per_s"] > 0 and value["train_tokens_per_s"] > 0
    for name in ("vllm_deterministic", "sleep_cycle", "engine_numerics"):  # no engine probe without a GPU
        assert smoke["json"]["checks"][name]["value"] == {"phase": "not started"}


def test_resume_check_killed_resumed_and_compared_weights_that_moved(smoke):
    value = smoke["json"]["checks"]["resume_bit_identical"]["value"]
    assert value["killed_returncode"] == -9 and value["resumed_returncode"] == 0
    assert value["killed_after_step"] == value["resumed_from_step"] == 4
    assert value["tensors_identical"] and value["file_identical"] and value["metrics_identical"]
    assert value["moved_from_base"]


def test_figures_are_read_from_the_run(smoke):
    figures = smoke["json"]["figures"]
    for arm in ("fp32", "bf16"):
        train = figures[f"train.{arm}"]
        assert train["trained_completion_tokens_per_s"] > 0 and train["vllm"] == {
            "used": False, "mode": None, "dtype": None, "seed": None, "seed_given": None}  # fmt: skip
        assert train["sampler_gap"]["rounds_measured"] == 4 and train["loss_scale"] is None
        assert train["peak_gpu_memory_gb"] is None  # CPU: no GPU memory to report
    assert figures["train.fp32"]["weights_changed_fraction"] > 0
    # fp32 without dropout: no gap but rounding (dynamic sampling re-pads the groups it merges)
    assert figures["train.fp32"]["sampler_gap"]["max"] <= 1e-5
    assert figures["train.fp32"]["representable_update"] == 1.0
    assert {v["backend"] for v in figures["eval"].values()} == {"hf"}
    assert set(figures["eval"]) == {f"{r}/mcq" for r in ("base", "base-bfloat16", "fp32-s1", "bf16-s1")}
    assert figures["eval_speed"]["hf_tokens_per_s"] > 0
    assert figures["base_model"]["parameters"] > 0 and figures["base_model"]["device"] == "cpu"
    assert {"base_model", "train", "evaluate", "sparsity"} <= set(figures["stage_seconds"])


# ------------------------------------------------------------------------- the checks can fail


def test_a_wrong_dtype_fails_its_check(smoke):
    gs = load_smoke()
    config = gs.load_config(smoke["config"])
    config["precisions"]["bf16"]["param_dtype"] = "float32"  # what the run did not do
    report = gs.Report(gpu=False)
    gs.arm_checks(report, config, smoke["workdir"] / "results")
    assert report.checks["dtypes.bf16"]["status"] == "fail"
    assert report.checks["dtypes.fp32"]["status"] == "pass"


def test_a_gpu_only_check_is_not_applicable_on_cpu_whatever_its_result():
    gs = load_smoke()
    cpu, gpu = gs.Report(gpu=False), gs.Report(gpu=True)
    for report in (cpu, gpu):
        report.check("ok", "", lambda: (True, 1), gpu_only=True)
        report.check("bad", "", lambda: (False, 1), gpu_only=True)
        report.check("raises", "", lambda: 1 / 0)
    assert [cpu.checks[n]["status"] for n in ("ok", "bad")] == [NO_GPU] * 2
    hf, vllm = gs.Report(gpu=True), gs.Report(gpu=False, vllm=True)
    for report in (hf, vllm):
        report.check("engine", "", lambda: (False, 1), vllm_only=True)
    assert hf.checks["engine"]["status"] == "not applicable without vLLM" and vllm.failed == ["engine"]
    assert [gpu.checks[n]["status"] for n in ("ok", "bad", "raises")] == ["pass", "fail", "fail"]
    assert "ZeroDivisionError" in gpu.checks["raises"]["value"] and gpu.failed == ["bad", "raises"]


def test_samplers_that_disagree_fail_the_backend_check():
    gs = load_smoke()
    summary = {"backend": "vllm", "pass_at_1": 0.30, "pass_at_1_se": 0.02}
    close = {"run": "fp32-s1", "task": "mcq", "workflow": summary,
             "summary": {"backend": "hf", "pass_at_1": 0.33, "pass_at_1_se": 0.02}}  # fmt: skip
    far = {**close, "summary": {"backend": "hf", "pass_at_1": 0.60, "pass_at_1_se": 0.02}}
    assert gs.compare_backends(close)[0] is True
    assert gs.compare_backends(far)[0] is False


def test_device_memory_peak_from_nvidia_smi_samples(tmp_path):
    gs = load_smoke()
    log = tmp_path / "gpu_memory.csv"
    log.write_text("1024, 143771\n52000, 143771\n\n800, 143771\n")
    assert gs.device_memory_peak(log) == {"peak_mib": 52000, "total_mib": 143771, "samples": 3}
    log.write_text("")
    with pytest.raises(ValueError):
        gs.device_memory_peak(log)


def test_report_exits_nonzero_when_a_check_fails(smoke, tmp_path, monkeypatch):
    gs = load_smoke()
    monkeypatch.setattr(gs, "resume_check", lambda *a: (False, "forced failure"))
    out = tmp_path / "report.json"
    argv = ["report", "--config", str(smoke["config"]), "--workdir", str(smoke["workdir"]), "--out", str(out),
            "--snakemake-rc", "0", "--snakemake-seconds", "1"]  # fmt: skip
    assert gs.main(argv) == 1
    report = json.loads(out.read_text())
    assert report["passed"] is False and report["failed"] == ["resume_bit_identical"]
    assert Path(report["config"]) == Path(smoke["config"]).resolve()


def test_twin_base_model_has_grouped_query_attention(smoke):
    saved = json.loads((smoke["workdir"] / "results" / "models" / "base" / "config.json").read_text())
    assert saved["architectures"] == ["LlamaForCausalLM"]
    assert (saved["num_attention_heads"], saved["num_key_value_heads"]) == (4, 2)


def test_shipped_smoke_model_is_a_llama_of_qwen25_05b_size():
    import torch

    from workflow_scripts.models.modeling import build_char_tokenizer, build_tiny_llama
    from workflow_scripts.runtime.config import load_config

    tiny = load_config(REPO / "config.gpu-smoke.yaml", check_files=False)["model"]["tiny"]
    tokenizer = build_char_tokenizer()
    with torch.device("meta"):  # shapes only: no 1.4 GB of weights on a test machine
        model = build_tiny_llama(len(tokenizer), tiny, tokenizer)
    cfg = model.config
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.intermediate_size) == (896, 24, 4864)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads) == (14, 2)
    assert 0.35e9 < sum(p.numel() for p in model.parameters()) < 0.37e9  # Qwen2.5-0.5B without embeddings


def test_num_kv_heads_must_divide_num_heads():
    from workflow_scripts.runtime.config import ConfigError, validate_config

    config = yaml.safe_load((REPO / "config.gpu-smoke.yaml").read_text())
    config["model"]["tiny"]["num_kv_heads"] = 3
    with pytest.raises(
        ConfigError, match=r"model\.tiny\.num_kv_heads: must divide model\.tiny\.num_heads \(14\)"
    ):
        validate_config(config, source="smoke.yaml", check_files=False)


# ------------------------------------------------------------------ device checks, by hand (no GPU needed)


def test_driver_preflight_refuses_a_driver_too_old_for_the_torch_wheel(tmp_path, monkeypatch, capsys):
    gs = load_smoke()
    checks = gs.checks
    old = checks.driver_verdict("570.86.15", "13.0", False, "torch 2.13.0")
    assert old["rc"] == checks.EXIT_DRIVER == 3 and "install NVIDIA driver >= 580" in old["reason"]
    assert checks.driver_verdict("580.65.06", "13.0", True)["status"] == "pass"
    assert checks.driver_verdict("535.1", "12.8", True)["status"] == "pass"
    assert checks.driver_verdict("580.65.06", None, False)["rc"] == 3  # a CPU torch beside a GPU
    assert checks.driver_verdict("580.65.06", "13.0", False)["rc"] == 3  # torch sees no GPU
    none = checks.driver_verdict(None, None, False)
    assert (none["status"], none["rc"]) == (NO_GPU, 0) and "no NVIDIA driver" in none["reason"]
    info = {"driver": "570.86.15", "torch": "2.13.0", "torch_cuda": "13.0", "cuda_available": False,
            "verdict": old}  # fmt: skip
    monkeypatch.setattr(checks, "preflight_info", lambda: info)
    out = tmp_path / "gpu_smoke.json"
    assert gs.main(["preflight", "--workdir", str(tmp_path), "--out", str(out)]) == 3
    report = json.loads(out.read_text())
    assert report["passed"] is False and report["failed"] == ["driver"]
    assert "install NVIDIA driver >= 580" in report["checks"]["driver"]["reason"]
    assert "preflight fail: NVIDIA driver 570.86.15 is too old" in capsys.readouterr().out


def test_engine_start_checks_share_sleep_mode_and_kv_tokens():
    gs = load_smoke()
    config = gs.load_config(REPO / "config.gpu-smoke.yaml", check_files=False)
    engine = {"used": True, "platform": "gpu", "gpu_memory_utilization": 0.3, "kv_cache_tokens": 500_000,
              "max_model_len": 128, "sleep_mode": True}  # fmt: skip
    assert gs.checks.engine_start(config, {"vllm": engine})[0] is True
    for change in ({"gpu_memory_utilization": 0.4}, {"sleep_mode": False}, {"platform": "cpu"},
                   {"kv_cache_tokens": 31 * 128}, {"used": False}):  # fmt: skip
        assert gs.checks.engine_start(config, {"vllm": {**engine, **change}})[0] is False, change


def test_plan_and_measured_peak_agree_within_15_percent(tmp_path):
    gs = load_smoke()
    checks = gs.checks
    plan = {k: 1.0 for k in ("weights", "gradients", "optimizer", "reference", "sampler_copy", "gathered",
                              "activations", "logprob_head", "context", "fragmentation", "vllm")}  # fmt: skip
    plan["total"] = 10.0
    run_json = tmp_path / "run.json"
    run_json.write_text("{}")
    end = run_json.stat().st_mtime
    stamp = lambda t: time.strftime("%Y/%m/%d %H:%M:%S.000", time.localtime(t))  # noqa: E731
    log = tmp_path / "gpu_memory.csv"
    log.write_text(f"{stamp(end - 100)}, 20000, 143771\n{stamp(end - 5)}, 9216, 143771\n"
                   f"{stamp(end - 3)}, 8192, 143771\n")  # fmt: skip
    record = {"peak_gpu_memory_gb": 7.0, "peak_gpu_memory_reserved_gb": 7.5, "wall_time_s": 10}
    peak = checks.measured_peak(record, run_json, str(log))
    assert peak["device_gib"] == 9.0 and peak["samples"] == 2 and peak["source"] == "device (nvidia-smi)"
    ok, value, reason = checks.plan_vs_peak(plan, peak)  # 10 vs 9: 11%
    assert ok and value["relative_difference"] == 0.111 and "within 15%" in reason
    torch_only = checks.measured_peak(record, run_json, "")
    assert torch_only["source"] == "torch reserved" and torch_only["peak_gib"] == 7.5
    ok, value, reason = checks.plan_vs_peak(plan, torch_only)  # 10 - 1 (context) vs 7.5: 20%
    assert not ok and value["plan_compared_gib"] == 9.0 and "more than 15%" in reason
    assert checks.plan_vs_peak(plan, None)[1]["measured"] == "no measured GPU peak"
    assert checks.measured_peak({"peak_gpu_memory_gb": None}, run_json, "") is None


def test_rollout_and_training_tokens_per_s_split_from_step_times():
    gs = load_smoke()
    config = {"train": {"prompts_per_step": 2, "num_generations": 4}}
    row = {"rollouts_drawn": 2, "completion_length": 10}
    steps = ((True, 3.0), (False, 1.0), (True, 5.0), (False, 1.0))
    metrics = [{**row, "generation_step": g, "step_time_s": t} for g, t in steps]
    out = gs.checks.throughput(config, metrics)
    assert out["rollout_s"] == 6.0 and out["rollout_tokens_per_s"] == round(2 * 80 / 6.0, 1)
    assert out["train_s"] == 4.0 and out["train_tokens_per_s"] == 80.0


def test_engine_probe_results_become_three_checks(tmp_path):
    gs = load_smoke()
    good = {"phase": "woke", "generated": True, "deterministic_algorithms": True, "identical": True,
            "freed_gib": 30.5, "identical_after_wake": True}  # fmt: skip
    found = gs.checks.probe_checks(good, tmp_path / "log")
    assert found["vllm_deterministic"][0] and found["sleep_cycle"][0]
    differ = gs.checks.probe_checks({**good, "identical": False, "freed_gib": 0.0}, tmp_path / "log")
    assert not differ["vllm_deterministic"][0] and not differ["sleep_cycle"][0]
    assert not found["engine_numerics"][0] and "no engine record" in found["engine_numerics"][2]
    engine = {"attention_backend": "TRITON_ATTN", "attention_dtype": "float32", "kv_cache_dtype": "float32",
              "matmul_precision": "ieee"}  # fmt: skip
    fp32 = gs.checks.probe_checks({**good, "dtype": "float32", "engine": engine}, tmp_path / "log")
    assert fp32["engine_numerics"][0] and "computes IEEE fp32" in fp32["engine_numerics"][2]
    tf32 = {**good, "dtype": "float32", "engine": {**engine, "matmul_precision": "tf32"}}
    assert not gs.checks.probe_checks(tf32, tmp_path / "log")["engine_numerics"][0]
    bf16_kv = {**good, "dtype": "float32", "engine": {**engine, "kv_cache_dtype": "bfloat16"}}
    assert not gs.checks.probe_checks(bf16_kv, tmp_path / "log")["engine_numerics"][0]
    crashed = gs.checks.probe_checks({"phase": "start", "deterministic_algorithms": True}, tmp_path / "log")
    assert not crashed["vllm_deterministic"][0] and "phase 'start'" in crashed["vllm_deterministic"][2]


def test_engine_probe_turns_deterministic_algorithms_on_first_and_records_what_broke(tmp_path):
    """The probe child on a machine where it cannot start an engine (no vLLM, or no model here): it
    switched deterministic algorithms on before anything else and its JSON says what stopped it."""
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(twin_config(), sort_keys=False))
    out = tmp_path / "probe.json"
    cmd = [sys.executable, str(REPO / "bench" / "gpu_smoke.py"), "engine-probe", "--config", str(config),
           "--results", str(tmp_path / "results"), "--arm", "fp32", "--out", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode != 0
    result = json.loads(out.read_text())
    assert result["deterministic_algorithms"] is True and result["dtype"] == "float32" and result["error"]
    found = load_smoke().checks.probe_checks(result, tmp_path / "log")
    assert not found["vllm_deterministic"][0] and result["error"][:40] in found["vllm_deterministic"][2]
