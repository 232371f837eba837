"""train stage: ``run`` fine-tunes one (precision, seed) with GRPO configured as DAPO and writes it.
Long on purpose: the GRPO run is one sequence of set-up steps, each a few lines, kept in reading order.

The base policy is trained on the training prompts with the training task's verifier as the reward
(``verifiers.make_reward_function``; the same module scores evaluation). Outputs under ``out_dir``:

- ``model/``: the final policy (safetensors, in ``param_dtype``, checked on disk) and tokenizer;
- ``metrics.jsonl``: one line per optimizer step (keys: ``metrics_log``);
- ``run.json``: provenance (run name and repeat, versions, config hash, precision mode, dtypes at start,
  end and as saved, autocast observed, device, steps, seed, wall time, reward and dynamic-sampling
  summaries, resume), ``representable_update`` (``representable``), ``health`` (``train_health``),
  ``sampler`` (engine, dtype, correction: ``sampler.plan``), ``vllm`` (engine dtype and seed:
  ``grpo_trainer.vllm_seed``), ``importance_sampling`` (what TRL got, whether it acts), ``sampler_gap``
  (``metrics_log.gap_summary``), ``loss_scale`` (fp16: ``metrics_log.scaler_summary``), ``train_seed``,
  ``bf16_matmul``, ``optimizer`` (``optimizers``) and ``precision_contract`` (expected and observed);
- ``tb/``: TensorBoard events when ``train.report_to`` is tensorboard (not a declared output).

Where the pieces live: the config -> GRPOConfig table in ``grpo_config``; every override of TRL
(eval-mode rollouts, DAPO dynamic sampling, the epoch-aware sampler) in ``grpo_trainer``; metrics.jsonl
in ``metrics_log``; checkpoints and resume in ``checkpoints``; precision modes in ``precision``.

Resume: a rerun resumes from the newest complete checkpoint in ``ckpt_dir``, truncates the live
metrics to the checkpoint's step and continues; the Trainer restores the RNG states after
fast-forwarding the data loader, so a resumed deterministic run ends bit-identical to an uninterrupted
one. After a successful run the checkpoint folder is deleted (optimizer state is ~3x the model). The
Trainer also saves at the last step; resumed there it would train a step past max_steps, so a job killed
after that save but before run.json starts again (``checkpoints.prepare_checkpoint_dir``).

GPU path: ``train.use_vllm`` samples with vLLM colocated on the training GPUs (vllm imported only then).
Several processes (``train.distributed``: ddp or fsdp): ``from_snakemake`` and ``main`` run ``accelerate
launch ... -m workflow_scripts.train --job <spec>`` (``launch``), each rank's output in the rule's log;
the per-device batch is divided by the world size. Only rank 0 writes; run.json records each rank's.
"""

from workflow_scripts.runtime import startup  # noqa: F401  first: no garbage collection during imports

# isort: split

import argparse
import contextlib
import json
import logging
import os
import shutil
import time
from collections.abc import Mapping
from pathlib import Path

import torch
from accelerate import PartialState

