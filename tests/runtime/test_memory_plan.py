"""The GPU memory plan against hand-computed cases, real parameter counts and the shipped paper config."""

from __future__ import annotations

import copy

import pytest
import yaml
from conftest import REPO

from workflow_scripts.runtime import memory_plan
from workflow_scripts.runtime.config import ConfigError, load_config, validate_config
from workflow_scripts.runtime.memory_plan import Dims, GiB, dims_from_hf_config, train_terms

QWEN25_7B = {"model_type": "qwen2", "num_hidden_layers": 28, "hidden_size": 3584, "num_attention_heads": 28,
             "num_key_value_heads": 4, "intermediate_size": 18944, "vocab_size": 152064,
             "max_position_embeddings": 4096, "tie_word_embeddings": False}  # fmt: skip


def test_parameter_counts_match_real_models():
    assert dims_from_hf_config(QWEN25_7B).parameters == 7_615_616_512  # Qwen2.5-7B's published count
    import torch  # noqa: F401  (transformers builds the tiny Llama)

    from workflow_scripts.models.modeling import build_char_tokenizer, build_tiny_llama

    tok = build_char_tokenizer()
    tiny = {"hidden_size": 64, "num_layers": 3, "num_heads": 4, "num_kv_heads": 2, "intermediate_size": 96,
            "max_position_embeddings": 64, "seed": 0}  # fmt: skip
    model = build_tiny_llama(len(tok), tiny, tok)
    dims = dims_from_hf_config(model.config.to_dict())
    assert dims.parameters == sum(p.numel() for p in model.parameters())


def test_the_layers_and_the_root_unit_add_up_to_the_model():
    dims = dims_from_hf_config(QWEN25_7B)
    assert dims.root_parameters == 2 * 152064 * 3584 + 3584  # untied embeddings + LM head + final norm
    assert dims.layers * dims.layer_parameters + dims.root_parameters == dims.parameters
    # a recomputed SwiGLU/GQA block of Qwen2.5-7B: 8h + 2kv + 5I = 124,416 values a token = 34.7 x hidden
    assert memory_plan.block_values(dims) == 8 * 3584 + 2 * 512 + 5 * 18944 == 124_416
    assert round(memory_plan.block_values(dims) / 3584, 1) == 34.7
    # a 4h GeLU-style MLP with full attention reads as Korthikanti's count (16h + one 4h gradient)
    mha = Dims(layers=1, hidden=64, heads=4, kv_heads=4, intermediate=64, vocab=8, positions=8)
    assert memory_plan.block_values(mha) == 8 * 64 + 2 * 64 + 5 * 64


def test_the_log_prob_head_constants_are_trls():
    from trl.kernels import chunked_logprob
    from trl.trainer import utils

    assert memory_plan.LOGPROB_TOKEN_CHUNK == chunked_logprob.TOKEN_CHUNK_SIZE
    assert memory_plan.LOGPROB_VOCAB_CHUNK == utils._CHUNKED_LOGPROB_CHUNK_SIZE


def small_train(**changes) -> dict:
    train = {"prompts_per_step": 4, "num_generations": 4, "gradient_accumulation_steps": 2,
             "steps_per_generation": 4, "max_completion_length": 8, "activation_checkpointing": False,
             "use_vllm": True, "distributed": {"strategy": "fsdp"},
             "vllm": {"gpu_memory_utilization": 0.5, "max_model_len": 16, "sleep_mode": False}}  # fmt: skip
    train.update(changes)
    return train


# 2 layers, hidden 8, 2 heads of 4, one KV head (GQA: kv = 4), MLP 16, vocabulary 10
SMALL = Dims(layers=2, hidden=8, heads=2, kv_heads=1, intermediate=16, vocab=10, positions=32)


