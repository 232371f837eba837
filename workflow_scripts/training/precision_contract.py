"""An arm's precision contract: every dtype its config implies, observed in the run and checked.

``expected_contract`` derives the contract from the precision mode (and the run's layout: processes,
FSDP, vLLM); ``ContractCheck`` observes the same fields inside the run and raises ``PrecisionError``
naming the arm and each field that differs. It checks at the first optimizer step, the earliest point
where every field exists: parameters, gradients, autocast (observed in the first training forward),
the rollout dtype (the first sampling forward, or the vLLM engine) and the bf16 product path are read
just before that step updates anything; the AdamW states (created by that step) right after it, before
any second step. run.json keeps ``expected`` and ``observed``.

| field                  | expected                               | observed from                          |
|------------------------|----------------------------------------|----------------------------------------|
| params_body, _lm_head  | param_dtype; lm_head_dtype (or param)  | the trainable parameters' dtypes       |
| grads_body, _lm_head   | as the parameters                      | ``p.grad`` before the first step       |
| optimizer_state_body,  | as the parameters (no fp32 copies)     | AdamW's exp_avg/exp_avg_sq after it    |
| optimizer_state_lm_head|                                        |                                        |
| autocast               | the mode's autocast dtype or null      | ``AutocastProbe`` (first train forward)|
| rollout_dtype          | sampler_dtype, else autocast dtype,    | vLLM engine dtype, else the HF copy's  |
|                        | else param_dtype                       | (``sampler``), else the dtype the      |
|                        |                                        | policy computed in while sampling      |
| bf16_matmul            | ``precision.matmul_path``              | the torch-function mode active         |
| grad_reduce_dtype      | null in one process; else the          | FSDP2 policy reduce_dtype (null: the   |
|                        | gradients' dtype (nothing casts them)  | gradients'), DDP: the gradients' dtype |
| kv_cache_dtype         | the rollout dtype with vLLM, else null | the dtype of the KV-cache tensors the  |
|                        |                                        | engine's attention layers hold         |
| engine_attention_dtype | the rollout dtype with vLLM, else null | the engine's attention layers' dtype   |
| engine_matmul_precision| "ieee" with vLLM (TF32 off in every    | the engine process's fp32 product modes|
|                        | arm), else null                        | (torch, cuBLAS, oneDNN, Triton tl.dot) |
| engine_deterministic   | with vLLM: the arm's ``deterministic``;| torch's deterministic algorithms as the|
|                        | else null                              | engine's worker sees them              |
| engine_batch_invariant | false with vLLM, else null             | VLLM_BATCH_INVARIANT as vLLM reads it  |
| sampler_lm_head_dtype  | with vLLM: sampler_dtype, autocast or  | the engine's LM-head weight            |
|                        | the head's (lm_head_dtype); else null  |                                        |

The engine's fields come from its worker's objects (``vllm_engine.engine_record``), not its config: an
fp32 engine whose attention ran TF32 products, or whose KV cache held bf16, is refused however it was
configured (module docstring of ``vllm_engine``: why these, and the determinism decision).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from transformers import TrainerCallback

from workflow_scripts.models.dtypes import dtype_name
from workflow_scripts.training.bf16_matmul import EmulatedBF16
from workflow_scripts.training.precision import PrecisionError, PrecisionMode, head_param_names, matmul_path
from workflow_scripts.training.sampler import own_sampler_dtypes

GROUPS = ("body", "lm_head")

ENGINE_FIELDS = {
    "kv_cache_dtype": "kv_cache_dtype",
    "engine_attention_dtype": "attention_dtype",
    "engine_matmul_precision": "matmul_precision",
    "engine_deterministic": "deterministic_algorithms",
    "engine_batch_invariant": "batch_invariant",
    "sampler_lm_head_dtype": "lm_head_dtype",
}
"""Contract field -> the ``vllm_engine.engine_record`` key it is observed from."""


def expected_contract(mode: PrecisionMode, *, device: str, world: int, use_vllm: bool) -> dict:
    """The dtypes the arm's config implies (see the module table)."""
    rollout = mode.sampler_compute_dtype
    heads = {"body": mode.param_dtype, "lm_head": mode.head_dtype}
    contract: dict = {}
    for kind in ("params", "grads", "optimizer_state"):
        for group in GROUPS:
            contract[f"{kind}_{group}"] = heads[group]
    contract.update(
        autocast=mode.autocast,
        rollout_dtype=rollout,
        bf16_matmul=matmul_path(mode, device),
        grad_reduce_dtype=None if world == 1 else mode.param_dtype,
        kv_cache_dtype=rollout if use_vllm else None,
        engine_attention_dtype=rollout if use_vllm else None,
        engine_matmul_precision="ieee" if use_vllm else None,
        engine_deterministic=bool(mode.deterministic) if use_vllm else None,
        engine_batch_invariant=False if use_vllm else None,
        sampler_lm_head_dtype=(mode.sampler_dtype or mode.autocast or mode.head_dtype) if use_vllm else None,
    )
    return contract


