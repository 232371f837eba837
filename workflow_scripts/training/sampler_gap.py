"""The sampler-trainer gap: how far the loss's log-probs are from those the rollouts were drawn with.

Before any optimizer update on a generation round the policy's weights are the ones that sampled it, so
any difference between log p_sampler and log p_trainer is numerical or mode noise, not learning:

| path     | log p_sampler                                   | log p_trainer                            |
|----------|-------------------------------------------------|------------------------------------------|
| HF (CPU) | the old log-probs: eval mode (``sampling_mode``, | the loss forward: train mode, the arm's  |
|          | no dropout), whole generation batch             | dropout, one micro-batch                 |
| vLLM     | vLLM's own log-probs of the sampled tokens      | the loss forward (as above)              |

Measured on CPU (test config's model, 32 steps, 8 rounds): with dropout 0 the gap is exactly 0 in fp32
and in bf16 (the same weights, batch rows computed alike); with dropout 0.1 its mean is ~0.2-0.3 nats
and ~20% of first-step tokens are outside the clip range, in either dtype: on the HF path the gap is the
dropout. With vLLM a kernel and dtype gap adds to it (a GPU measurement).

Measured on the micro-batches of the first optimizer step after each generation round (before any
update on that round), over the completion tokens the loss sees, and logged once per round
(metrics.jsonl, keys: ``metrics_log.GAP_KEYS``): the mean and max |log p_sampler - log p_trainer|, the
share of tokens whose policy ratio exp(log p_trainer - log p_old) is already outside the clip range
[1 - epsilon, 1 + epsilon_high] (``outside_clip``; either sign of the advantage) and the share the loss
clips (``clipped``: below with A < 0, above with A > 0, TRL's clip_ratio/region_mean at that step). On
the HF path p_old is p_sampler; with vLLM it is the trainer's recomputation in eval mode, and TRL's own
vLLM-vs-recomputation difference and importance-sampling ratios are logged beside it
(``metrics_log.VLLM_KEYS``). Without sampler log-probs (HF path, steps_per_generation * num_iterations
<= gradient_accumulation_steps: TRL reuses the loss's own log-probs as old ones, the ratio is exactly 1)
the gap is null and the two shares are 0.

Several processes: token sums and counts are summed, the max maxed, over processes (every process
reaches the same micro-batches, so the gather is collective).
"""

from __future__ import annotations

import torch

from workflow_scripts.training.metrics_log import GAP_KEYS

LOG_KEYS = tuple(GAP_KEYS.values())  # mean, max, outside_clip, clipped: the log keys written here


def gap_totals(
    trainer_logps: torch.Tensor,
    sampler_logps: torch.Tensor | None,
    old_logps: torch.Tensor | None,
    mask: torch.Tensor,
    advantages: torch.Tensor,
    epsilon_low: float,
    epsilon_high: float,
) -> torch.Tensor:
    """(6,) float64 sums over one micro-batch: [sum |gap|, gap tokens, max |gap|, tokens, outside, clipped].

    trainer_logps, sampler_logps, old_logps, mask: (B, T); advantages: (B,) or (B, T). ``sampler_logps``
    None: no gap measured (0 gap tokens); NaN entries (tokens vLLM could not score) are left out of the
    gap. ``old_logps`` None: the ratio is 1 (TRL's aligned case). ``max |gap|`` is -inf without tokens.
    """
    valid = mask.bool()
    trainer = trainer_logps.detach().double()
    totals = torch.zeros(6, dtype=torch.float64, device=trainer.device)
    totals[2] = -torch.inf
    if sampler_logps is not None:
        delta = (sampler_logps.detach().double() - trainer).abs()
        scored = valid & ~torch.isnan(delta)
        if scored.any():
            totals[0] = delta[scored].sum()
            totals[1] = scored.sum()
            totals[2] = delta[scored].max()
    old = trainer if old_logps is None else old_logps.detach().double()
    ratio = torch.exp(trainer - old)  # exactly 1 without old log-probs (TRL's aligned case)
    adv = advantages.detach().double()
    adv = adv.unsqueeze(1) if adv.dim() == 1 else adv
    low, high = ratio < 1 - epsilon_low, ratio > 1 + epsilon_high
    totals[3] = valid.sum()
    totals[4] = (valid & (low | high)).sum()
    totals[5] = (valid & ((low & (adv < 0)) | (high & (adv > 0)))).sum()
    return totals


