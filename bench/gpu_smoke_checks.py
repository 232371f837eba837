"""GPU smoke check, the device-facing checks: what ``bench/gpu_smoke.py`` adds on one GPU to the run's record.

- **preflight** (``bench/gpu_smoke.sh`` runs it first): prints the NVIDIA driver, the CUDA version torch
  was built with, the GPU and its memory, and refuses (exit ``EXIT_DRIVER``, one line naming what to
  install) a driver the torch wheel cannot use (``MIN_DRIVER``: torch 2.13.0 from PyPI is a CUDA 13.0
  build, driver >= 580), a CPU torch on a GPU machine, or a torch that sees no GPU. Without a driver it
  says there is no GPU and the GPU-only checks are skipped;
- **engine_start.<arm>**: the arm's colocated vLLM engine (run.json ``vllm``, read from the engine) started
  with the configured share (``gpu_memory_utilization``, or ``kv_cache_gb``), sleep mode as configured,
  on the GPU, and its KV cache (``kv_cache_tokens``, blocks x block size) holds
  ``train.vllm.min_concurrent_seqs`` sequences of ``max_model_len`` tokens;
- **memory_plan.<arm>**: ``memory_plan.train_plan`` for the smoke model (its dimensions from the built
  base model's config.json), at the longest sequence its data can make (``longest_sequence``; the
  config's worst-case plan beside it), against the measured peak: the device's memory (nvidia-smi samples)
  while the arm's train job ran (its run.json's mtime minus ``wall_time_s``), else torch's reserved /
  allocated peak; they must agree within ``PLAN_TOLERANCE`` of the measured peak;
- **engine probe** (``engine-probe``, a child process, fp32 arm): ``torch.use_deterministic_algorithms``
  on, then an in-process vLLM engine (as TRL's colocated one) in the arm's dtype with the arm's
  ``train.vllm`` settings and sleep mode on: two generations with the same seeds (``vllm_deterministic``:
  both succeed and are identical), then sleep(level=1) / wake_up and a third (``sleep_cycle``: memory freed
  by sleeping, the same completions after waking);
- **rollout_gap.<arm>**: the sampler-trainer gap of every generation round (metrics.jsonl) from the CUDA
  engine, with rollout and training tokens/s split from TRL's ``step_time_s`` (``throughput``).
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from statistics import median
from typing import Any

from gpu_smoke_resume import read_json, resume_arm

from workflow_scripts.runtime import paths
from workflow_scripts.runtime.atomic import write_json
from workflow_scripts.training.metrics_log import read_metrics

NO_GPU = "skipped (no GPU)"
EXIT_DRIVER = 3  # preflight refused: the driver, or torch, cannot run the check
MIN_DRIVER = {13: 580, 12: 525, 11: 450}  # CUDA major torch was built for -> least Linux driver major
PLAN_TOLERANCE = 0.15
PROBE_TIMEOUT_S = 300  # the engine probe: one engine start (compile + CUDA graphs) and three small rounds
GiB = 1 << 30
SMOKE = Path(__file__).resolve().with_name("gpu_smoke.py")


# ------------------------------------------------------------------------------------------ preflight


def driver_version() -> str | None:
    """The NVIDIA driver's version (nvidia-smi, else /proc/driver/nvidia/version); None without one."""
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=60,
            )
            if out.returncode == 0 and out.stdout.strip():
                return out.stdout.split()[0]
        except (OSError, subprocess.SubprocessError):
            pass
    proc = Path("/proc/driver/nvidia/version")
    if proc.is_file():
        found = re.search(r"Kernel Module\s+(?:for \S+\s+)?(\d+\.\d+(?:\.\d+)?)", proc.read_text())
        return found.group(1) if found else None
    return None


