"""What the sparsity and overlap stages share (neither imports the other): a tensor name's module type and
layer, the default tolerances and the command-line options of a checkpoint diff."""

from __future__ import annotations

import argparse
import re

from workflow_scripts.measures.checkpoint_io import DEFAULT_WINDOW_BYTES
from workflow_scripts.runtime.config import schema_defaults

MODULE_TYPES = (
    "attn_q", "attn_k", "attn_v", "attn_o", "mlp_gate", "mlp_up", "mlp_down",
    "norm", "embedding", "lm_head", "other",
)  # fmt: skip
_MODULE_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (module, re.compile(pattern))
    for module, pattern in (
        ("norm", r"(^|\.)[^.]*(norm|ln_\w*)(\.|$)"),
        ("lm_head", r"(^|\.)lm_head(\.|$)"),
        ("embedding", r"(^|\.)(embed_tokens|wte|word_embeddings|embeddings?)(\.|$)"),
        ("attn_q", r"(^|\.)q_proj(\.|$)"),
        ("attn_k", r"(^|\.)k_proj(\.|$)"),
        ("attn_v", r"(^|\.)v_proj(\.|$)"),
        ("attn_o", r"(^|\.)o_proj(\.|$)"),
        ("mlp_gate", r"(^|\.)gate_proj(\.|$)"),
        ("mlp_up", r"(^|\.)up_proj(\.|$)"),
        ("mlp_down", r"(^|\.)down_proj(\.|$)"),
    )
)
_LAYER_RE = re.compile(r"(?:^|\.)(?:layers|layer|h|blocks)\.(\d+)(?:\.|$)")


def module_type(name: str) -> str:
    """Module type of a Llama/Qwen-style parameter name, one of MODULE_TYPES."""
    for module, pattern in _MODULE_PATTERNS:
        if pattern.search(name):
            return module
    return "other"


def layer_index(name: str) -> int:
    """Decoder layer index from e.g. ``model.layers.3.mlp.up_proj.weight``; -1 outside the layers."""
    match = _LAYER_RE.search(name)
    return int(match.group(1)) if match else -1


def default_etas() -> list[float]:
    """The schema default of ``sparsity.etas`` (the one place defaults live)."""
    return schema_defaults("sparsity", "etas")


def add_diff_options(p: argparse.ArgumentParser) -> None:
    """The options sparsity and overlap share, with the workflow's defaults."""
    p.add_argument("--etas", type=float, nargs="+", help="relative tolerances (default: the schema's)")
    p.add_argument("--window-mb", type=int, default=DEFAULT_WINDOW_BYTES >> 20, help="MiB per file handle")
    p.add_argument("--threads", type=int, default=1, help="worker threads (e.g. the rule's {threads})")
    p.add_argument(
        "--cast-base-to-final",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="compare against the base cast to a narrower final dtype (the run's real start point)",
    )


def diff_options(args: argparse.Namespace) -> dict:
    """``run`` keyword arguments of the ``add_diff_options`` options."""
    return {
        "etas": args.etas,
        "threads": args.threads,
        "window_bytes": args.window_mb << 20,
        "cast_base_to_final": args.cast_base_to_final,
    }