def _one(dtypes: set[str]) -> str | None:
    """A group's dtype: the one seen, None for none, 'a+b' when mixed (never equal to an expectation)."""
    return "+".join(sorted(dtypes)) if dtypes else None


def _grouped(model, tensor_of: Callable) -> dict[str, str | None]:
    heads = head_param_names(model)
    seen: dict[str, set[str]] = {g: set() for g in GROUPS}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        for t in tensor_of(p):
            seen["lm_head" if name in heads else "body"].add(dtype_name(t.dtype))
    return {g: _one(d) for g, d in seen.items()}


def _matmul_active() -> str:
    from torch.overrides import _get_current_function_mode_stack

    return (
        "emulated"
        if any(isinstance(m, EmulatedBF16) for m in _get_current_function_mode_stack())
        else "native"
    )


def differences(expected: Mapping, observed: Mapping) -> list[str]:
    """'field: expected X, observed Y' for each field observed that differs."""
    return [
        f"{key}: expected {expected[key]}, observed {observed[key]}"
        for key in expected
        if key in observed and observed[key] != expected[key]
    ]


class ContractCheck(TrainerCallback):
    """Observes the contract at the first optimizer step and raises on a difference (module docstring).

    ``engine``: returns ``engine_fields`` of a vLLM engine ({rollout_dtype} of the HF sampler's own copy),
    or None on the HF path (then the rollout dtype is the probe's sampling record); ``reduce_dtype``:
    returns the gradient-reduction dtype the distributed wrapper uses (None in one process)."""

    def __init__(
        self,
        mode: PrecisionMode,
        expected: Mapping,
        model: torch.nn.Module,
        probe,
        engine: Callable[[], Mapping | None] = lambda: None,
        reduce_dtype: Callable[[str | None], str | None] = lambda grads: None,
    ) -> None:
        self.mode, self.expected, self.model, self.probe = mode, dict(expected), model, probe
        self.engine, self.reduce_dtype = engine, reduce_dtype
        self.observed: dict = {}
        self.checked = False
        self._handles: list = []

    def on_train_begin(self, args, state, control, optimizer=None, **kwargs):
        if self.checked or optimizer is None or self._handles:
            return
        inner = getattr(optimizer, "optimizer", optimizer)  # accelerate's AcceleratedOptimizer wraps it
        self._handles = [
            inner.register_step_pre_hook(self._before),
            inner.register_step_post_hook(self._after),
        ]

    def _raise_on(self, fields: Mapping) -> None:
        self.observed.update(fields)
        wrong = differences(self.expected, fields)
        if wrong:
            raise PrecisionError(f"precision {self.mode.name!r}: contract violated: " + "; ".join(wrong))

    def _before(self, optimizer, args, kwargs) -> None:
        if "params_body" in self.observed:
            return
        params = _grouped(self.model, lambda p: [p])
        grads = _grouped(self.model, lambda p: [] if p.grad is None else [p.grad])
        autocast = (self.probe.record or {}) if self.probe is not None else {}
        sampling = (getattr(self.probe, "sampling", None) or {}) if self.probe is not None else {}
        engine = self.engine()
        fields = {f"params_{g}": params[g] for g in GROUPS} | {f"grads_{g}": grads[g] for g in GROUPS}
        fields.update(
            autocast=autocast.get("dtype") if autocast.get("enabled") else None,
            rollout_dtype=(engine or {}).get("rollout_dtype", sampling.get("layer_output_dtype")),
            bf16_matmul=_matmul_active(),
            grad_reduce_dtype=self.reduce_dtype(grads["body"]),
            **{key: (engine or {}).get(key) for key in ENGINE_FIELDS},
        )
        self._raise_on(fields)

    def _after(self, optimizer, args, kwargs) -> None:
        states = {}
        for p, state in optimizer.state.items():
            states[id(p)] = [
                t for k, t in state.items() if k != "step" and torch.is_tensor(t) and t.dim() > 0
            ]
        grouped = _grouped(self.model, lambda p: states.get(id(p), []))
        for handle in self._handles:
            handle.remove()
        self.checked = True
        self._raise_on({f"optimizer_state_{g}": grouped[g] for g in GROUPS})

    def record(self) -> dict:
        """run.json's ``precision_contract``."""
        return {"expected": self.expected, "observed": self.observed, "checked": self.checked,
                "checked_at": "first optimizer step"}  # fmt: skip


