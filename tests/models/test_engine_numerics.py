"""How an engine's fp32 product paths become its recorded ``matmul_precision`` and the contract's fields,
without an engine (tests/models/test_vllm_engine.py reads them from vLLM's real CPU engine)."""

from __future__ import annotations

import pytest

from workflow_scripts.models.vllm_engine import matmul_precision
from workflow_scripts.training.precision import PrecisionMode
from workflow_scripts.training.precision_contract import differences, engine_fields, expected_contract

IEEE = {"float32_matmul_precision": "highest", "cuda_matmul_tf32": False, "onednn_matmul_fp32": "ieee",
        "triton_dot_fp32": None}  # fmt: skip


@pytest.mark.parametrize(
    "change,expected",
    [
        ({}, "ieee"),
        ({"triton_dot_fp32": "ieee"}, "ieee"),  # a CUDA worker with TRITON_F32_DEFAULT=ieee
        ({"triton_dot_fp32": "tf32"}, "tf32"),  # Triton's default: the fp32 engine's attention in TF32
        ({"triton_dot_fp32": "tf32x3"}, "tf32x3"),
        (
            {"float32_matmul_precision": "high", "cuda_matmul_tf32": True, "onednn_matmul_fp32": "tf32"},
            "tf32",
        ),  # torch's "high"
        ({"float32_matmul_precision": "medium", "onednn_matmul_fp32": "bf16"}, "bf16"),
        ({"cuda_matmul_tf32": True, "triton_dot_fp32": "ieee"}, "tf32"),  # cuBLAS's flag alone
        ({"onednn_matmul_fp32": "bf16", "triton_dot_fp32": "tf32"}, "bf16+tf32"),
    ],
)
def test_matmul_precision_is_ieee_only_when_every_fp32_product_path_is(change, expected):
    assert matmul_precision(IEEE | change) == expected


def test_an_fp32_arm_refuses_an_engine_record_with_tf32_products_or_a_bf16_cache():
    fp32 = PrecisionMode("fp32", "float32", deterministic=True)
    expected = expected_contract(fp32, device="cuda", world=1, use_vllm=True)
    record = {"model_dtype": "float32", "kv_cache_dtype": "float32", "attention_dtype": "float32",
              "matmul_precision": "ieee", "deterministic_algorithms": True, "batch_invariant": False,
              "lm_head_dtype": "float32"}  # fmt: skip
    assert differences(expected, engine_fields(record)) == []
    tf32 = record | {"matmul_precision": "tf32", "batch_invariant": True}
    assert differences(expected, engine_fields(tf32)) == [
        "engine_matmul_precision: expected ieee, observed tf32",
        "engine_batch_invariant: expected False, observed True",
    ]
    bf16_cache = record | {"kv_cache_dtype": "bfloat16", "attention_dtype": "bfloat16"}
    assert differences(expected, engine_fields(bf16_cache)) == [
        "kv_cache_dtype: expected float32, observed bfloat16",
        "engine_attention_dtype: expected float32, observed bfloat16",
    ]
    hf = expected_contract(fp32, device="cuda", world=1, use_vllm=False)  # no engine: nothing expected
    engine_keys = ("engine_matmul_precision", "engine_deterministic", "engine_batch_invariant")
    assert {hf[k] for k in engine_keys} == {None}
