"""The GPU memory plan: what each arm's train job and the evaluate job hold per GPU, from the config alone.

Computed before any job (the config check of ``snakemake -n``), so a config that cannot fit is refused in
seconds, not hours into a queue. Every term is an estimate of the largest allocation of its kind; the
GPU smoke check compares the sum with the measured peak where a GPU is lent.

| term (per GPU)      | bytes                                                                             |
|---------------------|-----------------------------------------------------------------------------------|
| weights             | P x param bytes (/ G under FSDP: sharded over the job's G GPUs)                   |
| gradients           | P x param bytes (/ G under FSDP)                                                  |
| optimizer           | 2 x P x param bytes (AdamW's two states in the masters' dtype, the contract) (/G) |
| activations         | per layer 17 x b x T x h x compute bytes (Korthikanti et al. 2022, with fused     |
|                     | attention: 34 bytes a token and hidden unit in 16 bits); with checkpointing one   |
|                     | saved input per layer (b x T x h x compute bytes) + one layer recomputed          |
| logits              | b x C x V x (compute bytes + 4): the completion tokens' logits and their fp32      |
|                     | log-softmax (TRL scores only the completion: logits_to_keep)                       |
| reference (KL log)  | P x model.dtype bytes on the logging rank (/ G on every rank under FSDP: sharded) |
| vLLM (colocated)    | train.vllm.gpu_memory_utilization x GPU memory: vLLM reserves its share up front;  |
|                     | with train.vllm.sleep_mode the engine frees it while the trainer computes, so the |
|                     | total holds the larger of it and activations + logits, not their sum              |

P parameters (from the model's dimensions), b completions per micro-batch and process
(prompts_per_step x num_generations / (gradient_accumulation_steps x processes)), T tokens a sequence
(train.vllm.max_model_len, else the model's positions), C = train.max_completion_length, h hidden size,
V vocabulary. Inside its share the engine needs its weights (P x rollout bytes) and a KV cache for at
least one sequence of T tokens (2 x layers x kv heads x head dim x T x rollout bytes): checked too.
Not planned yet: the evaluate and base_model jobs (one GPU each, the model twice at most).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

GiB = 1 << 30
BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
KEYS_THAT_FIT = (
    "resources.train.gpus (with train.distributed.strategy: fsdp, which shards weights, gradients and "
    "optimizer states)",
    "train.activation_checkpointing: true",
    "train.gradient_accumulation_steps (fewer completions per micro-batch)",
    "train.vllm.gpu_memory_utilization / train.vllm.max_model_len",
    "train.vllm.sleep_mode: true (the engine frees its share while the trainer computes)",
)


@dataclass(frozen=True)
class Dims:
    """A decoder's dimensions (Llama / Qwen2 layout: q, k, v, o projections, a gated MLP, two norms)."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    positions: int
    tied: bool = False
    qkv_bias: bool = False

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def parameters(self) -> int:
        kv = self.kv_heads * self.head_dim
        attention = 2 * self.hidden * self.hidden + 2 * self.hidden * kv
        bias = (self.hidden + 2 * kv) if self.qkv_bias else 0
        layer = attention + bias + 3 * self.hidden * self.intermediate + 2 * self.hidden
        embeddings = self.vocab * self.hidden * (1 if self.tied else 2)
        return self.layers * layer + embeddings + self.hidden


def dims_from_hf_config(cfg: Mapping) -> Dims:
    """Dims from a transformers config.json (Llama, Qwen2 and their kin)."""
    return Dims(
        layers=int(cfg["num_hidden_layers"]), hidden=int(cfg["hidden_size"]),
        heads=int(cfg["num_attention_heads"]),
        kv_heads=int(cfg.get("num_key_value_heads") or cfg["num_attention_heads"]),
        intermediate=int(cfg["intermediate_size"]), vocab=int(cfg["vocab_size"]),
        positions=int(cfg.get("max_position_embeddings") or 4096),
        tied=bool(cfg.get("tie_word_embeddings", False)),
        qkv_bias=cfg.get("model_type") == "qwen2" or bool(cfg.get("attention_bias", False)),
    )  # fmt: skip


def model_dims(model: Mapping) -> Dims | None:
    """The base model's dimensions: ``model.architecture`` (a config.json's keys, for a hub id that is
    not on this machine), else a local folder's config.json; None when neither is there."""
    if model.get("architecture"):
        return dims_from_hf_config(model["architecture"])
    source = Path(str(model["source"])).expanduser()
    if (source / "config.json").is_file():
        return dims_from_hf_config(json.loads((source / "config.json").read_text()))
    return None


def _gib(n: float) -> float:
    return round(n / GiB, 1)


