"""The evaluation sampler against vLLM's real engine (its CPU build): seeds, greedy, threads, release,
and what the engine reports about itself. A tiny Llama with heads of 32 (``VLLM_TINY``), untrained: its
samples are near uniform over the vocabulary, so two streams that differ give different completions.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from conftest import VLLM_TINY

from workflow_scripts.models.generation import sample_completions
from workflow_scripts.models.modeling import build_char_tokenizer, build_tiny_llama, load_tokenizer
from workflow_scripts.models.vllm_backend import sample_completions_vllm, sample_seed
from workflow_scripts.training.precision import PrecisionError, PrecisionMode

pytestmark = pytest.mark.vllm

ENGINE = {"gpu_memory_utilization": 0.9, "kv_cache_gb": 0.25, "max_model_len": 64, "enforce_eager": True}


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory) -> dict[str, str]:
    tokenizer = build_char_tokenizer()
    tiny = {**VLLM_TINY, "max_position_embeddings": 64, "seed": 0, "initializer_range": 0.05}
    model = build_tiny_llama(len(tokenizer), tiny, tokenizer)
    dirs = {}
    for dtype in ("float32", "bfloat16"):
        path = tmp_path_factory.mktemp(f"vllm_tiny_{dtype}")
        model.to(getattr(torch, dtype)).save_pretrained(path)
        tokenizer.save_pretrained(path)
        dirs[dtype] = str(path)
    return dirs


def sample(model_dir: str, prompts, n: int, seed: int, temperature: float = 1.0, dtype: str = "float32",
           threads: int = 1):  # fmt: skip
    tokenizer = load_tokenizer(model_dir)
    return sample_completions_vllm(
        model_dir, tokenizer, list(prompts), n_samples=n, temperature=temperature, top_p=1.0,
        max_new_tokens=8, seed=seed, dtype=dtype, stop_ids=[tokenizer.eos_token_id], engine=ENGINE,
        threads=threads,
    )  # fmt: skip


def test_request_seeds_are_spaced_by_the_samples_per_prompt():
    seeds = [sample_seed(100, i, 4) + j for i in range(3) for j in range(4)]
    assert seeds == list(range(100, 112))  # vLLM's child j of a request seeded s draws stream s + j


def test_every_prompt_and_sample_draws_its_own_stream_and_a_seed_reproduces_them(model_dirs):
    prompts = ["12+7="] * 3  # one prompt thrice: streams shared across prompts would repeat completions
    first, record = sample(model_dirs["float32"], prompts, n=4, seed=100)
    again, _ = sample(model_dirs["float32"], prompts, n=4, seed=100)
    tokens = [c.token_ids for c in first]
    assert tokens == [c.token_ids for c in again]  # same seed, same samples, across engines
    by_prompt = [tokens[i * 4 : (i + 1) * 4] for i in range(3)]
    # with request seed seed + i, sample j of prompt i+1 was sample j+1 of prompt i, token for token
    assert by_prompt[1][:3] != by_prompt[0][1:] and by_prompt[2][:3] != by_prompt[1][1:]
    assert len(set(tokens)) == len(tokens)  # 12 streams, 12 different completions
    assert record["model_dtype"] == "float32" and record["platform"] == "cpu"


def test_greedy_sends_one_sample_per_prompt_and_matches_the_hf_greedy_tokens(model_dirs):
    prompts = ["3+4=", "9-2=", "hello"]
    completions, _ = sample(model_dirs["float32"], prompts, n=3, seed=5, temperature=0.0)
    assert [c.sample_index for c in completions] == [0, 1, 2] * 3
    for i in range(3):
        assert len({c.token_ids for c in completions[i * 3 : (i + 1) * 3]}) == 1
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dirs["float32"], dtype=torch.float32)
    tokenizer = load_tokenizer(model_dirs["float32"])
    hf = sample_completions(model, tokenizer, prompts, n_samples=1, max_new_tokens=8)

    def fields(c):
        return c.token_ids, c.text, c.num_tokens, c.truncated, c.stop_token_id

    assert [fields(c) for c in completions[::3]] == [fields(c) for c in hf]


FP32_ARM = PrecisionMode("fp32", "float32", deterministic=True)


def contract_refusal(record: dict, mode: PrecisionMode = FP32_ARM) -> str | None:
    """The precision contract's verdict on an engine record under ``mode`` (``ContractCheck``, as the train
    stage runs it at the first optimizer step): its error, or None when the engine is what the arm says."""
    from types import SimpleNamespace

    from workflow_scripts.training.precision_contract import ContractCheck, engine_fields, expected_contract

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))  # an fp32 body and head:
    model.get_output_embeddings = lambda: model[1]  # only the engine's fields can differ
    expected = expected_contract(mode, device="cpu", world=1, use_vllm=True)
    probe = SimpleNamespace(record={"enabled": False}, sampling={})
    check = ContractCheck(mode, expected, model, probe, engine=lambda: engine_fields(record))
    optimizer = torch.optim.AdamW(model.parameters())
    check.on_train_begin(None, None, None, optimizer=optimizer)
    model(torch.ones(1, 2)).sum().backward()
    try:
        optimizer.step()
    except PrecisionError as err:
        return str(err)
    return None


@pytest.mark.parametrize("dtype,deterministic", [("float32", True), ("bfloat16", False)])
def test_the_engine_reports_what_its_worker_really_runs(model_dirs, dtype, deterministic, monkeypatch):
    """Read from the worker's attention layers and KV-cache tensors, not the config (whose cache_dtype
    is "auto"): an fp32 engine computes attention in fp32 over an fp32 cache with IEEE fp32 products and
    passes an fp32 arm's contract; a bf16 engine is refused by it. The engine runs under the job's
    deterministic algorithms, never batch-invariant (even when the job inherited VLLM_BATCH_INVARIANT=1),
    and compiles into the job's own cache."""
    from workflow_scripts.models import vllm_engine

    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "1")
    torch.use_deterministic_algorithms(deterministic)
    try:
        _, record = sample(model_dirs[dtype], ["1+1="], n=2, seed=0, dtype=dtype)
    finally:
        torch.use_deterministic_algorithms(False)
    assert record["model_dtype"] == record["kv_cache_dtype"] == record["lm_head_dtype"] == dtype
    assert record["attention_dtype"] == record["runner_kv_cache_dtype"] == dtype
    assert record["kv_cache_tensors"] == record["attention_layers"] == VLLM_TINY["num_layers"]
    assert record["cache_dtype_setting"] == "auto"
    # the CPU build: V1 runner (no Triton, so no V2 runner), C++ attention, torch fp32 matmuls "highest"
    assert (record["model_runner"], record["attention_backend"]) == ("CPUModelRunner", "CPU_ATTN")
    assert (record["float32_matmul_precision"], record["onednn_matmul_fp32"]) == ("highest", "ieee")
    assert record["triton_dot_fp32"] is None and record["matmul_precision"] == "ieee"
    assert record["deterministic_algorithms"] is deterministic and record["batch_invariant"] is False
    assert record["cache_root"] == vllm_engine.job_cache_root()
    # vLLM keeps what it learned about the model class in the job's cache (modelinfos/: the one shared part)
    assert list((Path(record["cache_root"]) / "modelinfos").glob("*ForCausalLM.json"))
    assert record["kv_cache_memory_bytes"] == int(ENGINE["kv_cache_gb"] * 2**30)
    assert record["max_model_len"] == 64 and record["enforce_eager"] is True
    refusal = contract_refusal(record)
    if dtype == "float32":
        assert refusal is None
    else:
        assert refusal == (
            "precision 'fp32': contract violated: rollout_dtype: expected float32, observed bfloat16; "
            "kv_cache_dtype: expected float32, observed bfloat16; engine_attention_dtype: expected float32, "
            "observed bfloat16; engine_deterministic: expected True, observed False; sampler_lm_head_dtype: "
            "expected float32, observed bfloat16"
        )


