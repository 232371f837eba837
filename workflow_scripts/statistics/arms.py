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
| sampler      | sampler_dtype               | the rollout sampler's own weights dtype, where it    |
|              |                             | holds its own (else "as trainer")                    |
| correction   | importance_correction       | the arm's IS correction mode (null: the train        |
|              |                             | section's setting, "as train")                       |

The table the report shows (``describe``) spells every dtype out; the factors compare only what an arm
sets apart from its masters, so a bf16 arm differs from fp32 in one factor, not three.

Where an arm's sampler-trainer gap comes from (``gap_source``; the report's mismatch table), from what
it samples and trains in (``sampler_setup`` of a run.json: its ``sampler`` entry {backend: hf | vllm,
dtype, trainer_dtype, copies, reason} when present, else the run's copy of its config, ``mode``, ``train``;
``arm_setup`` of a config entry: the sampler computes in ``sampler_dtype``, null meaning as the trainer
computes, autocast else param_dtype, with vLLM when ``train.use_vllm``):

| source        | when                                                                                 |
|---------------|--------------------------------------------------------------------------------------|
| numerics      | the sampler computes in another dtype than the loss forward, is another engine       |
|               | (vLLM: other kernels), or holds weights of its own (``sampler_dtype``, ``copies``:   |
|               | e.g. a bf16 copy beside bf16 autocast, which keeps some ops in fp32)                 |
| dropout       | dropout > 0: the loss forward runs in train mode, the sampler in eval mode           |
| both          | numerics and dropout                                                                 |
| none expected | same weights, dtype and kernels, eval mode: the gap must be 0 (and is, <= ZERO_GAP)  |
| unexplained   | none expected, but the measured mean gap is above ZERO_GAP                           |

seed_offset and control are not factors: an arm that differs from the reference only by its seeds is a
null twin (``twin_of``). Each difference from the reference gets a name a reader knows from the
experiment (``effect_name``): bf16 round-to-nearest masters are the "rounding stall" (updates below half a
bf16 spacing are lost), bf16 stochastic-rounding masters "precision noise" (unbiased rounding).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping
from typing import Any

from workflow_scripts.models.dtypes import dtype_name
from workflow_scripts.runtime import paths

FACTORS = (
    "masters",
    "compute",
    "dropout",
    "deterministic",
    "update_noise",
    "lm_head",
    "sampler",
    "correction",
)
LABELS = {
    "masters": "master weights",
    "compute": "compute dtype",
    "dropout": "dropout (loss forward)",
    "deterministic": "deterministic algorithms",
    "update_noise": "update noise",
    "lm_head": "LM head dtype",
    "sampler": "sampler weights",
    "correction": "importance-sampling correction",
}
ZERO_GAP = 1e-6  # nats: a mean |Δ log p| at or below it is no gap (identical numerics give exactly 0)


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
        "sampler": _sampler_factor(e),
        "correction": e["importance_correction"] or "as train",
    }


def _sampler_factor(e: Mapping[str, Any]) -> str:
    """The sampler factor: "as trainer", or "<dtype> weights" where it holds weights of its own."""
    own = e["sampler_dtype"]
    if own is None or (own == e["param_dtype"] and not e["autocast"]):
        return "as trainer"
    return f"{_short(own)} weights"


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
    sampler = (f"its own {_short(e['sampler_dtype'])} weights" if f["sampler"] != "as trainer"
               else compute) + ", eval mode"  # fmt: skip
    if f["correction"] != "as train":
        sampler += f", IS correction {f['correction']}"
    return {
        "masters": f["masters"],
        "compute": compute + (" (autocast)" if e["autocast"] else ""),
        "sampler": sampler,
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
    if factor == "sampler":
        if arm == "as trainer":
            return "sampler as trainer"
        return f"sampler-trainer mismatch ({str(arm).split()[0]} sampler)"
    if factor == "correction":
        return f"IS correction {arm}" if arm != "as train" else "IS correction as train"
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


# ------------------------------------------------------------------ where the sampler-trainer gap comes from


def _dtype(name: Any) -> str | None:
    return None if name is None else dtype_name(name)


def arm_setup(entry: Mapping[str, Any], train: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What an arm samples and trains in, from its precisions entry and the train section:
    {backend, dtype, trainer_dtype, dropout, copies} (copies: the sampler holds weights of its own,
    ``PrecisionMode.sampler_copies``)."""
    trainer = _dtype(entry.get("autocast") or entry.get("param_dtype"))
    own = _dtype(entry.get("sampler_dtype"))
    return {
        "backend": "vllm" if (train or {}).get("use_vllm") else "hf",
        "dtype": own or trainer,
        "trainer_dtype": trainer,
        "dropout": float(entry.get("dropout") or 0.0),
        "copies": own is not None and not (own == entry.get("param_dtype") and not entry.get("autocast")),
    }


def sampler_setup(record: Mapping[str, Any]) -> dict[str, Any] | None:
    """``arm_setup`` of one run.json: its ``sampler`` entry (what the run did) over its config copy
    (``mode``, ``train``); None when it has neither."""
    mode = record.get("mode")
    setup = (
        arm_setup(mode, record.get("train")) if isinstance(mode, Mapping) and "param_dtype" in mode else None
    )
    sampler = record.get("sampler")
    if not isinstance(sampler, Mapping):
        return setup
    setup = setup or {"dropout": 0.0, "copies": False}
    return {
        **setup,
        "backend": str(sampler.get("backend") or setup.get("backend") or "hf"),
        "dtype": _dtype(sampler.get("dtype")) or setup.get("dtype"),
        "trainer_dtype": _dtype(sampler.get("trainer_dtype")) or setup.get("trainer_dtype"),
        "copies": bool(sampler.get("copies", setup.get("copies"))),
    }


def gap_source(setup: Mapping[str, Any] | None, measured: float | None) -> str:
    """Where a run's gap comes from (module docstring): numerics, dropout, both, none expected, or
    unexplained (none expected, but the measured mean gap is above ``ZERO_GAP``); "n/a" without a setup."""
    if setup is None:
        return "n/a"
    numerics = (
        setup.get("backend") != "hf"
        or setup.get("dtype") != setup.get("trainer_dtype")
        or bool(setup.get("copies"))
    )
    dropout = float(setup.get("dropout") or 0.0) > 0
    if numerics or dropout:
        return "both" if numerics and dropout else "numerics" if numerics else "dropout"
    finite = measured is not None and not math.isnan(measured)
    return "unexplained" if finite and measured > ZERO_GAP else "none expected"


def describe_setup(setup: Mapping[str, Any] | None) -> str:
    """The sampler beside the trainer in a few words: "vLLM bf16 / fp32, dropout 0.1"."""
    if setup is None:
        return "n/a"
    engine = "vLLM" if setup.get("backend") == "vllm" else "HF"
    copy = " (own copy)" if setup.get("copies") else ""
    dropout = float(setup.get("dropout") or 0.0)
    text = f"{engine} {_short(setup.get('dtype'))}{copy} / {_short(setup.get('trainer_dtype'))}"
    return text + (f", dropout {dropout:g}" if dropout else "")


def run_setups(records: Iterable[Any]) -> dict[str, dict[str, Any] | None]:
    """run name -> ``sampler_setup`` of every run.json among ``records`` (others, base.json, skipped)."""
    out: dict[str, dict[str, Any] | None] = {}
    for record in records:
        if isinstance(record, Mapping) and "precision" in record and "seed" in record:
            name = paths.run_name(record["precision"], record["seed"], int(record.get("repeat") or 1))
            out[name] = sampler_setup(record)
    return out
