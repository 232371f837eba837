"""What each arm is: its factors in words, how it differs from the reference, which arms isolate a factor.

An arm's name is a label; its meaning is its config entry. The report opens with this table so a reader
never has to guess what "bf16" contains, and the decomposition (``decompose``) reads the factor
differences to attribute a bundle arm's effect to the single-factor arms that carry its parts.

| factor       | config keys                 | values in words                                      |
|--------------|-----------------------------|------------------------------------------------------|
| masters      | param_dtype, rounding       | fp32; bf16 round-to-nearest; bf16 stochastic rounding |
| compute      | autocast                    | autocast dtype of the products, else as the masters  |
| dropout      | dropout                     | rate in the loss forward only (sampling: eval mode)  |
| determinism  | deterministic               | deterministic algorithms on / off (inert on CPU)     |
| update noise | update_noise                | Gaussian noise of X bf16 spacings after every step   |
| LM head      | lm_head_dtype               | the head's dtype where it differs from the masters   |

The table the report shows (``describe``) spells every dtype out; the factors compare only what an arm
sets apart from its masters, so a bf16 arm differs from fp32 in one factor, not three.

seed_offset and control are not factors: an arm that differs from the reference only by its seeds is a
null twin (``twin_of``). Each difference from the reference gets a name a reader knows from the
experiment (``effect_name``): bf16 round-to-nearest masters are the "rounding stall" (updates below half a
bf16 spacing are lost), bf16 stochastic-rounding masters "precision noise" (unbiased rounding).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

FACTORS = ("masters", "compute", "dropout", "deterministic", "update_noise", "lm_head")
LABELS = {
    "masters": "master weights",
    "compute": "compute dtype",
    "dropout": "dropout (loss forward)",
    "deterministic": "deterministic algorithms",
    "update_noise": "update noise",
    "lm_head": "LM head dtype",
}


@functools.cache
def _defaults() -> dict[str, Any]:
    from workflow_scripts.runtime.config import load_schema

    props = load_schema()["properties"]["precisions"]["additionalProperties"]["properties"]
    return {k: v["default"] for k, v in props.items() if "default" in v}


def entry_with_defaults(entry: Mapping[str, Any]) -> dict[str, Any]:
    """One precisions entry with the schema's defaults filled in (the schema is their only source)."""
    return {**_defaults(), **dict(entry)}


def _short(dtype: str | None) -> str:
    return {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}.get(str(dtype), str(dtype))


def factors(entry: Mapping[str, Any]) -> dict[str, Any]:
    """The arm's factor values (comparable across arms and configs)."""
    e = entry_with_defaults(entry)
    masters = _short(e["param_dtype"])
    if e["param_dtype"] == "bfloat16":
        masters += " stochastic rounding" if e["rounding"] == "stochastic" else " round-to-nearest"
    return {
        "masters": masters,
        # compute and LM head are factors of their own only where they differ from the masters: a bf16
        # arm computes in bf16 because its masters are bf16 (one factor, not three)
        "compute": f"{_short(e['autocast'])} autocast" if e["autocast"] else "as masters",
        "dropout": float(e["dropout"]),
        "deterministic": bool(e["deterministic"]),
        "update_noise": None if e["update_noise"] in (None, 0) else float(e["update_noise"]),
        "lm_head": _short(e["lm_head_dtype"])
        if e["lm_head_dtype"] not in (None, e["param_dtype"])
        else "as masters",
    }


def describe(entry: Mapping[str, Any]) -> dict[str, str]:
    """The arm table's cells: what it stores, computes, samples in, its dropout, determinism, optimizer."""
    e, f = entry_with_defaults(entry), factors(entry)
    optimizer = f"AdamW, states in {_short(e['param_dtype'])}"
    if e["param_dtype"] == "bfloat16":
        optimizer += ", update written by " + (
            "stochastic rounding (unbiased)" if e["rounding"] == "stochastic" else "round-to-nearest"
        )
    if f["update_noise"]:
        optimizer += f", + Gaussian noise of {f['update_noise']:g} bf16 spacings a step"
    seeds = f"s + {e['seed_offset']}" if e["seed_offset"] else "s"
    compute = _short(e["autocast"] or e["param_dtype"])
    return {
        "masters": f["masters"],
        "compute": compute + (" (autocast)" if e["autocast"] else ""),
        "sampler": f"{compute}, eval mode",
        "dropout": f"{f['dropout']:g}" + (" (loss forward only)" if f["dropout"] else ""),
        "deterministic": "yes" if f["deterministic"] else "no",
        "optimizer": optimizer,
        "lm_head": _short(e["lm_head_dtype"] or e["param_dtype"]),
        "seeds": seeds,
        "control": str(e["control"] or ""),
    }


