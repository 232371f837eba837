"""Model and tokenizer construction and loading: the one place dtypes and trust settings are applied.

- ``build_tiny_tokenizer``: the tokenizer of ``model.tiny.tokenizer``, built locally: ``char`` (every
  printable ASCII character is a token, ``build_char_tokenizer``) or ``bpe`` (``build_bpe_tokenizer``:
  BPE learnt from the warm-start pool after Qwen2's pre-tokenization, so a number is written digit by
  digit, as Qwen2.5 writes it, and a word of the templates is one token, as in any subword vocabulary).
  Both join tokens back with ``decoders.Fuse`` and pad on the left for batched generation.
- ``build_tiny_llama``: a Llama-architecture causal LM of the ``model.tiny`` dimensions (the default
  base model; at Qwen2.5-0.5B's dimensions with grouped-query attention, the GPU smoke check's).
- ``load_model`` / ``load_tokenizer``: a local folder or a hub id, always with an explicit dtype
  (transformers 5 would otherwise take the dtype saved in the config), safetensors only, and
  ``trust_remote_code`` off unless the config turns it on. A failure names what could not be read: the
  broken ``*.safetensors`` file of a truncated or corrupt folder, else the folder or hub id. Weights
  come back in aligned storage (``aligned_storage``): the same weights, the same floats.
- ``set_head_dtype`` / ``load_head_as_saved``: an LM head kept in another dtype than the body (the
  precision field ``lm_head_dtype``), computing its logits in that dtype; read back exactly as saved.
"""

from __future__ import annotations

import os
import string
from collections.abc import Iterable
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
)

from workflow_scripts.models.dtypes import from_safetensors

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
SPECIAL_TOKENS = {"pad_token": "<pad>", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
# Qwen2's pre-tokenization (transformers' Qwen2Tokenizer.PRETOKENIZE_REGEX): every digit on its own, a
# word with its leading space or sign, a run of punctuation with its leading space.
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)


def torch_dtype(name: str) -> torch.dtype:
    try:
        return DTYPES[name]
    except KeyError as err:
        raise ValueError(f"unknown dtype {name!r}; known: {sorted(DTYPES)}") from err


def _alphabet() -> list[str]:
    return sorted(set(string.printable) - set("\x0b\x0c\r"))


def build_tiny_tokenizer(spec: dict | None, texts: Iterable[str] = ()) -> PreTrainedTokenizerFast:
    """The tokenizer ``model.tiny.tokenizer`` names ({kind, vocab_size}); ``texts`` train a ``bpe``."""
    kind = (spec or {}).get("kind", "char")
    if kind == "char":
        return build_char_tokenizer()
    if kind == "bpe":
        return build_bpe_tokenizer(texts, int(spec["vocab_size"]))  # its default: the config schema
    raise ValueError(f"model.tiny.tokenizer.kind: unknown kind {kind!r}; known: ['bpe', 'char']")


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS.values())}
    for ch in _alphabet():
        vocab.setdefault(ch, len(vocab))
    core = Tokenizer(models.WordLevel(vocab, unk_token=SPECIAL_TOKENS["unk_token"]))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"(?m)."), behavior="isolated")
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, padding_side="left", **SPECIAL_TOKENS)
    return tok


def build_bpe_tokenizer(texts: Iterable[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """BPE learnt from ``texts`` (at most ``vocab_size`` tokens; the special tokens and the printable
    ASCII alphabet always), after Qwen2's pre-tokenization: digits never merge, so arithmetic stays the
    digit-by-digit task it is at paper scale, while the words of a prompt cost one token each instead of
    one per character (the warm start's cost is its token count). Deterministic: the same texts give
    the same vocabulary and merges in any process. Pass prompts and answers as separate texts, as they
    are tokenized, so no merge spans the boundary."""
    core = Tokenizer(models.BPE(unk_token=SPECIAL_TOKENS["unk_token"]))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated")
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS.values()), initial_alphabet=_alphabet(),
        show_progress=False,
    )  # fmt: skip
    core.train_from_iterator(texts, trainer)
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=core, padding_side="left", **SPECIAL_TOKENS)


def build_tiny_llama(vocab_size: int, tiny_cfg: dict, tokenizer) -> LlamaForCausalLM:
    # initializer_range None or absent: transformers' own default
    init = {"initializer_range": v} if (v := tiny_cfg.get("initializer_range")) is not None else {}
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=tiny_cfg["hidden_size"],
        num_hidden_layers=tiny_cfg["num_layers"],
        num_attention_heads=tiny_cfg["num_heads"],
        num_key_value_heads=tiny_cfg.get("num_kv_heads") or tiny_cfg["num_heads"],
        intermediate_size=tiny_cfg["intermediate_size"],
        max_position_embeddings=tiny_cfg["max_position_embeddings"],
        tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **init,
    )
    torch.manual_seed(tiny_cfg["seed"])
    return LlamaForCausalLM(config)