def test_each_train_term_by_hand():
    # a layer: q, o 2 x 64 + k, v 2 x 8 x 4 + MLP 3 x 8 x 16 + 2 norms x 8 = 592; root 2 x 80 + 8 = 168
    assert (SMALL.layer_parameters, SMALL.root_parameters, SMALL.parameters) == (592, 168, 2 * 592 + 168)
    p = 1352
    fp32 = {"param_dtype": "float32", "autocast": None}
    terms, b, tokens = train_terms(SMALL, fp32, small_train(), "bfloat16", processes=2, gpu_gib=1.0)
    assert (b, tokens) == (4, 16)  # 4 x 4 completions / (2 micro-batches x 2 processes); max_model_len
    assert terms["weights"] == terms["gradients"] == p * 4 / 2  # FSDP over 2 processes
    assert terms["optimizer"] == 2 * p * 4 / 2 and terms["reference"] == p * 2 / 2
    # FSDP2: root gathered + its unsharded gradients, two layers gathered + two layers' gradients
    assert terms["gathered"] == (2 * 168 + 4 * 592) * 4
    block = 8 * 8 + 2 * 4 + 5 * 16  # 152 values a token
    assert terms["activations"] == (2 * (block - 16) + 16) * 4 * 16 * 4  # every block, one gradient
    # the chunked head: a [min(N, 4096), min(V, 32768)] tile, hidden states in fp32 + their fp32 gradient
    n = 4 * 8  # b x completion tokens
    assert terms["logprob_head"] == n * 10 * 4 + n * 8 * (4 + 4)
    allocator = sum(terms[k] for k in ("weights", "gradients", "optimizer", "reference", "gathered",
                                       "activations", "logprob_head"))  # fmt: skip
    assert terms["fragmentation"] == pytest.approx(0.08 * allocator)
    assert terms["context"] == 2 * GiB  # CUDA context + NCCL (2 processes)
    assert terms["vllm"] == 0.5 * GiB  # the share of the reported total
    ckpt, _, _ = train_terms(SMALL, fp32, small_train(activation_checkpointing=True), "bfloat16", 2, 1.0)
    assert ckpt["activations"] == (2 * 8 + block) * 4 * 16 * 4  # saved inputs + one recomputed block
    bf16 = {"param_dtype": "bfloat16", "autocast": None}
    ddp_train = small_train(distributed={"strategy": "ddp"}, use_vllm=False)
    ddp, _, _ = train_terms(SMALL, bf16, ddp_train, "bfloat16", 2, 1.0)
    assert ddp["weights"] == p * 2 and ddp["vllm"] == 0 and ddp["reference"] == p * 2
    assert ddp["gathered"] == p * 2  # DDP's gradient buckets
    # 16-bit masters: the head's fp32 gradient accumulator (V x h x 4) comes on top
    assert ddp["logprob_head"] == n * 10 * 2 + n * 8 * (2 + 4) + 10 * 8 * 4
    one, _, _ = train_terms(SMALL, bf16, ddp_train, "bfloat16", 1, 1.0)
    assert one["gathered"] == 0 and one["context"] == 1 * GiB


def test_the_engine_floor_by_hand():
    train = small_train()
    engine = memory_plan.engine_terms(SMALL, "bfloat16", train, processes=2)
    assert engine["weights"] == 1352 * 2
    # TRL's limits: max_num_seqs = 4 completions x TP 1 x 4 steps_per_generation = 16; 4096 tokens
    assert memory_plan.engine_batch_limits(train, 2) == (16, 4096)
    forward = 4096 * (4 * 8 + (8 + 2 * 4 + 3 * 16)) * 2
    assert engine["profiling"] == forward + 16 * 10 * (2 + 12)
    assert engine["graphs"] == GiB and engine["non_torch"] == GiB / 2
    assert engine["kv"] == 32 * 16 * (2 * 2 * 1 * 4 * 2)  # 32 sequences x 16 tokens x K+V, 2 layers
    eager = small_train(vllm={**train["vllm"], "enforce_eager": True, "tensor_parallel_size": 2,
                              "max_num_seqs": 8, "min_concurrent_seqs": 4})  # fmt: skip
    split = memory_plan.engine_terms(SMALL, "float32", eager, processes=2)
    assert split["weights"] == 1352 * 4 / 2 and split["graphs"] == 0 and split["non_torch"] == GiB
    assert split["profiling"] == 4096 * (4 * 8 + (8 + 2 * 4 + 3 * 16) / 2) * 4 + 8 * 10 * (4 + 12)
    assert split["kv"] == 4 * 16 * (2 * 2 * 1 * 4 * 4)  # one KV head: replicated, not split
    qwen = dims_from_hf_config(QWEN25_7B)
    assert memory_plan.kv_bytes_per_token(qwen, "float32") == 112 * 1024  # the design note's 112 KiB
    assert memory_plan.kv_bytes_per_token(qwen, "float32", 2) == 56 * 1024


