"""bench/false_larger_16.py: the rule's false "larger" rate with 16-seed references, on a synthetic pool of
exchangeable runs (the real measurement needs ~120 fp32 runs: config.twins.yaml and the default)."""

import json

import numpy as np
import pytest
from conftest import bench_module
from test_null_splits import write_metrics


@pytest.fixture(scope="module")
def false16():
    return bench_module("false_larger_16")


def test_configurations_are_disjoint_and_as_many_as_fit(false16):
    deal = false16.configurations(np.arange(130), 16, 8, np.random.default_rng(0))
    assert len(deal) == 5
    used = [u for ref, arm in deal for u in (*ref, *arm)]
    assert len(used) == len(set(used)) == 120 and all(len(r) == 16 and len(a) == 8 for r, a in deal)
    assert false16.clopper_pearson(0, 5) == (0.0, pytest.approx(0.5218, abs=1e-4))


@pytest.mark.slow
def test_the_rate_over_five_disjoint_configurations_of_exchangeable_runs(false16, tmp_path, capsys):
    """5 configurations x 2 quantities of the rule on 120 synthetic runs of one arm in 3 folders (~3 s: the
    null yardstick each comparison reports, which the rule does not read, on 10 splits, not the default
    200, which took 19 s of the 23)."""
    rng = np.random.default_rng(1)
    arms = []
    for k, (name, seeds) in enumerate(
        (("fp32", range(1, 49)), ("fp32_twin", range(1, 49)), ("fp32", range(49, 73)))
    ):
        write_metrics(tmp_path / f"r{k}", name, seeds, rng)
        arms += ["--arm", f"{tmp_path / f'r{k}'}:{name}"]
    out = tmp_path / "rates.json"
    assert false16.main([*arms, "--bootstrap", "200", "--null-splits", "10", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["configurations"] == 5
    for q in ("dJ", "kl", "either"):
        r = result["disjoint"][q]
        assert r["n"] == 5 and 0 <= r["rate"] <= 1 and r["ci95"][0] <= r["rate"] <= r["ci95"][1]
    assert all(set(o) == {"dJ", "kl", "either"} for o in result["first"])
    assert "5 disjoint configurations of 16 reference + 8 arm runs" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="needs 144"):
        false16.main([*arms, "--min-configurations", "6"])
