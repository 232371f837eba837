"""A run's model for sampling and scoring: in its saved dtype or an arm's, frozen, on the device.

The evaluate stage and the tests that replay it load models only through here, so a run is always
read as it was saved (a bf16 run in bf16) or cast exactly as training starts an arm from the base.
"""

from __future__ import annotations

import copy
import logging
import os
from collections import Counter
from pathlib import Path

import torch

from workflow_scripts.models.modeling import DTYPES, load_head_as_saved, load_model, unreadable_safetensors

log = logging.getLogger("evaluate")


def saved_dtype(model_dir: str | os.PathLike) -> str:
    """The floating dtype a model folder's safetensors hold (the most common one if mixed)."""
    from workflow_scripts.training.precision import saved_dtypes

    try:
        saved = saved_dtypes(model_dir)
    except Exception as err:  # a broken file: name it (safetensors' own message names none)
        bad = unreadable_safetensors(model_dir)
        if bad is None:
            raise
        raise ValueError(f"{bad[0]}: corrupt or truncated safetensors file ({bad[1]})") from err
    counts = Counter(d for d in saved.values() if d in DTYPES)
    if not counts:
        raise ValueError(f"{model_dir}: no floating-point tensors in the safetensors files")
    if len(counts) > 1:
        log.warning("%s: mixed dtypes %s; loading in the most common", model_dir, dict(counts))
    return counts.most_common(1)[0][0]


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def frozen(model, device=None):
    """``model`` on ``device``, in eval mode, without gradients (sampling and scoring only)."""
    model = model.to(device or default_device()).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def load_run_model(
    model_dir: str | os.PathLike, trust_remote_code: bool = False, device=None, dtype: str | None = None
):
    """(model in ``dtype`` (default: the dtype it was saved in), on ``device``, eval mode; the dtype's name).

    A dtype other than the saved one is a cast of the saved weights, exactly as ``precision.load_policy``
    starts an arm from the base (``modeling.load_model`` with the arm's param dtype). As saved, an LM
    head stored in another dtype than the rest (``lm_head_dtype``) keeps its saved values and dtype."""
    if dtype is not None:
        return frozen(load_model(model_dir, dtype, trust_remote_code), device), dtype
    dtype = saved_dtype(model_dir)
    model = load_head_as_saved(load_model(model_dir, dtype, trust_remote_code), model_dir)
    return frozen(model, device), dtype


def dtype_of(model) -> str:
    """The dtype name of a model's (first) parameters."""
    return str(next(model.parameters()).dtype).removeprefix("torch.")


def load_pair(policy_dir: str | os.PathLike, reference_dir: str | os.PathLike, policy_dtype: str | None,
              reference_dtype: str | None, trust_remote_code: bool = False):  # fmt: skip
    """(policy, reference): each loaded once, in eval mode. The same folder in the same dtype (a base
    run) gives the reference as a copy of the policy: a separate object with the same weights."""
    policy, policy_dtype = load_run_model(policy_dir, trust_remote_code, dtype=policy_dtype)
    reference_dtype = reference_dtype or policy_dtype
    if Path(reference_dir).resolve() == Path(policy_dir).resolve() and reference_dtype == policy_dtype:
        return policy, copy.deepcopy(policy)
    reference, _ = load_run_model(reference_dir, trust_remote_code, dtype=reference_dtype)
    return policy, reference