def test_the_sampler_dtype_sizes_the_engine_and_an_hf_sampler_copy_and_fp16_computes_in_two_bytes():
    p = 1352
    fp16 = {"param_dtype": "float32", "autocast": "float16", "sampler_dtype": "float16"}
    bf16_sampler = {"param_dtype": "float32", "autocast": None, "sampler_dtype": "bfloat16"}
    fp32 = {"param_dtype": "float32", "autocast": None}
    train = small_train(kv_cache_gb=None)
    engine = memory_plan.train_plan(SMALL, bf16_sampler, train, "bfloat16", 2, 1.0)["engine"]
    assert engine["dtype"] == "bfloat16"  # the engine runs in the sampler's dtype, not the masters'
    assert memory_plan.train_plan(SMALL, fp16, train, "bfloat16", 2, 1.0)["engine"]["dtype"] == "float16"
    with_vllm, _, _ = train_terms(SMALL, bf16_sampler, train, "bfloat16", 2, 1.0)
    assert with_vllm["sampler_copy"] == 0  # vLLM holds the copy, in its share
    hf = small_train(use_vllm=False)
    copy_terms, _, _ = train_terms(SMALL, bf16_sampler, hf, "bfloat16", 2, 1.0)
    assert copy_terms["sampler_copy"] == p * 2  # the HF sampler's own bf16 copy, whole on every process
    plain, _, _ = train_terms(SMALL, fp32, hf, "bfloat16", 2, 1.0)
    assert plain["sampler_copy"] == 0
    assert copy_terms["activations"] == plain["activations"]  # fp32 compute in both
    fp16_terms, _, _ = train_terms(SMALL, fp16, hf, "bfloat16", 2, 1.0)
    assert fp16_terms["activations"] == plain["activations"] / 2  # fp16 autocast: 2-byte activations
    assert fp16_terms["weights"] == plain["weights"]  # fp32 masters


def test_sleep_mode_counts_the_larger_of_the_engine_and_the_trainers_transient_terms_not_their_sum():
    fp32 = {"param_dtype": "float32", "autocast": None}
    awake = memory_plan.train_plan(SMALL, fp32, small_train(), "bfloat16", processes=2, gpu_gib=1.0)
    train = small_train()
    train["vllm"] = {**train["vllm"], "sleep_mode": True}
    asleep = memory_plan.train_plan(SMALL, fp32, train, "bfloat16", processes=2, gpu_gib=1.0)
    train["vllm"]["gpu_memory_utilization"] = 0.9  # a share above the sleeping engine's residue
    asleep = memory_plan.train_plan(SMALL, fp32, train, "bfloat16", processes=2, gpu_gib=2.0)
    terms, _, _ = train_terms(SMALL, fp32, train, "bfloat16", 2, 2.0)
    transient = (terms["gathered"] + terms["activations"] + terms["logprob_head"]) * 1.08
    residue = GiB + GiB / 2  # the sleeping engine keeps its CUDA graphs and non-torch memory
    awake_terms, _, _ = train_terms(SMALL, fp32, small_train(), "bfloat16", 2, 1.0)
    assert awake["total"] == round(sum(awake_terms.values()) / GiB, 1)  # awake: every term, the share too
    assert asleep["residue"] == 1.5 and awake["residue"] == 0.0
    assert asleep["total"] == round((sum(terms.values()) - terms["vllm"] - transient
                                     + max(terms["vllm"], transient + residue)) / GiB, 1)  # fmt: skip
    assert asleep["total"] == round((sum(terms.values()) - transient) / GiB, 1)  # the share (1.8) is larger
    assert asleep["vllm"] == 1.8  # the table still shows the engine's share
    train["vllm"]["gpu_memory_utilization"] = (
        0.5  # a share (1.0) below the residue: residue + transient count
    )
    small = memory_plan.train_plan(SMALL, fp32, train, "bfloat16", processes=2, gpu_gib=2.0)
    terms, _, _ = train_terms(SMALL, fp32, train, "bfloat16", 2, 2.0)
    assert small["total"] == round((sum(terms.values()) - terms["vllm"] + residue) / GiB, 1)
    assert memory_plan.residue_bytes(SMALL, "float32", small_train(use_vllm=False), 2) == 0


