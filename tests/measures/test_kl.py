"""The KL estimator against the exact sequence-level KL of a model small enough to enumerate."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from scipy import stats as st
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from workflow_scripts.measures.kl import estimate_kl, kl_from_logprobs, pair_scores, sequence_logprobs

torch.set_num_threads(1)

VOCAB = {"<pad>": 0, "<unk>": 1, "</s>": 2, "a": 3, "b": 4}
EOS = VOCAB["</s>"]
MAX_NEW = 3  # 1 + 4 + 16 eos-terminated completions and 64 truncated ones per prompt


@pytest.fixture(scope="module")
def tok():
    core = Tokenizer(models.WordLevel(VOCAB, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"(?m)."), behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=core, padding_side="left", pad_token="<pad>",
                                   eos_token="</s>", unk_token="<unk>")  # fmt: skip


def _model(seed: int, scale: float = 10.0) -> LlamaForCausalLM:
    """A 5-token Llama; ``scale`` sharpens its next-token distributions (KL between seeds ~0.6 at 10)."""
    cfg = LlamaConfig(vocab_size=len(VOCAB), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=2, intermediate_size=32, max_position_embeddings=32, pad_token_id=0,
                      eos_token_id=EOS, bos_token_id=None, tie_word_embeddings=False)  # fmt: skip
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)
    return model


@torch.no_grad()
def _next_logprobs(model, ids: list[int]) -> list[float]:
    """log pi(. | ids) from one unpadded forward pass (independent of the batched scorer)."""
    return torch.log_softmax(model(torch.tensor([ids])).logits[0, -1].double(), -1).tolist()


def exact_kl(policy, reference, prompt_ids: list[int], max_new: int) -> tuple[float, float]:
    """(KL(policy || reference) over every generation of at most ``max_new`` tokens, total probability).

    A generation ends at the end token (scored with it) or after ``max_new`` tokens (scored without).
    """
    kl = mass = 0.0

    def walk(prefix: list[int], lp: float, lq: float) -> None:
        nonlocal kl, mass
        if len(prefix) == max_new:
            kl += math.exp(lp) * (lp - lq)
            mass += math.exp(lp)
            return
        a, b = _next_logprobs(policy, prompt_ids + prefix), _next_logprobs(reference, prompt_ids + prefix)
        for token in range(len(VOCAB)):
            if token == EOS:
                kl += math.exp(lp + a[token]) * (lp + a[token] - lq - b[token])
                mass += math.exp(lp + a[token])
            else:
                walk([*prefix, token], lp + a[token], lq + b[token])

    walk([], 0.0, 0.0)
    return kl, mass


def test_estimate_matches_exact_kl_within_its_standard_error(tok):
    policy, reference = _model(0), _model(1)
    prompts = ["ab", "ba"]
    exact = []
    for p in prompts:
        kl, mass = exact_kl(policy, reference, tok(p, add_special_tokens=False)["input_ids"], MAX_NEW)
        assert mass == pytest.approx(1.0, abs=1e-9)
        exact.append(kl)
    target = sum(exact) / len(exact)  # the estimator weights prompts equally
    est = estimate_kl(policy, reference, tok, prompts * 200, n_samples=4, max_new_tokens=MAX_NEW, seed=0)
    assert est.n_prompts == 400 and est.n_samples == 4
    assert 0.1 < est.truncated_frac < 0.9 and est.mean_length < MAX_NEW  # both kinds of ending occur
    for mean, se in ((est.k1_mean, est.k1_se), (est.k3_mean, est.k3_se), (est.rb_mean, est.rb_se)):
        assert abs(mean - target) < 4 * se, (mean, se, target)
        # The test has power: an estimator off by a factor of 2 (either way) would fail it.
        assert abs(mean - 2 * target) > 4 * se and abs(mean - target / 2) > 4 * se


def test_base_vs_base_is_exactly_zero(tok):
    policy = _model(0)
    reference = copy.deepcopy(policy)
    est = estimate_kl(policy, reference, tok, ["ab", "ba", "a"], n_samples=5, max_new_tokens=MAX_NEW, seed=3)
    assert est.k1_mean == 0.0 and est.k3_mean == 0.0 and est.rb_mean == 0.0
    assert set(est.per_prompt_k1) == set(est.per_prompt_k3) == set(est.per_prompt_rb) == {0.0}
    with pytest.raises(ValueError, match="separate"):
        estimate_kl(policy, policy, tok, ["ab"])


def generations(max_new: int) -> list[list[int]]:
    """Every generation of at most ``max_new`` tokens: ended by the end token, or cut at ``max_new``."""
    out, frontier = [], [[]]
    for _ in range(max_new):
        out += [[*g, EOS] for g in frontier]
        frontier = [[*g, t] for g in frontier for t in range(len(VOCAB)) if t != EOS]
    return out + frontier


def test_rb_is_the_exact_kl_in_expectation_over_every_generation(tok):
    """rb(y) = sum over y's positions of the full next-token KL. Weighted by pi(y) over every generation
    its expectation is the sequence-level KL exactly (the tower rule; no sampling), in both directions
    of the model pair; leaving out the end token's position or the last cut position would break it."""
    for policy, reference in ((_model(0), _model(1)), (_model(1), _model(0))):
        for prompt in ("ab", "b"):
            ids = tok(prompt, add_special_tokens=False)["input_ids"]
            completions = generations(MAX_NEW)
            scores = pair_scores(policy, reference, [ids] * len(completions), completions, pad_id=0)
            weights = scores.logp_policy.exp()
            assert weights.sum().item() == pytest.approx(1.0, abs=1e-9)
            exact, _ = exact_kl(policy, reference, ids, MAX_NEW)
            assert (weights * scores.token_kl).sum().item() == pytest.approx(exact, rel=1e-6, abs=1e-9)
            assert (scores.token_kl >= 0).all()  # a sum of KLs: never negative, unlike k1
            # The same pairs scored one full pass each (share_prefill off) give the same token KL.
            alone = pair_scores(policy, reference, [ids] * len(completions), completions, pad_id=0,
                                share_prefill=False, batch_size=7)  # fmt: skip
            assert alone.token_kl.tolist() == pytest.approx(scores.token_kl.tolist(), abs=1e-5)


