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


def small_train(**changes) -> dict:
    train = {"prompts_per_step": 4, "num_generations": 4, "gradient_accumulation_steps": 2,
             "max_completion_length": 8, "activation_checkpointing": False, "use_vllm": True,
             "distributed": {"strategy": "fsdp"},
             "vllm": {"gpu_memory_utilization": 0.5, "max_model_len": 16, "sleep_mode": False}}  # fmt: skip
    train.update(changes)
    return train


def test_each_term_by_hand():
    dims = Dims(layers=2, hidden=8, heads=2, kv_heads=2, intermediate=16, vocab=10, positions=32)
    # parameters: per layer q,k,v,o 4 x 64 + MLP 3 x 128 + 2 norms x 8 = 656; x 2 + embeddings 2 x 80 + norm 8
    assert dims.parameters == 2 * 656 + 160 + 8 == 1480
    fp32 = {"param_dtype": "float32", "autocast": None}
    terms, b, tokens = train_terms(dims, fp32, small_train(), "bfloat16", processes=2, gpu_gib=1.0)
    assert (b, tokens) == (4, 16)  # 4 x 4 completions / (2 micro-batches x 2 processes); max_model_len
    assert terms["weights"] == terms["gradients"] == 1480 * 4 / 2  # FSDP over 2 processes
    assert terms["optimizer"] == 2 * 1480 * 4 / 2
    assert terms["activations"] == 2 * 17 * 4 * 16 * 8 * 4  # layers x 17 x b x T x h x 4 bytes
    assert terms["logits"] == 4 * 8 * 10 * (4 + 4)  # b x completion x vocab x (fp32 + fp32 log-softmax)
    assert terms["reference"] == 1480 * 2 / 2 and terms["vllm"] == 0.5 * GiB  # sharded like the policy
    ckpt, _, _ = train_terms(dims, fp32, small_train(activation_checkpointing=True), "bfloat16", 2, 1.0)
    assert ckpt["activations"] == 2 * 4 * 16 * 8 * 4 + 17 * 4 * 16 * 8 * 4  # saved inputs + one layer
    bf16 = {"param_dtype": "bfloat16", "autocast": None}
    ddp_train = small_train(distributed={"strategy": "ddp"}, use_vllm=False)
    ddp, _, _ = train_terms(dims, bf16, ddp_train, "bfloat16", 2, 1.0)
    assert ddp["weights"] == 1480 * 2 and ddp["vllm"] == 0 and ddp["logits"] == 4 * 8 * 10 * (2 + 4)
    assert ddp["reference"] == 1480 * 2  # the logging rank's whole copy
    # the engine's floor: bf16 weights + K and V of one 16-token sequence in every layer
    floor = (1480 * 2 + 2 * 2 * 2 * 4 * 16 * 2) / GiB
    assert memory_plan.engine_needs(dims, "bfloat16", 16) == round(floor, 1)


def test_sleep_mode_counts_the_larger_of_the_engine_and_the_trainers_activations_not_their_sum():
    dims = Dims(layers=2, hidden=8, heads=2, kv_heads=2, intermediate=16, vocab=10, positions=32)
    fp32 = {"param_dtype": "float32", "autocast": None}
    awake = memory_plan.train_plan(dims, fp32, small_train(), "bfloat16", processes=2, gpu_gib=1.0)
    train = small_train()
    train["vllm"] = {**train["vllm"], "sleep_mode": True}
    asleep = memory_plan.train_plan(dims, fp32, train, "bfloat16", processes=2, gpu_gib=1.0)
    terms, _, _ = train_terms(dims, fp32, train, "bfloat16", 2, 1.0)
    phase = terms["activations"] + terms["logits"]
    assert awake["total"] == round(sum(terms.values()) / GiB, 1)
    assert asleep["total"] == round((sum(terms.values()) - terms["vllm"] - phase + max(terms["vllm"], phase))
                                    / GiB, 1)  # fmt: skip
    assert asleep["vllm"] == awake["vllm"]  # the table still shows the engine's share


@pytest.mark.parametrize("name", ["config.paper.yaml", "config.one-node.yaml"])
def test_the_gpu_configs_plan_per_arm_and_fit_gpus_of_80_gb(name):
    config = load_config(REPO / name, check_files=False)
    plans = memory_plan.plans(config)
    assert set(plans) == {"fp32", "bf16"}
    assert all(plan["total"] <= config["gpu"]["memory_gb"] for plan in plans.values())
    assert plans["fp32"]["vllm_needs"] <= config["train"]["vllm"]["gpu_memory_utilization"] * 80
    table = memory_plan.table(config)
    assert "| fp32 |" in table and "| bf16 |" in table and "B parameters" in table
    doc = (REPO / "docs" / "gpu-and-slurm.md").read_text()  # the docs' plan tables are this code's numbers
    for arm, plan in plans.items():
        names = ("weights", "gradients", "optimizer", "activations", "logits", "reference", "vllm", "total")
        assert f"| {arm} | " + " | ".join(str(plan[k]) for k in names) + " |" in doc, (name, arm)


def test_the_paper_config_on_one_gpu_is_refused_naming_the_arm_and_the_shortfall():
    raw = yaml.safe_load((REPO / "config.paper.yaml").read_text())
    raw["resources"]["train"]["gpus"] = 1
    raw["train"]["distributed"]["strategy"] = "ddp"
    with pytest.raises(ConfigError) as err:
        validate_config(copy.deepcopy(raw), source="paper.yaml", check_files=False)
    text = str(err.value)
    assert "paper.yaml: resources.train.gpus: arm 'fp32' needs" in text
    assert "GiB more than gpu.memory_gb" in text
    assert "arm 'bf16' needs" in text and "train.activation_checkpointing" in text


def test_a_cpu_config_has_no_plan():
    config = load_config(REPO / "config.yaml")
    assert memory_plan.plans(config) is None and memory_plan.table(config) == ""