from workflow_scripts.measures.representable import representable_update
from workflow_scripts.models.modeling import load_model, load_tokenizer
from workflow_scripts.runtime import paths
from workflow_scripts.runtime.atomic import atomic_dir, write_json, write_text
from workflow_scripts.runtime.config import load_config, section_hash
from workflow_scripts.runtime.numerics import numerics_provenance
from workflow_scripts.runtime.resources import train_processes
from workflow_scripts.runtime.smk import main_from
from workflow_scripts.runtime.threads import log_startup, process_age_s
from workflow_scripts.tasks.rows import read_rows
from workflow_scripts.training.bf16_matmul import bf16_matmul
from workflow_scripts.training.bf16_matmul import record as matmul_record
from workflow_scripts.training.checkpoints import (
    Snapshots,
    checkpoint_step,
    latest_complete_checkpoint,
    prepare_checkpoint_dir,
    run_key,
)
from workflow_scripts.training.curriculum import schedule as curriculum_schedule
from workflow_scripts.training.grpo_config import (
    gate_vllm,
    grpo_config,
    importance_sampling_record,
    reward_functions,
    strategy,
    tracking_env,
    world_size_from_env,
)
from workflow_scripts.training.grpo_trainer import check_chunked_logprob_head, make_trainer_class
from workflow_scripts.training.heldout import HeldOutCurves, check_heldout, heldout_record, heldout_slices
from workflow_scripts.training.heldout_spec import HELDOUT_FILE, heldout_spec, without_heldout
from workflow_scripts.training.launch import launch_training
from workflow_scripts.training.metrics_callback import MetricsLogger
from workflow_scripts.training.metrics_log import (
    gap_summary,
    kl_prompt_sample,
    read_metrics,
    reward_summary,
    scaler_summary,
    truncate_metrics,
)
from workflow_scripts.training.optimizers import optimizer_cls_and_kwargs, optimizer_record
from workflow_scripts.training.precision import (
    AutocastProbe,
    PrecisionMode,
    apply_determinism,
    check_param_dtypes,
    check_saved_dtypes,
    check_supported,
    enable_cpu_fp16,
    head_param_names,
    load_policy,
    matmul_path,
    model_dropouts,
    summarize_dtypes,
    train_seed,
)
from workflow_scripts.training.precision_contract import contract_check
from workflow_scripts.training.ranks import (
    KLPartner,
    check_distribution,
    fsdp_on_cpu,
    rank_records,
    shard_reference,
)
from workflow_scripts.training.run_record import peak_gpu_memory, versions, vllm_record
from workflow_scripts.training.sampler import arm_train_config
from workflow_scripts.training.sampler import plan as sampler_plan
from workflow_scripts.training.train_health import NonFiniteGuard, assess_health

__all__ = ["from_snakemake", "job_from_config", "main", "read_metrics", "run", "run_or_launch", "train_run"]

log = logging.getLogger("train")


def _device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _train_dataset(rows: list[dict]):
    from datasets import Dataset

    return Dataset.from_list(
        [
            {
                "id": r["id"],
                "prompt": r["prompt"],
                "answer": str(r["answer"]),
                "kind": r["kind"],
                "meta": json.dumps(r.get("meta") or {}, sort_keys=True),
                **({"phase": r["phase"]} if "phase" in r else {}),
            }
            for r in rows
        ]
    )


def _training_kind(path: Path, rows: list[dict]) -> str:
    kinds = sorted({r["kind"] for r in rows})
    if len(kinds) != 1:
        raise ValueError(f"{path}: training rows must share one verifier kind, got {kinds}")
    return kinds[0]


def train_run(
    config: Mapping,
    precision: str,
    seed: int,
    data_dir,
    base_dir,
    out_dir,
    ckpt_dir,
    threads: int = 1,
    callbacks: list | None = None,
    repeat: int = 1,
) -> dict:
    """``run`` with the sections taken from a whole (validated) config: the tests' form (one process)."""
    job = job_from_config(config, precision, seed, data_dir, base_dir, out_dir, ckpt_dir, repeat)
    return run(**job, threads=threads, callbacks=callbacks)


def job_from_config(
    config: Mapping, precision: str, seed: int, data_dir, base_dir, out_dir, ckpt_dir, repeat: int = 1
) -> dict:
    """``run``'s arguments (but threads) from a whole (validated) config, as JSON: what ``--job`` reads."""
    if precision not in config["precisions"]:
        raise KeyError(f"unknown precision {precision!r}; configured: {sorted(config['precisions'])}")
    model = config.get("model", {})
    return {
        "train": without_heldout(config["train"]),
        "precision": precision,
        "mode": dict(config["precisions"][precision]),
        "model": {k: model[k] for k in ("dtype", "trust_remote_code") if k in model},
        "seed": int(seed),
        "repeat": int(repeat),
        "data_dir": str(data_dir),
        "base_dir": str(base_dir),
        "out_dir": str(out_dir),
        "ckpt_dir": str(ckpt_dir),
        "verifier": dict(config["data"]["train"]["verifier"]) if "data" in config else None,
        "heldout": heldout_spec(config) if "data" in config else None,
        "snapshots": {
            str(k): str(paths.snapshot_in(out_dir, k))
            for k in (paths.snapshot_steps(config, precision) if repeat == 1 and "train" in config else [])
        },
    }


