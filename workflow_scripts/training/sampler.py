"""The arm's rollout sampler: which engine samples, in which numerics, and whether TRL corrects the gap.

Every GPU user samples with vLLM while TRL trains, so the gap between the sampler's and the trainer's
numerics is part of what an arm is. Two keys of a ``precisions`` entry make it a factor of the
experiment, applied here and nowhere else:

| key                   | null                                   | set                                      |
|-----------------------|----------------------------------------|------------------------------------------|
| sampler_dtype         | the sampler computes as the trainer:   | the sampler holds its own weights in that |
|                       | HF: the trained model itself (eval     | dtype, re-cast from the masters before    |
|                       | mode); vLLM: the engine in the arm's   | every round: HF: a copy of the policy     |
|                       | compute dtype (autocast, else masters) | (``OwnSampler``); vLLM: the engine dtype  |
| importance_correction | ``train.importance_sampling`` decides  | off, or one of TRL's modes (token_truncate|
|                       |                                        | = TIS, token_mask, sequence_*)            |

``arm_train_config`` folds both into the run's train section (``use_vllm``, ``importance_sampling``),
so GRPOConfig, the held-out curves and the contract see one answer; ``plan`` is run.json's ``sampler``:
{backend, dtype (what rollouts compute in), trainer_dtype, copies, correction, reason}.

vLLM's CPU build has no float16 kernels: an arm that samples in float16 with ``train.use_vllm`` on a CPU
samples with the HF sampler (a float16 copy), and ``reason`` says so.

TRL applies its importance-sampling correction only under ``use_vllm`` (the ratio p_trainer / p_vllm, in
``_generate_and_score_completions`` and again in the loss). An HF copy has its own log-probs just as
vLLM does, so ``OwnSamplerMixin`` sets ``use_vllm`` for the duration of those two calls only, and TRL's
own code computes, logs (``sampling/importance_sampling_ratio/*``) and applies the ratio; generation is
routed to the copy (``_generate_single_turn``). Outside those calls ``use_vllm`` stays False (the
held-out curves, run.json and the contract read it).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator, Mapping

import torch

from workflow_scripts.training.precision import PrecisionError, PrecisionMode

CORRECTION_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
NO_VLLM_DTYPES_ON_CPU = ("float16",)  # vLLM's CPU build: float32 and bfloat16 only


def plan(mode: PrecisionMode, train_cfg: Mapping, device: str, sharded: bool = False) -> dict:
    """run.json's ``sampler``: which engine samples the arm's rollouts, in which dtype, and why."""
    dtype = mode.sampler_compute_dtype
    backend, reason = ("vllm" if train_cfg["use_vllm"] else "hf"), None
    if backend == "vllm" and device == "cpu" and dtype in NO_VLLM_DTYPES_ON_CPU:
        backend = "hf"
        reason = f"vLLM's CPU build has no {dtype} kernels: sampled with the HF sampler (a {dtype} copy)"
    copies = backend == "hf" and mode.sampler_copies
    if copies and sharded:
        raise PrecisionError(
            f"precision {mode.name!r}: sampler_dtype {mode.sampler_dtype} with the HF sampler under FSDP "
            "is not supported (the copy would hold whole weights on every rank); use train.use_vllm"
        )
    given = train_cfg["importance_sampling"]
    correction = mode.importance_correction or (given["mode"] if given["correction"] else "off")
    own_logps = backend == "vllm" or copies
    return {
        "backend": backend,
        "dtype": dtype,
        "trainer_dtype": mode.compute_dtype,
        "copies": copies,
        "correction": correction,
        "correction_acts": correction != "off" and own_logps,
        "reason": reason,
    }


def arm_train_config(train_cfg: Mapping, mode: PrecisionMode, sampler: Mapping) -> dict:
    """The run's train section with the arm's sampler applied: ``use_vllm`` as the plan samples and
    ``importance_sampling`` with the arm's correction (its clip bounds stay the train section's)."""
    out = dict(train_cfg)
    out["use_vllm"] = sampler["backend"] == "vllm"
    given = dict(train_cfg["importance_sampling"])
    if sampler["correction"] == "off":
        given["correction"] = False
    else:
        given.update(correction=True, mode=sampler["correction"])
    out["importance_sampling"] = given
    return out


class OwnSampler:
    """The HF sampler's own copy of the policy in ``dtype``: re-cast from the trained weights before a
    round (``sync``), sampled from (``model``), and scored (``logps``) in its own numerics, eval mode."""

    def __init__(self, policy: torch.nn.Module, dtype: torch.dtype) -> None:
        self.dtype = dtype
        self.model = copy.deepcopy(policy).to(dtype).eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.synced_step: int | None = None

    def attach(self, temperature: float, cast_lm_head_to_fp32: bool, device) -> None:
        """TRL's chunked log-prob head on the copy (the trainer's log-probs take the same path)."""
        from trl.trainer.utils import add_fused_lm_head

        self.model.to(device)
        add_fused_lm_head(self.model, temperature=temperature, cast_lm_head_to_fp32=cast_lm_head_to_fp32)

    @torch.no_grad()
    def sync(self, trained: torch.nn.Module, step: int) -> None:
        """Every weight re-cast from the trained model (round to nearest), once per optimizer step."""
        if self.synced_step == step:
            return
        source = dict(trained.named_parameters())
        for name, p in self.model.named_parameters():
            p.copy_(source[name])
        self.synced_step = step

    @torch.no_grad()
    def logps(self, prompt_ids: list[list[int]], completion_ids: list[list[int]], pad_id: int) -> list[list]:
        """Per completion token, log p under the copy (the sampled distribution: logits / temperature,
        as TRL scores its own and vLLM's tokens), one list per completion."""
        prompts = [torch.tensor(p) for p in prompt_ids]
        width = max(len(p) for p in prompts)
        longest = max((len(c) for c in completion_ids), default=0)
        if longest == 0:
            return [[] for _ in completion_ids]
        device = next(self.model.parameters()).device
        ids = torch.full((len(prompts), width + longest), pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, (p, c) in enumerate(zip(prompts, completion_ids, strict=True)):
            ids[i, width - len(p) : width] = p  # prompts left-padded, completions right-padded (TRL)
            ids[i, width : width + len(c)] = torch.tensor(c, dtype=torch.long)
            mask[i, width - len(p) : width + len(c)] = 1
        ids, mask = ids.to(device), mask.to(device)
        labels = ids.masked_fill(mask == 0, -100)
        labels[:, :width] = -100
        with torch.autocast(device.type, enabled=False):
            out = self.model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
        logps = out.log_probs[:, -longest:].float().cpu()
        return [logps[i, : len(c)].tolist() for i, c in enumerate(completion_ids)]


class OwnSamplerMixin:
    """GRPOTrainer overrides that sample with ``self.own_sampler`` (an ``OwnSampler``; None: TRL's path)
    and let TRL's vLLM importance-sampling code act on its log-probs (module docstring)."""

    own_sampler: OwnSampler | None = None

    @contextlib.contextmanager
    def _sampler_corrects(self) -> Iterator[None]:
        acts = self.own_sampler is not None and self.vllm_importance_sampling_correction
        before = self.use_vllm
        self.use_vllm = before or acts
        try:
            yield
        finally:
            self.use_vllm = before

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, *args, **kwargs):
        sampler = self.own_sampler
        if sampler is None:
            return super()._generate_single_turn(prompt_ids, images, multimodal_fields, num_generations,
                                                 *args, **kwargs)  # fmt: skip
        if images is not None or multimodal_fields:
            raise NotImplementedError("the HF sampler copy (sampler_dtype) samples text prompts only")
        sampler.sync(self.accelerator.unwrap_model(self.model), int(self.state.global_step))
        wrapped, use_vllm = self.model_wrapped, self.use_vllm
        self.model_wrapped, self.use_vllm = sampler.model, False
        try:
            completion_ids, _ = super()._generate_single_turn(prompt_ids, images, multimodal_fields,
                                                              num_generations, *args, **kwargs)  # fmt: skip
        finally:
            self.model_wrapped, self.use_vllm = wrapped, use_vllm
        return completion_ids, sampler.logps(prompt_ids, completion_ids, self._tokenizer.pad_token_id)

    def _generate_and_score_completions(self, inputs):
        with self._sampler_corrects():
            return super()._generate_and_score_completions(inputs)

    def _compute_loss(self, model, inputs):
        with self._sampler_corrects():
            return super()._compute_loss(model, inputs)


def own_sampler_dtypes(trainer) -> dict | None:
    """{rollout_dtype} the HF copy computed in (observed by its probe), or None without a copy."""
    sampler = getattr(trainer, "own_sampler", None)
    probe = getattr(trainer, "own_sampler_probe", None)
    if sampler is None:
        return None
    seen = (getattr(probe, "sampling", None) or {}) if probe is not None else {}
    return {"rollout_dtype": seen.get("layer_output_dtype")}