def test_rb_has_less_monte_carlo_variance_than_k1_and_k3(tok):
    """Rao-Blackwellization: rb averages k1 over each position's next token, so its Monte-Carlo variance
    given the prompts is at most k1's; on this pair (KL ~0.6 per sequence) it is below k3's as well."""
    policy, reference = _model(0), _model(1)
    est = estimate_kl(policy, reference, tok, ["ab", "ba", "a", "bb"] * 10, n_samples=8,
                      max_new_tokens=MAX_NEW, seed=4)  # fmt: skip
    assert est.rb_mc_var < est.k1_mc_var and est.rb_mc_var < est.k3_mc_var, est


def test_sequence_logprobs_matches_unbatched_scoring(tok):
    model = _model(2)
    prompts = [[3], [3, 4, 4, 3], [4, 3], [3, 3]]
    completions = [[4, 4, EOS], [3], [4, 3, 4], []]
    expected = []
    for p, c in zip(prompts, completions, strict=True):
        expected.append(sum(_next_logprobs(model, p + c[:j])[c[j]] for j in range(len(c))))
    for kwargs in ({}, {"batch_size": 1}, {"memory_budget_gb": 1e-12}):
        got = sequence_logprobs(model, prompts, completions, pad_id=0, **kwargs)
        assert got.dtype == torch.float64
        assert got.tolist() == pytest.approx(expected, abs=1e-5)
    assert got[3].item() == 0.0  # an empty completion has probability 1


def test_shared_prompt_scoring_matches_scoring_each_pair_alone(tok):
    """A prompt's samples share the prompt's forward pass: same sums as one full pass per pair, for
    prompts of several lengths (left padding), completions of several lengths (right padding), an empty
    one, and batches split by size and by the memory bound."""
    model = _model(2)
    prompts = [[3], [3, 4, 4, 3], [4, 3]] * 3 + [[3, 3]]
    completions = [[4, 4, EOS], [3], [4, 3, 4], [EOS], [4, EOS], [3, 3], [4], [3, 4, 3, 4, EOS], [], [4]]
    expected = sequence_logprobs(model, prompts, completions, pad_id=0, share_prefill=False)
    by_hand = [sum(_next_logprobs(model, p + c[:j])[c[j]] for j in range(len(c))) for p, c in
               zip(prompts, completions, strict=True)]  # fmt: skip
    assert expected.tolist() == pytest.approx(by_hand, abs=1e-5)
    for kwargs in ({}, {"batch_size": 1}, {"batch_size": 4}, {"memory_budget_gb": 1e-12}):
        got = sequence_logprobs(model, prompts, completions, pad_id=0, **kwargs)
        assert got.dtype == torch.float64
        assert got.tolist() == pytest.approx(expected.tolist(), abs=1e-5), kwargs
    assert got[8].item() == 0.0


def test_bf16_policy_against_fp32_reference(tok):
    reference = _model(0)
    policy = copy.deepcopy(reference).to(torch.bfloat16)
    est = estimate_kl(policy, reference, tok, ["ab", "ba"] * 20, n_samples=4, max_new_tokens=MAX_NEW, seed=1)
    assert math.isfinite(est.k1_mean) and 0.0 <= est.k3_mean < 0.05  # rounding-sized, non-negative