def run(
    train: dict,
    precision: str,
    mode: dict,
    model: dict,
    seed: int,
    data_dir,
    base_dir,
    out_dir,
    ckpt_dir,
    threads: int = 1,
    callbacks: "list | None" = None,
    verifier: "dict | None" = None,
    repeat: int = 1,
    heldout: "dict | None" = None,
    snapshots: "dict | None" = None,
) -> dict:
    """The stage: train arm ``precision`` (its config entry ``mode``) with seed ``seed``; write model/,
    metrics.jsonl and run.json under ``out_dir``. ``model`` = {dtype, trust_remote_code} of the base;
    ``verifier`` = the training set's verifier settings (``data.train.verifier``; None: defaults);
    ``repeat`` = 1, or k >= 2 for a repeat of (precision, seed) (config ``repeats``: same seed);
    ``heldout`` = the held-out curve's settings (``heldout_spec``; the stage always has them; None: no
    curve), measured on data_dir/eval/{task}.jsonl and written to heldout.jsonl; ``snapshots`` = {step:
    folder} where the policy at that step is copied (config ``snapshots``, ``checkpoints.Snapshots``)."""
    started = time.time()
    data_dir, base_dir, out_dir, ckpt_dir = map(Path, (data_dir, base_dir, out_dir, ckpt_dir))
    train_cfg = dict(train)
    mode = PrecisionMode.from_config(precision, mode)
    gate_vllm(bool(train_cfg["use_vllm"]))
    torch.set_num_threads(threads)
    device = _device()
    check_supported(mode, device)
    determinism = apply_determinism(mode)
    world = world_size_from_env(None)
    sharded = strategy(train_cfg) == "fsdp"
    sampler = sampler_plan(mode, train_cfg, device, sharded)  # the arm's sampler, its correction (sampler)
    train_cfg = arm_train_config(train_cfg, mode, sampler)
    stream_seed = train_seed(mode, seed)  # seed + the arm's seed_offset (a negative control's own seeds)
    args = grpo_config(train_cfg, mode, stream_seed, ckpt_dir, world)  # checks the train section once
    if args.steps_per_generation * args.num_iterations <= args.gradient_accumulation_steps:
        log.warning(
            "steps_per_generation * num_iterations <= gradient_accumulation_steps: the policy ratio "
            "is 1 and DAPO's clipping never acts"
        )

    rows = read_rows(data_dir / "train.jsonl")
    kind = _training_kind(data_dir / "train.jsonl", rows)
    train_rows, schedule = curriculum_schedule(train_cfg, data_dir, rows, kind)
    key = run_key(train_cfg, mode, seed, base_dir, data_dir)
    live_metrics = ckpt_dir / "metrics.jsonl"
    live_heldout = ckpt_dir / HELDOUT_FILE
    state = PartialState()  # the process group GRPOConfig set up (a no-op in one process)
    with state.main_process_first():  # one process prepares the folder; the others then read it
        if state.is_main_process:
            resume = prepare_checkpoint_dir(ckpt_dir, key, before=train_cfg["max_steps"])
            resume_step = checkpoint_step(resume) if resume else 0
            previous = truncate_metrics(live_metrics, resume_step) if resume else []
            previous_heldout = truncate_metrics(live_heldout, resume_step) if resume else []
            for live in (live_metrics, live_heldout):
                if not resume and live.exists():
                    live.unlink()
            if resume and [r["step"] for r in previous] != list(range(1, resume_step + 1)):
                raise RuntimeError(f"{live_metrics}: metrics do not cover steps 1..{resume_step} of {resume}")
        else:
            resume = latest_complete_checkpoint(
                ckpt_dir, remove_incomplete=False, before=train_cfg["max_steps"]
            )
            resume_step, previous = (checkpoint_step(resume) if resume else 0), []
            previous_heldout = [r for r in read_metrics(live_heldout) if r["step"] <= resume_step]
    log.info("%s seed %d: %s on %s (%s)", precision, seed,
             f"resuming from step {resume_step}" if resume else "starting", device, mode)  # fmt: skip

    trust = bool(model.get("trust_remote_code", False))
    tokenizer = load_tokenizer(base_dir, trust)
    policy = load_policy(base_dir, mode, trust)
    start_dtypes = check_param_dtypes(policy, mode)
    representable = representable_update(policy, train_cfg["learning_rate"], mode.rounding)
    reference = None  # the KL log's base model: only the rank that logs needs it (under FSDP: sharded)
    if state.is_main_process or sharded:
        reference = load_model(base_dir, model.get("dtype", "float32"), trust).to(device).eval()
        for p in reference.parameters():
            p.requires_grad_(False)
        if sharded:
            reference = shard_reference(reference)

    logger = MetricsLogger(
        live_metrics, train_cfg["max_steps"], kind, reference=reference, tokenizer=tokenizer,
        kl_prompts=kl_prompt_sample([r["prompt"] for r in rows], train_cfg["kl_prompts"]),
        kl_every=train_cfg["kl_every"], kl_samples=train_cfg["kl_samples"],
        max_new_tokens=train_cfg["max_completion_length"], previous=previous, sharded=sharded,
        phase_of=schedule["phase_of"], phase_names=schedule["names"],
    )  # fmt: skip
    snapshot_outputs = {int(k): Path(v) for k, v in (snapshots or {}).items()}
    saver = Snapshots(ckpt_dir, list(snapshot_outputs), tokenizer) if snapshot_outputs else None
    if saver and sharded:
        raise ValueError(
            "config snapshots: not available under FSDP (the weights are shards); set snapshots: {}"
        )
    curves = None
    if heldout is not None:
        name = paths.run_name(precision, seed, repeat)
        about = {"run": name, "precision": precision, "seed": seed, "repeat": repeat,
                 "stream": paths.stream_run(name)}  # fmt: skip
        curves = HeldOutCurves(
            live_heldout, heldout, heldout_slices(heldout, data_dir), about, train_cfg["max_steps"],
            tokenizer, sharded=sharded, is_main=state.is_main_process, previous=previous_heldout,
            phase_of=schedule["phase_of"], workers=threads,
        )  # fmt: skip
    from transformers.trainer_callback import PrinterCallback

    trainer_class = make_trainer_class(
        bool(train_cfg["dynamic_sampling"]),
        int(train_cfg["dynamic_sampling_max_rounds"]),
        vllm_dtype=mode.sampler_compute_dtype if train_cfg["use_vllm"] else None,
        vllm_settings=train_cfg["vllm"],
        curriculum=schedule["sampler"],
        sampler_dtype=sampler["dtype"] if sampler["copies"] else None,
    )
    cpu_fsdp = fsdp_on_cpu() if sharded and device == "cpu" else contextlib.nullcontext()
    with tracking_env(train_cfg["report_to"], out_dir), cpu_fsdp:  # tracking: the whole training
        trainer = trainer_class(
            model=policy,
            reward_funcs=reward_functions(train_cfg, kind, verifier),
            args=args,
            train_dataset=_train_dataset(train_rows),
            processing_class=tokenizer,
            callbacks=[
                NonFiniteGuard(),
                logger,
                *([KLPartner(logger)] if sharded else []),
                *([curves] if curves else []),
                *([saver] if saver else []),
                *(callbacks or []),
            ],
        )
        if curves:
            curves.trainer = trainer  # its colocated vLLM engine, when it has one
        trainer.remove_callback(PrinterCallback)
        enable_cpu_fp16(trainer.accelerator)  # an fp16 arm on CPU: autocast and a scaler (precision)
        check_chunked_logprob_head(trainer)  # the memory plan's log-prob head, before any step
        check_distribution(trainer.accelerator, train_cfg, world)
        probe = AutocastProbe(trainer.model)
        if curves:
            curves.probe = probe
        # the arm's optimizer (rounding, update_noise; None: TRL's adamw_torch), its dtype contract, and
        # the path its bf16 products take (precision, optimizers, precision_contract, bf16_matmul)
        trainer.optimizer_cls_and_kwargs = optimizer_cls_and_kwargs(mode, args, stream_seed)
        contract = contract_check(trainer, mode, probe, device=device, world=world)
        train_start = time.perf_counter()
        try:
            with bf16_matmul(matmul_path(mode, device)):
                trainer.train(resume_from_checkpoint=str(resume) if resume else None)
        finally:
            logger.close()
            probe.close()
    train_wall = time.perf_counter() - train_start
    policy = trainer.accelerator.unwrap_model(trainer.model)
    end_dtypes = check_param_dtypes(policy, mode)  # under FSDP: this rank's shards
    ranks = rank_records(trainer.accelerator, start_dtypes, end_dtypes, probe, contract, reference)
    # FSDP: the whole tensors are gathered (a collective: every rank calls it); rank 0 gets them
    full_state = trainer.accelerator.get_state_dict(trainer.model) if sharded else None

    record: dict = {}
    if trainer.accelerator.is_main_process:
        metrics = read_metrics(live_metrics)
        steps = [r["step"] for r in metrics]
        if steps != list(range(1, train_cfg["max_steps"] + 1)):
            raise RuntimeError(
                f"{live_metrics}: expected steps 1..{train_cfg['max_steps']}, got {len(steps)} lines"
            )
        with atomic_dir(out_dir / "model") as tmp:
            policy.save_pretrained(tmp, safe_serialization=True, state_dict=full_state)
            tokenizer.save_pretrained(tmp)
            written = check_saved_dtypes(tmp, mode, head_param_names(policy))
        if saver:
            saver.publish(snapshot_outputs)
        write_text(out_dir / "metrics.jsonl", live_metrics.read_text(encoding="utf-8"))
        heldout_lines = []
        if heldout is not None:
            heldout_lines = read_metrics(live_heldout)
            check_heldout(heldout_lines, live_heldout, heldout, train_cfg["max_steps"])
            write_text(out_dir / HELDOUT_FILE, live_heldout.read_text(encoding="utf-8"))
        health = assess_health(metrics, train_cfg["health"])
        for reason in health["reasons"]:
            log.warning("run marked diverged: %s", reason)
        summary = reward_summary(metrics)
        record = {
            "run": paths.run_name(precision, seed, repeat),
            "precision": precision,
            "mode": mode.as_dict(),
            "seed": seed,
            "train_seed": stream_seed,
            "repeat": repeat,
            "device": device,
            **peak_gpu_memory(),  # peak_gpu_memory_gb (allocated), peak_gpu_memory_reserved_gb
            "vllm": vllm_record(trainer),
            "sampler": sampler,
            "importance_sampling": importance_sampling_record(args, sampler),
            "world_size": world,
            "strategy": strategy(train_cfg),
            "distributed_type": trainer.accelerator.distributed_type.name,
            "ranks": ranks,
            "threads": threads,
            "versions": versions(),
            "numerics": numerics_provenance(),
            "config_hash": section_hash(train_cfg, mode.as_dict(), seed),
            "run_key": key,
            "train": train_cfg,
            "trainer": {
                "per_device_train_batch_size": args.per_device_train_batch_size,
                "generation_batch_size": args.generation_batch_size,
                "steps_per_generation": args.steps_per_generation,
                "save_steps": args.save_steps,
                "bf16": args.bf16,
                "fp16": args.fp16,
                "report_to": list(args.report_to or []),
            },
            "determinism": determinism,
            "dropout": model_dropouts(policy),
            "sampling_mode": "eval (dropout only in the loss forward)",
            "dtypes_start": summarize_dtypes(start_dtypes),
            "dtypes_end": summarize_dtypes(end_dtypes),
            "dtypes_saved": summarize_dtypes(written),
            "trainable_tensors": len(start_dtypes),
            "autocast": {"requested": mode.autocast, "observed": probe.record},
            "bf16_matmul": matmul_record(mode.bf16_matmul, device, mode.computes_bf16),
            "optimizer": optimizer_record(trainer.optimizer, mode),
            "precision_contract": contract.record(),
            "representable_update": representable,
            "health": health,
            "dynamic_sampling": {
                "enabled": bool(train_cfg["dynamic_sampling"]),
                "max_rounds": train_cfg.get("dynamic_sampling_max_rounds"),
                "rollouts_drawn": summary["rollouts_drawn"],
                "groups_kept": summary["groups_kept"],
                "groups_zero_spread": summary["groups_zero_spread"],
                "cap_hits": summary["dynamic_cap_hits"],
            },
            "steps": train_cfg["max_steps"],
            "steps_this_session": trainer.state.global_step - resume_step,
            "resumed": resume is not None,
            "resumed_from_step": resume_step if resume else None,
            "train_wall_s": round(train_wall, 3),
            "wall_time_s": round(time.time() - started, 3),
            "s_per_step": round(train_wall / max(1, trainer.state.global_step - resume_step), 4),
            "rewards": summary,
            "sampler_gap": gap_summary(metrics),
            "loss_scale": scaler_summary(metrics),
            "heldout": heldout_record(heldout, heldout_lines),
            "snapshots": sorted(snapshot_outputs),
        }
        write_json(out_dir / "run.json", record)
        shutil.rmtree(ckpt_dir, ignore_errors=True)
        log.info("done: %s", json.dumps(record["rewards"]))
    trainer.accelerator.wait_for_everyone()
    return record