def test_the_gradient_term_follows_the_accumulation_mode():
    """FSDP with gradient_sync every_micro_batch (the default; sync_each_batch): the shard P x p / G;
    last_micro_batch (transformers' no_sync): the whole unsharded gradient on every GPU; DDP: whole."""
    p = 1352
    fp32 = {"param_dtype": "float32", "autocast": None}
    sharded, _, _ = train_terms(SMALL, fp32, small_train(), "bfloat16", 2, 1.0)
    every = small_train(distributed={"strategy": "fsdp", "gradient_sync": "every_micro_batch"})
    last = small_train(distributed={"strategy": "fsdp", "gradient_sync": "last_micro_batch"})
    assert (
        sharded["gradients"]
        == train_terms(SMALL, fp32, every, "bfloat16", 2, 1.0)[0]["gradients"]
        == p * 4 / 2
    )
    assert train_terms(SMALL, fp32, last, "bfloat16", 2, 1.0)[0]["gradients"] == p * 4
    assert (
        memory_plan.gradient_mode(every, 2) == "sharded" and memory_plan.gradient_mode(last, 2) == "unsharded"
    )
    ddp = small_train(distributed={"strategy": "ddp", "gradient_sync": "every_micro_batch"})
    assert memory_plan.gradient_mode(ddp, 2) == "replicated"
    assert train_terms(SMALL, fp32, ddp, "bfloat16", 2, 1.0)[0]["gradients"] == p * 4


def test_the_trainer_gets_sync_each_batch_exactly_when_the_plan_counts_sharded_gradients(tmp_path):
    """grpo_config passes accelerate's sync_each_batch (transformers' accelerator_config) under fsdp with
    every_micro_batch, and nothing otherwise: the plan's gradient mode is what the trainer runs."""
    from conftest import load_test_config

    from workflow_scripts.training.grpo_config import grpo_config
    from workflow_scripts.training.precision import PrecisionMode

    mode = PrecisionMode.from_config("fp32", {"param_dtype": "float32", "autocast": None})
    train = validate_config(load_test_config(), check_files=False)["train"]
    cases = [("fsdp", "every_micro_batch", {"sync_each_batch": True}), ("fsdp", "last_micro_batch", None),
             ("ddp", "every_micro_batch", None)]  # fmt: skip
    for strategy, sync, expected in cases:
        train["distributed"] = {"processes": 2, "strategy": strategy, "gradient_sync": sync}
        args = grpo_config(train, mode, 1, tmp_path, world_size=2)
        assert args.accelerator_config.gradient_accumulation_kwargs == expected, (strategy, sync)
        planned = "sharded" if expected else "unsharded" if strategy == "fsdp" else "replicated"
        assert memory_plan.gradient_mode(train, 2) == planned