def test_an_engine_whose_worker_sets_tf32_is_recorded_and_refused_by_an_fp32_arm(model_dirs, monkeypatch):
    """vLLM's worker sets torch's fp32 matmul precision for the whole process from
    VLLM_FLOAT32_MATMUL_PRECISION (its CPU worker too): "high" gives TF32 (oneDNN's tf32 mode on a CPU);
    the record reads it from the worker's process and the fp32 arm's contract refuses the engine."""
    import vllm

    from workflow_scripts.models.vllm_engine import (
        engine_kwargs,
        engine_record,
        free_memory,
        keep_threads,
        prepare_process,
        release,
    )

    prepare_process()
    monkeypatch.setenv("VLLM_FLOAT32_MATMUL_PRECISION", "high")  # after prepare_process, as a stray job env
    try:
        with keep_threads(1):
            llm = vllm.LLM(model=model_dirs["float32"], dtype="float32", seed=0, **engine_kwargs(ENGINE, "e"))
        try:
            record = engine_record(llm)
        finally:
            release(llm)
            del llm
            free_memory()
    finally:
        torch.set_float32_matmul_precision("highest")
    assert record["float32_matmul_precision"] == "high" and record["onednn_matmul_fp32"] == "tf32"
    assert record["matmul_precision"] == "tf32" and record["attention_dtype"] == "float32"
    assert contract_refusal(record, PrecisionMode("fp32", "float32")) == (  # deterministic: off, as here
        "precision 'fp32': contract violated: engine_matmul_precision: expected ieee, observed tf32"
    )