def test_kl_from_logprobs_by_hand():
    logp_policy = torch.tensor([-1.0, -2.0, -0.5, -0.5], dtype=torch.float64)
    logp_ref = torch.tensor([-1.5, -1.0, -0.5, -1.5], dtype=torch.float64)
    est = kl_from_logprobs(logp_policy, logp_ref, [0, 0, 1, 1])
    log_r = logp_ref - logp_policy
    k1, k3 = -log_r, torch.expm1(log_r) - log_r
    assert est.per_prompt_k1 == pytest.approx([k1[:2].mean().item(), k1[2:].mean().item()])
    assert est.per_prompt_k3 == pytest.approx([k3[:2].mean().item(), k3[2:].mean().item()])
    assert est.k1_mean == pytest.approx(k1.mean().item())
    assert est.k3_se == pytest.approx(abs(est.per_prompt_k3[0] - est.per_prompt_k3[1]) / 2)
    assert all(v >= 0 for v in est.per_prompt_k3) and est.n_prompts == 2 and est.n_samples == 2
    # sum_p s2_p / m / P^2 with the unbiased within-prompt variance
    for x, got in ((k1, est.k1_mc_var), (k3, est.k3_mc_var)):
        assert got == pytest.approx((x[:2].var().item() / 2 + x[2:].var().item() / 2) / 4)
    assert est.rb_mean is None and est.per_prompt_rb == []  # no token KL given: no rb
    token_kl = torch.tensor([0.2, 0.4, 0.1, 0.3], dtype=torch.float64)
    est = kl_from_logprobs(logp_policy, logp_ref, [0, 0, 1, 1], token_kl)
    assert est.per_prompt_rb == pytest.approx([0.3, 0.2]) and est.rb_mean == pytest.approx(0.25)
    assert est.rb_mc_var == pytest.approx((0.02 / 2 + 0.02 / 2) / 4)


def test_one_sample_per_prompt_has_no_monte_carlo_variance(tok):
    policy, reference = _model(0), _model(1)
    est = estimate_kl(policy, reference, tok, ["ab", "ba", "a"], n_samples=1, max_new_tokens=MAX_NEW, seed=0)
    assert est.n_samples == 1 and est.k1_mc_var is None and est.k3_mc_var is None and est.rb_mc_var is None
    assert math.isfinite(est.k3_se)  # the prompt-level SE is still defined
    est = kl_from_logprobs(torch.zeros(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64), [0, 0, 1])
    assert est.k3_mc_var is None  # one prompt with a single sample is enough to leave it undefined


CAL_REPLICATES = 200


def test_mc_var_is_the_variance_across_resamples_on_fixed_prompts_and_the_se_overstates_it(tok):
    """What the variance analysis needs: every run is scored on the same prompts, so a run's KL noise is
    the spread of the estimate over fresh samples on THOSE prompts. Over independent sampling seeds on
    24 fixed prompts (kl_samples 4), the mean mc var matches the replicates' variance of the mean within
    the chi-square band of a variance from that many replicates, while k3_se^2 (which also holds the
    between-prompt spread, large here: the reference differs in the embedding of 'b' only, so all-'a'
    and all-'b' prompts differ in KL) lies above that band."""
    policy = _model(0)
    reference = copy.deepcopy(policy)
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        row = reference.model.embed_tokens.weight[VOCAB["b"]]
        row += torch.randn(row.shape, generator=gen)
    prompts = [c * n for n in range(1, 13) for c in "ab"]
    ests = [
        estimate_kl(policy, reference, tok, prompts, n_samples=4, max_new_tokens=2, seed=s)
        for s in range(CAL_REPLICATES)
    ]
    df = CAL_REPLICATES - 1
    lo, hi = st.chi2.ppf([0.0005, 0.9995], df) / df  # replicate variance / true variance, 2-sided 0.001
    for key in ("k1", "k3", "rb"):
        means = np.array([getattr(e, f"{key}_mean") for e in ests])
        mc = np.mean([getattr(e, f"{key}_mc_var") for e in ests])
        se2 = np.mean([getattr(e, f"{key}_se") ** 2 for e in ests])
        observed = means.var(ddof=1)
        assert lo < observed / mc < hi, (key, observed, mc)
        if key == "k3":  # the analysis's noise (k1's per-sequence spread is larger: its se^2 ~1.3x here)
            assert se2 / observed > hi, (key, observed, se2)  # prompt-level SE^2: not the noise across seeds