def test_the_documented_tensor_parallel_fallback_fits_only_with_sharded_gradients():
    """docs/gpu-and-slurm.md's fallback (tensor parallelism 2 at share 0.35, no sleep mode) fits with the
    gradients reduce-scattered every micro-batch; with transformers' no_sync (last_micro_batch) every GPU
    would hold the fp32 arm's whole 28.4 GiB gradient and the config is refused, naming the mode."""
    raw = yaml.safe_load((REPO / "config.paper.yaml").read_text())
    raw["train"]["vllm"].update(gpu_memory_utilization=0.35, sleep_mode=False, tensor_parallel_size=2)
    config = validate_config(copy.deepcopy(raw), source="tp2.yaml", check_files=False)
    plans = memory_plan.plans(config)
    assert plans["fp32"]["total"] == 67.6 and plans["fp32"]["gradients"] == 3.5  # the docs' numbers
    assert plans["fp32"]["engine"]["fits_sequences"] == 46
    raw["train"]["distributed"]["gradient_sync"] = "last_micro_batch"
    with pytest.raises(ConfigError) as err:
        validate_config(copy.deepcopy(raw), source="tp2.yaml", check_files=False)
    text = str(err.value)
    assert "tp2.yaml: resources.train.gpus: arm 'fp32' needs 94.4 GiB per GPU" in text
    assert "gradients 28.4" in text and "gradients: UNSHARDED" in text
    assert "train.distributed.gradient_sync: every_micro_batch" in text


def test_the_paper_fp32_total_matches_a_hand_computation():
    """Every term of the paper's fp32 arm by hand (GiB), from Qwen2.5-7B's dimensions."""
    config = load_config(REPO / "config.paper.yaml", check_files=False)
    plan = memory_plan.plans(config)["fp32"]
    h, kv, inter, vocab, layers, p = 3584, 512, 18944, 152064, 28, 7_615_616_512
    layer = 2 * h * h + 2 * h * kv + h + 2 * kv + 3 * h * inter + 2 * h  # 233,057,792
    root = 2 * vocab * h + h
    b, tokens, completion = 2, 4096, 3072
    persistent = (p * 4 * 4 + p * 2) / 8  # weights + gradients + 2 AdamW states in fp32, bf16 base: /8
    gathered = (2 * root + 4 * layer) * 4
    activations = (layers * h + 8 * h + 2 * kv + 5 * inter) * b * tokens * 4
    head = 4096 * 32768 * 4 + b * completion * h * 8
    transient = gathered + activations + head
    fragmentation = 0.08 * (persistent + transient)
    share = 0.6 * 0.99 * 80 * GiB
    total = persistent + fragmentation + 2 * GiB + max(share, transient * 1.08) - 0.08 * transient
    assert plan["total"] == pytest.approx(total / GiB, abs=0.1)
    assert 60 < plan["total"] < 72  # the estimate of the old config's real need: ~70-72 GiB


@pytest.mark.parametrize("name", ["config.paper.yaml", "config.one-node.yaml"])
def test_the_gpu_configs_plan_per_arm_and_fit_gpus_of_80_gb(name):
    config = load_config(REPO / name, check_files=False)
    plans = memory_plan.plans(config)
    assert set(plans) == {"fp32", "bf16"}
    assert all(plan["total"] <= 0.99 * config["gpu"]["memory_gb"] for plan in plans.values())
    for plan in plans.values():  # the engine's KV cache holds min_concurrent_seqs full-length sequences
        engine = plan["engine"]
        assert engine["floor"] <= engine["share"] and engine["fits_sequences"] >= engine["sequences"] == 32
    assert not list(memory_plan.problems(config))
    table = memory_plan.table(config)
    assert "| fp32 |" in table and "| bf16 |" in table and "B parameters" in table
    assert "| fp32 | float32 |" in table and "sequences the share holds" in table
    fsdp = config["train"]["distributed"]["strategy"] == "fsdp"
    assert ("gradients: sharded, P x bytes / processes" in table) == fsdp  # the accumulation mode, printed
    assert ("sleeping engine's residue" in table) == config["train"]["vllm"]["sleep_mode"]
    doc = (REPO / "docs" / "gpu-and-slurm.md").read_text()  # the docs' plan tables are this code's numbers
    for line in table.splitlines():
        if line.startswith(("| fp32 ", "| bf16 ")):
            assert line in doc, (name, line)