def engine_fields(record: Mapping) -> dict:
    """The contract's observed engine fields (rollout_dtype and ``ENGINE_FIELDS``) from an engine record."""
    observed = {field: record[key] for field, key in ENGINE_FIELDS.items()}
    return {"rollout_dtype": record["model_dtype"], **observed}


def vllm_engine_dtypes(trainer) -> dict | None:
    """``engine_fields`` of the trainer's colocated vLLM engine, read from the engine itself
    (``vllm_engine.engine_record``); None: no vLLM."""
    generation = getattr(trainer, "vllm_generation", None) if getattr(trainer, "use_vllm", False) else None
    llm = getattr(generation, "llm", None)
    if generation is None or llm is None:
        return None
    from workflow_scripts.models.vllm_engine import engine_record

    return engine_fields(engine_record(llm))


def reduce_dtype_of(accelerator, world: int) -> Callable[[str | None], str | None]:
    """How the run reduces gradients across processes: FSDP2's policy reduce_dtype (None = the gradients'
    own), DDP's buckets (the gradients' dtype); None in one process."""

    def observe(grads: str | None) -> str | None:
        if world == 1:
            return None
        plugin = getattr(getattr(accelerator, "state", None), "fsdp_plugin", None)
        policy = getattr(plugin, "mixed_precision_policy", None) if plugin is not None else None
        reduce = getattr(policy, "reduce_dtype", None)
        return dtype_name(reduce) if reduce is not None else grads

    return observe


def contract_check(trainer, mode: PrecisionMode, probe, *, device: str, world: int) -> ContractCheck:
    """The arm's ContractCheck for a built trainer, added to its callbacks (train stage)."""
    use_vllm = bool(getattr(trainer.args, "use_vllm", False))
    expected = expected_contract(mode, device=device, world=world, use_vllm=use_vllm)

    def engine() -> dict | None:  # the vLLM engine, else the HF sampler's own copy, else None
        return vllm_engine_dtypes(trainer) or own_sampler_dtypes(trainer)

    check = ContractCheck(mode, expected, trainer.model, probe, engine=engine,
                          reduce_dtype=reduce_dtype_of(trainer.accelerator, world))  # fmt: skip
    trainer.add_callback(check)
    return check
