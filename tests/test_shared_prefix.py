"""Shared-prefix decoding attention: the attention of copied caches, without the copies."""

from __future__ import annotations

import copy

import pytest
import torch

from workflow_scripts.models import shared_prefix
from workflow_scripts.models.generation import decode, sample_completions, sampling_warpers, stop_token_ids
from workflow_scripts.models.modeling import build_char_tokenizer, build_tiny_llama
from workflow_scripts.models.shared_prefix import SharedPrefixKV, shared_prefix_attention

torch.set_num_threads(1)

PROMPTS = ["1+2=", "33+44=", "5-1=", "12+7=", "100-1="]


def reference_attention(q, prefix_k, prefix_v, mask, own_k, own_v, prompt_of_row, scaling):
    """sdpa over each row's copy of its prompt's keys/values followed by its own generated ones."""
    groups = q.shape[1] // prefix_k.shape[1]
    k = torch.cat([prefix_k[prompt_of_row], own_k], dim=2).repeat_interleave(groups, 1)
    v = torch.cat([prefix_v[prompt_of_row], own_v], dim=2).repeat_interleave(groups, 1)
    own = torch.ones(len(q), own_k.shape[2], dtype=torch.bool)
    keep = torch.cat([mask.bool()[prompt_of_row], own], 1)
    out = torch.nn.functional.scaled_dot_product_attention(
        q.double(), k.double(), v.double(), attn_mask=keep[:, None, None, :], scale=scaling
    )
    return out.transpose(1, 2)  # (rows, 1, heads, dim)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 4), (4, 2), (6, 1)])
