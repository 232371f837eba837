"""The sweep's per-task seed statistics: what the sizing of the default (noise budget) is judged by."""

import numpy as np
import pytest
from conftest import bench_module


@pytest.fixture(scope="module")
def sweep():
    return bench_module("sweep_miniature")


def test_seed_statistics_set_the_across_seed_variance_against_the_mean_eval_noise(sweep):
    dj, noise = [0.10, 0.14, 0.12, 0.08], [1e-4, 3e-4, 2e-4, 2e-4]
    k3, k3_se = [0.2, 0.4, 0.3, 0.3], [0.01, 0.03, 0.02, 0.02]
    per_seed = [
        {"chain": {"summary": {"dJ": d, "eval_noise_var": v}, "kl": {"rb_mean": k, "rb_se": s}}}
        for d, v, k, s in zip(dj, noise, k3, k3_se, strict=True)
    ]
    config = {"data": {"tasks": {"chain": {"role": "off_task"}}}}
    got = sweep.seed_statistics(per_seed, config)["chain"]
    assert got["dJ_mean"] == pytest.approx(0.11)
    assert got["dJ_seed_var"] == pytest.approx(np.var(dj, ddof=1))
    assert got["dJ_se"] == pytest.approx(np.std(dj, ddof=1) / 2)
    assert got["dJ_noise_share"] == pytest.approx(2e-4 / np.var(dj, ddof=1))
    assert got["kl_noise_var"] == pytest.approx(np.mean(np.square(k3_se)))
    assert got["kl_noise_share"] == pytest.approx(np.mean(np.square(k3_se)) / np.var(k3, ddof=1))
    # The estimator the analysis reads: k3 when the config says so.
    per_seed = [{"chain": {**r["chain"], "kl": {"k3_mean": 2 * r["chain"]["kl"]["rb_mean"], "k3_se": 0.0}}}
                for r in per_seed]  # fmt: skip
    got = sweep.seed_statistics(per_seed, {**config, "analysis": {"kl_estimator": "k3"}})["chain"]
    assert got["kl_mean"] == pytest.approx(0.6) and got["kl_noise_var"] == 0.0
    assert got["role"] == "off_task"


def test_nested_overrides_merge_and_replace(sweep):
    base = {"model": {"tiny": {"sft_lr": 1e-3, "near_miss": {"rate": 0.5}}}, "seeds": [1, 2]}
    out = sweep.merged(base, {"model": {"tiny": {"near_miss": {"families": ["mul"]}}}, "seeds": [3]})
    assert out == {
        "model": {"tiny": {"sft_lr": 1e-3, "near_miss": {"rate": 0.5, "families": ["mul"]}}},
        "seeds": [3],
    }
    assert base["model"]["tiny"]["near_miss"] == {"rate": 0.5}  # the defaults are left alone