def test_batch_invariance_would_replace_the_training_processs_own_kernels(tmp_path):
    """Why VLLM_BATCH_INVARIANT stays off (``vllm_engine``, "Determinism, decided"): vLLM's switch
    re-registers aten ops for the whole process, so in a colocated engine the trainer's own softmax would
    no longer be torch's. Shown on the CPU build in a child process (the overrides cannot be undone)."""
    import subprocess
    import sys

    code = (
        "import os, torch\n"
        "os.environ['VLLM_BATCH_INVARIANT'] = '1'\n"
        "x = torch.randn(64, 1000, generator=torch.Generator().manual_seed(0))\n"
        "before = torch.softmax(x, -1)\n"
        "from vllm.model_executor.determinism.batch_invariant import init_batch_invariance\n"
        "init_batch_invariance()  # what the worker's init runs (gpu_worker.py:1524-1526)\n"
        "print(torch.equal(torch.softmax(x, -1), before))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "False"  # torch.softmax on CPU is vLLM's kernel now
    assert "batch_invariant.py" in proc.stderr  # torch's warning: the CPU kernel was overridden, and by whom


def rss_mb() -> float:
    with open(f"/proc/{os.getpid()}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS")) / 1024


def test_the_job_keeps_its_threads_and_release_frees_the_engine(model_dirs):
    sample(model_dirs["float32"], ["1+1="], n=2, seed=1)  # vllm imported, its one-off state built
    torch.set_num_threads(1)
    before = rss_mb()
    _, record = sample(model_dirs["float32"], ["1+1="] * 8, n=8, seed=1, threads=2)
    after = rss_mb()
    # vLLM's CPU worker swaps torch.set_num_threads for a no-op; the job's count holds and can change
    assert record["threads"] == 2 and torch.get_num_threads() == 2
    torch.set_num_threads(1)
    assert torch.get_num_threads() == 1
    # the engine is shut down when sampling returns: its 256 MiB KV cache is not held until a collection
    assert after - before < 0.5 * ENGINE["kv_cache_gb"] * 1024, (before, after)


