"""Batched sampling from a causal LM with the transformers backend.

All (prompt, sample) pairs are generated in batches across prompts, left padded, with the KV cache, so a
batch of short prompts costs one decoding loop rather than one per prompt. A prompt is prefilled
once for its ``n_samples`` rows, and each decoding step runs the model once per distinct (prompt, tokens
so far) of the batch (``decode``'s states), never per row: with the same draws, 200 problems x 128
samples of the tiny default took 0.5-1.2 s where copying the prompt's cache to every row took 3-7 s
(1 thread, Sapphire Rapids; word problems, with 40-token prompts, gained most).
Pairs are ordered by prompt length (longest first) so a batch holds prompts of similar length (little
padding) and the first batch is the largest (an out-of-memory error shows up at once); results come back
in prompt-major order.

Batch size = min(``batch_size``, memory bound), the bound recomputed for each batch from its longest
prompt (``bounded_batch_size``): per sequence, KV cache (2 x layers x kv_heads x head_dim x (prompt +
max_new_tokens) x dtype bytes) + prefill activations + attention scores + the next-token logits with
the copies the sampler makes (vocab x 24 bytes); the budget is ``memory_budget_gb`` if given, else 70% of
free GPU memory or 25% of available host memory, measured once per call.

The sampled distribution is exactly softmax(logits / temperature) cut to ``top_p``: ``decode`` is
``generate``'s sampling step with transformers' own temperature and top-p warpers and nothing else, so a
model's saved ``generation_config`` (e.g. Qwen instruct models ship top_k 20 and repetition_penalty
1.05) cannot leak into the draws. This matters for the KL estimator, which needs draws from pi_theta
itself. ``decode`` exists because ``generate`` keeps a finished row computing pads until the batch's
longest answer ends; most answers here end in half the token budget (docs/performance.md).
``NEUTRAL_GENERATION`` lists the neutral value of every other knob, for a direct ``generate`` call
(bench/bench_eval.py's baseline).

Under FSDP every rank must run the same forwards (each all-gathers the shards): ``lockstep`` makes every
rank decode rank 0's tokens, and ``agreed_memory_budget_gb`` gives every rank the same batches.

Generation stops at any of the model's end tokens (the tokenizer's eos plus the generation config's
``eos_token_id`` list); ``Completion.stop_token_id`` records which one, so a completion can be
teacher-forced exactly as it was sampled.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from transformers import DynamicCache, GenerationConfig, LogitsProcessorList
from transformers.cache_utils import DynamicLayer
from transformers.generation.logits_process import TemperatureLogitsWarper, TopPLogitsWarper


@dataclass(frozen=True)
class Completion:
    prompt_index: int
    sample_index: int
    text: str
    num_tokens: int  # generated tokens, the end token included
    truncated: bool  # hit max_new_tokens without an end-of-sequence token
    token_ids: tuple[int, ...] = ()  # generated tokens, the end token excluded
    stop_token_id: int | None = None  # the end token that stopped it (None when truncated)


_NEUTRAL = {
    "top_k": 0,
    "top_h": None,
    "min_p": None,
    "typical_p": 1.0,
    "epsilon_cutoff": 0.0,
    "eta_cutoff": 0.0,
    "repetition_penalty": 1.0,
    "encoder_repetition_penalty": 1.0,
    "no_repeat_ngram_size": 0,
    "encoder_no_repeat_ngram_size": 0,
    "bad_words_ids": None,
    "sequence_bias": None,
    "suppress_tokens": None,
    "begin_suppress_tokens": None,
    "forced_bos_token_id": None,
    "forced_eos_token_id": None,
    "min_length": 0,
    "min_new_tokens": None,
    "exponential_decay_length_penalty": None,
    "guidance_scale": None,
    "renormalize_logits": False,
    "remove_invalid_values": False,
    "watermarking_config": None,
    "stop_strings": None,
    "max_time": None,
    "num_beams": 1,
    "num_return_sequences": 1,
}
# Only keys this transformers version knows (an unknown key would be passed on to forward()).
NEUTRAL_GENERATION: dict = {k: v for k, v in _NEUTRAL.items() if hasattr(GenerationConfig(), k)}


def stop_token_ids(model, tokenizer, generation_config=None) -> list[int]:
    """The tokenizer's eos plus the generation config's end tokens (chat models have several).

    ``generation_config`` defaults to ``model.generation_config`` (``model`` may be None when given).
    """
    ids: list[int] = []
    candidates = [tokenizer.eos_token_id]
    gen_cfg = generation_config
    if gen_cfg is None:
        gen_cfg = getattr(model, "generation_config", None)
    gen_eos = getattr(gen_cfg, "eos_token_id", None)
    candidates += list(gen_eos) if isinstance(gen_eos, list | tuple) else [gen_eos]
    for tok in candidates:
        if tok is not None and int(tok) not in ids:
            ids.append(int(tok))
    if not ids:
        raise ValueError("the tokenizer has no eos token and the model's generation config names none")
    return ids


def _dims(model) -> dict[str, int]:
    cfg = model.config
    cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    hidden = int(getattr(cfg, "hidden_size", 1024))
    heads = int(getattr(cfg, "num_attention_heads", 16))
    return {
        "layers": int(getattr(cfg, "num_hidden_layers", 24)),
        "hidden": hidden,
        "heads": heads,
        "kv_heads": int(getattr(cfg, "num_key_value_heads", None) or heads),
        "head_dim": int(getattr(cfg, "head_dim", None) or hidden // heads),
        "intermediate": int(getattr(cfg, "intermediate_size", None) or 4 * hidden),
        "vocab": int(getattr(cfg, "vocab_size", 32000)),
        "elem": next(model.parameters()).element_size(),
    }


def generation_bytes_per_sequence(model, prompt_tokens: int, new_tokens: int) -> int:
    """Rough peak memory one sequence adds to a ``generate`` batch (see the module docstring)."""
    d = _dims(model)
    length = prompt_tokens + new_tokens
    kv = 2 * d["layers"] * d["kv_heads"] * d["head_dim"] * length * d["elem"]
    prefill = prompt_tokens * (4 * d["hidden"] + 2 * d["intermediate"]) * d["elem"]
    scores = d["heads"] * prompt_tokens * prompt_tokens * 4
    logits = d["vocab"] * 24
    return kv + prefill + scores + logits


def scoring_bytes_per_sequence(model, total_tokens: int, scored_tokens: int) -> int:
    """Rough peak memory of one teacher-forced sequence (no cache; float64 log-softmax of scored tokens)."""
    d = _dims(model)
    activations = total_tokens * (4 * d["hidden"] + 2 * d["intermediate"]) * d["elem"]
    scores = d["heads"] * total_tokens * total_tokens * 4
    logits = (scored_tokens + 1) * d["vocab"] * (d["elem"] + 16)
    return activations + scores + logits


def memory_budget_bytes(device: torch.device, budget_gb: float | None = None) -> int:
    """Bytes a batch may use: the configured budget, else a share of what is free on ``device`` now."""
    if budget_gb is not None:
        return int(budget_gb * (1 << 30))
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(0.7 * free)
    import psutil

    return int(0.25 * psutil.virtual_memory().available)


_LOCKSTEP: list = []  # the process groups whose ranks decode rank 0's tokens (``lockstep``), innermost last


@contextlib.contextmanager
def lockstep(group=None) -> Iterator[None]:
    """Inside: every rank of ``group`` (None: the default process group) decodes the tokens rank 0 drew.

    A sharded (FSDP) model's forward all-gathers its shards, so every rank must run the same forwards.
    Ranks whose numerics differ (a non-deterministic bf16 arm) would draw different tokens, end rows at
    different steps and leave a rank waiting for a forward that never comes; with rank 0's tokens every
    rank runs the same states, batches and steps. The ranks must agree on the batches too (the same
    prompts, ``batch_size`` and memory budget: ``agreed_memory_budget_gb``)."""
    _LOCKSTEP.append(group)
    try:
        yield
    finally:
        _LOCKSTEP.pop()


def _follow_rank0(tokens: torch.Tensor) -> torch.Tensor:
    if _LOCKSTEP:
        import torch.distributed as dist

        dist.broadcast(tokens, group_src=0, group=_LOCKSTEP[-1])
    return tokens


def agreed_memory_budget_gb(device: torch.device, group=None) -> float:
    """The smallest of the ranks' automatic memory budgets (``memory_budget_bytes``), in GiB: a
    collective, so every rank of ``group`` bounds its batches alike (``lockstep``)."""
    import torch.distributed as dist

    budget = torch.tensor([memory_budget_bytes(device)], dtype=torch.int64, device=device)
    dist.all_reduce(budget, op=dist.ReduceOp.MIN, group=group)
    return int(budget.item()) / (1 << 30)


def bounded_batch_size(batch_size: int, bytes_per_sequence: int, budget_bytes: int) -> int:
    """``batch_size`` capped so that ``bytes_per_sequence`` x batch fits ``budget_bytes`` (at least 1)."""
    return max(1, min(batch_size, budget_bytes // max(1, bytes_per_sequence)))


def _rng_devices(device: torch.device) -> list[int]:
    if device.type == "cuda":
        return [device.index if device.index is not None else torch.cuda.current_device()]
    return []


def supports_logits_to_keep(model) -> bool:
    """Whether ``model.forward`` can compute the logits of the last positions only."""
    try:
        return "logits_to_keep" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


def left_padded(rows: list[list[int]], width: int, pad: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, attention mask) of token rows right-aligned in ``width`` columns, ``pad`` on the left."""
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, p in enumerate(rows):
        if p:
            ids[row, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            mask[row, width - len(p) :] = 1
    return ids.to(device), mask.to(device)


def sampling_warpers(temperature: float, top_p: float) -> LogitsProcessorList:
    """What ``generate`` applies when sampling with every other knob neutral (``NEUTRAL_GENERATION``):
    logits / temperature, then the top_p nucleus (at least one token kept)."""
    warpers = LogitsProcessorList([TemperatureLogitsWarper(temperature)])
    if top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p, min_tokens_to_keep=1))
    return warpers