def test_the_old_paper_engine_share_is_refused_naming_the_fp32_arm():
    """train.vllm as it was ({gpu_memory_utilization: 0.4, max_model_len: 4096}: no sleep mode, no TP):
    0.4 x 79.2 GiB cannot hold the fp32 engine's weights, start-up profile, graphs and 32 sequences."""
    raw = yaml.safe_load((REPO / "config.paper.yaml").read_text())
    raw["train"]["vllm"] = {"gpu_memory_utilization": 0.4, "max_model_len": 4096}
    with pytest.raises(ConfigError) as err:
        validate_config(copy.deepcopy(raw), source="paper.yaml", check_files=False)
    text = str(err.value)
    assert "paper.yaml: train.vllm.gpu_memory_utilization: arm 'fp32': the colocated vLLM engine" in text
    assert "share is 31.7 GiB" in text and "weights 28.4" in text and "KV for 32 x 4096 tokens 14.0" in text
    assert "train.vllm.tensor_parallel_size" in text and "train.vllm.sleep_mode" in text
    assert "arm 'bf16'" not in text  # the bf16 engine (14.2 GiB of weights) fits that share


def test_tensor_parallelism_must_divide_the_processes():
    raw = yaml.safe_load((REPO / "config.paper.yaml").read_text())
    raw["train"]["vllm"]["tensor_parallel_size"] = 3
    expected = r"train\.vllm\.tensor_parallel_size: 3 must divide the train job's 8"
    with pytest.raises(ConfigError, match=expected):
        validate_config(copy.deepcopy(raw), source="paper.yaml", check_files=False)


def test_the_paper_config_on_one_gpu_is_refused_naming_the_arm_and_the_shortfall():
    raw = yaml.safe_load((REPO / "config.paper.yaml").read_text())
    raw["resources"]["train"]["gpus"] = 1
    raw["train"]["distributed"]["strategy"] = "ddp"
    with pytest.raises(ConfigError) as err:
        validate_config(copy.deepcopy(raw), source="paper.yaml", check_files=False)
    text = str(err.value)
    assert "paper.yaml: resources.train.gpus: arm 'fp32' needs" in text
    assert "GiB more than the GPU reports (79.2 GiB of gpu.memory_gb 80)" in text
    assert "arm 'bf16' needs" in text and "train.activation_checkpointing" in text


def test_a_cpu_config_has_no_plan():
    config = load_config(REPO / "config.yaml")
    assert memory_plan.plans(config) is None and memory_plan.table(config) == ""


def test_a_known_sequence_length_sizes_the_activations_and_leaves_the_engine_alone():
    """sequence_tokens (the GPU smoke check's: the data's longest prompt + completion) replaces the config's
    worst-case T in the activations, which scale with it; every other term, the engine included, stays."""
    fp32 = {"param_dtype": "float32", "autocast": None}
    train = small_train()
    worst, _, tokens = train_terms(SMALL, fp32, train, "bfloat16", 2, 1.0)
    short, _, short_tokens = train_terms(SMALL, fp32, train, "bfloat16", 2, 1.0, sequence_tokens=tokens // 4)
    assert short_tokens == tokens // 4 and tokens % 4 == 0
    assert short["activations"] == worst["activations"] / 4
    assert {k: v for k, v in short.items() if k not in ("activations", "fragmentation")} == {
        k: v for k, v in worst.items() if k not in ("activations", "fragmentation")
    }
    plan = memory_plan.train_plan(SMALL, fp32, train, "bfloat16", 2, 1.0, sequence_tokens=tokens // 4)
    assert plan["tokens"] == tokens // 4
    assert plan["engine"] == memory_plan.train_plan(SMALL, fp32, train, "bfloat16", 2, 1.0)["engine"]
