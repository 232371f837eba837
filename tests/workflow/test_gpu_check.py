"""The device check's CPU twin: bench/gpu_check.sh as a lent GPU runs it, at tiny shapes, on CPU, no smoke.

The probes run the GPU code (random Qwen2, deterministic algorithms, TRL's fused head, gradient
accumulation 2, AdamW) and compare what a step holds (weights, gradients, AdamW's states, the reference)
with memory_plan's terms exactly; the allocator peak exists only on CUDA, so they say "skipped (no GPU)",
never "pass". FSDP2 runs in one gloo process. The unit tests show each check can fail and that the time
budget ends the script. Costs ~25 s (the twin) + ~10 s (the rest).
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import torch
from conftest import REPO, bench_module

pytestmark = pytest.mark.slow
SCRIPT = REPO / "bench" / "gpu_check.sh"


def run_check(workdir, **env) -> subprocess.CompletedProcess:
    env = {**os.environ, "GPU_CHECK_TINY": "1", "GPU_CHECK_SMOKE": "0",
           "GPU_CHECK_WHEELS": str(workdir / "none"),
           **env}  # fmt: skip
    return subprocess.run(
        ["bash", str(SCRIPT), str(workdir)], capture_output=True, text=True, timeout=300, env=env
    )


def test_the_cpu_twin_runs_every_step_and_writes_a_summary(tmp_path):
    proc = run_check(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    steps = summary["steps"]
    assert set(steps) == {"probe.tiny.fp32", "probe.tiny.bf16", "fsdp", "smoke"}
    for arm in ("fp32", "bf16"):
        probe = steps[f"probe.tiny.{arm}"]
        assert probe["status"] == "skipped (no GPU)" and "(equal)" in probe["reason"]
        assert probe["persistent_gib"] == pytest.approx(probe["planned_persistent_gib"], rel=1e-9)
        assert (
            len(probe["losses"]) == 2 and probe["plan"]["micro_batch"] == 2 and probe["plan"]["tokens"] == 64
        )
    assert steps["fsdp"]["status"] == "pass" and steps["fsdp"]["dtensor_parameters"]
    assert steps["smoke"]["status"] == "skipped"
    assert summary["failed"] == [] and summary["elapsed_s"] < summary["budget_s"]
    page = (tmp_path / "summary.md").read_text()
    assert page.startswith("# Device check") and "| fsdp | pass |" in page


def test_the_budget_ends_the_script_with_every_unrun_step_failed(tmp_path):
    """The 9-minute bound: a step gets only what is left; a spent budget runs nothing and fails it."""
    proc = run_check(tmp_path, GPU_CHECK_BUDGET_S="20")
    assert proc.returncode == 1
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["failed"] == ["fsdp", "probe.tiny.bf16", "probe.tiny.fp32"]
    assert all("budget was spent" in summary["steps"][s]["reason"] for s in summary["failed"])


@pytest.fixture
def gpu_check():
    """bench/gpu_check.py, with torch's global switches put back after a probe set them."""
    module = bench_module("gpu_check")
    yield module
    torch.use_deterministic_algorithms(False)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False


def test_a_plan_that_misses_a_held_tensor_fails_the_probe(gpu_check, monkeypatch):
    real = gpu_check.memory_plan.train_terms

    def no_reference(*args, **kwargs):
        terms, b, tokens = real(*args, **kwargs)
        return {**terms, "reference": 0}, b, tokens

    monkeypatch.setattr(gpu_check.memory_plan, "train_terms", no_reference)
    result = gpu_check.probe("tiny", "bf16", "cpu")
    assert result["status"] == "fail" and "(DIFFERENT)" in result["reason"]


def test_the_summary_fails_a_dead_step_and_a_smoke_with_a_failed_check(gpu_check, tmp_path):
    (tmp_path / "fsdp.json").write_text(json.dumps({"status": "pass", "reason": "ok"}))
    (tmp_path / "probe.one-node.fp32.err").write_text("exit 1\nCUDA out of memory")
    (tmp_path / "smoke").mkdir()
    (tmp_path / "smoke" / "gpu_smoke.json").write_text(json.dumps(
        {"checks": {"workflow": {"status": "pass"}, "memory_plan.fp32": {"status": "fail"}}}))  # fmt: skip
    summary = gpu_check.summarize(tmp_path, 540, 12)
    assert summary["failed"] == ["probe.one-node.fp32", "smoke"]
    assert "CUDA out of memory" in summary["steps"]["probe.one-node.fp32"]["reason"]
    assert summary["steps"]["smoke"]["failed_checks"] == ["memory_plan.fp32"]
    assert "| smoke | fail |" in (tmp_path / "summary.md").read_text()