class GrowingLayer(DynamicLayer):
    """A ``DynamicLayer`` whose keys and values sit in a buffer with ``room`` free positions after the
    prompt: a decoding step writes its token in place, where ``DynamicLayer`` concatenates (copies) the
    whole cache at every step. ``keys``/``values`` are views of the filled part, as attention expects."""

    def __init__(self, room: int):
        super().__init__()
        self.room, self.length = room, 0
        self.k_buf = self.v_buf = None

    def _views(self) -> tuple[torch.Tensor, torch.Tensor]:
        self.keys, self.values = self.k_buf[..., : self.length, :], self.v_buf[..., : self.length, :]
        return self.keys, self.values

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = key_states.shape[-2]
        if self.k_buf is None or self.length + n > self.k_buf.shape[-2]:
            shape = (*key_states.shape[:-2], self.length + n + self.room, key_states.shape[-1])
            k_buf, v_buf = key_states.new_empty(shape), value_states.new_empty(shape)
            if self.length:
                k_buf[..., : self.length, :], v_buf[..., : self.length, :] = self.keys, self.values
            self.k_buf, self.v_buf = k_buf, v_buf
        self.k_buf[..., self.length : self.length + n, :] = key_states
        self.v_buf[..., self.length : self.length + n, :] = value_states
        self.length += n
        return self._views()

    def get_seq_length(self) -> int:
        return self.length

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.length:
            self.k_buf, self.v_buf = (b.repeat_interleave(repeats, dim=0) for b in (self.k_buf, self.v_buf))
            self._views()

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.length:
            self.k_buf, self.v_buf = self.k_buf[indices, ...], self.v_buf[indices, ...]
            self._views()