def gap_metrics(totals: torch.Tensor) -> dict[str, float | None]:
    """LOG_KEYS -> value from summed totals (``gap_totals``; None where nothing was measured)."""
    gap_tokens, tokens = float(totals[1]), float(totals[3])
    mean = float(totals[0]) / gap_tokens if gap_tokens else None
    return dict(
        zip(
            LOG_KEYS,
            (
                mean,
                float(totals[2]) if gap_tokens else None,
                float(totals[4]) / tokens if tokens else None,
                float(totals[5]) / tokens if tokens else None,
            ),
            strict=True,
        )
    )


def combine_totals(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Two ``gap_totals`` as one: sums and counts add, the max is the larger."""
    out = a + b
    out[2] = torch.maximum(a[2], b[2])
    return out


def first_step_of_round(micro_step: int, generate_every: int, accumulation: int) -> bool:
    """Whether micro-batch ``micro_step`` (TRL's ``_step``) belongs to an optimizer step with no update
    since its generation round was sampled: rounds start at multiples of ``generate_every``, updates
    follow every ``accumulation``-th micro-batch."""
    start = (micro_step // generate_every) * generate_every
    return micro_step // accumulation == start // accumulation


class SamplerGapMixin:
    """GRPOTrainer overrides that measure the gap (module docstring); put before GRPOTrainer in the bases.

    ``_compute_loss``: on a first-step micro-batch, keeps the log-probs of the loss forward (the first
    ``_get_per_token_logps_and_entropies`` call inside it) and adds the micro-batch's totals; at the last
    micro-batch of the optimizer step the totals are reduced over processes and logged. Nothing in the
    loss changes (the kept tensor is detached)."""

    _gap_capture: bool = False
    _gap_logps: torch.Tensor | None = None
    _gap_sum: torch.Tensor | None = None

    def _get_per_token_logps_and_entropies(self, *args, **kwargs):
        out = super()._get_per_token_logps_and_entropies(*args, **kwargs)
        if self._gap_capture:
            self._gap_capture = False
            self._gap_logps = out[0].detach()
        return out

    def _compute_loss(self, model, inputs):
        if not self.model.training:
            return super()._compute_loss(model, inputs)
        step = self._step
        accumulation = self.args.gradient_accumulation_steps
        generate_every = self.args.steps_per_generation * self.num_iterations
        measure = first_step_of_round(step, generate_every, accumulation)
        self._gap_capture, self._gap_logps = measure, None
        try:
            loss = super()._compute_loss(model, inputs)
        finally:
            self._gap_capture = False
        if measure and self._gap_logps is not None:
            mask = inputs["completion_mask"]
            if "tool_mask" in inputs:
                mask = mask * inputs["tool_mask"]
            sampler = inputs.get("sampling_per_token_logps", inputs.get("old_per_token_logps"))
            totals = gap_totals(
                self._gap_logps, sampler, inputs.get("old_per_token_logps"), mask, inputs["advantages"],
                self.epsilon_low, self.epsilon_high,
            )  # fmt: skip
            self._gap_sum = totals if self._gap_sum is None else combine_totals(self._gap_sum, totals)
            self._gap_logps = None
        if measure and (step + 1) % accumulation == 0 and self._gap_sum is not None:
            self._log_gap(self._gap_sum)
            self._gap_sum = None
        return loss

    def _log_gap(self, totals: torch.Tensor) -> None:
        gathered = self.accelerator.gather(totals.unsqueeze(0)).view(-1, totals.numel())
        reduced = gathered.sum(dim=0)
        reduced[2] = gathered[:, 2].max()  # -inf + -inf stays -inf: no gap tokens anywhere
        for key, value in gap_metrics(reduced).items():
            if value is not None:
                self._metrics["train"][key].append(value)