def differences(entry: Mapping[str, Any], reference: Mapping[str, Any]) -> dict[str, list[Any]]:
    """{factor: [reference value, arm value]} for every factor where the arm differs from the reference."""
    a, r = factors(entry), factors(reference)
    return {k: [r[k], a[k]] for k in FACTORS if a[k] != r[k]}


def effect_name(factor: str, values: list[Any]) -> str:
    """A difference in the words of the experiment ("rounding stall", "dropout 0.1", ...)."""
    ref, arm = values
    if factor == "masters" and str(ref) == "fp32":
        if arm == "bf16 round-to-nearest":
            return "rounding stall (bf16 masters, round-to-nearest)"
        if arm == "bf16 stochastic rounding":
            return "precision noise (bf16 masters, stochastic rounding)"
    if factor == "dropout":
        return f"dropout {arm:g}" if ref == 0 else f"dropout {ref:g} -> {arm:g}"
    if factor == "compute":
        return f"{arm} compute" if arm != "as masters" else f"no autocast (was {ref})"
    if factor == "deterministic":
        return "deterministic algorithms " + ("on" if arm else "off")
    if factor == "update_noise":
        return f"update noise {arm:g}" if arm else "no update noise"
    return f"{LABELS[factor]} {ref} -> {arm}"


def twin_of(entry: Mapping[str, Any], reference: Mapping[str, Any]) -> bool:
    """Whether the arm is the reference under another name (a null twin: no factor differs)."""
    return not differences(entry, reference)


def arms_block(precisions: Mapping[str, Mapping[str, Any]], order: list[str]) -> dict[str, Any]:
    """stats.json ``arms``: per arm its description, factors, differences from the reference (the first of
    ``order``) with their names, and its kind: reference, single factor, bundle, or null twin."""

    def known(entry: Any) -> bool:
        return isinstance(entry, Mapping) and "param_dtype" in entry

    if not order or not known(precisions.get(order[0])):
        return {}  # arm order or control labels only (no config entries): nothing to describe
    ref = precisions[order[0]]
    out: dict[str, Any] = {}
    for arm in order:
        entry = precisions.get(arm)
        if not known(entry):
            out[arm] = {"kind": "unknown", "description": None, "differences": {}, "effects": []}
            continue
        diff = differences(entry, ref)
        kind = (
            "reference"
            if arm == order[0]
            else "null twin"
            if not diff
            else "single factor"
            if len(diff) == 1
            else "bundle"
        )
        out[arm] = {
            "kind": kind,
            "description": describe(entry),
            "factors": factors(entry),
            "differences": diff,
            "effects": [effect_name(k, v) for k, v in diff.items()],
        }
    return out


def name_conflicts(configs: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Arm names that mean different factors in different configs: one line per conflict.

    ``configs``: {config name: its precisions section}. control and seed_offset are compared too: a
    name that is a twin in one file and the reference in another is also two things."""
    seen: dict[str, tuple[str, dict[str, Any]]] = {}
    problems = []
    for cname, precisions in configs.items():
        for arm, entry in precisions.items():
            e = entry_with_defaults(entry)
            meaning = {**factors(entry), "seed_offset": e["seed_offset"], "control": e["control"]}
            if arm in seen and seen[arm][1] != meaning:
                other, before = seen[arm]
                diff = {k: (before[k], meaning[k]) for k in meaning if before[k] != meaning[k]}
                problems.append(f"arm {arm!r} means different things in {other} and {cname}: {diff}")
            seen.setdefault(arm, (cname, meaning))
    return problems