def driver_verdict(
    driver: str | None, torch_cuda: str | None, cuda_available: bool, torch_version: str = "torch"
) -> dict:
    """{status, reason, rc}: skipped without a driver; refused (rc EXIT_DRIVER) for a driver older than
    torch's CUDA build needs, a CPU torch beside a driver, or a torch that sees no GPU; else pass."""
    if driver is None:
        return {
            "status": NO_GPU,
            "rc": 0,
            "reason": "no NVIDIA driver: the GPU-only checks are skipped (the CPU twin)",
        }
    if torch_cuda is None:
        return {
            "status": "fail",
            "rc": EXIT_DRIVER,
            "reason": f"{torch_version} is a CPU build on a machine with NVIDIA driver {driver}: install "
            "the CUDA torch wheel (make setup-gpu, docs/gpu-and-slurm.md)",
        }
    major = int(torch_cuda.split(".")[0])
    need = MIN_DRIVER.get(major, max(MIN_DRIVER.values()))
    have = int(driver.split(".")[0])
    if have < need:
        return {
            "status": "fail",
            "rc": EXIT_DRIVER,
            "reason": f"NVIDIA driver {driver} is too old for {torch_version} (built for CUDA {torch_cuda}): "
            f"install NVIDIA driver >= {need}, or a torch wheel built for your driver's CUDA",
        }
    if not cuda_available:
        return {
            "status": "fail",
            "rc": EXIT_DRIVER,
            "reason": f"{torch_version} (CUDA {torch_cuda}) sees no GPU beside driver {driver}: check "
            "CUDA_VISIBLE_DEVICES and the NVIDIA container runtime",
        }
    return {
        "status": "pass",
        "rc": 0,
        "reason": f"driver {driver} >= {need}, the least CUDA {torch_cuda} needs",
    }


def preflight_info() -> dict:
    """Driver, torch and its CUDA build, and the GPU (name, memory) as torch sees it."""
    import torch

    info: dict[str, Any] = {
        "driver": driver_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
    }
    if info["cuda_available"]:
        props = torch.cuda.get_device_properties(0)
        free, total = torch.cuda.mem_get_info(0)
        info.update(
            gpu=props.name,
            gpu_count=torch.cuda.device_count(),
            total_memory_gib=round(props.total_memory / GiB, 2),
            reported_gib=round(total / GiB, 2),
            free_gib=round(free / GiB, 2),
        )
    info["verdict"] = driver_verdict(
        info["driver"], info["torch_cuda"], info["cuda_available"], f"torch {info['torch']}"
    )
    return info


def preflight(workdir: Path, out: Path) -> int:
    """Print what runs the check; refuse a driver or torch that cannot. Writes workdir/preflight.json
    (the report's ``driver`` check), and on refusal ``out`` with that check failed."""
    info = preflight_info()
    verdict = info["verdict"]
    print(
        f"gpu_smoke: torch {info['torch']} built for CUDA {info['torch_cuda'] or '- (a CPU build)'}; "
        f"NVIDIA driver {info['driver']}"
    )
    if info.get("gpu"):
        print(
            f"gpu_smoke: GPU {info['gpu']} ({info['total_memory_gib']} GiB; "
            f"{info['reported_gib']} GiB as CUDA reports it, {info['free_gib']} GiB free; "
            f"{info['gpu_count']} visible)"
        )
    else:
        print("gpu_smoke: no GPU: the GPU-only checks will say 'skipped (no GPU)'")
    print(f"gpu_smoke: preflight {verdict['status']}: {verdict['reason']}")
    write_json(workdir / "preflight.json", info)
    if verdict["rc"]:
        check = {
            "status": "fail",
            "value": info,
            "expected": "a driver and torch that can use the GPU",
            "reason": verdict["reason"],
        }
        write_json(out, {"passed": False, "failed": ["driver"], "checks": {"driver": check}, "figures": {}})
    return int(verdict["rc"])


# ------------------------------------------------------------------------------ the colocated engine


