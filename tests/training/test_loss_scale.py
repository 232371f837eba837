"""fp16 arms: the loss-scale trajectory and skipped steps reach metrics.jsonl (``scaler_state``).

The optimizer here is accelerate's AcceleratedOptimizer with a real torch GradScaler (it runs on CPU), the
object the Trainer hands its callbacks; that accelerate builds it for an fp16 arm needs CUDA (GPU check).
"""

from __future__ import annotations

import json
import types

import pytest
import torch

from workflow_scripts.training.metrics_callback import MetricsLogger, scaler_state
from workflow_scripts.training.metrics_log import SCALER_KEYS, read_metrics, scaler_summary


@pytest.fixture
def scaled_optimizer():
    from accelerate import Accelerator
    from accelerate.optimizer import AcceleratedOptimizer

    Accelerator(cpu=True)  # the process state AcceleratedOptimizer needs
    weight = torch.nn.Parameter(torch.ones(3))
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    optimizer = AcceleratedOptimizer(torch.optim.SGD([weight], lr=0.1), device_placement=False, scaler=scaler)

    def step(gradient: float) -> None:
        optimizer.scaler.scale((weight * gradient).sum()).backward()
        optimizer.step()
        optimizer.zero_grad()

    return optimizer, step, weight


def test_each_step_logs_the_scale_and_whether_an_overflow_skipped_it(scaled_optimizer, tmp_path):
    optimizer, step, weight = scaled_optimizer
    logger = MetricsLogger(tmp_path / "metrics.jsonl", max_steps=3, kind="integer")
    args, control = types.SimpleNamespace(), types.SimpleNamespace()
    for number, gradient in enumerate((1.0, float("inf"), 1.0), 1):
        before = weight.detach().clone()
        step(gradient)
        state = types.SimpleNamespace(global_step=number, is_world_process_zero=True)
        logger.on_log(args, state, control, logs={"loss": 0.0}, model=None, optimizer=optimizer)
        assert torch.equal(weight, before) == (gradient != 1.0)  # an overflow step changes nothing
    logger.close()
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [(r["loss_scale"], r["step_skipped"]) for r in rows] == [
        (1024.0, False),
        (512.0, True),
        (512.0, False),
    ]
    assert scaler_summary(rows) == {"initial": 1024.0, "final": 512.0, "min": 512.0, "skipped_steps": 1}


def test_without_a_scaler_the_keys_are_null_and_run_json_has_no_summary(tmp_path):
    plain = torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=0.1)
    assert scaler_state(plain) == scaler_state(None) == dict.fromkeys(SCALER_KEYS)
    rows = [json.loads(json.dumps({"step": 1, **scaler_state(plain)}))]
    assert scaler_summary(rows) is None
