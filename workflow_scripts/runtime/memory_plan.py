"""The GPU memory plan: what each arm's train job holds per GPU, and what its colocated vLLM engine needs
to start and to generate, from the config alone.

Computed before any job (the config check of ``snakemake -n``), so a config that cannot fit is refused in
seconds, not hours into a queue. Every term is an estimate of the largest allocation of its kind, summed
(the peaks of different phases do not all coincide: the sum is an upper bound by design). The GPU smoke
check (bench/gpu_smoke.py, ``memory_plan.<arm>``) compares it with each arm's measured peak, within 15%,
at the longest sequence the run's data can make (``sequence_tokens``). Measured on an H200 (HF sampler,
358M parameters, 4 arms): the trainer's terms came within 2-8% of torch's reserved peak at that length,
and 1.9-2.6x above it at the config's T (the model's 128 positions against sequences of 39 tokens): T is
the worst case, and activations scale with it. The device's usable memory is what it reports
(``gpu.reported_gib``, ~0.99 x the nominal size: 79.2 GiB on an "80 GB" card), not its nominal size.

The train job, per GPU (P parameters, p param bytes, c compute bytes, G = processes under FSDP else 1):

| term        | bytes                                                                                     |
|-------------|-------------------------------------------------------------------------------------------|
| weights     | P x p / G                                                                                 |
| gradients   | P x p / G with train.distributed.gradient_sync every_micro_batch (``gradient_sync``); with |
|             | last_micro_batch under FSDP, P x p: every GPU holds the whole unsharded gradient until the |
|             | last micro-batch (``gradient_bytes`` cites the source)                                     |
| optimizer   | 2 x P x p / G (AdamW's two states in the masters' dtype, the contract)                    |
| reference   | P x model.dtype bytes / G (the KL log's base model, sharded like the policy)              |
| sampler_copy| the HF sampler's own copy of the policy (an arm with its own sampler_dtype s, no vLLM):   |
|             | P x s; else 0                                                                             |
| gathered    | FSDP2's working set: the root unit (embeddings + LM head + final norm; the decoder layers |
|             | are the wrapped units) stays gathered through forward and backward and its unsharded      |
|             | gradients live until the root's reduce-scatter at the end of backward: 2 x root x p; two  |
|             | decoder layers gathered (the one computing, the one prefetched) and two layers' unsharded |
|             | gradients (the one computed, the one in its reduce-scatter): 4 x layer x p. DDP with >1   |
|             | process: its gradient buckets, P x p. One process: 0                                     |
| activations | with checkpointing: one saved input per layer (L x b x T x h x c) + one recomputed block;  |
|             | without: every block. A SwiGLU/GQA block saves 8h + 2kv + 4I values a token (two RMSNorms |
|             | 3h each: input, normalised, weighted; q h, k and v kv each, attention output h; gate, up, |
|             | SiLU(gate), their product I each) and its backward holds one more I-wide gradient:        |
|             | ``block_values`` (Qwen2.5-7B: 34.7 x h, not Korthikanti's 17 for a 4h GeLU MLP)           |
| logprob_head| TRL 1.16's chunked head (``add_fused_lm_head``; no full logits, checked at train start by |
|             | ``grpo_trainer.check_chunked_logprob_head``): one [4096, 32768] logits tile in c, the     |
|             | scored hidden states (N x h x c) and their fp32 gradient (N x h x 4), N = b x C; with     |
|             | 16-bit masters the head's fp32 gradient accumulator (V x h x 4) beside its cast copy      |
| context     | CUDA context, cuBLAS workspaces (1 GiB) + NCCL buffers with >1 process (1 GiB)            |
| fragmentation | 8% of the trainer's allocator terms above (the caching allocator's split blocks)        |
| vllm        | the engine's share: gpu_memory_utilization x the reported total (with kv_cache_gb: its    |
|             | floor without KV + kv_cache_gb); with train.vllm.sleep_mode the engine frees it while the |
|             | trainer computes, so the total holds the larger of it and the trainer's transient terms   |
|             | (gathered + activations + logprob_head, with their fragmentation) plus what the sleeping  |
|             | engine keeps (``residue``: its CUDA-graph pool and non-torch memory), not their sum       |

b completions per micro-batch and process (prompts_per_step x num_generations / (gradient_accumulation_steps
x processes)), T tokens a sequence (``sequence_tokens`` where the caller knows the data's longest prompt +
completion, else train.vllm.max_model_len, else the model's positions), C =
train.max_completion_length, h hidden size, kv = kv heads x head dim, I intermediate size, V vocabulary.

The colocated engine's floor, per GPU (t = train.vllm.tensor_parallel_size, e = the arm's sampler bytes:
sampler_dtype, else autocast, else param_dtype):

| term       | bytes                                                                                       |
|------------|---------------------------------------------------------------------------------------------|
| weights    | P x e / t (vLLM shards every linear layer, the embeddings and the LM head over TP)          |
| profiling  | vLLM's start-up profile: a forward over max_num_batched_tokens (M) tokens, M x (4h + (h +    |
|            | 2kv + 3I) / t) x e, plus a sampler pass over min(max_num_seqs, M) x V logits: the logits in |
|            | e, their fp32 copy, probabilities and the top-k/top-p sort (e + 12 bytes an entry)          |
| graphs     | CUDA-graph pool, 1 GiB, unless enforce_eager                                                |
| non_torch  | memory outside torch (cuBLAS/NCCL workspaces of the engine): 0.5 GiB, 1 GiB with TP         |
| kv         | min_concurrent_seqs sequences of T tokens: 2 x L x kv x T x e / t per sequence              |

vLLM gives the KV cache what its share leaves (share - the rest); the plan requires that to hold
``train.vllm.min_concurrent_seqs`` full-length sequences, so rollouts stay batched (vLLM itself refuses
only below one). max_num_seqs / max_num_batched_tokens default to what TRL 1.16 passes (per-device batch
x t x steps_per_generation; 4096). Not planned yet: the evaluate and base_model jobs (one GPU each, the
model twice at most).

Long on purpose: every memory term and its source in one place, so the plan and its refusal read together.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

GiB = 1 << 30
BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
REPORTED_PER_NOMINAL = 0.99  # torch.cuda.mem_get_info's total / the nominal size: 79.2 of "80" GiB (H100)
CUDA_CONTEXT = 1 * GiB  # context, cuBLAS workspaces, kernels loaded: 0.5-1 GiB on Hopper
NCCL_BUFFERS = 1 * GiB  # NCCL communicators' buffers (FSDP/DDP collectives): 0.5-1 GiB
FRAGMENTATION = 0.08  # the caching allocator's blocks split by mixed sizes: 5-10% of what it holds
LOGPROB_TOKEN_CHUNK = 4096  # trl/kernels/chunked_logprob.py TOKEN_CHUNK_SIZE (TRL 1.16)
LOGPROB_VOCAB_CHUNK = 32768  # trl/trainer/utils.py _CHUNKED_LOGPROB_CHUNK_SIZE (TRL 1.16)
TRL_MAX_NUM_BATCHED_TOKENS = 4096  # what TRL 1.16's colocate mode passes to vllm.LLM
ENGINE_GRAPHS = 1 * GiB  # vLLM's CUDA-graph pool for a 1.5-7B model: 0.5-1.5 GiB in its start-up logs
ENGINE_NON_TORCH = GiB // 2  # the engine's own non-torch memory; doubled under TP (custom all-reduce)
# What a sleeping engine keeps (``residue``). vLLM 0.30's sleep (v1/worker/gpu_worker.py:245-280,
# device_allocator/sleep_mode_backend.py CuMemBackend.suspend) frees only the CuMem pool's allocations,
# tagged "weights" (load_model, gpu_worker.py:502) and "kv_cache" (gpu_worker.py:756); the CUDA-graph pool
# is captured outside that pool (capture_model, gpu_worker.py:816) and NCCL communicators keep their
# buffers unless enable_nccl_comm_suspend (config/model.py:350, default False). Measured by others:
# vllm-project/vllm#56373 ("level-1 cuMem sleep ... leaves graph executables and native CUDA graph pools
# resident"), #47654 (1.4 GiB graph pool, TP 8), #51485 (NCCL buffers ~1 GiB a rank at TP 4, kept by
# default). So the residue is the engine's graphs + non_torch terms (ENGINE_GRAPHS, ENGINE_NON_TORCH).
RESIDUE_TERMS = ("graphs", "non_torch")
GRADIENT_NOTES = {  # the plan's gradient term per accumulation mode (``gradient_mode``), as the table says it
    "sharded": "gradients: sharded, P x bytes / processes (train.distributed.gradient_sync: "
    "every_micro_batch, a reduce-scatter each micro-batch)",
    "unsharded": "gradients: UNSHARDED, P x bytes on every GPU (train.distributed.gradient_sync: "
    "last_micro_batch, one reduce-scatter an optimizer step)",
    "replicated": "gradients: P x bytes on every GPU (no FSDP: each process holds the whole model)",
}
GRADIENT_SYNC_DEFAULT = "every_micro_batch"
SAMPLER_EXTRA_BYTES = 12  # per logit: fp32 copy (4) + probabilities (4) + top-k/top-p sort values (4)
KEYS_THAT_FIT = (
    "resources.train.gpus (with train.distributed.strategy: fsdp, which shards weights, gradients and "
    "optimizer states)",
    "train.activation_checkpointing: true",
    "train.gradient_accumulation_steps (fewer completions per micro-batch)",
    "train.distributed.gradient_sync: every_micro_batch (under fsdp: gradients stay sharded during "
    "accumulation)",
    "train.vllm.gpu_memory_utilization / train.vllm.max_model_len",
    "train.vllm.sleep_mode: true (the engine frees its share while the trainer computes)",
)
KEYS_FOR_THE_ENGINE = (
    "train.vllm.gpu_memory_utilization (a larger share; with train.vllm.sleep_mode: true the trainer's "
    "activations reuse it)",
    "train.vllm.tensor_parallel_size (shards the engine's weights and KV cache over GPUs)",
    "train.vllm.max_model_len (shorter sequences)",
    "train.vllm.max_num_seqs / max_num_batched_tokens (a smaller start-up profile)",
    "train.vllm.min_concurrent_seqs (fewer sequences at once: slower rollouts)",
)
TRAIN_TERMS = ("weights", "gradients", "optimizer", "reference", "sampler_copy", "gathered", "activations",
               "logprob_head", "context", "fragmentation", "vllm")  # fmt: skip
TRANSIENT = ("gathered", "activations", "logprob_head")  # freed between steps: the sleeping engine's room
ENGINE_TERMS = ("weights", "profiling", "graphs", "non_torch", "kv")


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
    def kv_dim(self) -> int:
        """Width of K (and of V): kv heads x head dim (GQA: smaller than hidden)."""
        return self.kv_heads * self.head_dim

    @property
    def layer_parameters(self) -> int:
        """One decoder layer: q, k, v, o (+ q/k/v biases), gate, up, down, two norms (FSDP2's unit)."""
        kv = self.kv_dim
        attention = 2 * self.hidden * self.hidden + 2 * self.hidden * kv
        bias = (self.hidden + 2 * kv) if self.qkv_bias else 0
        return attention + bias + 3 * self.hidden * self.intermediate + 2 * self.hidden

    @property
    def root_parameters(self) -> int:
        """What is not in a decoder layer: embeddings, LM head (once when tied), final norm (FSDP2's
        root unit under TRANSFORMER_BASED_WRAP)."""
        return self.vocab * self.hidden * (1 if self.tied else 2) + self.hidden

    @property
    def parameters(self) -> int:
        return self.layers * self.layer_parameters + self.root_parameters


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


def reported_gib(gpu: Mapping | None) -> float | None:
    """The device's total as CUDA reports it (what vLLM multiplies its share by), GiB: gpu.reported_gib,
    else 0.99 x gpu.memory_gb (the nominal size); None without a GPU size."""
    gpu = gpu or {}
    if gpu.get("reported_gib"):
        return float(gpu["reported_gib"])
    return REPORTED_PER_NOMINAL * gpu["memory_gb"] if gpu.get("memory_gb") else None


def block_values(dims: Dims) -> int:
    """Values a token that one SwiGLU/GQA decoder block holds while it is recomputed and run backward.

    Saved for backward: two RMSNorms (input, normalised, weighted: 3h each), q (h), k and v (kv each),
    the attention output (h); gate, up, SiLU(gate) and their product (I each). Its backward then holds
    one more I-wide gradient (of the product, beside gate, up and SiLU). Korthikanti et al.'s 17h a token
    is this count for a 4h GeLU MLP with full multi-head attention; Qwen2.5-7B (I = 5.3h, kv = h/7)
    gives 34.7h."""
    return 8 * dims.hidden + 2 * dims.kv_dim + 5 * dims.intermediate


def micro_batch(train: Mapping, processes: int) -> int:
    """Completions per micro-batch and process (GRPOConfig's per_device_train_batch_size)."""
    return max(1, train["prompts_per_step"] * train["num_generations"]
               // (train["gradient_accumulation_steps"] * processes))  # fmt: skip


def gradient_sync(train: Mapping) -> str:
    """train.distributed.gradient_sync (the schema's default, every_micro_batch, when absent)."""
    return str((train.get("distributed") or {}).get("gradient_sync") or GRADIENT_SYNC_DEFAULT)


def gradient_mode(train: Mapping, processes: int) -> str:
    """How the plan counts gradients: "sharded" (FSDP reduce-scatters every micro-batch), "unsharded"
    (FSDP with last_micro_batch: the whole gradient on every GPU) or "replicated" (DDP / one process)."""
    if train["distributed"]["strategy"] != "fsdp" or processes < 2:
        return "replicated"
    return "sharded" if gradient_sync(train) == "every_micro_batch" else "unsharded"


def gradient_bytes(parameters: int, param: int, train: Mapping, processes: int) -> float:
    """Gradients per GPU during accumulation.

    Under FSDP2, transformers 5.24 runs all but the last micro-batch in ``accelerator.no_sync``
    (trainer.py:1904-1915) unless ``sync_each_batch``; accelerate 1.15's no_sync under FSDP2 is
    ``set_requires_gradient_sync(False)`` (accelerator.py:1166-1171); FSDP2 then keeps each unsharded
    gradient (torch 2.13 distributed/fsdp/_fully_shard/_fsdp_param_group.py:607-612) until the last
    micro-batch's reduce-scatter: P x p on every GPU. With every_micro_batch (the default; grpo_config
    passes ``sync_each_batch``) each micro-batch is reduce-scattered and only the shard, P x p / G, stays.

    Why every_micro_batch: on 2 gloo processes (CPU, a 5.05M-parameter Qwen2, 4 micro-batches; the
    transformers Trainer with accelerate's FSDP2) the no_sync path held 19.3 MiB of unsharded fp32
    gradients per rank where every_micro_batch held its 9.6 MiB shard, for 10-30% more time a micro-batch
    (gloo on 2 shared cores, where the reduce-scatter is not overlapped). On the paper's 8 GPUs the
    difference is 24.9 GiB a GPU for the 7B fp32 arm (28.4 x 7/8) and 12.4 for bf16, against one more
    reduce-scatter of P x p x 7/8 a micro-batch (~25 GiB over NVLink's ~370 GB/s of bus bandwidth:
    ~0.07 s, which FSDP2 overlaps with the backward of the layers before, beside a micro-batch's ~8 s of
    fp32 compute). Both modes sum the same gradients in the arm's dtype, in another order only."""
    if gradient_mode(train, processes) == "sharded":
        return parameters * param / processes
    return parameters * param


def gathered_bytes(dims: Dims, param: int, strategy: str, processes: int) -> float:
    """FSDP2's working set beyond the shards (root unit gathered + its unsharded gradients, two layers
    gathered + two layers' unsharded gradients); DDP's gradient buckets; nothing in one process."""
    if strategy == "fsdp" and processes > 1:
        return (2 * dims.root_parameters + 4 * dims.layer_parameters) * param
    if processes > 1:
        return dims.parameters * param  # DDP's flat buckets beside .grad (gradient_as_bucket_view off)
    return 0


def activation_bytes(dims: Dims, b: int, tokens: int, compute: int, checkpointing: bool) -> float:
    """Saved activations of one micro-batch (the module table's ``activations``)."""
    per_token = dims.layers * dims.hidden + block_values(dims) if checkpointing else (
        dims.layers * (block_values(dims) - dims.intermediate) + dims.intermediate)  # fmt: skip
    return per_token * b * tokens * compute


def logprob_head_bytes(dims: Dims, b: int, completion: int, compute: int, param: int) -> float:
    """TRL 1.16's chunked log-prob head (no [N, V] logits): one logits tile, the scored hidden states
    and their fp32 gradient; with 16-bit masters also the head's fp32 gradient accumulator."""
    scored = b * completion
    tile = min(scored, LOGPROB_TOKEN_CHUNK) * min(dims.vocab, LOGPROB_VOCAB_CHUNK) * compute
    accumulator = dims.vocab * dims.hidden * 4 if param != 4 else 0  # fp32: it is the gradient itself
    return tile + scored * dims.hidden * (compute + 4) + accumulator


def context_bytes(processes: int, tensor_parallel: int = 1) -> float:
    """CUDA context (+ NCCL buffers when the job talks to other GPUs)."""
    return CUDA_CONTEXT + (NCCL_BUFFERS if processes > 1 or tensor_parallel > 1 else 0)


def engine_settings(train: Mapping) -> dict:
    """train.vllm with the schema's defaults for the engine keys a partial mapping lacks."""
    given = train["vllm"]
    return {
        "gpu_memory_utilization": given["gpu_memory_utilization"],
        "max_model_len": given.get("max_model_len"),
        "kv_cache_gb": given.get("kv_cache_gb"),
        "enforce_eager": bool(given.get("enforce_eager", False)),
        "sleep_mode": bool(given.get("sleep_mode", False)),
        "tensor_parallel_size": int(given.get("tensor_parallel_size") or 1),
        "max_num_seqs": given.get("max_num_seqs"),
        "max_num_batched_tokens": given.get("max_num_batched_tokens"),
        "min_concurrent_seqs": int(given.get("min_concurrent_seqs") or 32),
    }


def engine_batch_limits(train: Mapping, processes: int) -> tuple[int, int]:
    """(max_num_seqs, max_num_batched_tokens) the engine gets: the config's, else TRL 1.16's (the
    per-device batch x tensor-parallel size x steps_per_generation; 4096)."""
    engine = engine_settings(train)
    seqs = engine["max_num_seqs"] or (
        micro_batch(train, processes) * engine["tensor_parallel_size"] * train["steps_per_generation"]
    )
    return int(seqs), int(engine["max_num_batched_tokens"] or TRL_MAX_NUM_BATCHED_TOKENS)


def kv_bytes_per_token(dims: Dims, dtype: str, tensor_parallel: int = 1) -> float:
    """K and V of one token in every layer, per GPU (kv heads split over TP, replicated below one each)."""
    heads = max(1.0, dims.kv_heads / tensor_parallel)
    return 2 * dims.layers * heads * dims.head_dim * BYTES[dtype]


def engine_terms(dims: Dims, dtype: str, train: Mapping, processes: int) -> dict[str, float]:
    """The colocated engine's floor per GPU in bytes, term by term (the module's engine table)."""
    engine = engine_settings(train)
    t, e = engine["tensor_parallel_size"], BYTES[dtype]
    seqs, batched = engine_batch_limits(train, processes)
    forward = batched * (4 * dims.hidden + (dims.hidden + 2 * dims.kv_dim + 3 * dims.intermediate) / t) * e
    sampler = min(seqs, batched) * dims.vocab * (e + SAMPLER_EXTRA_BYTES)
    tokens = engine["max_model_len"] or dims.positions
    return {
        "weights": dims.parameters * e / t,
        "profiling": forward + sampler,
        "graphs": 0 if engine["enforce_eager"] else ENGINE_GRAPHS,
        "non_torch": ENGINE_NON_TORCH * (2 if t > 1 else 1),
        "kv": engine["min_concurrent_seqs"] * tokens * kv_bytes_per_token(dims, dtype, t),
    }


def engine_plan(dims: Dims, dtype: str, train: Mapping, processes: int, gpu_total_gib: float | None) -> dict:
    """The engine's floor in GiB (``engine_terms``), its share of the reported total and how many
    full-length sequences the KV cache left by that share holds."""
    terms = engine_terms(dims, dtype, train, processes)
    engine = engine_settings(train)
    tokens = engine["max_model_len"] or dims.positions
    fixed = sum(v for k, v in terms.items() if k != "kv")
    if engine["kv_cache_gb"] is not None:
        share = fixed + engine["kv_cache_gb"] * GiB
    else:
        share = engine["gpu_memory_utilization"] * (gpu_total_gib or 0) * GiB
    per_sequence = tokens * kv_bytes_per_token(dims, dtype, engine["tensor_parallel_size"])
    plan = {k: _gib(v) for k, v in terms.items()}
    plan.update(floor=_gib(fixed + terms["kv"]), share=_gib(share), dtype=dtype,
                sequences=engine["min_concurrent_seqs"], tokens=tokens,
                fits_sequences=max(0, int((share - fixed) // per_sequence)), floor_bytes=fixed + terms["kv"],
                share_bytes=share)  # fmt: skip
    return plan


def sampler_dtype(mode: Mapping) -> str:
    """The dtype an arm samples in (``PrecisionMode.sampler_compute_dtype``, from its config entry)."""
    return mode.get("sampler_dtype") or mode.get("autocast") or mode["param_dtype"]


def copies_sampler(mode: Mapping) -> bool:
    """Whether the HF sampler holds its own copy (``PrecisionMode.sampler_copies``)."""
    own = mode.get("sampler_dtype")
    return own is not None and not (own == mode["param_dtype"] and not mode.get("autocast"))


def train_terms(dims: Dims, mode: Mapping, train: Mapping, model_dtype: str, processes: int,
                gpu_gib: float | None, sequence_tokens: int | None = None,
                ) -> tuple[dict[str, float], int, int]:  # fmt: skip
    """One arm's train job per GPU in bytes, term by term (the module table); and b and T.

    ``gpu_gib``: the device's reported total (``reported_gib``), which the engine's share multiplies;
    ``sequence_tokens``: T for the trainer's activations (the engine keeps its own max_model_len)."""
    p = dims.parameters
    param = BYTES[mode["param_dtype"]]
    compute = BYTES[mode.get("autocast") or mode["param_dtype"]]
    strategy = train["distributed"]["strategy"]
    shard = processes if strategy == "fsdp" else 1
    b = micro_batch(train, processes)
    tokens = sequence_tokens or train["vllm"]["max_model_len"] or dims.positions
    own_copy = copies_sampler(mode) and not train["use_vllm"]
    terms = {
        "weights": p * param / shard,
        "gradients": gradient_bytes(p, param, train, processes),
        "optimizer": 2 * p * param / shard,
        "reference": p * BYTES[model_dtype] / shard,
        "sampler_copy": p * BYTES[sampler_dtype(mode)] if own_copy else 0,
        "gathered": gathered_bytes(dims, param, strategy, processes),
        "activations": activation_bytes(dims, b, tokens, compute, bool(train["activation_checkpointing"])),
        "logprob_head": logprob_head_bytes(dims, b, train["max_completion_length"], compute, param),
    }
    terms["fragmentation"] = FRAGMENTATION * sum(terms.values())
    tp = engine_settings(train)["tensor_parallel_size"] if train["use_vllm"] else 1
    terms["context"] = context_bytes(processes, tp)
    terms["vllm"] = 0
    if train["use_vllm"]:
        terms["vllm"] = engine_plan(dims, sampler_dtype(mode), train, processes, gpu_gib)["share_bytes"]
    return {k: terms[k] for k in TRAIN_TERMS}, b, tokens


def residue_bytes(dims: Dims, dtype: str, train: Mapping, processes: int) -> float:
    """What the colocated engine keeps on the GPU while it sleeps: its CUDA-graph pool and non-torch
    memory (``RESIDUE_TERMS``; the constants' comment cites vLLM 0.30's source). 0 without an engine."""
    if not train["use_vllm"]:
        return 0
    terms = engine_terms(dims, dtype, train, processes)
    return sum(terms[k] for k in RESIDUE_TERMS)


def train_total(terms: Mapping[str, float], sleep_mode: bool, residue: float = 0) -> float:
    """The terms' sum; with a sleeping engine the larger of the engine's share and what the trainer
    computes beside the sleeping engine (its transient terms with their fragmentation + the engine's
    ``residue``) instead of both."""
    total = sum(terms.values())
    if sleep_mode and terms["vllm"]:
        transient = sum(terms[k] for k in TRANSIENT) * (1 + FRAGMENTATION)
        total += max(terms["vllm"], transient + residue) - terms["vllm"] - transient
    return total


def train_plan(dims: Dims, mode: Mapping, train: Mapping, model_dtype: str, processes: int,
               gpu_gib: float | None, sequence_tokens: int | None = None) -> dict:  # fmt: skip
    """One arm's train job per GPU in GiB (``train_terms``), its total and its engine's floor."""
    terms, b, tokens = train_terms(dims, mode, train, model_dtype, processes, gpu_gib, sequence_tokens)
    plan: dict = {k: _gib(v) for k, v in terms.items()}
    sleep = bool(train["use_vllm"] and engine_settings(train)["sleep_mode"])
    residue = residue_bytes(dims, sampler_dtype(mode), train, processes)
    plan.update(total=_gib(train_total(terms, sleep, residue)), micro_batch=b, tokens=tokens,
                parameters=dims.parameters, gradient_mode=gradient_mode(train, processes),
                residue=_gib(residue) if sleep else 0.0)  # fmt: skip
    if train["use_vllm"]:
        plan["engine"] = engine_plan(dims, sampler_dtype(mode), train, processes, gpu_gib)
    return plan


def plans(config: Mapping) -> dict | None:
    """{arm: train plan} for a config whose train job has GPUs and whose model's dimensions are known."""
    from workflow_scripts.runtime.resources import rule_resources, train_processes

    gpus = rule_resources(config, "train")["gpus"]
    dims = model_dims(config["model"])
    if not gpus or dims is None:
        return None
    total = reported_gib(config.get("gpu"))
    processes, dtype = train_processes(config), config["model"]["dtype"]
    return {
        arm: train_plan(dims, mode, config["train"], dtype, processes, total)
        for arm, mode in config["precisions"].items()
    }


def engine_problems(arm: str, engine: Mapping) -> Iterator[tuple[str, str]]:
    """The engine's floor above its share: vLLM would not start, or would generate nearly serially."""
    if engine["floor_bytes"] <= engine["share_bytes"]:
        return
    yield (
        "train.vllm.gpu_memory_utilization",
        f"arm {arm!r}: the colocated vLLM engine ({engine['dtype']}) needs {engine['floor']} GiB per GPU "
        f"but its share is {engine['share']} GiB ({format_engine(engine)}); that share's KV cache holds "
        f"{engine['fits_sequences']} sequences of {engine['tokens']} tokens, below "
        f"train.vllm.min_concurrent_seqs ({engine['sequences']}). Keys that fix it: "
        + "; ".join(KEYS_FOR_THE_ENGINE),
    )


def problems(config: Mapping) -> Iterator[tuple[str, str]]:
    """An arm whose plan exceeds the GPU's reported memory, or whose engine's floor exceeds its share."""
    planned = plans(config)
    total = reported_gib(config.get("gpu"))
    if not planned or not total:
        return
    for arm, plan in planned.items():
        if plan["total"] > total:
            short = round(plan["total"] - total, 1)
            yield (
                "resources.train.gpus",
                f"arm {arm!r} needs {plan['total']} GiB per GPU, {short} GiB more than the GPU reports "
                f"({round(total, 1)} GiB of gpu.memory_gb {config['gpu']['memory_gb']}): "
                f"{format_terms(plan)}; {GRADIENT_NOTES[plan['gradient_mode']]}. "
                "Keys that lower it: " + "; ".join(KEYS_THAT_FIT),
            )
        if "engine" in plan:
            yield from engine_problems(arm, plan["engine"])


def format_terms(plan: Mapping) -> str:
    return ", ".join(f"{n} {plan[n]}" for n in TRAIN_TERMS)


def format_engine(engine: Mapping) -> str:
    return ", ".join(f"{n} {engine[n]}" for n in ENGINE_TERMS[:-1]) + (
        f", KV for {engine['sequences']} x {engine['tokens']} tokens {engine['kv']}"
    )


def table(config: Mapping) -> str:
    """The plan as the text ``snakemake -n`` prints (empty for a CPU config): the train job's terms per
    arm, then each arm's engine floor beside its share."""
    planned = plans(config)
    if not planned:
        return ""
    gpu = config.get("gpu") or {}
    total = reported_gib(gpu)
    names = (*TRAIN_TERMS, "total")
    lines = [f"memory plan per GPU of the train job (GiB; gpu.memory_gb: {gpu.get('memory_gb')}, reported "
             f"{round(total, 1) if total else None}):", "| arm | " + " | ".join(names) + " |"]  # fmt: skip
    lines += [f"| {arm} | " + " | ".join(str(p[k]) for k in names) + " |" for arm, p in planned.items()]
    first = next(iter(planned.values()))
    lines.append(f"({first['parameters'] / 1e9:.2f}B parameters, {first['micro_batch']} completions x "
                 f"{first['tokens']} tokens per micro-batch and GPU)")  # fmt: skip
    lines.append(GRADIENT_NOTES[first["gradient_mode"]])
    if first["residue"]:
        lines.append(
            "sleeping engine's residue (CUDA graphs + non-torch, beside the trainer's transient "
            "terms): " + ", ".join(f"{arm} {p['residue']}" for arm, p in planned.items()) + " GiB"
        )
    if "engine" in first:
        lines += engine_table(planned)
    return "\n".join(lines)


def engine_table(planned: Mapping[str, Mapping]) -> list[str]:
    """The colocated engine's floor per arm beside its share (GiB per GPU)."""
    seqs, tokens = (next(iter(planned.values()))["engine"][k] for k in ("sequences", "tokens"))
    head = (f"colocated vLLM engine per GPU (GiB; KV for train.vllm.min_concurrent_seqs = {seqs} sequences "
            f"of {tokens} tokens):")  # fmt: skip
    lines = [head, "| arm | dtype | weights | profiling | graphs | non_torch | kv | floor | share | "
             "sequences the share holds |"]  # fmt: skip
    for arm, plan in planned.items():
        e = plan["engine"]
        cells = [str(e[k]) for k in (*ENGINE_TERMS, "floor", "share")]
        lines.append(f"| {arm} | {e['dtype']} | " + " | ".join(cells) + f" | {e['fits_sequences']} |")
    return lines