def test_attention_equals_sdpa_over_copied_caches(dtype, heads, kv_heads):
    """Left-padded prompts, grouped-query heads, several steps, rows dropped between steps: every output
    equals float64 sdpa over the copied cache to within the dtype's rounding of its inputs."""
    gen = torch.Generator().manual_seed(0)
    prompts, repeat, length, dim, room, layers = 3, 5, 7, 8, 4, 2
    mask = torch.ones(prompts, length, dtype=torch.long)
    mask[1, :3] = 0  # left padding
    mask[2, :6] = 0  # a one-token prompt
    prefix = [tuple(torch.randn(prompts, kv_heads, length, dim, generator=gen).to(dtype) for _ in "kv")
              for _ in range(layers)]  # fmt: skip
    state = SharedPrefixKV(prefix, mask, repeat, room)
    rows = torch.arange(prompts * repeat)  # each live row's index before any was dropped
    own = [[torch.empty(len(rows), kv_heads, 0, dim, dtype=dtype) for _ in "kv"] for _ in range(layers)]
    for step in range(3):
        for layer in range(layers):
            q = torch.randn(len(rows), heads, 1, dim, generator=gen).to(dtype)
            k, v = (torch.randn(len(rows), kv_heads, 1, dim, generator=gen).to(dtype) for _ in "kv")
            got = state.attend(layer, q, k, v, scaling=0.3)
            own[layer] = [torch.cat([own[layer][0], k], 2), torch.cat([own[layer][1], v], 2)]
            pk, pv = prefix[layer]
            want = reference_attention(q, pk, pv, mask, *own[layer], rows // repeat, 0.3)
            assert got.shape == (len(rows), 1, heads, dim) and got.dtype == dtype
            tol = 1e-5 if dtype == torch.float32 else 1e-2  # bf16: the rounding of the output
            torch.testing.assert_close(got.double(), want, atol=tol, rtol=tol)
        keep = torch.tensor([i for i in range(len(rows)) if (i + step) % 3])  # drop every third row
        state.select(keep)
        rows = rows[keep]
        own = [[t[keep] for t in pair] for pair in own]


def test_a_row_never_attends_to_another_rows_tokens_or_to_padding():
    """Change one row's generated key or a padded prompt position: only what may see it changes."""
    gen = torch.Generator().manual_seed(1)
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    prefix = [tuple(torch.randn(2, 2, 4, 4, generator=gen) for _ in "kv")]
    q = torch.randn(6, 2, 1, 4, generator=gen)
    k, v = (torch.randn(6, 2, 1, 4, generator=gen) for _ in "kv")
    base = SharedPrefixKV(prefix, mask, 3, 2).attend(0, q, k, v, 0.5)
    k2 = k.clone()
    k2[4] += 5.0  # row 4 (prompt 1, sample 1)
    moved = SharedPrefixKV(prefix, mask, 3, 2).attend(0, q, k2, v, 0.5)
    changed = (moved - base).abs().amax(dim=(1, 2, 3)) > 0
    assert changed.tolist() == [False, False, False, False, True, False]
    padded = [(prefix[0][0].clone(), prefix[0][1].clone())]
    padded[0][0][0, :, :2] = 1e3  # prompt 0's padding positions
    padded[0][1][0, :, :2] = 1e3
    assert torch.equal(SharedPrefixKV(padded, mask, 3, 2).attend(0, q, k, v, 0.5), base)


@pytest.fixture(scope="module")
def tiny():
    tok = build_char_tokenizer()
    cfg = {"hidden_size": 16, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "intermediate_size": 32,
           "max_position_embeddings": 64, "seed": 0}  # fmt: skip
    return build_tiny_llama(len(tok), cfg, tok).eval(), tok


def test_decoding_draws_what_copying_the_prompt_cache_draws(tiny):
    """Through the model (grouped-query heads, mixed prompt lengths, rows ending at different steps):
    the same tokens greedy and sampled as decoding with the prompt's cache copied to every sample."""
    model, tok = tiny
    stops, pad = stop_token_ids(model, tok), tok.pad_token_id
    prompts = [tok(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    width = max(map(len, prompts))
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = (ids != pad).long()
    assert shared_prefix.supports(model)
    for warpers in (None, sampling_warpers(1.0, 0.9)):
        out = {}
        for shared in (True, False):
            torch.manual_seed(3)
            out[shared] = decode(model, ids, mask, 6, warpers, stops, pad, repeat=9, shared=shared)
        assert torch.equal(out[True], out[False])
    ended = [next((j for j, t in enumerate(r) if t in stops), 6) for r in out[True].tolist()]
    assert len(set(ended)) > 1  # rows left the batch at different steps
    assert len({tuple(r) for r in out[True].tolist()}) > len(PROMPTS)  # sampled rows differ
    assert model.config._attn_implementation == "sdpa"  # restored after the decode


def test_sample_completions_uses_it_and_the_draws_match(tiny):
    model, tok = tiny
    kw = {"n_samples": 6, "temperature": 1.0, "max_new_tokens": 6, "seed": 4, "batch_size": 12}
    calls = []
    real = SharedPrefixKV.attend

    def counting(self, *a, **k):
        calls.append(1)
        return real(self, *a, **k)

    SharedPrefixKV.attend = counting
    try:
        shared = sample_completions(model, tok, PROMPTS, **kw)
    finally:
        SharedPrefixKV.attend = real
    assert calls
    copied = copy.deepcopy(model)
    copied.config.sliding_window = 4096  # unsupported: falls back to copying the cache
    assert not shared_prefix.supports(copied)
    assert sample_completions(copied, tok, PROMPTS, **kw) == shared


def test_unsupported_attention_features_are_refused():
    state = SharedPrefixKV([tuple(torch.zeros(1, 1, 2, 2) for _ in "kv")], torch.ones(1, 2), 2, 2)
    module = torch.nn.Module()
    module.layer_idx = 0
    q, k = torch.zeros(2, 1, 1, 2), torch.zeros(2, 1, 1, 2)
    with pytest.raises(NotImplementedError, match="softcap"):
        shared_prefix_attention(module, q, k, k, None, shared_prefix=state, softcap=30.0)
    with pytest.raises(ValueError, match="one token"):
        state.attend(0, torch.zeros(2, 1, 3, 2), torch.zeros(2, 1, 3, 2), torch.zeros(2, 1, 3, 2), 1.0)
