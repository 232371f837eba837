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

Beside them, over the same scored tokens (names as verl's rollout_corr/* where it has one):

| metrics.jsonl key              | what                                                   | verl             |
|--------------------------------|--------------------------------------------------------|------------------|
| sampler_gap_kl_k1              | mean(log p_s - log p_t): KL(sampler ‖ trainer), k1     | kl               |
| sampler_gap_kl_k3              | mean(exp(r) - 1 - r), r = log p_t - log p_s: k3, >= 0  | k3_kl            |
| sampler_gap_log_ppl_abs_diff   | per sequence abs(mean_t log p_s - mean_t log p_t) over | log_ppl_abs_diff |
|                                | its scored tokens, averaged over sequences             |                  |
| sampler_gap_pos_<k>            | mean abs(Δ log p) at completion positions in log2 bin  |                  |
|                                | k: 0, 1, 2-3, 4-7, ..., the last open (POSITION_BINS   |                  |
|                                | bins; ``metrics_log.position_bin_label``)              |                  |
| sampler_gap_growth             | mean abs(Δ) over each completion's second half / over  |                  |
|                                | its first half (the middle token of an odd length in   |                  |
|                                | neither): > 1, the gap grows along the sequence        |                  |

The tokens were drawn from the sampler, so k1 and k3 estimate KL(sampler ‖ trainer); k1 can be
negative on a finite sample, k3 cannot. A completion's length for its halves is its last loss token
+ 1 (TRL right-pads completions, so position = column). Null where nothing was measured (the growth also
where the first half's gap is 0: 0/0 or x/0; a position bin without tokens).

Several processes: token sums and counts are summed, the max maxed, over processes (every process
reaches the same micro-batches, so the gather is collective: one tensor of ``TOTALS_SIZE``).
"""

from __future__ import annotations

import torch

from workflow_scripts.training.metrics_log import GAP_KEYS, GAP_POSITION_BINS

LOG_KEYS = tuple(GAP_KEYS.values())  # the log keys written here, in GAP_KEYS order
POSITION_BINS = GAP_POSITION_BINS
# the totals tensor: sums and counts (summed over micro-batches and processes) and one max (maxed)
SUM_ABS, N_GAP, MAX_ABS, N_TOKENS, N_OUTSIDE, N_CLIPPED = range(6)  # unchanged since the first version
SUM_K1, SUM_K3, SUM_LOG_PPL, N_SEQUENCES, SUM_FIRST, N_FIRST, SUM_LAST, N_LAST = range(6, 14)
BIN_SUMS = slice(14, 14 + POSITION_BINS)  # sum |gap| per position bin
BIN_COUNTS = slice(14 + POSITION_BINS, 14 + 2 * POSITION_BINS)  # scored tokens per position bin
TOTALS_SIZE = 14 + 2 * POSITION_BINS


def position_bins(length: int, device: torch.device | str | None = None) -> torch.Tensor:
    """(length,) long: the position bin of each completion column, t.bit_length() capped at the last bin
    (0 -> 0, 1 -> 1, 2-3 -> 2, 4-7 -> 3, ...)."""
    return torch.tensor(
        [min(t.bit_length(), POSITION_BINS - 1) for t in range(length)], dtype=torch.long, device=device
    )


def gap_totals(
    trainer_logps: torch.Tensor,
    sampler_logps: torch.Tensor | None,
    old_logps: torch.Tensor | None,
    mask: torch.Tensor,
    advantages: torch.Tensor,
    epsilon_low: float,
    epsilon_high: float,
) -> torch.Tensor:
    """(TOTALS_SIZE,) float64 sums over one micro-batch: [sum |gap|, gap tokens, max |gap|, tokens,
    outside, clipped, sum k1, sum k3, sum |log-ppl diff|, sequences, first-half sum |gap|, first-half
    tokens, second-half sum, second-half tokens, sum |gap| per position bin..., tokens per bin...].

    trainer_logps, sampler_logps, old_logps, mask: (B, T); advantages: (B,) or (B, T). ``sampler_logps``
    None: no gap measured (0 gap tokens); NaN entries (tokens vLLM could not score) are left out of every
    gap statistic. ``old_logps`` None: the ratio is 1 (TRL's aligned case). ``max |gap|`` is -inf without
    tokens. Sequences count those with at least one scored token.
    """
    valid = mask.bool()
    trainer = trainer_logps.detach().double()
    totals = torch.zeros(TOTALS_SIZE, dtype=torch.float64, device=trainer.device)
    totals[MAX_ABS] = -torch.inf
    if sampler_logps is not None:
        signed = sampler_logps.detach().double() - trainer  # log p_s - log p_t
        scored = valid & ~torch.isnan(signed)
        if scored.any():
            signed = torch.where(scored, signed, 0.0)
            delta = signed.abs()
            totals[SUM_ABS] = delta.sum()
            totals[N_GAP] = scored.sum()
            totals[MAX_ABS] = delta[scored].max()
            totals[SUM_K1] = signed.sum()
            r = -signed  # log p_t - log p_s
            totals[SUM_K3] = torch.where(scored, torch.expm1(r) - r, 0.0).sum()
            per_seq = scored.sum(dim=1)
            has = per_seq > 0
            totals[SUM_LOG_PPL] = (signed.sum(dim=1)[has] / per_seq[has]).abs().sum()
            totals[N_SEQUENCES] = has.sum()
            column = torch.arange(valid.shape[1], device=valid.device)
            length = torch.where(valid, column + 1, 0).max(dim=1, keepdim=True).values  # last loss token + 1
            twice = 2 * column + 1  # vs length: < first half, > second half, == the middle token
            first, last = scored & (twice < length), scored & (twice > length)
            totals[SUM_FIRST], totals[N_FIRST] = delta[first].sum(), first.sum()
            totals[SUM_LAST], totals[N_LAST] = delta[last].sum(), last.sum()
            bins = position_bins(valid.shape[1], device=trainer.device)
            totals[BIN_SUMS] = totals[BIN_SUMS].index_add(0, bins, delta.sum(dim=0))
            totals[BIN_COUNTS] = totals[BIN_COUNTS].index_add(0, bins, scored.sum(dim=0).double())
    old = trainer if old_logps is None else old_logps.detach().double()
    ratio = torch.exp(trainer - old)  # exactly 1 without old log-probs (TRL's aligned case)
    adv = advantages.detach().double()
    adv = adv.unsqueeze(1) if adv.dim() == 1 else adv
    low, high = ratio < 1 - epsilon_low, ratio > 1 + epsilon_high
    totals[N_TOKENS] = valid.sum()
    totals[N_OUTSIDE] = (valid & (low | high)).sum()
    totals[N_CLIPPED] = (valid & ((low & (adv < 0)) | (high & (adv > 0)))).sum()
    return totals


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def gap_metrics(totals: torch.Tensor) -> dict[str, float | None]:
    """LOG_KEYS -> value from summed totals (``gap_totals``; None where nothing was measured)."""
    t = totals.tolist()
    gap_tokens, tokens = t[N_GAP], t[N_TOKENS]
    first, last = _ratio(t[SUM_FIRST], t[N_FIRST]), _ratio(t[SUM_LAST], t[N_LAST])
    growth = last / first if first and last is not None else None  # 0/0, x/0: undefined
    bins = [_ratio(s, n) for s, n in zip(t[BIN_SUMS], t[BIN_COUNTS], strict=True)]
    values = (
        _ratio(t[SUM_ABS], gap_tokens),
        t[MAX_ABS] if gap_tokens else None,
        _ratio(t[N_OUTSIDE], tokens),
        _ratio(t[N_CLIPPED], tokens),
        _ratio(t[SUM_K1], gap_tokens),
        _ratio(t[SUM_K3], gap_tokens),
        _ratio(t[SUM_LOG_PPL], t[N_SEQUENCES]),
        growth,
        *bins,
    )
    return dict(zip(LOG_KEYS, values, strict=True))


def combine_totals(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Two ``gap_totals`` as one: sums and counts add, the max is the larger."""
    out = a + b
    out[MAX_ABS] = torch.maximum(a[MAX_ABS], b[MAX_ABS])
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
        reduced[MAX_ABS] = gathered[:, MAX_ABS].max()  # -inf + -inf stays -inf: no gap tokens anywhere
        for key, value in gap_metrics(reduced).items():
            if value is not None:
                self._metrics["train"][key].append(value)