def engine_start(config: dict, record: dict) -> tuple[bool, dict, str]:
    """The arm's colocated engine, as run.json records it, against train.vllm."""
    from workflow_scripts.runtime.memory_plan import engine_settings

    want = engine_settings(config["train"])
    got = record.get("vllm") or {}
    if not got.get("used"):
        return (
            False,
            got,
            "run.json records no colocated vLLM engine (train.use_vllm off, or it did not start)",
        )
    value = {
        k: got.get(k)
        for k in (
            "platform",
            "model_dtype",
            "gpu_memory_utilization",
            "kv_cache_memory_bytes",
            "kv_cache_tokens",
            "max_model_len",
            "sleep_mode",
            "enforce_eager",
        )
    }
    value["configured"] = {
        k: want[k] for k in ("gpu_memory_utilization", "kv_cache_gb", "sleep_mode", "min_concurrent_seqs")
    }
    wrong = []
    if got.get("platform") != "gpu":
        wrong.append(f"platform {got.get('platform')}, not gpu")
    if want["kv_cache_gb"] is not None:
        if got.get("kv_cache_memory_bytes") != int(float(want["kv_cache_gb"]) * GiB):
            wrong.append(
                f"KV cache {got.get('kv_cache_memory_bytes')} bytes, configured {want['kv_cache_gb']} GiB"
            )
    elif abs(float(got.get("gpu_memory_utilization") or 0) - want["gpu_memory_utilization"]) > 1e-6:
        wrong.append(
            f"share {got.get('gpu_memory_utilization')}, configured {want['gpu_memory_utilization']}"
        )
    if bool(got.get("sleep_mode")) != want["sleep_mode"]:
        wrong.append(f"sleep mode {got.get('sleep_mode')}, configured {want['sleep_mode']}")
    needed = want["min_concurrent_seqs"] * int(got.get("max_model_len") or 0)
    if got.get("kv_cache_tokens") is not None and got["kv_cache_tokens"] < needed:
        wrong.append(
            f"KV cache holds {got['kv_cache_tokens']} tokens < {want['min_concurrent_seqs']} x "
            f"{got.get('max_model_len')}"
        )
    if wrong:
        return False, value, "; ".join(wrong)
    held = "unknown" if got.get("kv_cache_tokens") is None else got["kv_cache_tokens"]
    return True, value, f"started at the configured share; KV cache {held} tokens"


# ------------------------------------------------------------------------------ memory plan vs peak


def longest_sequence(config: dict, res: Path) -> int:
    """Tokens of the longest sequence the trainer can see: the longest training prompt in the base's
    tokenizer (its special tokens included) + train.max_completion_length."""
    return longest_prompt(res) + int(config["train"]["max_completion_length"])


@functools.cache
def longest_prompt(res: Path) -> int:
    """Tokens of the longest training prompt of the run in ``res`` (read once for every arm's plan)."""
    from workflow_scripts.models.modeling import load_tokenizer
    from workflow_scripts.tasks.rows import read_rows

    tokenizer = load_tokenizer(paths.base_model_dir(res))
    rows = read_rows(paths.data_dir(res) / "train.jsonl")
    return max(len(tokenizer(row["prompt"])["input_ids"]) for row in rows)


def smoke_plan(config: dict, res: Path, arm: str, gpu_gib: float | None) -> dict:
    """memory_plan.train_plan of ``arm`` for the model the workflow built (its config.json), at the
    longest sequence its data can make (``longest_sequence``): the peak to compare with. Beside it,
    ``config_total``: the config's own plan (T = max_model_len or the model's positions, the worst case)."""
    from workflow_scripts.runtime.memory_plan import dims_from_hf_config, reported_gib, train_plan
    from workflow_scripts.runtime.resources import train_processes

    dims = dims_from_hf_config(json.loads((paths.base_model_dir(res) / "config.json").read_text()))
    total = gpu_gib or reported_gib(config.get("gpu"))
    args = (dims, config["precisions"][arm], config["train"], config["model"]["dtype"],
            train_processes(config), total)  # fmt: skip
    plan = train_plan(*args, sequence_tokens=longest_sequence(config, res))
    worst = train_plan(*args)
    return {**plan, "config_total": worst["total"], "config_tokens": worst["tokens"]}