def test_the_evaluate_job_samples_with_vllm_before_it_loads_the_kl_models(model_dirs, tmp_path, monkeypatch):
    """vLLM holds the device while it samples: the job loads the HF policy and reference after it has
    shut the engine down, and records what the engine ran."""
    from workflow_scripts import evaluate
    from workflow_scripts.models import vllm_backend
    from workflow_scripts.tasks.rows import make_row, write_rows

    data = tmp_path / "t.jsonl"
    write_rows(data, [make_row(f"q{i}", "t", "integer", f"{i}+1=", i + 1) for i in range(5)])
    order = []
    load_pair, sample = evaluate.load_pair, vllm_backend.release
    monkeypatch.setattr(evaluate, "load_pair", lambda *a, **k: order.append("load") or load_pair(*a, **k))
    monkeypatch.setattr(vllm_backend, "release", lambda *a: order.append("release") or sample(*a))
    eval_cfg = {"n_samples": 3, "temperature": 0.7, "top_p": 0.8, "batch_size": 256, "backend": "vllm",
                "seed": 0, "verify_timeout": 1.5, "code_timeout": 1.5, "kl_prompts": 4, "kl_samples": 2,
                "memory_budget_gb": None, "vllm": ENGINE}  # fmt: skip
    out = tmp_path / "out"
    summary, kl = evaluate.run(
        model=model_dirs["bfloat16"], base=model_dirs["float32"], data=data, samples_out=out / "s.parquet",
        summary_out=out / "s.json", kl_out=out / "kl.json", eval_cfg=eval_cfg,
        task_cfg={"kind": "integer", "role": "on_task", "max_new_tokens": 4}, run="bf16-s1", task="t",
        reference_run="base-bfloat16", reference_dtype="bfloat16",
    )  # fmt: skip
    assert order == ["release", "load"]
    assert summary["backend"] == "vllm" and summary["dtype"] == "bfloat16" and summary["N"] == 5
    assert summary["vllm"]["model_dtype"] == "bfloat16" and summary["vllm"]["sample_s"] > 0
    assert kl["policy_dtype"] == kl["reference_dtype"] == "bfloat16" and (out / "kl.json").exists()


def test_one_engine_for_all_tasks_of_a_run_gives_each_task_the_samples_of_its_own(model_dirs, tmp_path):
    """The per-run evaluate job (eval.jobs: per_run) starts one engine for all of a run's tasks; each task's
    samples, summary and KL equal those of a job that evaluates that task alone (its own engine)."""
    import json

    import pandas as pd

    from workflow_scripts import evaluate
    from workflow_scripts.tasks.rows import make_row, write_rows

    eval_cfg = {"n_samples": 3, "temperature": 0.7, "top_p": 0.8, "batch_size": 256, "backend": "vllm",
                "seed": 0, "verify_timeout": 1.5, "code_timeout": 1.5, "kl_prompts": 3, "kl_samples": 2,
                "memory_budget_gb": None, "vllm": ENGINE}  # fmt: skip
    specs = {"adds": ("+", 4), "subs": ("-", 6)}
    data, cfgs = {}, {}
    for task, (op, max_new) in specs.items():
        data[task] = tmp_path / f"{task}.jsonl"
        rows = [make_row(f"{task}{i}", task, "integer", f"{i}{op}1=", i + 1) for i in range(4)]
        write_rows(data[task], rows)
        cfgs[task] = {"kind": "integer", "role": "on_task", "max_new_tokens": max_new}

    def job(task: str, out):
        return evaluate.TaskJob(task, cfgs[task], data[task], out / f"{task}.parquet", out / f"{task}.json",
                                out / f"{task}.kl.json")  # fmt: skip

    model = model_dirs["float32"]
    common = {"model": model, "base": model, "eval_cfg": eval_cfg, "run": "base"}
    together = tmp_path / "together"
    evaluate.run_tasks(tasks=[job(t, together) for t in specs], **common)
    for task in specs:
        alone = tmp_path / f"alone-{task}"
        evaluate.run_tasks(tasks=[job(task, alone)], **common)
        samples = [pd.read_parquet(d / f"{task}.parquet") for d in (together, alone)]
        assert samples[0].equals(samples[1])
        one, two = (json.loads((d / f"{task}.json").read_text()) for d in (together, alone))
        assert one["vllm"]["start_s"] == json.loads((together / "adds.json").read_text())["vllm"]["start_s"]
        assert (one["timing"]["tasks_in_job"], two["timing"]["tasks_in_job"]) == (2, 1)
        assert one["correct_counts"] == two["correct_counts"] and one["seed"] == two["seed"]
        kl = [json.loads((d / f"{task}.kl.json").read_text()) for d in (together, alone)]
        assert kl[0]["per_prompt_rb"] == kl[1]["per_prompt_rb"]
