"""Training health (non-finite stops, divergence marked, schema bounds) and TensorBoard tracking."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from workflow_scripts.runtime.config import ConfigError, load_config, validate_config
from workflow_scripts.train import train_run
from workflow_scripts.training.metrics_log import read_metrics
from workflow_scripts.training.train_health import NonFiniteGuard, TrainingNotFinite, assess_health


@pytest.fixture(scope="module")
def unstable(tiny_base, tmp_path_factory) -> dict:
    """A legal but unstable learning rate (0.1) for 4 steps, with TensorBoard on."""
    config = json.loads(json.dumps(tiny_base["config"]))
    config["train"].update(
        max_steps=4, learning_rate=0.1, kl_every=2, kl_prompts=4, kl_samples=2, report_to="tensorboard"
    )
    root = tmp_path_factory.mktemp("unstable")
    train_run(config, "fp32", 1, tiny_base["data_dir"], tiny_base["base_dir"], root / "out", root / "ckpt")
    return {"out": root / "out", "run": json.loads((root / "out" / "run.json").read_text())}


@pytest.mark.slow
def test_unstable_learning_rate_marks_the_run_diverged(unstable):
    health = unstable["run"]["health"]
    assert health["diverged"] is True
    assert any("train.health.max_kl" in r for r in health["reasons"]), health
    assert health["kl_estimator"] == "rb" and health["max_kl"] > health["bounds"]["max_kl"]


@pytest.mark.slow
def test_tensorboard_events_land_in_the_runs_results_folder(unstable):
    events = list((unstable["out"] / "tb").glob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 0
    assert unstable["run"]["trainer"]["report_to"] == ["tensorboard"]
    assert len(read_metrics(unstable["out"] / "metrics.jsonl")) == 4


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("learning_rate", 1000),
        ("temperature", 100.0),
        ("epsilon", 5.0),
        ("epsilon_high", 5.0),
        ("beta", 1000.0),
    ],
)
def test_values_no_one_means_are_refused_naming_file_and_key(tmp_path, key, value):
    config = load_config(Path(__file__).resolve().parents[2] / "config.yaml", check_files=False)
    config["train"][key] = value
    with pytest.raises(ConfigError, match=rf"other\.yaml.*train\.{key}"):
        validate_config(config, source="other.yaml", check_files=False)


def test_assess_health_entropy_collapse_and_bounds_off():
    metrics = [{"step": s, "entropy": 1.0 if s < 10 else 0.001, "kl_k3": None} for s in range(1, 21)]
    health = assess_health(metrics, {"min_entropy": 0.01, "max_kl": 2.0})
    assert health["diverged"] and "entropy collapsed" in health["reasons"][0]
    assert not assess_health(metrics, {"min_entropy": None, "max_kl": None})["diverged"]
    healthy = [dict(r, entropy=0.5, kl_k3=0.1 if r["step"] == 20 else None) for r in metrics]
    assert assess_health(healthy, {"min_entropy": 0.01, "max_kl": 2.0})["diverged"] is False


def test_assess_health_reads_rb_and_k3_only_in_logs_from_before_rb():
    """One heavy-tailed k3 draw (50 nats) beside an rb of 0.4 is not an explosion; a log without rb is
    read by its k3."""
    bounds = {"min_entropy": None, "max_kl": 2.0}
    logged = [{"step": 10, "entropy": 0.5, "kl_k3": 50.0, "kl_rb": 0.4}]
    health = assess_health(logged, bounds)
    assert health["diverged"] is False and health["kl_estimator"] == "rb" and health["max_kl"] == 0.4
    old = [{"step": 10, "entropy": 0.5, "kl_k3": 50.0}]
    health = assess_health(old, bounds)
    assert health["diverged"] and health["kl_estimator"] == "k3"
    assert "k3 50 at step 10" in health["reasons"][0]


class _State:
    global_step = 7


def test_non_finite_loss_or_weight_stops_training_naming_the_step():
    guard = NonFiniteGuard()
    model = torch.nn.Linear(2, 2)
    guard.on_step_end(None, _State(), None, model=model)  # finite: nothing happens
    guard.on_log(None, _State(), None, logs={"loss": 0.5, "grad_norm": 1.0})
    with pytest.raises(TrainingNotFinite, match="step 7: loss is nan"):
        guard.on_log(None, _State(), None, logs={"loss": float("nan")})
    with torch.no_grad():
        model.weight[0, 0] = float("inf")
    with pytest.raises(TrainingNotFinite, match="step 7: weight weight is not finite"):
        guard.on_step_end(None, _State(), None, model=model)


def test_a_missing_tracker_package_is_a_config_error_naming_the_key(monkeypatch):
    import importlib.util

    from workflow_scripts.training.grpo_config import check_tracker_available

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a)
    )
    with pytest.raises(ConfigError, match=r"train\.report_to: wandb, but wandb is not installed"):
        check_tracker_available("wandb")
    check_tracker_available("tensorboard")  # installed here (the tracking extra)
    check_tracker_available("none")
