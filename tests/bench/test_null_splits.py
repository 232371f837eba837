"""bench/null_splits.py: the H2/H3 rule's false-positive rate from splits of runs of one arm."""

import numpy as np
import pandas as pd
import pytest
from conftest import bench_module

TASKS = ("chain", "mul", "word")


@pytest.fixture(scope="module")
def null_splits():
    return bench_module("null_splits")


def write_metrics(folder, arm: str, seeds, rng, spread: float = 0.01):
    """A metrics table of one arm: normal seed effects (shared + seed x task) plus known eval noise."""
    rows = []
    for s in seeds:
        shared = rng.normal(0, spread)
        for t in TASKS:
            rows.append({"run": f"{arm}-s{s}", "precision": arm, "seed": s, "task": t, "role": "off_task",
                         "dJ": 0.05 + shared + rng.normal(0, spread) + rng.normal(0, 0.002),
                         "eval_noise_var": 0.002**2, "kl_rb": 0.3 + rng.normal(0, spread),
                         "kl_rb_mc_var": 1e-6})  # fmt: skip
    (folder / "analysis").mkdir(parents=True)
    pd.DataFrame(rows).to_parquet(folder / "analysis" / "metrics.parquet")
    return pd.DataFrame(rows)


@pytest.mark.slow
def test_runs_in_two_folders_count_once_and_arms_are_relabelled(null_splits, tmp_path):
    rng = np.random.default_rng(0)
    first = write_metrics(tmp_path / "a", "fp32", range(1, 13), rng)
    write_metrics(tmp_path / "b", "fp32_twin", range(1, 9), rng)
    (tmp_path / "c" / "analysis").mkdir(parents=True)
    first[first["seed"] <= 8].to_parquet(tmp_path / "c" / "analysis" / "metrics.parquet")  # the same runs
    pool = null_splits.pooled_runs(
        [f"{tmp_path / d}:{a}" for d, a in (("a", "fp32"), ("b", "fp32_twin"), ("c", "fp32"))]
    )
    assert pool["unit"].nunique() == 20 and len(pool) == 20 * len(TASKS)
    outcomes = null_splits.split_verdicts(pool, 8, 10, seed=0, bootstrap=200)  # the default 2000: 5x the time
    assert set(outcomes) == {"dJ", "kl", "dJ_model_alone", "kl_model_alone"}
    assert all(len(v) == 10 for v in outcomes.values())
    assert set(outcomes["dJ"]) <= {"supported", "inconclusive", "contradicted"}
    # one arm under two names: the rule must rarely call the second arm's variance larger
    assert outcomes["dJ"].count("supported") <= 2 and outcomes["kl"].count("supported") <= 2


def test_too_few_runs_or_an_absent_arm_are_refused_naming_them(null_splits, tmp_path):
    write_metrics(tmp_path / "a", "fp32", range(1, 9), np.random.default_rng(1))
    pool = null_splits.pooled_runs([f"{tmp_path / 'a'}:fp32"])
    with pytest.raises(SystemExit, match="8 distinct runs; two disjoint sets of 8 need 16"):
        null_splits.split_verdicts(pool, 8, 1, seed=0)
    with pytest.raises(SystemExit, match="no off-task rows of arm 'bf16'"):
        null_splits.pooled_runs([f"{tmp_path / 'a'}:bf16"])
