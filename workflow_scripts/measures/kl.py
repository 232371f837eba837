"""KL(pi_theta || pi_0) to the base policy, estimated from samples of pi_theta.

One estimator serves the training-time KL log and the ``kl`` rule. Completions are drawn from
pi_theta at temperature 1 and top_p 1 (the evaluation samples at T=0.7/top_p=0.8 are not draws
from pi_theta), teacher-forced through both models, and log-probabilities summed per sequence:

| estimator | per sequence, with log r = log pi_0(y|x) - log pi_theta(y|x) | property                     |
|-----------|---------------------------------------------------------------|------------------------------|
| k1        | -log r                                                        | unbiased, can be negative    |
| k3        | exp(log r) - 1 - log r                                        | unbiased, >= 0, lower var.   |
| rb        | sum over y's positions t of KL(pi_theta(.|x,y<t) || pi_0(.|x,y<t)) | unbiased, >= 0, |
|           | the full next-token KL (every vocabulary entry)               | var <= k1's (Rao-Blackwell.) |

rb is k1 with each position's sampled token replaced by its expectation under pi_theta (the tower
rule makes the sum's expectation the sequence-level KL: the tests check it exactly by enumeration), so
it needs the whole next-token distribution of both models at each scored position, which the scorer
has anyway (``pair_scores`` runs both on the same batches). k3's lower variance holds near pi_0; at the
default's ~0.3 nats per sequence a rare completion that pi_0 likes far more than pi_theta has a huge k3
(measured: one prompt's mean 31 against a task mean of 0.35), so k3's Monte-Carlo variance is itself
noisy and heavy-tailed there. On the default's 24 trained models rb's Monte-Carlo variance was 1/36 to
1/106 of k3's on mul, chain and word (docs/design.md, "KL: the rb estimator"): the analysis reads rb
(``analysis.kl_estimator``); k1 and k3 stay in kl.json.

Per-prompt means are averaged over prompts. Two uncertainties are reported, for two questions:

| field                | what                                                   | answers                    |
|----------------------|--------------------------------------------------------|----------------------------|
| k1_se, k3_se         | SE across prompts (the prompt is the unit)             | how well the KL over the   |
|                      |                                                        | task's prompts is known    |
| k1_mc_var, k3_mc_var | sum_p s2_p / m_p / P^2, the Monte-Carlo variance of    | how far fresh samples on   |
|                      | the mean GIVEN the prompts (s2_p: unbiased variance of | the same prompts would     |
|                      | the m_p per-sequence values of prompt p; P prompts)    | move the mean              |

The variance analysis needs the second: every run's KL is measured on the same seeded prompts
(``evaluate.measure_kl``), so the between-prompt spread in the SE is a fixed property of the prompt set
shared by all runs, not noise across seeds (as dJ's noise is the within-problem binomial part only,
``passk.eval_noise_variance``). The SE stays the prompt-level uncertainty of the task-level KL (and the
conservative noise bound where no Monte-Carlo variance exists). With one sample per prompt the
within-prompt variance is undefined: the mc vars are None (null in kl.json).

What is estimated: the KL between the two distributions over *generations*, i.e. completions cut at
``max_new_tokens``: a completion that ended with an end token is scored with that token, a truncated
one without any (its probability is that of the prefix). Both are proper distributions over the same
finite set, so the estimate is the exact sequence-level KL of what generation produces (the tests
enumerate that set for a tiny model and compare).

Numerics: each model runs in its own dtype (a bf16 run stays bf16, pi_0 as saved); the logits of the
scored positions are cast to float64 before the log-softmax, and the sums are float64. A prompt's
samples share one forward pass of the prompt (its KV cache copied to them, as in sampling), so a sample
costs its few completion tokens (word problems: 4.4x less scoring, measured in docs/performance.md).
Batches are ordered by length and bounded by memory (``generation.scoring_bytes_per_sequence``). Sampling and
scoring run products of other shapes, so in bf16 the two see slightly different rounding of the same
policy; that is noise of the order of bf16 spacing per token, not a bias of the estimator.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field

import torch

from workflow_scripts.models.generation import (
    bounded_batch_size,
    left_padded,
    memory_budget_bytes,
    sample_completions,
    scoring_bytes_per_sequence,
    supports_logits_to_keep,
)


@dataclass(frozen=True)
class PairScores:
    """Teacher-forced scores of completions under a policy and a reference, float64 per pair.

    ``token_kl``: the sum over the completion's positions t of the full next-token KL
    KL(policy(.|x, y<t) || reference(.|x, y<t)), the Rao-Blackwellized estimator (``rb``) of the
    module docstring."""

    logp_policy: torch.Tensor
    logp_ref: torch.Tensor
    token_kl: torch.Tensor


@torch.inference_mode()
def sequence_logprobs(
    model,
    prompts: list[list[int]],
    completions: list[list[int]],
    pad_id: int,
    batch_size: int = 64,
    *,
    memory_budget_gb: float | None = None,
    share_prefill: bool = True,
) -> torch.Tensor:
    """Sum of log pi(completion | prompt) per pair, teacher-forced in batched forward passes (float64).

    Left padding with explicit position ids; an empty completion scores 0 (log 1). ``share_prefill``:
    pairs with the same prompt (a prompt's samples) run the prompt once and its KV cache is copied to
    them, so a sample costs its completion tokens only (``_shared_prefill_logits``); False = every pair
    one full forward pass. The two agree to float rounding (the products have other shapes).
    """
    logps, _ = _score([model], prompts, completions, pad_id, batch_size, memory_budget_gb, share_prefill)
    return logps[0]


@torch.inference_mode()
def pair_scores(
    policy,
    reference,
    prompts: list[list[int]],
    completions: list[list[int]],
    pad_id: int,
    batch_size: int = 64,
    *,
    memory_budget_gb: float | None = None,
    share_prefill: bool = True,
) -> PairScores:
    """``sequence_logprobs`` under both models on the same batches, and the per-position full KL
    between their next-token distributions summed over each completion (both in float64)."""
    logps, token_kl = _score([policy, reference], prompts, completions, pad_id, batch_size,
                             memory_budget_gb, share_prefill)  # fmt: skip
    return PairScores(logps[0], logps[1], token_kl)


def _score(models, prompts, completions, pad_id, batch_size, memory_budget_gb, share_prefill):
    """(per-model sequence log-probs, token KL of models[0] against models[1] or None), each pair scored
    in batches that every model runs (one memory bound for all of their logits)."""
    for model in models:
        model.eval()
    device = next(models[0].parameters()).device
    budget = memory_budget_bytes(device, memory_budget_gb) // len(models)
    logps = [torch.zeros(len(prompts), dtype=torch.float64) for _ in models]
    token_kl = torch.zeros(len(prompts), dtype=torch.float64) if len(models) == 2 else None
    repeated = len({tuple(p) for p in prompts}) < len(prompts)
    shared = share_prefill and repeated and min(map(len, prompts), default=0) > 0
    batches = _shared_prefill_logits if shared else _one_pass_logits
    for rows, per_model, targets, in_completion in batches(models, prompts, completions, pad_id, batch_size,
                                                           budget):  # fmt: skip
        index = torch.tensor(rows)
        logsm = [torch.log_softmax(logits.double(), dim=-1) for logits in per_model]
        for out, lsm in zip(logps, logsm, strict=True):
            out[index] = (lsm.gather(-1, targets[..., None]).squeeze(-1) * in_completion).sum(-1).cpu()
        if token_kl is not None:
            p = logsm[0].exp()  # a token the policy rules out (p = 0) adds 0, not 0 * inf = NaN
            per_position = torch.where(p > 0, p * (logsm[0] - logsm[1]), 0.0).sum(-1)
            token_kl[index] = (per_position * in_completion).sum(-1).cpu()
    return logps, token_kl


def _one_pass_logits(models, prompts, completions, pad_id, batch_size, budget):
    """Batches of whole (prompt + completion) sequences, longest first: (pair rows, each model's logits
    of the completion positions, targets, mask), completions right-aligned."""
    device = next(models[0].parameters()).device
    order = sorted(range(len(prompts)), key=lambda j: -(len(prompts[j]) + len(completions[j])))
    order = [j for j in order if completions[j]]
    keep = [supports_logits_to_keep(model) for model in models]
    start = 0
    while start < len(order):
        head = order[start]
        width = len(prompts[head]) + len(completions[head])
        scored = max(len(completions[j]) for j in order[start : start + batch_size])
        size = bounded_batch_size(batch_size, scoring_bytes_per_sequence(models[0], width, scored), budget)
        chunk = order[start : start + size]
        start += size
        scored = max(len(completions[j]) for j in chunk)
        seqs = [list(prompts[j]) + list(completions[j]) for j in chunk]
        ids, mask = left_padded(seqs, width, pad_id, device)
        position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
        per_model = []
        for model, keep_logits in zip(models, keep, strict=True):
            kwargs = {"logits_to_keep": scored + 1} if keep_logits else {}
            logits = model(input_ids=ids, attention_mask=mask, position_ids=position_ids, **kwargs).logits
            # Positions width-scored-1 .. width-2 predict the last `scored` tokens.
            per_model.append(logits[:, -(scored + 1) : -1])
        lengths = torch.tensor([len(completions[j]) for j in chunk], device=device)
        in_completion = torch.arange(scored, device=device)[None, :] >= (scored - lengths)[:, None]
        yield chunk, per_model, ids[:, -scored:], in_completion


def _shared_prefill_logits(models, prompts, completions, pad_id, batch_size, budget):
    """``_one_pass_logits`` for pairs that share prompts: each distinct prompt is run once (left
    padded, KV cache kept, the logits of its last position score the first completion token), its cache
    is copied to its pairs (``DynamicCache.batch_select_indices``) and the completions, right padded,
    run on top of it. A batch holds whole prompts, up to ``batch_size`` pairs within the memory bound."""
    from transformers import DynamicCache

    device = next(models[0].parameters()).device
    keep = [{"logits_to_keep": 1} if supports_logits_to_keep(model) else {} for model in models]
    pairs_of: dict[tuple[int, ...], list[int]] = {}
    for j, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        if c:
            pairs_of.setdefault(tuple(p), []).append(j)
    keys = sorted(pairs_of, key=len, reverse=True)  # longest prompt first: the tightest memory bound first
    start = 0
    while start < len(keys):
        width = len(keys[start])
        scored = max(len(completions[j]) for k in keys[start : start + batch_size] for j in pairs_of[k])
        per_pair = scoring_bytes_per_sequence(models[0], width + scored, scored)
        bound = bounded_batch_size(batch_size, per_pair, budget)
        chunk, rows = [keys[start]], len(pairs_of[keys[start]])
        while start + len(chunk) < len(keys) and rows + len(pairs_of[keys[start + len(chunk)]]) <= bound:
            rows += len(pairs_of[keys[start + len(chunk)]])
            chunk.append(keys[start + len(chunk)])
        start += len(chunk)
        ids, mask = left_padded([list(key) for key in chunk], width, pad_id, device)
        pair_rows = [j for key in chunk for j in pairs_of[key]]
        prompt_row = [row for row, key in enumerate(chunk) for _ in pairs_of[key]]
        prompt_row = torch.tensor(prompt_row, device=device)
        longest = max(len(completions[j]) for j in pair_rows)
        targets = torch.full((len(pair_rows), longest), pad_id, dtype=torch.long)
        for row, j in enumerate(pair_rows):
            targets[row, : len(completions[j])] = torch.tensor(completions[j], dtype=torch.long)
        targets = targets.to(device)
        lengths = torch.tensor([len(completions[j]) for j in pair_rows], device=device)
        in_completion = torch.arange(longest, device=device)[None, :] < lengths[:, None]
        full_mask = torch.cat([mask[prompt_row], in_completion[:, :-1].long()], dim=1)
        positions = mask.sum(-1)[prompt_row][:, None] + torch.arange(longest - 1, device=device)[None, :]
        per_model = []
        for model, keep_logits in zip(models, keep, strict=True):
            cache = DynamicCache(config=model.config)
            first = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
                          cache=cache, use_cache=True, **keep_logits).logits[:, -1]  # fmt: skip
            logits = first[prompt_row][:, None]
            if longest > 1:  # completion token t (t >= 1) is scored by the logits after token t - 1
                cache.batch_select_indices(prompt_row)
                rest = model(input_ids=targets[:, :-1], attention_mask=full_mask, position_ids=positions,
                             cache=cache, use_cache=True).logits  # fmt: skip
                logits = torch.cat([logits, rest], dim=1)
            per_model.append(logits)
        yield pair_rows, per_model, targets, in_completion


@dataclass(frozen=True)
class KLEstimate:
    k1_mean: float
    k1_se: float
    k3_mean: float
    k3_se: float
    n_prompts: int
    n_samples: int
    per_prompt_k1: list[float]
    per_prompt_k3: list[float]
    mean_length: float | None = None  # generated tokens per sample (end token included)
    truncated_frac: float | None = None  # samples that hit max_new_tokens
    sample_seconds: float | None = None
    score_seconds: float | None = None  # teacher-forcing through both models
    per_sequence_k1: list[float] = field(default_factory=list, repr=False)
    k1_mc_var: float | None = None  # Monte-Carlo variance of k1_mean given the prompts; None: 1 sample
    k3_mc_var: float | None = None
    rb_mean: float | None = None  # the Rao-Blackwellized estimator; None: scored without the full KL
    rb_se: float | None = None
    rb_mc_var: float | None = None
    per_prompt_rb: list[float] = field(default_factory=list)

    def as_dict(self) -> dict:
        out = self.__dict__.copy()
        out.pop("per_sequence_k1")
        return out


def kl_from_logprobs(
    logp_policy: torch.Tensor,
    logp_ref: torch.Tensor,
    prompt_index: list[int],
    token_kl: torch.Tensor | None = None,
) -> KLEstimate:
    """k1/k3 (and rb, given ``token_kl``) per sequence -> per-prompt means -> mean and SE across prompts
    (prompts in index order), and the Monte-Carlo variance of each mean given the prompts (None if a
    prompt has < 2 samples)."""
    log_r = (logp_ref - logp_policy).double()
    per_sequence = {"k1": -log_r, "k3": torch.expm1(log_r) - log_r}
    if token_kl is not None:
        per_sequence["rb"] = token_kl.double()
    index = torch.tensor(prompt_index)
    prompts = torch.unique(index)
    groups = {name: [x[index == p] for p in prompts] for name, x in per_sequence.items()}

    def summary(name: str) -> dict:
        per_prompt = torch.stack([g.mean() for g in groups[name]])
        n = len(per_prompt)
        se = float(per_prompt.std(unbiased=True) / math.sqrt(n)) if n > 1 else float("nan")
        few = not groups[name] or min(len(g) for g in groups[name]) < 2
        mc = None if few else float(sum(g.var(unbiased=True) / len(g) for g in groups[name]) / n**2)
        return {f"{name}_mean": float(per_prompt.mean()), f"{name}_se": se, f"{name}_mc_var": mc,
                f"per_prompt_{name}": per_prompt.tolist()}  # fmt: skip

    fields = {key: value for name in per_sequence for key, value in summary(name).items()}
    return KLEstimate(
        n_prompts=len(prompts),
        n_samples=len(prompt_index) // max(1, len(prompts)),
        per_sequence_k1=per_sequence["k1"].tolist(),
        **fields,
    )


def estimate_kl(
    policy,
    reference,
    tokenizer,
    prompts: list[str],
    n_samples: int = 4,
    max_new_tokens: int = 8,
    batch_size: int = 256,
    seed: int = 0,
    *,
    memory_budget_gb: float | None = None,
) -> KLEstimate:
    """Sample from ``policy`` at T=1, top_p=1 and estimate KL(policy || reference) per sequence."""
    if policy is reference:
        raise ValueError("policy and reference must be separate model objects (pass a copy)")
    t0 = time.perf_counter()
    completions = sample_completions(
        policy,
        tokenizer,
        prompts,
        n_samples=n_samples,
        temperature=1.0,
        top_p=1.0,
        max_new_tokens=max_new_tokens,
        batch_size=batch_size,
        seed=seed,
        memory_budget_gb=memory_budget_gb,
    )
    t1 = time.perf_counter()
    prompt_ids = tokenizer(list(prompts), add_special_tokens=False)["input_ids"]
    p_list = [prompt_ids[c.prompt_index] for c in completions]
    c_list = [list(c.token_ids) + ([] if c.stop_token_id is None else [c.stop_token_id]) for c in completions]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    budget = {"memory_budget_gb": memory_budget_gb}
    scores = pair_scores(policy, reference, p_list, c_list, pad, batch_size, **budget)
    t2 = time.perf_counter()
    est = kl_from_logprobs(scores.logp_policy, scores.logp_ref, [c.prompt_index for c in completions],
                           scores.token_kl)  # fmt: skip
    n = max(1, len(completions))
    return dataclasses.replace(
        est,
        mean_length=sum(c.num_tokens for c in completions) / n,
        truncated_frac=sum(c.truncated for c in completions) / n,
        sample_seconds=t1 - t0,
        score_seconds=t2 - t1,
    )
