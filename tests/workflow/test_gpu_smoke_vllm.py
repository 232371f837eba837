"""The GPU smoke check's vLLM twin: test_gpu_smoke.py's CPU twin with vLLM on, through vLLM's CPU build.

The same script (bench/gpu_smoke.sh -> Snakemake -> bench/gpu_smoke.py) on config.gpu-smoke.yaml at tiny
dimensions, with rollouts from TRL's colocated engine (``train.use_vllm``) and every evaluation sampled
by vLLM (``eval.backend: vllm``): the vLLM checks run here (engine dtype and seed per arm, every
evaluation through vLLM, HF and vLLM pass@1 in agreement) beside every check that needs no GPU; only
the CUDA ones (device, GPU memory, time budget) are left to a GPU. The model has heads of 32, the
smallest vLLM's CPU attention takes (``VLLM_TINY``).
"""

from __future__ import annotations

import json

import pytest
from conftest import VLLM_TINY
from test_gpu_smoke import EVERYWHERE, GPU_ONLY, VLLM_ONLY, run_smoke, twin_config

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

ENGINE = {"kv_cache_gb": 0.25, "enforce_eager": True}


def vllm_twin_config() -> dict:
    config = twin_config()
    config["model"]["tiny"].update(VLLM_TINY)
    config["train"].update(use_vllm=True, vllm=dict(ENGINE))
    config["eval"].update(backend="vllm", vllm=dict(ENGINE))
    return config


@pytest.fixture(scope="module")
def smoke(tmp_path_factory) -> dict:  # its own run: the vLLM twin (.venv-vllm only)
    return run_smoke(tmp_path_factory.mktemp("gpu_smoke_vllm"), vllm_twin_config())


def test_vllm_twin_passes_every_vllm_check_and_every_check_that_needs_no_gpu(smoke):
    report, proc = smoke["json"], smoke["proc"]
    log = (smoke["workdir"] / "snakemake.log").read_text()[-3000:]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:] + log
    for name in (*EVERYWHERE, *VLLM_ONLY):
        assert report["checks"][name]["status"] == "pass", (name, report["checks"][name])
    for name in GPU_ONLY:
        assert report["checks"][name]["status"] == "skipped (no GPU)", name
    assert report["passed"] is True


def test_every_engine_ran_as_configured_and_was_recorded(smoke):
    figures = smoke["json"]["figures"]
    for arm, dtype in (("fp32", "float32"), ("bf16", "bfloat16")):
        vllm = figures[f"train.{arm}"]["vllm"]
        assert vllm["model_dtype"] == vllm["kv_cache_dtype"] == vllm["lm_head_dtype"] == dtype
        assert vllm["platform"] == "cpu" and vllm["kv_cache_memory_bytes"] == 2**28 and vllm["enforce_eager"]
    for name, summary in figures["eval"].items():
        assert summary["backend"] == "vllm", name
    results = smoke["workdir"] / "results" / "eval"
    for path in results.glob("*/*.json"):
        if path.name.endswith(".kl.json"):
            continue
        engine = json.loads(path.read_text())["vllm"]
        assert engine["platform"] == "cpu" and engine["threads"] == 1, path
        assert engine["model_dtype"] == json.loads(path.read_text())["dtype"], path