def decoding_cache(model, room: int) -> DynamicCache:
    """A ``DynamicCache`` of ``GrowingLayer``s with ``room`` positions to decode into (full-attention
    models; any other layer type keeps transformers' own layers)."""
    cache = DynamicCache(config=model.config)
    if all(type(layer) is DynamicLayer for layer in cache.layers):
        cache.layers = [GrowingLayer(room) for _ in cache.layers]
    return cache


def decode(model, ids: torch.Tensor, mask: torch.Tensor, max_new_tokens: int,
           warpers: LogitsProcessorList | None, stops: list[int], pad: int,
           repeat: int = 1, grow: bool = True, last_only: bool | None = None,
           merge: bool = True) -> torch.Tensor:  # fmt: skip
    """The (rows x repeat, max_new_tokens) new tokens of left-padded prompts, pad after each row's end
    token: ``generate``'s sampling step (float32 logits, ``warpers``, softmax, one multinomial draw per
    row; argmax when ``warpers`` is None) over a KV cache, with two savings that ``generate`` lacks.

    The model runs once per *state*, not per row: rows with the same prompt and the same tokens so far
    have the same next-token distribution. The prompts are prefilled once (one state each, whatever
    ``repeat``: their cache is never copied to their samples); each step draws every live row's token
    from its state's distribution (one multinomial over the rows, as before), and the distinct (state,
    token) pairs of the rows that go on are the next step's states, each with its parent's cache plus
    its token. The 128 samples of a tiny model's prompt share a handful of states, so most of the work
    goes; where samples diverge (long answers) the states are the rows and nothing is lost. A row that
    has ended leaves the batch instead of computing pads to the longest answer (most answers here end
    in half the budget). ``merge`` False: one state per row (the prompt cache copied to its ``repeat``
    rows, as ``generate`` does; the same draws). ``grow``: decode into ``GrowingLayer``s (False:
    transformers' ``DynamicLayer``, the same numbers). ``last_only``: whether the model takes
    ``logits_to_keep`` (None: look it up). Reproducible for given (seed, prompts, batches)."""
    device = ids.device
    cache = decoding_cache(model, max_new_tokens) if grow else DynamicCache(config=model.config)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    last_only = supports_logits_to_keep(model) if last_only is None else last_only
    last = {"logits_to_keep": 1} if last_only else {}
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache,
                   use_cache=True, **last).logits[:, -1]  # fmt: skip
    positions = mask.sum(-1)  # each state's next position
    rows = len(ids) * repeat
    if merge:
        row_state = torch.arange(len(ids), device=device).repeat_interleave(repeat)
    else:
        if repeat > 1:
            cache.batch_repeat_interleave(repeat)
            logits, mask, positions = (x.repeat_interleave(repeat, 0) for x in (logits, mask, positions))
        row_state = torch.arange(rows, device=device)
    history = torch.empty((len(logits), 0), dtype=torch.long, device=device)  # each state's tokens
    out = torch.full((rows, max_new_tokens), pad, dtype=torch.long, device=device)
    alive = torch.arange(rows, device=device)
    stop_ids = torch.tensor(stops, device=device)
    for step in range(max_new_tokens):
        scores = logits.to(dtype=torch.float32)
        if warpers is None:
            tokens = scores.argmax(-1)[row_state]
        else:
            probs = torch.softmax(warpers(history, scores), dim=-1)
            tokens = torch.multinomial(probs[row_state], num_samples=1).squeeze(1)
        tokens = _follow_rank0(tokens)
        out[alive, step] = tokens
        going = ~torch.isin(tokens, stop_ids)
        if step == max_new_tokens - 1 or not going.any():
            break
        alive, row_state, tokens = alive[going], row_state[going], tokens[going]
        if merge:  # the next states: distinct (state, token) pairs, in state order
            vocab = scores.shape[-1]
            pairs, row_state = torch.unique(row_state * vocab + tokens, return_inverse=True)
            parent, tokens = pairs // vocab, pairs % vocab
        else:
            parent, row_state = row_state, torch.arange(len(tokens), device=device)
        cache.batch_select_indices(parent)
        history = torch.cat([history[parent], tokens[:, None]], dim=1)
        mask = torch.cat([mask[parent], mask.new_ones((len(parent), 1))], dim=1)
        positions = positions[parent]
        logits = model(input_ids=tokens[:, None], attention_mask=mask, position_ids=positions[:, None],
                       cache=cache, use_cache=True).logits[:, -1]  # fmt: skip
        positions = positions + 1
    return out


