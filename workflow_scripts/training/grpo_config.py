"""config ``train`` section + precision mode -> TRL's ``GRPOConfig``: the whole mapping, in one place.

| train key                   | GRPOConfig field(s)                                                         |
|-----------------------------|-----------------------------------------------------------------------------|
| max_steps, learning_rate,   | same names (warm-up 0, optimizer adamw_torch)                               |
| lr_scheduler_type,          |                                                                             |
| weight_decay, max_grad_norm |                                                                             |
| prompts_per_step,           | per_device_train_batch_size = prompts_per_step * num_generations /          |
| num_generations,            | (gradient_accumulation_steps * world_size) completions; num_generations;    |
| gradient_accumulation_steps | gradient_accumulation_steps. An optimizer step sees prompts_per_step *      |
|                             | num_generations completions.                                                |
| steps_per_generation        | steps_per_generation: micro-batches per generation round (TRL's unit; a     |
|                             | multiple of gradient_accumulation_steps). A round samples prompts_per_step  |
|                             | * steps_per_generation / gradient_accumulation_steps prompts. Larger than   |
|                             | gradient_accumulation_steps (or num_iterations > 1) makes the policy ratio  |
|                             | differ from 1, i.e. makes DAPO's clipping act.                              |
| num_iterations              | num_iterations                                                              |
| temperature                 | temperature; top_p 1, top_k 0 (samples from pi_theta itself)                |
| max_completion_length       | max_completion_length                                                       |
| loss_type                   | loss_type (dapo: token-level loss normalised over the global batch)         |
| epsilon, epsilon_high       | epsilon (low clip), epsilon_high (clip-higher)                              |
| beta                        | beta (0: TRL loads no reference model and logs no KL; we log it)            |
| mask_truncated_completions  | mask_truncated_completions                                                  |
| overlong_buffer,            | reward_weights [1, overlong_penalty] over [the verifier reward, TRL's       |
| overlong_penalty            | get_soft_overlong_punishment(max_completion_length, overlong_buffer)]       |
| checkpoint_every            | save_steps, rounded up to whole generation rounds (see below);              |
|                             | save_strategy steps, save_total_limit 1, output_dir = the checkpoint folder |
| use_vllm                    | use_vllm, vllm_mode colocate (vllm is imported only then: gate_vllm)        |
| vllm.gpu_memory_utilization,| vllm_gpu_memory_utilization, vllm_max_model_length, vllm_enable_sleep_mode, |
| max_model_len, sleep_mode,  | vllm_tensor_parallel_size (kv_cache_gb, enforce_eager, max_num_seqs and     |
| tensor_parallel_size        | max_num_batched_tokens reach the engine: vllm_engine_args; GRPOConfig has   |
|                             | no field for the last two). min_concurrent_seqs: the memory plan's only     |
| importance_sampling.        | vllm_importance_sampling_correction, _mode, _clip_min, _clip_max (TRL      |
| correction, mode, clip_min, | acts on them only with use_vllm; defaults and reasons: the schema)         |
| clip_max                    |                                                                             |
| distributed.strategy        | ddp: nothing (accelerate wraps the model in DDP when there are >1           |
| (distributed.processes:     | processes). fsdp: fsdp + fsdp_config (FSDP2, full sharding, decoder-layer   |
| the launch, not TRL)        | wrapping, whole tensors on save) and the arm's mixed-precision policy       |
|                             | (precision.fsdp_mixed_precision) in fsdp_plugin_args                        |
| distributed.gradient_sync   | fsdp + every_micro_batch: accelerator_config.gradient_accumulation_kwargs   |
|                             | {sync_each_batch: true} (``gradient_sync_args``); otherwise nothing         |
| report_to                   | report_to (none / tensorboard / wandb); TensorBoard events go to the run's  |
|                             | results folder ``tb/`` (``tracking_env``), W&B honours WANDB_MODE=offline   |
| kl_every, kl_prompts,       | not TRL: our KL log (MetricsLogger) and the reward's verifier timeout       |
| kl_samples, reward_timeout  |                                                                             |
| dynamic_sampling,           | not TRL: DAPO's dynamic sampling in ``grpo_trainer`` (refill rounds, cap)   |
| dynamic_sampling_max_rounds |                                                                             |
| health                      | not TRL: ``train_health`` (divergence bounds)                               |
| (precision mode)            | bf16 / fp16 = autocast (ALWAYS explicit), disable_dropout False,            |
|                             | full_determinism False: see ``precision``                                   |
| activation_checkpointing    | activation_checkpointing (TRL's default on; ours off: the schema says why)  |
| (fixed)                     | seed = run seed, logging_steps 1,                                           |
|                             | disable_tqdm, scale_rewards group, shuffle_dataset, use_cpu when            |
|                             | there is no CUDA device (bf16 autocast on CPU needs it)                     |
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch

from workflow_scripts.runtime.config import ConfigError, check_train
from workflow_scripts.training.precision import PrecisionMode, fsdp_mixed_precision, trainer_precision_args
from workflow_scripts.verify.reward import make_reward_function


def generation_period(train_cfg: Mapping) -> int:
    """Optimizer steps per generation round (checkpoints must fall on multiples of it)."""
    micro = train_cfg["steps_per_generation"] * train_cfg["num_iterations"]
    ga = train_cfg["gradient_accumulation_steps"]
    return math.lcm(micro, ga) // ga


def save_steps(train_cfg: Mapping) -> int:
    period = generation_period(train_cfg)
    return math.ceil(train_cfg["checkpoint_every"] / period) * period


def world_size_from_env(world_size: int | None) -> int:
    return int(world_size if world_size is not None else os.environ.get("WORLD_SIZE", "1"))


def gate_vllm(use_vllm: bool) -> None:
    """Keep vllm out of a process that does not use it.

    TRL imports vllm at import time whenever it is installed (trl.generation.vllm_generation), which on
    a GPU box costs seconds and initialises CUDA state. With ``use_vllm`` false this marks vllm as
    absent (``sys.modules['vllm'] = None``: find_spec returns None, ``import vllm`` raises) before TRL is
    imported, so it is never imported. Call it before the first TRL import of the process.
    """
    if use_vllm:  # availability is checked once, by grpo_config
        if "vllm" in sys.modules and sys.modules["vllm"] is None:
            del sys.modules["vllm"]
    elif "vllm" not in sys.modules:
        sys.modules["vllm"] = None  # type: ignore[assignment]


def check_vllm_available() -> None:
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        raise ConfigError(
            "train.use_vllm: true, but vllm is not installed on this machine. Install the GPU extra "
            "(pip install '.[gpu]') on a CUDA machine, or set train.use_vllm: false."
        )


def strategy(train_cfg: Mapping) -> str:
    """``train.distributed.strategy`` (ddp for a train section from before the key existed)."""
    return (train_cfg.get("distributed") or {}).get("strategy", "ddp")


def fsdp_args(train_cfg: Mapping, world_size: int) -> dict:
    """The GRPOConfig fields of the strategy: FSDP2 full sharding for fsdp, none for ddp."""
    if strategy(train_cfg) != "fsdp":
        return {}
    if world_size < 2:
        raise ConfigError(
            f"train.distributed.strategy: fsdp shards over processes, but this run has {world_size}; "
            "launch it through the train stage (train.distributed.processes >= 2) or use ddp"
        )
    return {
        "fsdp": True,  # full sharding: reshard_after_forward below
        "fsdp_config": {
            "version": 2,
            "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",  # the model's decoder layers (_no_split_modules)
            "reshard_after_forward": True,
            "state_dict_type": "FULL_STATE_DICT",  # checkpoints and the saved model: whole tensors
            "cpu_ram_efficient_loading": False,
        },
    }


def gradient_sync_args(train_cfg: Mapping) -> dict:
    """GRPOConfig's accelerator_config for ``train.distributed.gradient_sync``: under FSDP with
    every_micro_batch, accelerate's ``sync_each_batch``, so FSDP2 reduce-scatters every micro-batch and each
    GPU keeps only its gradient shard (the memory plan's ``gradients`` term; it says why this is the default).

    Without it the unsharded gradients stay on every GPU through accumulation (transformers 5.24
    trainer.py:1904-1915 runs all but the last micro-batch in ``accelerator.no_sync``, which under FSDP2
    is ``set_requires_gradient_sync(False)``: accelerate 1.15 accelerator.py:1166-1171). transformers reads
    the flag from ``accelerator_config.gradient_accumulation_kwargs`` (trainer.py:810-830, into
    accelerate's GradientAccumulationPlugin) and then enters no ``no_sync`` at all (trainer.py:1905-1909).
    DDP: nothing, as its no_sync holds no extra memory (the local gradients are the same size)."""
    distributed = train_cfg.get("distributed") or {}
    if (
        strategy(train_cfg) != "fsdp"
        or distributed.get("gradient_sync", "every_micro_batch") != "every_micro_batch"
    ):
        return {}
    return {"accelerator_config": {"gradient_accumulation_kwargs": {"sync_each_batch": True}}}


def importance_sampling_args(train_cfg: Mapping) -> dict:
    """GRPOConfig's vllm_importance_sampling_* fields from ``train.importance_sampling``, always explicit:
    TRL's own defaults (on, sequence_mask) would otherwise apply without anyone choosing them."""
    given = train_cfg["importance_sampling"]  # validated: the schema filled every key
    return {
        "vllm_importance_sampling_correction": bool(given["correction"]),
        "vllm_importance_sampling_mode": given["mode"],
        "vllm_importance_sampling_clip_min": given["clip_min"],
        "vllm_importance_sampling_clip_max": given["clip_max"],
    }


def importance_sampling_record(args, sampler: Mapping | None = None) -> dict:
    """run.json's ``importance_sampling``: what TRL got, and whether it acts (where the sampler has its own
    log-probs: vLLM, or the HF sampler's own copy, ``sampler.plan``)."""
    own = bool(args.use_vllm or (sampler or {}).get("copies"))
    return {
        "correction": bool(args.vllm_importance_sampling_correction),
        "mode": args.vllm_importance_sampling_mode,
        "clip_min": args.vllm_importance_sampling_clip_min,
        "clip_max": args.vllm_importance_sampling_clip_max,
        "acts": own and bool(args.vllm_importance_sampling_correction),
    }


def grpo_config(
    train_cfg: Mapping,
    mode: PrecisionMode,
    seed: int,
    out_dir: str | os.PathLike,
    world_size: int | None = None,
):
    """The GRPOConfig for one run: the whole mapping from the config's train section (see the table)."""
    from trl import GRPOConfig

    world = world_size_from_env(world_size)
    check_train(train_cfg, world)  # the config's cross-key rules (config.py)
    if train_cfg["use_vllm"]:
        check_vllm_available()
    check_tracker_available(train_cfg["report_to"])
    ga = train_cfg["gradient_accumulation_steps"]
    per_device = train_cfg["prompts_per_step"] * train_cfg["num_generations"] // (ga * world)
    overlong = train_cfg["overlong_buffer"] is not None
    kwargs = dict(
        output_dir=str(out_dir),
        seed=seed,
        max_steps=train_cfg["max_steps"],
        learning_rate=train_cfg["learning_rate"],
        lr_scheduler_type=train_cfg["lr_scheduler_type"],
        warmup_steps=0,
        weight_decay=train_cfg["weight_decay"],
        max_grad_norm=train_cfg["max_grad_norm"],
        optim="adamw_torch",
        per_device_train_batch_size=per_device,
        gradient_accumulation_steps=ga,
        num_generations=train_cfg["num_generations"],
        steps_per_generation=train_cfg["steps_per_generation"],
        num_iterations=train_cfg["num_iterations"],
        temperature=train_cfg["temperature"],
        top_p=1.0,
        top_k=0,
        max_completion_length=train_cfg["max_completion_length"],
        loss_type=train_cfg["loss_type"],
        epsilon=train_cfg["epsilon"],
        epsilon_high=train_cfg["epsilon_high"],
        beta=train_cfg["beta"],
        scale_rewards="group",
        mask_truncated_completions=train_cfg["mask_truncated_completions"],
        reward_weights=[1.0, float(train_cfg["overlong_penalty"])] if overlong else None,
        use_vllm=bool(train_cfg["use_vllm"]),
        vllm_mode="colocate",
        vllm_gpu_memory_utilization=float(train_cfg["vllm"]["gpu_memory_utilization"]),
        vllm_max_model_length=train_cfg["vllm"]["max_model_len"],
        vllm_enable_sleep_mode=bool(train_cfg["vllm"].get("sleep_mode", False)),  # schema default: false
        vllm_tensor_parallel_size=int(train_cfg["vllm"].get("tensor_parallel_size", 1)),  # schema default: 1
        **importance_sampling_args(train_cfg),
        activation_checkpointing=bool(train_cfg["activation_checkpointing"]),  # TRL's default is ON
        save_strategy="steps",
        save_steps=save_steps(train_cfg),
        save_total_limit=1,
        save_only_model=False,
        logging_steps=1,
        logging_strategy="steps",
        report_to=train_cfg["report_to"],
        disable_tqdm=True,
        dataloader_num_workers=0,
        use_cpu=not torch.cuda.is_available(),
        shuffle_dataset=True,
        log_completions=False,
        **trainer_precision_args(mode),
        **fsdp_args(train_cfg, world),
        **gradient_sync_args(train_cfg),
    )
    args = GRPOConfig(**kwargs)
    if args.fsdp_plugin_args is not None:  # the plugin is built from this dict by the Trainer
        args.fsdp_plugin_args["mixed_precision_policy"] = fsdp_mixed_precision(mode)
    return args


def reward_functions(train_cfg: Mapping, kind: str, verifier: Mapping | None = None) -> list:
    """[the verifier reward of ``kind``] (+ TRL's soft overlong punishment when overlong_buffer is set).

    ``verifier``: the training set's verifier settings (``data.train.verifier``), as evaluation uses a
    task's, so the reward and the evaluation of the same kind read answers the same way."""
    funcs = [make_reward_function(kind, timeout=train_cfg["reward_timeout"], settings=verifier)]
    if train_cfg["overlong_buffer"] is not None:
        from trl.rewards import get_soft_overlong_punishment

        funcs.append(
            get_soft_overlong_punishment(train_cfg["max_completion_length"], train_cfg["overlong_buffer"])
        )
    return funcs


_TRACKERS = {  # report_to -> (package, how to install it)
    "tensorboard": ("tensorboard", "pip install '.[tracking]'"),
    "wandb": ("wandb", "pip install wandb"),
}


def check_tracker_available(report_to: str) -> None:
    """A missing tracker package is a config error naming the key, before any model is loaded."""
    import importlib.util

    if report_to in _TRACKERS:
        package, hint = _TRACKERS[report_to]
        if importlib.util.find_spec(package) is None:
            raise ConfigError(f"train.report_to: {report_to}, but {package} is not installed ({hint})")


@contextlib.contextmanager
def tracking_env(report_to: str, out_dir: str | os.PathLike) -> Iterator[Path | None]:
    """While the trainer is built and trains: the tracker writes under the run's results folder, not in
    the checkpoint folder (deleted after a successful run). TensorBoard: ``{out_dir}/tb``
    (transformers reads TENSORBOARD_LOGGING_DIR when it creates its callback). W&B: ``{out_dir}/wandb``
    (WANDB_DIR, read by wandb.init at the start of training; WANDB_MODE=offline needs no network).
    The variables are restored afterwards."""
    names = {"tensorboard": ("TENSORBOARD_LOGGING_DIR", "tb"), "wandb": ("WANDB_DIR", "")}
    if report_to not in names:
        yield None
        return
    variable, sub = names[report_to]
    folder = Path(out_dir) / sub if sub else Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    old = os.environ.get(variable)
    os.environ[variable] = str(folder)
    try:
        yield folder / "wandb" if report_to == "wandb" else folder
    finally:
        if old is None:
            os.environ.pop(variable, None)
        else:
            os.environ[variable] = old
