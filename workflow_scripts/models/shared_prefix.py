"""Decoding attention for ``n`` samples of each prompt without copying the prompt's keys and values.

Sampling 128 completions of a prompt the usual way copies the prompt's KV cache to 128 rows
(``batch_repeat_interleave``) and then reads all 128 copies at every decoding step. For the word problems
of the tiny default (40-token prompts, answers of 2-6 tokens) that copy and those reads were 40% of an
evaluation's generation time (cProfile: ``repeat_interleave`` 1.13 s, attention 0.90 s of 5.4 s).
Here each prompt's keys and values stay in one copy, ``(prompts, kv_heads, prompt_len, head_dim)``; a
decoding step scores the queries of all of a prompt's live samples against it in one matrix product
(the samples play the part of query positions), scores each row's own generated tokens separately, and
takes one softmax over both: the same attention, in another order of summation.

It runs as an attention function of transformers' ``AttentionInterface`` (``ATTENTION``), selected only
for the decoding steps of ``generation.decode`` (``decoding_steps``), with the model called without a
cache (``use_cache=False``): this module keeps the generated tokens' keys and values itself. Products
and softmax are computed in float32 whatever the model's dtype, as torch's fused CPU and GPU attention
kernels accumulate; the keys and values are the model's own (a bf16 model's are rounded to bf16).
Full attention only (no sliding window, soft-capping or attention sinks): ``supports`` says whether a
model qualifies, and anything else is refused rather than computed wrong.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

ATTENTION = "rlvr_shared_prefix"
_UNSUPPORTED = ("sliding_window", "softcap", "s_aux")


class SharedPrefixKV:
    """Keys and values of a decode whose rows are samples of ``prompts`` (``repeat`` rows each).

    ``prefix``: one (keys, values) pair per layer, each ``(prompts, kv_heads, prompt_len, head_dim)``,
    as a prefill cache holds them; ``mask``: the prompts' ``(prompts, prompt_len)`` attention mask (left
    padding); ``room``: how many tokens a row may generate. Rows are prompt-major (sample s of prompt p
    is row p * repeat + s) until ``select`` drops ended rows.
    """

    def __init__(self, prefix: list[tuple[torch.Tensor, torch.Tensor]], mask: torch.Tensor, repeat: int,
                 room: int):  # fmt: skip
        self.prefix = [(k.float(), v.float()) for k, v in prefix]
        self.prompts, self.repeat, self.room = mask.shape[0], repeat, room
        self.pad = ~mask.bool()[:, None, None, :]  # (prompts, 1, 1, prompt_len)
        self.slot = torch.arange(self.prompts * repeat, device=mask.device)  # each live row's grid slot
        self.keys: list[torch.Tensor | None] = [None] * len(prefix)
        self.values: list[torch.Tensor | None] = [None] * len(prefix)
        self.length = [0] * len(prefix)

    def select(self, keep: torch.Tensor) -> None:
        """Keep only the rows ``keep`` (indices into the live rows), in that order."""
        self.slot = self.slot[keep]
        self.keys = [None if k is None else k[keep] for k in self.keys]
        self.values = [None if v is None else v[keep] for v in self.values]

    def _to_grid(self, rows: torch.Tensor) -> torch.Tensor:
        """(rows, kv_heads, groups, x) -> (prompts, kv_heads, repeat * groups, x), zeros where no row."""
        _, kvh, g, x = rows.shape
        grid = rows.new_zeros(self.prompts * self.repeat, kvh, g, x)
        grid[self.slot] = rows
        grid = grid.view(self.prompts, self.repeat, kvh, g, x).transpose(1, 2)
        return grid.reshape(self.prompts, kvh, -1, x)

    def _from_grid(self, grid: torch.Tensor, groups: int) -> torch.Tensor:
        """The inverse of ``_to_grid`` for the live rows."""
        p, kvh, _, x = grid.shape
        rows = grid.view(p, kvh, self.repeat, groups, x).transpose(1, 2)
        return rows.reshape(p * self.repeat, kvh, groups, x)[self.slot]

    def attend(self, layer: int, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               scaling: float) -> torch.Tensor:  # fmt: skip
        """Append this step's ``key``/``value`` (rows, kv_heads, 1, head_dim) of ``layer`` and return the
        attention output of ``query`` (rows, heads, 1, head_dim) as (rows, 1, heads, head_dim)."""
        rows, heads, q_len, dim = query.shape
        if q_len != 1:
            raise ValueError(f"shared-prefix attention decodes one token per row, got {q_len}")
        kvh = key.shape[1]
        if self.keys[layer] is None:
            self.keys[layer] = key.new_empty(rows, kvh, self.room, dim)
            self.values[layer] = value.new_empty(rows, kvh, self.room, dim)
        t = self.length[layer]
        if t == self.room:
            raise ValueError(f"shared-prefix attention: more than room={self.room} decoded tokens")
        self.keys[layer][:, :, t] = key[:, :, 0]
        self.values[layer][:, :, t] = value[:, :, 0]
        self.length[layer] = t = t + 1
        groups = heads // kvh  # query head h reads kv head h // groups (transformers' repeat_kv)
        q = query.view(rows, kvh, groups, dim).float()
        prefix_k, prefix_v = self.prefix[layer]
        length = prefix_k.shape[2]
        scores_prefix = torch.matmul(self._to_grid(q), prefix_k.transpose(-1, -2)) * scaling
        scores_prefix = self._from_grid(scores_prefix.masked_fill(self.pad, float("-inf")), groups)
        own_k, own_v = self.keys[layer][:, :, :t].float(), self.values[layer][:, :, :t].float()
        scores_own = torch.matmul(q, own_k.transpose(-1, -2)) * scaling  # (rows, kv_heads, groups, t)
        weights = torch.softmax(torch.cat([scores_prefix, scores_own], dim=-1), dim=-1)
        out = self._from_grid(torch.matmul(self._to_grid(weights[..., :length]), prefix_v), groups)
        out = out + torch.matmul(weights[..., length:], own_v)
        return out.to(query.dtype).view(rows, heads, dim)[:, None]


def shared_prefix_attention(module, query, key, value, attention_mask, dropout: float = 0.0,
                            scaling: float | None = None, shared_prefix: SharedPrefixKV | None = None,
                            **kwargs):  # fmt: skip
    """transformers' attention-function signature; without ``shared_prefix`` it is plain sdpa."""
    if shared_prefix is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)  # fmt: skip
    bad = [k for k in _UNSUPPORTED if kwargs.get(k) is not None]
    if bad or dropout:
        raise NotImplementedError(f"shared-prefix attention does not implement {bad or 'dropout'}")
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    return shared_prefix.attend(module.layer_idx, query, key, value, scale), None


AttentionInterface.register(ATTENTION, shared_prefix_attention)


def supports(model) -> bool:
    """Whether ``model`` can decode with this attention: a transformers model with full attention in
    every layer, no logit soft-capping, and sdpa (or eager) as its own attention."""
    cfg = model.config
    cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    if getattr(cfg, "_attn_implementation", None) not in ("sdpa", "eager"):
        return False
    if any(getattr(cfg, k, None) for k in ("attn_logit_softcapping", "sliding_window", "use_sliding_window")):
        return False
    types = getattr(cfg, "layer_types", None)
    return not types or all(t == "full_attention" for t in types)


@contextlib.contextmanager
def decoding_steps(model) -> Iterator[None]:
    """Select ``ATTENTION`` for the model's forwards inside the block (its own attention after)."""
    cfg = model.config
    before = cfg._attn_implementation
    cfg._attn_implementation = ATTENTION
    try:
        yield
    finally:
        cfg._attn_implementation = before