def memory_samples(csv_path: Path) -> list[tuple[float | None, int, int]]:
    """(unix time or None, used MiB, total MiB) of nvidia-smi samples: ``timestamp, memory.used,
    memory.total`` or ``memory.used, memory.total`` lines (csv, noheader, nounits)."""
    rows = []
    for line in csv_path.read_text(encoding="utf-8").splitlines():
        parts = [p.strip() for p in line.split(",")]
        stamp = None
        if len(parts) == 3:
            try:
                stamp = time.mktime(time.strptime(parts[0].split(".")[0], "%Y/%m/%d %H:%M:%S"))
            except ValueError:
                continue
            parts = parts[1:]
        if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
            rows.append((stamp, int(parts[0]), int(parts[1])))
    return rows


def measured_peak(record: dict, run_json: Path, memory_log: str) -> dict | None:
    """The arm's measured peak (GiB): the device's (nvidia-smi) while its train job ran, else torch's."""
    out: dict[str, Any] = {
        "torch_allocated_gib": record.get("peak_gpu_memory_gb"),
        "torch_reserved_gib": record.get("peak_gpu_memory_reserved_gb"),
    }
    if memory_log and Path(memory_log).is_file() and record.get("wall_time_s"):
        end = run_json.stat().st_mtime
        start = end - float(record["wall_time_s"])
        used = [
            u for t, u, _ in memory_samples(Path(memory_log)) if t is not None and start - 1 <= t <= end + 1
        ]
        if used:
            out.update(device_gib=round(max(used) / 1024, 2), samples=len(used), source="device (nvidia-smi)")
    for key, name in (
        ("device_gib", None),
        ("torch_reserved_gib", "torch reserved"),
        ("torch_allocated_gib", "torch allocated"),
    ):
        if out.get(key) is not None:
            out["peak_gib"] = out[key]
            out.setdefault("source", name)
            return out
    return None


def plan_vs_peak(plan: dict, peak: dict | None) -> tuple[bool, dict, str]:
    """The plan's total against the measured peak: within PLAN_TOLERANCE of the peak."""
    from workflow_scripts.runtime.memory_plan import TRAIN_TERMS

    value: dict[str, Any] = {"plan_gib": {k: plan[k] for k in (*TRAIN_TERMS, "total")}}
    value["tokens"] = plan.get("tokens")  # T of the activations: the data's longest sequence
    if "config_total" in plan:  # the config's plan, at its worst-case T
        value["config_plan"] = {"total_gib": plan["config_total"], "tokens": plan["config_tokens"]}
    if "engine" in plan:
        value["engine_gib"] = {k: v for k, v in plan["engine"].items() if not k.endswith("_bytes")}
    if peak is None:
        value["measured"] = "no measured GPU peak"
        return False, value, "no measured GPU peak"
    value["measured"] = peak
    total = plan["total"]
    if peak["source"] != "device (nvidia-smi)":  # torch's allocator does not see the CUDA context
        total = round(total - plan["context"], 1)
    value["plan_compared_gib"] = total
    rel = abs(total - peak["peak_gib"]) / peak["peak_gib"] if peak["peak_gib"] else float("inf")
    value["relative_difference"] = round(rel, 3)
    ok = rel <= PLAN_TOLERANCE
    verb = "within" if ok else "more than"
    return (
        ok,
        value,
        (
            f"plan {total} GiB vs measured {peak['peak_gib']} GiB ({peak['source']}): "
            f"{rel:.0%}, {verb} {PLAN_TOLERANCE:.0%}"
        ),
    )


