"""A multi-process training run: the processes and strategy accelerate really runs (it falls back
silently), FSDP on CPU processes, what each rank saw, the KL reference sharded like the policy, and the
KL partner every FSDP rank must run alongside the main one."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping

from transformers import TrainerCallback

from workflow_scripts.training.grpo_config import strategy
from workflow_scripts.training.metrics_callback import MetricsLogger
from workflow_scripts.training.precision import AutocastProbe, summarize_dtypes


@contextlib.contextmanager
def fsdp_on_cpu() -> Iterator[None]:
    """Inside: an accelerator built with an FSDP plugin on CPU processes runs FSDP.

    accelerate 1.15 (``AcceleratorState.__init__``) turns a plugin into FSDP only for accelerator
    process groups and silently runs CPU processes as plain data parallel (MULTI_CPU), although torch's
    FSDP2 (``fully_shard``) shards over gloo. This sets the state accelerate would have set on GPUs
    (distributed_type FSDP, the plugin), so the sharded path (FSDP2 preparation, mixed-precision policy,
    full-state gathering for the save, the KL log in lockstep) runs on CPU exactly as it is written for
    GPUs: the multi-process test exercises it before any GPU does (``check_distribution`` confirms it)."""
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType

    original = AcceleratorState.__init__

    def init(self, *args, fsdp_plugin=None, **kwargs):
        original(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        if fsdp_plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
            self.distributed_type = DistributedType.FSDP
            self.fsdp_plugin = fsdp_plugin
            # every later AcceleratorState() copies PartialState's shared state over its own
            PartialState._shared_state["distributed_type"] = DistributedType.FSDP

    AcceleratorState.__init__ = init
    try:
        yield
    finally:
        AcceleratorState.__init__ = original


def shard_reference(model):
    """The KL log's reference model sharded over the ranks like the policy (FSDP2 ``fully_shard`` of each
    decoder layer, then the root; its own dtype, no mixed precision): each rank holds ~1/world of it,
    where a replicated copy would cost every GPU the whole model (~15 GB for a 7B model in bf16). Its
    forwards are collectives: every rank runs the KL log (``KLPartner``, in lockstep)."""
    from torch.distributed.fsdp import fully_shard

    layers = set(getattr(model, "_no_split_modules", None) or ())
    for module in model.modules():
        if type(module).__name__ in layers:
            fully_shard(module, reshard_after_forward=True)
    # the root too: FSDP2 keeps a root's parameters gathered after its forward by default (for the
    # backward a reference never runs), which would hold its embeddings and head whole between KL logs
    fully_shard(model, reshard_after_forward=True)
    return model


def check_distribution(accelerator, train_cfg: Mapping, world: int) -> None:
    """The processes and strategy asked for are the ones accelerate runs (it falls back silently: FSDP
    requested on CPU processes becomes plain data parallel unless ``fsdp_on_cpu`` is on)."""
    if accelerator.num_processes != world:
        raise RuntimeError(
            f"WORLD_SIZE is {world}, but accelerate runs {accelerator.num_processes} processes"
        )
    if strategy(train_cfg) == "fsdp" and accelerator.distributed_type.name != "FSDP":
        raise RuntimeError(
            f"train.distributed.strategy: fsdp, but accelerate runs {accelerator.distributed_type.name}"
        )


def local_elements(model) -> int | None:
    """Elements of ``model`` this rank holds (its shards under FSDP); None without a model."""
    if model is None:
        return None
    return sum(getattr(p, "to_local", lambda p=p: p)().numel() for p in model.parameters())


def rank_records(accelerator, start: dict, end: dict, probe: AutocastProbe, contract=None,
                 reference=None) -> list[dict]:  # fmt: skip
    """What every rank saw (dtypes of its trainable tensors, or shards, at start and end; autocast
    observed in its first forward; its precision contract, checked at its first optimizer step; the
    elements of the KL reference it holds), gathered on all ranks in rank order."""
    from accelerate.utils import gather_object

    mine = {
        "rank": accelerator.process_index,
        "device": str(accelerator.device),
        "dtypes_start": summarize_dtypes(start),
        "dtypes_end": summarize_dtypes(end),
        "autocast_observed": probe.record,
        "precision_contract": None if contract is None else contract.record(),
        "kl_reference_elements": local_elements(reference),
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