def _without_grad(fn):
    """``fn`` under inference mode; in ``lockstep`` (a sharded model) under no_grad instead: FSDP2 makes
    its all-gather buffers at a model's first forward, and buffers made in inference mode can never be
    written by training afterwards (a held-out measurement at step 0 runs that first forward)."""

    @functools.wraps(fn)
    def call(*args, **kwargs):
        with torch.no_grad() if _LOCKSTEP else torch.inference_mode():
            return fn(*args, **kwargs)

    return call


@_without_grad
def sample_completions(
    model,
    tokenizer,
    prompts: list[str],
    n_samples: int = 1,
    temperature: float = 0.0,
    top_p: float = 1.0,
    max_new_tokens: int = 8,
    batch_size: int = 256,
    seed: int = 0,
    *,
    memory_budget_gb: float | None = None,
    share_prefill: bool = True,
) -> list[Completion]:
    """``n_samples`` completions per prompt (greedy when temperature is 0), in prompt-major order.

    Reproducible for a given (seed, batch size, prompts); the global RNG state is left as it was.
    ``share_prefill``: decode a prompt's samples together, the model run once per distinct (prompt,
    tokens so far) (same draws, a fraction of the cost); False = every (prompt, sample) pair prefilled
    and decoded on its own.
    """
    model.eval()
    device = next(model.parameters()).device
    stops = stop_token_ids(model, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stops[0]
    prompt_ids = tokenizer(list(prompts), add_special_tokens=False)["input_ids"] if prompts else []
    order = sorted(range(len(prompts)), key=lambda i: -len(prompt_ids[i]))
    pairs = [(i, s) for i in order for s in range(n_samples)]
    warpers = sampling_warpers(temperature, top_p) if temperature > 0 else None
    last_only = supports_logits_to_keep(model)
    budget = memory_budget_bytes(device, memory_budget_gb)
    results: dict[tuple[int, int], Completion] = {}
    stop_set = set(stops)
    texts: dict[tuple[int, ...], str] = {}  # each distinct completion decoded once (samples repeat)

    def collect(chunk: list[tuple[int, int]], out: torch.Tensor) -> None:
        cut: list[tuple[int, ...]] = []
        ends: list[int | None] = []
        for seq in out.tolist():
            end = next((j for j, tok in enumerate(seq) if tok in stop_set), None)
            cut.append(tuple(seq if end is None else seq[:end]))
            ends.append(None if end is None else seq[end])
        new = list(dict.fromkeys(toks for toks in cut if toks not in texts))
        decoded = tokenizer.batch_decode([list(t) for t in new], skip_special_tokens=True)
        texts.update(zip(new, decoded, strict=True))
        for (i, s), toks, stop in zip(chunk, cut, ends, strict=True):
            ended = stop is not None
            results[(i, s)] = Completion(i, s, texts[toks], len(toks) + ended, not ended, toks, stop)

    def size_for(i: int) -> int:
        per_seq = generation_bytes_per_sequence(model, len(prompt_ids[i]), max_new_tokens)
        return bounded_batch_size(batch_size, per_seq, budget)

    # Shared: a prompt's samples decoded together (one prefill, one model row per distinct prefix).
    # Needs a whole prompt's samples in one batch (the longest prompt, first, has the smallest bound).
    shared = share_prefill and n_samples > 1 and bool(order) and size_for(order[0]) >= n_samples
    shared = shared and min(len(p) for p in prompt_ids) > 0
    with torch.random.fork_rng(devices=_rng_devices(device)):
        torch.manual_seed(seed)
        start = 0
        while start < (len(order) if shared else len(pairs)):
            if shared:
                group = order[start : start + size_for(order[start]) // n_samples]
                start += len(group)
                longest = len(prompt_ids[group[0]])
                ids, mask = left_padded([prompt_ids[i] for i in group], longest, pad, device)
                out = decode(
                    model,
                    ids,
                    mask,
                    max_new_tokens,
                    warpers,
                    stops,
                    pad,
                    repeat=n_samples,
                    last_only=last_only,
                )
                collect([(i, s) for i in group for s in range(n_samples)], out)
            else:
                longest = len(prompt_ids[pairs[start][0]])
                chunk = pairs[start : start + size_for(pairs[start][0])]
                start += len(chunk)
                ids, mask = left_padded([prompt_ids[i] for i, _ in chunk], longest, pad, device)
                out = decode(model, ids, mask, max_new_tokens, warpers, stops, pad, last_only=last_only)
                collect(chunk, out)
    return [results[(i, s)] for i in range(len(prompts)) for s in range(n_samples)]