def plan_lines(arm: str, value: dict) -> list[str]:
    """The plan's terms beside the measured peak, for the console."""
    plan = value.get("plan_gib") or {}
    lines = [f"memory plan {arm} (GiB): " + ", ".join(f"{k} {v}" for k, v in plan.items())]
    if "engine_gib" in value:
        lines.append(
            f"  engine floor {arm}: " + ", ".join(f"{k} {v}" for k, v in value["engine_gib"].items())
        )
    measured = value.get("measured")
    lines.append(
        f"  measured {arm}: " + (json.dumps(measured) if isinstance(measured, dict) else str(measured))
    )
    return lines


# ---------------------------------------------------------------------- sampler gap and throughput


def throughput(config: dict, metrics: list[dict]) -> dict:
    """Rollout and training tokens/s from TRL's step_time_s: a generation step's time is one training
    step (the median of the other steps) plus the round's generation and scoring."""
    train = config["train"]
    batch = train["prompts_per_step"] * train["num_generations"]
    plain = [r["step_time_s"] for r in metrics if not r["generation_step"] and r["step_time_s"]]
    rounds = [r for r in metrics if r["generation_step"] and r["step_time_s"]]
    one_step = median(plain) if plain else None
    out: dict[str, Any] = {"train_step_s": one_step, "rounds": len(rounds)}
    if one_step is None or not rounds:
        return {**out, "rollout_tokens_per_s": None, "train_tokens_per_s": None}
    rollout_s = sum(r["step_time_s"] - one_step for r in rounds)
    generated = sum(
        (r["rollouts_drawn"] or 0) * train["num_generations"] * (r["completion_length"] or 0) for r in rounds
    )
    trained = sum(batch * (r["completion_length"] or 0) for r in metrics)
    out.update(
        rollout_s=round(rollout_s, 3),
        train_s=round(one_step * len(metrics), 3),
        rollout_tokens_per_s=round(generated / rollout_s, 1) if rollout_s > 0 else None,
        train_tokens_per_s=round(trained / (one_step * len(metrics)), 1),
    )
    return out


def rollout_gap(config: dict, record: dict, metrics_path: Path) -> tuple[bool, dict, str]:
    """The gap of every generation round and the tokens/s, from the arm's CUDA engine."""
    metrics = read_metrics(metrics_path)
    rounds = [r for r in metrics if r["generation_step"]]
    gaps = [{"step": r["step"], "mean": r["sampler_gap_mean"], "max": r["sampler_gap_max"]} for r in rounds]
    engine = (record.get("vllm") or {}).get("platform") if (record.get("vllm") or {}).get("used") else None
    value = {"engine": engine or "hf", "per_round": gaps, **throughput(config, metrics)}
    missing = [g["step"] for g in gaps if g["mean"] is None]
    if engine != "gpu":
        return False, value, f"rollouts not from the CUDA engine ({engine or 'HF sampler'})"
    if missing or not gaps:
        return False, value, f"no gap at the rounds of steps {missing}"
    top = max(g["max"] for g in gaps if g["max"] is not None)
    return True, value, f"{len(gaps)} rounds from the CUDA engine, gap max {top:.3g} nats"


# ------------------------------------------------------------------------------ engine probe (child)


