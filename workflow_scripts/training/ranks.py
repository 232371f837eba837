"""A multi-process training run: the processes and strategy accelerate really runs (it falls back
silently), what each rank saw, and the KL partner every FSDP rank must run alongside the main one."""

from __future__ import annotations

from collections.abc import Mapping

from transformers import TrainerCallback

from workflow_scripts.training.grpo_config import strategy
from workflow_scripts.training.metrics_callback import MetricsLogger
from workflow_scripts.training.precision import AutocastProbe, summarize_dtypes


def check_distribution(accelerator, train_cfg: Mapping, world: int) -> None:
    """The processes and strategy asked for are the ones accelerate runs (it falls back silently: FSDP
    requested on CPU processes becomes plain data parallel)."""
    if accelerator.num_processes != world:
        raise RuntimeError(
            f"WORLD_SIZE is {world}, but accelerate runs {accelerator.num_processes} processes"
        )
    if strategy(train_cfg) == "fsdp" and accelerator.distributed_type.name != "FSDP":
        raise RuntimeError(
            f"train.distributed.strategy: fsdp, but accelerate runs {accelerator.distributed_type.name} "
            "(FSDP needs one GPU per process)"
        )


def rank_records(accelerator, start: dict, end: dict, probe: AutocastProbe) -> list[dict]:
    """What every rank saw (dtypes of its trainable tensors, or shards, at start and end; autocast
    observed in its first forward), gathered on all ranks in rank order."""
    from accelerate.utils import gather_object

    mine = {
        "rank": accelerator.process_index,
        "device": str(accelerator.device),
        "dtypes_start": summarize_dtypes(start),
        "dtypes_end": summarize_dtypes(end),
        "autocast_observed": probe.record,
    }
    return sorted(gather_object([mine]), key=lambda r: r["rank"])


class KLPartner(TrainerCallback):
    """FSDP: a KL measurement's forwards all-gather shards, so every rank must run it; the main process
    measures and logs (MetricsLogger), the other ranks run the same measurement alongside and drop it."""

    def __init__(self, logger: MetricsLogger) -> None:
        self.logger = logger

    def on_log(self, args, state, control, logs=None, model=None, **kwargs):
        lg = self.logger
        step = state.global_step
        if state.is_world_process_zero or "train_runtime" in (logs or {}) or lg.reference is None:
            return
        if lg.kl_every and (step % lg.kl_every == 0 or step == lg.max_steps):
            lg.measure_kl(model, step)