def train_terms(dims: Dims, mode: Mapping, train: Mapping, model_dtype: str, processes: int,
                gpu_gib: float | None) -> tuple[dict[str, float], int, int]:  # fmt: skip
    """One arm's train job per GPU in bytes, term by term (the module table); and b and T."""
    p = dims.parameters
    param = BYTES[mode["param_dtype"]]
    compute = BYTES[mode.get("autocast") or mode["param_dtype"]]
    shard = processes if train["distributed"]["strategy"] == "fsdp" else 1
    b = max(1, train["prompts_per_step"] * train["num_generations"]
            // (train["gradient_accumulation_steps"] * processes))  # fmt: skip
    tokens = train["vllm"]["max_model_len"] or dims.positions
    layer = 17 * b * tokens * dims.hidden * compute
    if train["activation_checkpointing"]:
        activations = dims.layers * b * tokens * dims.hidden * compute + layer
    else:
        activations = dims.layers * layer
    terms = {
        "weights": p * param / shard,
        "gradients": p * param / shard,
        "optimizer": 2 * p * param / shard,
        "activations": activations,
        "logits": b * train["max_completion_length"] * dims.vocab * (compute + 4),
        "reference": p * BYTES[model_dtype] / shard,
        "vllm": train["vllm"]["gpu_memory_utilization"] * (gpu_gib or 0) * GiB if train["use_vllm"] else 0,
    }
    return terms, b, tokens


def train_plan(dims: Dims, mode: Mapping, train: Mapping, model_dtype: str, processes: int,
               gpu_gib: float | None) -> dict:  # fmt: skip
    """One arm's train job per GPU in GiB (``train_terms``), with the total and what the engine needs."""
    terms, b, tokens = train_terms(dims, mode, train, model_dtype, processes, gpu_gib)
    plan = {k: _gib(v) for k, v in terms.items()}
    total = sum(terms.values())
    if train["use_vllm"] and train["vllm"].get("sleep_mode"):  # the engine sleeps while the trainer computes
        phase = terms["activations"] + terms["logits"]
        total += max(terms["vllm"], phase) - terms["vllm"] - phase
    plan.update(total=_gib(total), micro_batch=b, tokens=tokens, parameters=dims.parameters)
    if train["use_vllm"]:
        plan["vllm_needs"] = engine_needs(dims, mode.get("autocast") or mode["param_dtype"], tokens)
    return plan


def engine_needs(dims: Dims, dtype: str, tokens: int) -> float:
    """GiB a vLLM engine needs at least: its weights and the KV cache of one sequence of ``tokens``."""
    kv = 2 * dims.layers * dims.kv_heads * dims.head_dim * tokens * BYTES[dtype]
    return _gib(dims.parameters * BYTES[dtype] + kv)


def plans(config: Mapping) -> dict | None:
    """{arm: train plan} for a config whose train job has GPUs and whose model's dimensions are known."""
    from workflow_scripts.runtime.resources import rule_resources, train_processes

    gpus = rule_resources(config, "train")["gpus"]
    dims = model_dims(config["model"])
    if not gpus or dims is None:
        return None
    gpu_gib = (config.get("gpu") or {}).get("memory_gb")
    processes, dtype = train_processes(config), config["model"]["dtype"]
    return {
        arm: train_plan(dims, mode, config["train"], dtype, processes, gpu_gib)
        for arm, mode in config["precisions"].items()
    }


def problems(config: Mapping) -> Iterator[tuple[str, str]]:
    """An arm whose plan exceeds ``gpu.memory_gb`` (or whose engine cannot start in its share)."""
    planned = plans(config)
    gpu_gib = (config.get("gpu") or {}).get("memory_gb")
    if not planned or not gpu_gib:
        return
    for arm, plan in planned.items():
        if plan["total"] > gpu_gib:
            short = round(plan["total"] - gpu_gib, 1)
            yield (
                "resources.train.gpus",
                f"arm {arm!r} needs {plan['total']} GiB per GPU, {short} GiB more than gpu.memory_gb "
                f"({gpu_gib}): {format_terms(plan)}. Keys that lower it: " + "; ".join(KEYS_THAT_FIT),
            )
        share = config["train"]["vllm"]["gpu_memory_utilization"] * gpu_gib
        if "vllm_needs" in plan and plan["vllm_needs"] > share:
            yield (
                "train.vllm.gpu_memory_utilization",
                f"arm {arm!r}: the colocated engine needs {plan['vllm_needs']} GiB (weights + one "
                f"sequence's KV cache) but its share is {round(share, 1)} GiB",
            )


def format_terms(plan: Mapping) -> str:
    names = ("weights", "gradients", "optimizer", "activations", "logits", "reference", "vllm")
    return ", ".join(f"{n} {plan[n]}" for n in names)


def table(config: Mapping) -> str:
    """The plan as the text ``snakemake -n`` prints (empty for a CPU config)."""
    planned = plans(config)
    if not planned:
        return ""
    gpu = (config.get("gpu") or {}).get("memory_gb")
    names = ("weights", "gradients", "optimizer", "activations", "logits", "reference", "vllm", "total")
    lines = [f"memory plan per GPU of the train job (GiB; gpu.memory_gb: {gpu}):",
             "| arm | " + " | ".join(names) + " |"]  # fmt: skip
    for arm, p in planned.items():
        lines.append(f"| {arm} | " + " | ".join(str(p[k]) for k in names) + " |")
    first = next(iter(planned.values()))
    lines.append(f"({first['parameters'] / 1e9:.2f}B parameters, {first['micro_batch']} completions x "
                 f"{first['tokens']} tokens per micro-batch and GPU)")  # fmt: skip
    return "\n".join(lines)


