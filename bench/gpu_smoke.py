"""GPU smoke check, the reader: one JSON of checks and figures from a finished run of config.gpu-smoke.yaml.

``bench/gpu_smoke.sh`` runs the workflow on that config into a work folder, then ``report`` here. It reads
the run's own outputs (run.json, metrics.jsonl, the eval and KL summaries, the sparsity summaries,
benchmarks/) and adds measurements of its own:

- **resume** (``gpu_smoke_resume``): the deterministic fp32 arm trained again in a child that SIGKILLs
  itself after its first checkpoint, then resumed; its weights must be bit-identical to the workflow's;
- **HF vs vLLM**: the on-task evaluation of that run repeated with the HF sampler (``evaluate.run`` into
  a scratch folder, same seed and settings), for tokens/s and for pass@1 agreement between samplers;
- **device checks** (``gpu_smoke_checks``): the driver preflight (``gpu_smoke.sh`` runs it first and
  stops on a driver the torch wheel cannot use), each arm's engine start, its memory plan beside the
  measured peak, the fp32 engine under deterministic algorithms and a sleep/wake cycle (one child
  process, ``engine-probe``), the sampler-trainer gap and tokens/s from the CUDA engine.

| check               | pass when                                                              | GPU only |
|---------------------|------------------------------------------------------------------------|----------|
| workflow            | snakemake exited 0 and every target of the config exists               |          |
| device.<arm>        | the arm trained on cuda                                                | yes      |
| dtypes.<arm>        | every trainable tensor at start and end, and every saved one, is the   |          |
|                     | arm's param_dtype                                                      |          |
| autocast.<arm>      | the autocast state seen inside the first forward is the one requested  |          |
| determinism.<arm>   | deterministic algorithms on exactly in the deterministic arms          |          |
| vllm_train.<arm>    | the trainer generated the rollouts with vLLM, in the arm's dtype       | vLLM     |
| vllm_seed.<arm>     | the engine's seed is grpo_trainer.vllm_seed(run seed, rank 0), not 0   | vLLM     |
| sampler_gap.<arm>   | the sampler-trainer gap was measured at every generation round         |          |
| importance_sampling | run.json records TRL's correction as configured; it acts only with     |          |
| .<arm>              | vLLM and correction on                                                 |          |
| vllm_eval           | every evaluation sampled with vLLM                                     | vLLM     |
| hf_vs_vllm_pass1    | HF and vLLM pass@1 of the same run differ by <= 4 SE + 0.02            | vLLM     |
| base_kl_zero        | KL of every base run to itself is 0 (abs <= 1e-6)                       |          |
| resume_bit_identical| killed + resumed fp32 weights == uninterrupted ones, which moved        |          |
| peak_gpu_memory     | the device's memory was sampled and its peak stayed under 95% of total  | yes      |
| time_budget         | workflow + this script took <= 600 s                                    | yes      |
| driver              | driver new enough for torch's CUDA build, torch sees the GPU            | yes      |
| engine_start.<arm>  | run.json's engine: on the GPU, the configured share and sleep mode, KV  | yes      |
|                     | for min_concurrent_seqs x max_model_len tokens                         |          |
| memory_plan.<arm>   | plan total within 15% of the measured peak (device while the arm       | yes      |
|                     | trained, else torch's reserved peak + the plan without its context)    |          |
| vllm_deterministic  | fp32 engine under deterministic algorithms: generates, twice identical | yes      |
| sleep_cycle         | sleep(1) frees memory; after wake_up the same completions              | yes      |
| engine_numerics     | the probe's fp32 engine: attention and KV cache float32, matmuls IEEE  | yes      |
|                     | (vllm_engine.engine_record, read from the engine's worker)             |          |
| rollout_gap.<arm>   | a gap every generation round from the CUDA engine; tokens/s of rollout  | yes      |
|                     | and training                                                           |          |

Every check has a status and a reason. Status is "pass", "fail", "skipped (no GPU)" (a GPU-only check on
a machine without CUDA: never "pass"; its value still holds what could be read, e.g. the memory plan)
or "not applicable without vLLM" (a vLLM check of a config that samples with HF: the HF twin).
The vLLM checks run wherever the config uses vLLM: on a GPU, and on CPU with vLLM's CPU build (the
vLLM twin, tests/workflow/test_gpu_smoke_vllm.py). Exit status 1 when any check fails. Eval tokens/s
are the evaluate job's own ``generate_s``: for vLLM it includes building the engine (``vllm.LLM``), for
HF the model is already loaded.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import gpu_smoke_checks as checks  # noqa: E402
from bench_default import rule_totals  # noqa: E402
from gpu_smoke_resume import read_json, resume_arm, resume_check, train_child  # noqa: E402

from workflow_scripts.runtime import paths  # noqa: E402
from workflow_scripts.runtime.atomic import write_json  # noqa: E402
from workflow_scripts.runtime.config import load_config  # noqa: E402
from workflow_scripts.training.metrics_log import read_metrics, rollout_rows  # noqa: E402

PASS, FAIL = "pass", "fail"
NA, NA_VLLM = checks.NO_GPU, "not applicable without vLLM"
TIME_BUDGET_S = 600.0
KL_ZERO_TOL = 1e-6
MEMORY_SHARE = 0.95


class Report:
    """Checks (name -> {status, value, expected, reason}) and figures; a check that raises is a failure."""

    def __init__(self, gpu: bool, vllm: bool = False) -> None:
        self.gpu, self.vllm = gpu, vllm
        self.checks: dict[str, dict] = {}
        self.figures: dict[str, Any] = {}

    def check(self, name: str, expected: str, fn: Callable[[], tuple], gpu_only: bool = False,
              vllm_only: bool = False) -> None:  # fmt: skip
        """``fn`` returns (ok, value) or (ok, value, reason); a GPU-only check without a GPU is skipped
        (its value kept), a vLLM-only one of an HF config not applicable."""
        try:
            ok, value, *why = fn()
            status = PASS if ok else FAIL
            reason = why[0] if why else (f"as expected: {expected}" if ok else f"expected {expected}")
        except Exception as err:  # the JSON must say what broke, whatever broke
            status, value = FAIL, f"{type(err).__name__}: {err}"
            reason = value
        if vllm_only and not self.vllm:
            status, reason = NA_VLLM, "the config samples with HF"
        if gpu_only and not self.gpu:
            status, reason = NA, "needs CUDA; this machine has no GPU"
        self.checks[name] = {"status": status, "value": value, "expected": expected, "reason": reason}

    def figure(self, name: str, fn: Callable[[], Any]) -> None:
        try:
            self.figures[name] = fn()
        except Exception as err:
            self.figures[name] = {"error": f"{type(err).__name__}: {err}"}

    @property
    def failed(self) -> list[str]:
        return [n for n, c in self.checks.items() if c["status"] == FAIL]


# ----------------------------------------------------------------------------- what the run recorded


def arm_checks(report: Report, config: dict, res: Path) -> None:
    seed = config["seeds"][0]
    for arm, mode in config["precisions"].items():
        run_json = paths.train_dir(arm, seed, res) / "run.json"

        def record(run_json=run_json) -> dict:
            return read_json(run_json)

        def dtypes(mode=mode, record=record):
            rec = record()
            seen = {k: rec[k] for k in ("dtypes_start", "dtypes_end", "dtypes_saved")}
            return all(set(v) == {mode["param_dtype"]} for v in seen.values()), seen

        def autocast(mode=mode, record=record):
            observed = record()["autocast"]["observed"] or {}
            want = mode["autocast"]
            computes = want or mode["param_dtype"]
            ok = (
                observed.get("enabled") == (want is not None)
                and observed.get("dtype") == want
                and observed.get("layer_output_dtype") == computes
            )
            return ok, observed

        def determinism(mode=mode, record=record):
            det = record()["determinism"]
            return det["use_deterministic_algorithms"] == mode["deterministic"], det

        def device(record=record):
            return record()["device"] == "cuda", record()["device"]

        def vllm_train(record=record, mode=mode):
            rec = record()
            vllm = rec.get("vllm") or {}
            # the engine samples in the arm's rollout dtype (vLLM's "auto" would give an fp32 arm bf16)
            want = mode["autocast"] or mode["param_dtype"]
            ok = bool(vllm.get("used")) and str(vllm.get("dtype", "")).removeprefix("torch.") == want
            return ok, {"requested": rec["train"]["use_vllm"], "rollout_dtype": want, **vllm}

        def vllm_seed_check(record=record):
            from workflow_scripts.training.grpo_trainer import vllm_seed

            got, want = (record().get("vllm") or {}).get("seed"), vllm_seed(seed, 0)
            return got == want, {"engine": got, "expected": want}

        def gap(record=record, arm=arm):
            rounds = len(rollout_rows(read_metrics(paths.train_dir(arm, seed, res) / "metrics.jsonl")))
            measured = record().get("sampler_gap") or {}
            return measured.get("rounds_measured") == rounds and measured.get("mean") is not None, measured

        def importance_sampling(record=record):
            got = dict(record().get("importance_sampling") or {})
            want = dict(config["train"]["importance_sampling"])
            acts = bool(config["train"]["use_vllm"] and want["correction"])
            return got == {**want, "acts": acts}, got

        report.check(f"dtypes.{arm}", f"all tensors {mode['param_dtype']}", dtypes)
        report.check(f"autocast.{arm}", f"autocast {mode['autocast']}", autocast)
        report.check(f"determinism.{arm}", f"deterministic algorithms {mode['deterministic']}", determinism)
        report.check(f"device.{arm}", "cuda", device, gpu_only=True)
        report.check(f"vllm_train.{arm}", "rollouts from vLLM", vllm_train, vllm_only=True)
        report.check(f"vllm_seed.{arm}", "engine seed from the run seed", vllm_seed_check, vllm_only=True)
        report.check(f"sampler_gap.{arm}", "gap measured every generation round", gap)
        report.check(f"importance_sampling.{arm}", "as configured", importance_sampling)
        report.check(f"engine_start.{arm}", "engine on the GPU at the configured share, KV for "
                     "min_concurrent_seqs full sequences", lambda r=record: checks.engine_start(config, r()),
                     gpu_only=True, vllm_only=True)  # fmt: skip
        metrics_path = paths.train_dir(arm, seed, res) / "metrics.jsonl"
        report.check(f"rollout_gap.{arm}", "a gap every generation round from the CUDA engine; tokens/s",
                     lambda r=record, m=metrics_path: checks.rollout_gap(config, r(), m),
                     gpu_only=True, vllm_only=True)  # fmt: skip
        report.figure(
            f"train.{arm}", lambda arm=arm, record=record: train_figures(config, arm, record(), res)
        )


def train_figures(config: dict, arm: str, record: dict, res: Path) -> dict:
    """Throughput, memory and what training did, from run.json, metrics.jsonl and the sparsity summary."""
    seed = config["seeds"][0]
    train = config["train"]
    metrics = read_metrics(paths.train_dir(arm, seed, res) / "metrics.jsonl")
    batch = train["prompts_per_step"] * train["num_generations"]
    trained = sum(batch * (r["completion_length"] or 0) for r in metrics)
    generated = sum(
        (r["rollouts_drawn"] or 0) * train["num_generations"] * (r["completion_length"] or 0)
        for r in metrics
        if r["generation_step"]
    )
    wall = record["train_wall_s"]
    sparsity = read_json(paths.sparsity_summary(arm, seed, res))["model"]
    kls = [r["kl_k3"] for r in metrics if r["kl_k3"] is not None]
    return {
        "train_wall_s": wall,
        "s_per_step": record["s_per_step"],
        "trained_completion_tokens_per_s": round(trained / wall, 1) if wall else None,
        "generated_completion_tokens_per_s": round(generated / wall, 1) if wall else None,
        "peak_gpu_memory_gb": record.get("peak_gpu_memory_gb"),
        "vllm": record.get("vllm"),
        "reward_first_last": [metrics[0]["reward"], metrics[-1]["reward"]] if metrics else None,
        "kl_k3_last": kls[-1] if kls else None,
        "weights_changed_fraction": 1.0 - sparsity["equal_stored_fraction"],
        "changed_fraction_by_eta": sparsity["changed_fraction"],
        "representable_update": (record.get("representable_update") or {}).get("whole_model"),
        "sampler_gap": record.get("sampler_gap"),
        "loss_scale": record.get("loss_scale"),
    }


def eval_tokens_per_s(summary: dict) -> float | None:
    seconds = summary["timing"]["generate_s"]
    tokens = summary["counts"]["samples"] * summary["mean_length"]
    return round(tokens / seconds, 1) if seconds else None


def eval_checks(report: Report, config: dict, res: Path) -> None:
    runs, tasks = paths.run_names(config), list(config["data"]["tasks"])

    def summaries() -> dict:
        return {f"{r}/{t}": read_json(paths.eval_summary(r, t, res)) for r in runs for t in tasks}

    def vllm_eval():
        backends = {k: s["backend"] for k, s in summaries().items()}
        return set(backends.values()) == {"vllm"}, backends

    def base_kl():
        values = {}
        for r in paths.base_runs(config):
            for t in tasks:
                kl = read_json(paths.kl_summary(r, t, res))
                values[f"{r}/{t}"] = {"k1": kl["k1_mean"], "k3": kl["k3_mean"]}
        ok = all(abs(v["k1"]) <= KL_ZERO_TOL and abs(v["k3"]) <= KL_ZERO_TOL for v in values.values())
        return ok, values

    report.check("vllm_eval", "every evaluation sampled with vllm", vllm_eval, vllm_only=True)
    report.check("base_kl_zero", f"|k1|, |k3| <= {KL_ZERO_TOL} for every base run", base_kl)

    def eval_figures() -> dict:
        out = {}
        for key, s in summaries().items():
            kl = read_json(paths.kl_summary(*key.split("/"), res))
            out[key] = {
                "backend": s["backend"],
                "dtype": s["dtype"],
                "pass_at_1": s["pass_at_1"],
                "dJ": s["dJ"],
                "generate_s": s["timing"]["generate_s"],
                "tokens_per_s": eval_tokens_per_s(s),
                "kl_k1": kl["k1_mean"],
                "kl_k3": kl["k3_mean"],
            }
        return out

    report.figure("eval", eval_figures)


def stage_seconds(workdir: Path) -> dict[str, float]:
    """Rule -> summed job seconds (bench_default's per-rule totals of benchmarks/)."""
    return {rule: round(t["seconds"], 1) for rule, t in rule_totals(workdir).items()}


def device_memory_peak(csv_path: Path) -> dict:
    """Peak and total MiB of nvidia-smi samples (``gpu_smoke_checks.memory_samples``)."""
    rows = checks.memory_samples(csv_path)
    if not rows:
        raise ValueError(f"{csv_path}: no memory samples")
    return {"peak_mib": max(r[1] for r in rows), "total_mib": max(r[2] for r in rows), "samples": len(rows)}


# ------------------------------------------------------------------------------- HF re-evaluation


def hf_reeval(config: dict, res: Path, scratch: Path) -> dict:
    """The on-task evaluation of the fp32 arm's run again, with the HF sampler, into ``scratch``."""
    from workflow_scripts import evaluate
    from workflow_scripts.runtime.resources import job_threads

    arm = resume_arm(config) or next(iter(config["precisions"]))
    run = paths.run_name(arm, config["seeds"][0])
    task = next(t for t, s in config["data"]["tasks"].items() if s["role"] == "on_task")
    reference = paths.reference_spec(config, run)
    out = scratch / "eval_hf"
    summary, _ = evaluate.run(
        model=paths.model_dir(run, res), base=paths.base_model_dir(res), data=paths.eval_data(task, res),
        samples_out=out / f"{task}.samples.parquet", summary_out=out / f"{task}.json",
        kl_out=out / f"{task}.kl.json", eval_cfg={**config["eval"], "backend": "hf"},
        task_cfg=config["data"]["tasks"][task], run=run, task=task,
        base_samples=paths.eval_samples(reference["reference_run"], task, res),
        threads=job_threads(config, "evaluate"), trust_remote_code=config["model"]["trust_remote_code"],
        **reference,
    )  # fmt: skip
    return {
        "run": run,
        "task": task,
        "summary": summary,
        "workflow": read_json(paths.eval_summary(run, task, res)),
    }


def compare_backends(hf: dict) -> tuple[bool, dict]:
    a, b = hf["workflow"], hf["summary"]
    se = math.sqrt((a["pass_at_1_se"] or 0.0) ** 2 + (b["pass_at_1_se"] or 0.0) ** 2)
    diff = a["pass_at_1"] - b["pass_at_1"]
    value = {
        "run": hf["run"],
        "task": hf["task"],
        f"pass_at_1_{a['backend']}": a["pass_at_1"],
        "pass_at_1_hf": b["pass_at_1"],
        "difference": diff,
        "allowed": 4 * se + 0.02,
    }
    return abs(diff) <= 4 * se + 0.02, value


# ------------------------------------------------------------------------------------------- report


def device_info(workdir: Path) -> dict:
    """gpu_smoke.sh's preflight (driver, torch's CUDA, the GPU), or the same read now."""
    saved = workdir / "preflight.json"
    return read_json(saved) if saved.exists() else checks.preflight_info()


def build_report(args: argparse.Namespace) -> Report:
    started = time.perf_counter()
    config_path, workdir = Path(args.config).resolve(), Path(args.workdir).resolve()
    config = load_config(config_path)
    res = workdir / paths.RESULTS
    scratch = workdir / "gpu_smoke"
    device = device_info(workdir)
    uses_vllm = bool(config["train"]["use_vllm"] or config["eval"]["backend"] == "vllm")
    report = Report(gpu=bool(device["cuda_available"]), vllm=uses_vllm)
    report.figures["device"] = device
    verdict = device["verdict"]
    report.check("driver", "a driver new enough for torch's CUDA build; torch sees the GPU",
                 lambda: (verdict["status"] == PASS, device, verdict["reason"]), gpu_only=True)  # fmt: skip

    def workflow():
        missing = [str(p) for p in expected_targets(config, res) if not p.exists()]
        return args.snakemake_rc == 0 and not missing, {"snakemake_rc": args.snakemake_rc, "missing": missing}

    report.check("workflow", "snakemake exit 0, every target present", workflow)
    report.figure("base_model", lambda: read_json(paths.base_record(res)))
    arm_checks(report, config, res)
    eval_checks(report, config, res)
    report.check(
        "resume_bit_identical",
        "killed after the first checkpoint + resumed == uninterrupted, bit for bit; weights moved",
        lambda: resume_check(config_path, config, res, scratch, args.child_timeout),
    )
    hf: dict = {}

    def backends():
        hf.update(hf_reeval(config, res, scratch))
        return compare_backends(hf)

    report.check("hf_vs_vllm_pass1", "|pass@1 vllm - pass@1 hf| <= 4 SE + 0.02", backends, vllm_only=True)

    def eval_speed() -> dict:
        out = {"run": hf["run"], "task": hf["task"]}
        for summary in (hf["workflow"], hf["summary"]):
            out[f"{summary['backend']}_tokens_per_s"] = eval_tokens_per_s(summary)
            out[f"{summary['backend']}_generate_s"] = summary["timing"]["generate_s"]
        out["note"] = "vllm generate_s includes building the engine; hf's excludes the model load"
        return out

    report.figure("eval_speed", eval_speed)
    report.figure("stage_seconds", lambda: stage_seconds(workdir))
    checks.plan_checks(report, config, res, args.memory_log, device.get("reported_gib"))
    checks.run_probe(report, config_path, config, res, scratch, args.child_timeout)

    def memory():
        if not args.memory_log:
            raise FileNotFoundError("no device memory samples (no GPU, or nvidia-smi missing)")
        peak = device_memory_peak(Path(args.memory_log))
        return peak["peak_mib"] < MEMORY_SHARE * peak["total_mib"], peak

    report.check(
        "peak_gpu_memory", f"sampled, peak < {MEMORY_SHARE:.0%} of the device", memory, gpu_only=True
    )
    smoke_s = time.perf_counter() - started
    total = args.snakemake_seconds + smoke_s
    report.figures["wall_s"] = {
        "snakemake": round(args.snakemake_seconds, 1),
        "gpu_smoke_py": round(smoke_s, 1),
        "total": round(total, 1),
    }
    budget = (total <= TIME_BUDGET_S, round(total, 1))
    report.check("time_budget", f"<= {TIME_BUDGET_S:.0f} s", lambda: budget, gpu_only=True)
    return report


def expected_targets(config: dict, res: Path) -> list[Path]:
    runs, tasks = paths.run_names(config), list(config["data"]["tasks"])
    arms, seeds = list(config["precisions"]), config["seeds"]
    return [
        paths.base_record(res),
        *(paths.train_dir(a, s, res) / "run.json" for a in arms for s in seeds),
        *(paths.eval_summary(r, t, res) for r in runs for t in tasks),
        *(paths.kl_summary(r, t, res) for r in runs for t in tasks),
        *(paths.sparsity_summary(a, s, res) for a in arms for s in seeds),
        *(paths.overlap_table(a, res) for a in arms),
        paths.analysis_dir(res) / "stats.json",
        paths.analysis_dir(res) / "report.md",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    rep = sub.add_parser("report", help="checks and figures of a finished smoke run -> one JSON")
    rep.add_argument("--config", required=True, help="the config the workflow ran with")
    rep.add_argument("--workdir", required=True, help="the workflow's working directory (results/ inside)")
    rep.add_argument("--out", required=True, help="the JSON to write")
    rep.add_argument("--snakemake-rc", type=int, required=True)
    rep.add_argument("--snakemake-seconds", type=float, required=True)
    rep.add_argument("--memory-log", default="", help="nvidia-smi memory samples (csv); absent on CPU")
    rep.add_argument("--child-timeout", type=int, default=900, help="seconds per resume training child")
    child = sub.add_parser("train-child", help="(internal) one training run of the resume check")
    child.add_argument("--config", required=True)
    child.add_argument("--precision", required=True)
    child.add_argument("--seed", type=int, required=True)
    for name in ("--data", "--base", "--out", "--ckpt"):
        child.add_argument(name, required=True)
    child.add_argument("--kill-at", type=int, default=0, help="SIGKILL itself after this step's checkpoint")
    pre = sub.add_parser("preflight", help="driver, torch's CUDA and the GPU; exit 3 on a driver too old")
    pre.add_argument("--workdir", required=True)
    pre.add_argument("--out", required=True, help="the report JSON, written only when refused")
    probe = sub.add_parser("engine-probe", help="(internal) deterministic fp32 engine + sleep/wake cycle")
    for name in ("--config", "--results", "--arm", "--out"):
        probe.add_argument(name, required=True)
    args = parser.parse_args(argv)
    if args.command == "train-child":
        return train_child(args)
    if args.command == "preflight":
        return checks.preflight(Path(args.workdir), Path(args.out))
    if args.command == "engine-probe":
        config = load_config(args.config)
        return checks.engine_probe(config, Path(args.results), args.arm, Path(args.out))
    report = build_report(args)
    failed = report.failed
    write_json(args.out, {
        "passed": not failed,
        "failed": failed,
        "config": str(Path(args.config).resolve()),
        "checks": report.checks,
        "figures": report.figures,
    })  # fmt: skip
    width = max(map(len, report.checks))
    for name, check in report.checks.items():
        print(f"{name:<{width}}  {check['status']:<17} {str(check['reason'])[:160]}")
    for name, check in report.checks.items():
        if name.startswith("memory_plan."):
            print("\n".join(checks.plan_lines(name.split(".", 1)[1], check["value"])))
    print(f"{'FAILED: ' + ', '.join(failed) if failed else 'all checks passed'} -> {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