def run_or_launch(job: dict, processes: int, threads: int = 1, log_path: str | None = None) -> None:
    """``run(**job)`` here (one process, or already a launched rank), else ``processes`` processes through
    ``accelerate launch`` (``launch``; ``threads`` split between them, output to ``log_path``)."""
    if processes == 1 or "WORLD_SIZE" in os.environ:
        run(**job, threads=threads)
    else:
        launch_training(job, processes, threads, log_path)


def from_snakemake(smk) -> None:
    log_startup(process_age_s())
    job = {
        "train": dict(smk.params.train),
        "precision": smk.wildcards.precision,
        "mode": dict(smk.params.precision),
        "model": dict(smk.params.model),
        "seed": int(smk.wildcards.seed),
        "repeat": int(getattr(smk.wildcards, "repeat", 1)),  # rule train_repeat (config repeats)
        "data_dir": str(Path(smk.input.train).parent),
        "base_dir": str(smk.input.base),
        "out_dir": str(Path(smk.output.run).parent),
        "ckpt_dir": str(smk.params.checkpoints),
        "verifier": dict(smk.params.verifier),
        "heldout": dict(smk.params.heldout),
        # the snapshot steps of this run and their output folders (rule train_snapshots; else none)
        "snapshots": {str(k): str(v) for k, v in dict(smk.params.snapshots).items()},
    }
    # the world size the rule planned (resources.train_processes): a param, so a new one retrains
    run_or_launch(job, int(smk.params.processes), smk.threads, smk.log[0] if len(smk.log) else None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", default="config.yaml")
    parser.add_argument("--precision")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--repeat", type=int, default=1, help="k >= 2: repeat k of (precision, seed)")
    parser.add_argument("--data", default=str(paths.data_dir()))
    parser.add_argument("--base", default=str(paths.base_model_dir()))
    parser.add_argument("--out", default=None, help="default results/train/{precision}/seed{seed}")
    parser.add_argument("--ckpt", default=None, help="default results/checkpoints/{precision}/seed{seed}")
    parser.add_argument(
        "--threads", type=int, default=1, help="threads of the run (all processes); --job: of this process"
    )
    parser.add_argument(
        "--job", default=None, help="a JSON of run()'s arguments (what the launcher gives each process)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if args.job:
        run(**json.loads(Path(args.job).read_text(encoding="utf-8")), threads=args.threads)
        return 0
    if args.precision is None or args.seed is None:
        parser.error("--precision and --seed are required (or --job)")
    config = load_config(args.config)
    out = args.out or paths.train_dir(args.precision, args.seed, repeat=args.repeat)
    ckpt = args.ckpt or paths.checkpoint_dir(args.precision, args.seed, repeat=args.repeat)
    job = job_from_config(config, args.precision, args.seed, args.data, args.base, out, ckpt, args.repeat)
    run_or_launch(job, train_processes(config), args.threads)
    return 0


if __name__ == "__main__":
    main_from(globals())