def load_tokenizer(source: str | os.PathLike, trust_remote_code: bool = False):
    try:
        tok = AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, TypeError) as err:
        raise ValueError(f"{source}: cannot load the tokenizer ({type(err).__name__}: {err})") from err
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def load_model(
    source: str | os.PathLike,
    dtype: str | torch.dtype,
    trust_remote_code: bool = False,
    dropout: float | None = None,
):
    """A causal LM in exactly ``dtype``; ``dropout`` (if given) sets every dropout the config exposes."""
    dtype = torch_dtype(dtype) if isinstance(dtype, str) else dtype
    overrides = {}
    if dropout is not None:
        from transformers import AutoConfig

        cfg = AutoConfig.from_pretrained(source, trust_remote_code=trust_remote_code)
        overrides = {k: dropout for k in dropout_keys(cfg)}
    try:
        model = AutoModelForCausalLM.from_pretrained(
            source, dtype=dtype, trust_remote_code=trust_remote_code, use_safetensors=True, **overrides
        )
    except Exception as err:
        bad = unreadable_safetensors(source)
        if bad is not None:
            raise ValueError(f"{bad[0]}: corrupt or truncated safetensors file ({bad[1]})") from err
        raise ValueError(f"{source}: cannot load the model ({type(err).__name__}: {err})") from err
    return aligned_storage(model)


ALIGNMENT = 64  # bytes: torch's CPU allocator's alignment (one AVX512 vector, one cache line)


def aligned_storage(model):
    """``model`` with every CPU parameter and buffer in storage aligned to ``ALIGNMENT`` bytes.

    Why: a CPU product's floats can depend on where its operands lie. Weights loaded from safetensors
    are views into the file, at the file's offsets (e.g. 40 bytes past a 64-byte line), while a copy
    (``copy.deepcopy``, a cast, a training step's new tensor) is aligned; on an AVX512 CPU MKL's
    single-row product (a state of the decode, a one-prompt batch) rounds the two differently
    (measured: AMD EPYC, 1 row x (16..512) fp32, every shape). Aligned here, the same weights give the
    same floats however the model was made: a base run's KL to its own copy is exactly 0."""
    for tensor in [*model.parameters(), *model.buffers()]:
        if tensor.device.type == "cpu" and tensor.data_ptr() % ALIGNMENT:
            tensor.data = tensor.data.clone(memory_format=torch.contiguous_format)  # .data: no autograd
    return model


def set_head_dtype(model, dtype: str | torch.dtype):
    """The LM head in ``dtype`` (weights cast) with its input cast to it, so the logits are computed in
    ``dtype`` (TRL's cast_lm_head_to_fp32 does the same in training). Needs an untied head."""
    dtype = torch_dtype(dtype) if isinstance(dtype, str) else dtype
    head = model.get_output_embeddings()
    if getattr(model.config, "tie_word_embeddings", False):
        raise ValueError(f"an LM head in {dtype} needs an untied head (tie_word_embeddings is true)")
    head.to(dtype)
    if not getattr(head, "_casts_input", False):
        head.register_forward_pre_hook(lambda module, args: (args[0].to(module.weight.dtype), *args[1:]))
        head._casts_input = True
    return model


def load_head_as_saved(model, source: str | os.PathLike):
    """Give ``model`` its LM head exactly as saved in the local folder ``source`` when the folder stores
    the head in another dtype than the rest (an arm with ``lm_head_dtype``): its saved values, not a
    round trip through the body's dtype."""
    from safetensors import safe_open

    head = model.get_output_embeddings()
    names = {name for name, p in model.named_parameters() if any(p is q for q in head.parameters())}
    for path in sorted(Path(source).glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as fh:
            for name in names & set(fh.keys()):
                if (
                    DTYPES.get(from_safetensors(fh.get_slice(name).get_dtype()))
                    == model.get_parameter(name).dtype
                ):
                    continue  # saved like the body: loaded exactly already (headers only, no read)
                saved = fh.get_tensor(name)
                set_head_dtype(model, saved.dtype)
                with torch.no_grad():
                    model.get_parameter(name).copy_(saved)
    return model


def unreadable_safetensors(source: str | os.PathLike) -> tuple[Path, str] | None:
    """The first ``*.safetensors`` file of a local folder whose header or size is broken, with why."""
    from safetensors import safe_open

    folder = Path(source)
    if not folder.is_dir():
        return None
    for path in sorted(folder.glob("*.safetensors")):
        try:
            with safe_open(str(path), framework="pt") as fh:
                fh.keys()
        except Exception as err:  # SafetensorError is not exported under a stable name
            return path, str(err)
    return None


def dropout_keys(config) -> list[str]:
    """Config attributes that set a dropout probability (attention_dropout, hidden_dropout, ...)."""
    return sorted(k for k, v in config.to_dict().items() if "dropout" in k and isinstance(v, int | float))