def engine_probe(config: dict, res: Path, arm: str, out: Path) -> int:
    """In a fresh process: deterministic algorithms on, an in-process engine in the arm's dtype with
    sleep mode; two same-seed generations, then sleep / wake / a third. Writes ``out`` after each phase."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # in-process, as TRL's colocated engine
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # precision.apply_determinism's switches
    os.environ["FLASH_ATTENTION_DETERMINISTIC"] = "1"
    import torch

    mode = config["precisions"][arm]
    torch.use_deterministic_algorithms(bool(mode["deterministic"]))
    dtype = mode.get("autocast") or mode["param_dtype"]
    result: dict[str, Any] = {
        "arm": arm,
        "dtype": dtype,
        "phase": "start",
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
    }
    write_json(out, result)
    try:
        probe_phases(config, res, dtype, result, out)
    except Exception as err:  # what broke, in the JSON: generation under deterministic algorithms may not run
        result["error"] = f"{type(err).__name__}: {err}"[:2000]
        write_json(out, result)
        raise
    return 0


def probe_phases(config: dict, res: Path, dtype: str, result: dict, out: Path) -> None:
    """The engine probe's phases: start, generate twice, sleep, wake, generate (``engine_probe``)."""
    import torch

    from workflow_scripts.models.modeling import load_tokenizer
    from workflow_scripts.models.vllm_backend import import_vllm, sample_llm
    from workflow_scripts.models.vllm_engine import engine_kwargs, engine_record, prepare_process
    from workflow_scripts.tasks.rows import read_jsonl

    vllm = import_vllm("train.use_vllm")
    base = paths.base_model_dir(res)
    tokenizer = load_tokenizer(base, config["model"]["trust_remote_code"])
    task = next(t for t, s in config["data"]["tasks"].items() if s["role"] == "on_task")
    prompts = [r["prompt"] for r in read_jsonl(paths.eval_data(task, res))[:32]]
    stops = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    settings = config["train"]["vllm"]  # the arm's colocated engine's settings; sleep mode on for the cycle
    prepare_process()  # as every engine of the workflow: IEEE fp32 products, its own compile cache
    started = time.perf_counter()
    llm = vllm.LLM(model=str(base), tokenizer=str(base), dtype=dtype, seed=1, generation_config="vllm",
                   enable_sleep_mode=True, **engine_kwargs(settings, "train.vllm"))  # fmt: skip
    result.update(phase="engine started", engine_start_s=round(time.perf_counter() - started, 1))
    result["engine"] = engine_record(llm)  # what it really runs: attention backend, KV dtype, matmul mode
    write_json(out, result)
    new_tokens = int(config["train"]["max_completion_length"])

    def generate() -> tuple[list, float]:
        done, seconds = sample_llm(llm, tokenizer, stops, prompts, 8, 1.0, 1.0, new_tokens, 7)
        return [c.token_ids for c in done], seconds

    first, seconds = generate()
    tokens = sum(len(t) for t in first)
    result.update(phase="generated", generated=True, completions=len(first),
                  tokens_per_s=round(tokens / seconds, 1) if seconds else None)  # fmt: skip
    write_json(out, result)
    second, _ = generate()
    result.update(phase="repeated", identical=second == first)
    write_json(out, result)
    free_awake = torch.cuda.mem_get_info()[0]
    llm.sleep(level=1)
    free_asleep = torch.cuda.mem_get_info()[0]
    result.update(phase="slept", freed_gib=round((free_asleep - free_awake) / GiB, 2))
    write_json(out, result)
    llm.wake_up()
    third, _ = generate()
    result.update(phase="woke", identical_after_wake=third == first)
    write_json(out, result)


def probe_checks(result: dict | None, log: Path) -> dict[str, tuple[bool, dict, str]]:
    """``vllm_deterministic``, ``sleep_cycle`` and ``engine_numerics`` from the probe's JSON (as far as it
    got)."""
    result = result or {"phase": "not started"}
    where = f"the probe stopped at phase {result.get('phase')!r}; see {log}"
    if result.get("error"):
        where = f"{result['error'][:300]} (at phase {result.get('phase')!r}; see {log})"
    if not result.get("generated"):
        det = (False, result, f"no generation under deterministic algorithms: {where}")
    elif not result.get("deterministic_algorithms"):
        det = (False, result, "deterministic algorithms were not on")
    elif result.get("identical") is None:
        det = (False, result, where)
    else:
        same = result["identical"]
        det = (same, result, "two same-seed generations " + ("identical" if same else "differ"))
    if "identical_after_wake" not in result:
        sleep = (False, result, f"no wake/sleep cycle: {where}")
    else:
        ok = result["freed_gib"] > 0 and result["identical_after_wake"]
        sleep = (
            ok,
            result,
            f"sleep freed {result['freed_gib']} GiB; after waking the completions are "
            + ("the same" if result["identical_after_wake"] else "different"),
        )
    return {"vllm_deterministic": det, "sleep_cycle": sleep, "engine_numerics": engine_numerics_check(result)}


def engine_numerics_check(result: dict) -> tuple[bool, dict, str]:
    """An fp32 probe's engine must compute IEEE fp32: its attention and KV-cache tensors in float32 and
    every fp32 product path IEEE (``vllm_engine.engine_record``, read from the engine's worker; the
    precision contract's ``kv_cache_dtype`` and ``engine_matmul_precision``). A 16-bit probe: recorded."""
    engine = result.get("engine")
    if not engine:
        return False, result, f"no engine record (the probe stopped at phase {result.get('phase')!r})"
    keys = ("attention_backend", "attention_dtype", "kv_cache_dtype", "matmul_precision")
    seen = {k: engine.get(k) for k in keys}
    if result.get("dtype") != "float32":
        return True, seen, f"{result.get('dtype')} engine: {seen}"
    ok = seen["attention_dtype"] == seen["kv_cache_dtype"] == "float32" and seen["matmul_precision"] == "ieee"
    said = "fp32 engine computes IEEE fp32: " if ok else "fp32 engine is NOT IEEE fp32: "
    return ok, seen, said + str(seen)


# ------------------------------------------------------------------------ wired into the report


def plan_checks(report, config: dict, res: Path, memory_log: str, gpu_gib: float | None) -> None:
    """memory_plan.<arm>: the plan's terms and total beside the arm's measured peak."""
    seed = config["seeds"][0]
    for arm in config["precisions"]:
        run_json = paths.train_dir(arm, seed, res) / "run.json"

        def compare(arm=arm, run_json=run_json):
            plan = smoke_plan(config, res, arm, gpu_gib)
            peak = measured_peak(read_json(run_json), run_json, memory_log) if report.gpu else None
            return plan_vs_peak(plan, peak)

        expected = f"plan total within {PLAN_TOLERANCE:.0%} of the measured peak"
        report.check(f"memory_plan.{arm}", expected, compare, gpu_only=True)


def run_probe(report, config_path: Path, config: dict, res: Path, scratch: Path, timeout: int):
    """vllm_deterministic, sleep_cycle and engine_numerics from one engine-probe child (on a GPU with vLLM
    only)."""
    arm = resume_arm(config)
    out, log = scratch / "engine_probe.json", scratch / "engine_probe.log"
    timeout = min(timeout, PROBE_TIMEOUT_S)
    result = None if arm else {"phase": "not started: no deterministic float32 arm in the config"}
    if report.gpu and report.vllm and arm is not None:
        scratch.mkdir(parents=True, exist_ok=True)
        out.unlink(missing_ok=True)
        cmd = [sys.executable, str(SMOKE), "engine-probe", "--config", str(config_path),
               "--results", str(res), "--arm", arm, "--out", str(out)]  # fmt: skip
        with open(log, "w", encoding="utf-8") as fh:
            try:
                subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, timeout=timeout, cwd=scratch)
            except subprocess.TimeoutExpired:
                fh.write(f"\nengine probe: timed out after {timeout} s\n")
        result = read_json(out) if out.exists() else None
    expected = {"vllm_deterministic": "fp32 engine under deterministic algorithms generates, twice the same",
                "sleep_cycle": "sleep(level=1) frees memory, wake_up gives the same completions",
                "engine_numerics": "an fp32 engine's attention, KV cache, matmuls: IEEE fp32"}  # fmt: skip
    for name, outcome in probe_checks(result, log).items():
        report.check(name, expected[name], lambda o=outcome: o, gpu_only=True, vllm_only=True)
