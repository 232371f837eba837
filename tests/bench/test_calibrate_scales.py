"""bench/calibrate_scales.py: both scales of the H2/H3 rule on real-shaped runs: null splits, planted
effects of each form, null twins."""

import numpy as np
import pandas as pd
import pytest
from conftest import bench_module
from test_null_splits import TASKS, write_metrics


@pytest.fixture(scope="module")
def cal():
    return bench_module("calibrate_scales")


def test_a_planted_effect_multiplies_the_variance_in_its_form_and_nothing_else(cal):
    rng = np.random.default_rng(0)
    rows = pd.DataFrame([{"unit": u, "task": t, "precision": "A" if u < 8 else "B", "x": rng.normal()}
                         for u in range(16) for t in TASKS])  # fmt: skip
    wide = lambda r: r[r["precision"] == "A"].pivot_table(index="unit", columns="task", values="x")  # noqa: E731
    before = wide(rows)
    for form in cal.FORMS:
        after = wide(cal.plant(rows, "x", 4.0, form))
        dev_b, dev_a = before - before.mean(), after - after.mean()
        shared_b, shared_a = dev_b.mean(axis=1), dev_a.mean(axis=1)
        resid_b, resid_a = dev_b.sub(shared_b, axis=0), dev_a.sub(shared_a, axis=0)
        assert np.allclose(after.mean(), before.mean())  # task means kept
        k_shared = 2.0 if form in ("whole", "shared") else 1.0
        k_task = 2.0 if form in ("whole", "task") else 1.0
        assert np.allclose(shared_a, k_shared * shared_b) and np.allclose(resid_a, k_task * resid_b)
    b = cal.plant(rows, "x", 4.0, "whole")
    assert b.loc[b["precision"] == "B", "x"].equals(rows.loc[rows["precision"] == "B", "x"])


@pytest.mark.slow
def test_the_script_prints_every_scale_and_form_and_finds_a_large_planted_effect(cal, tmp_path, capsys):
    rng = np.random.default_rng(1)
    write_metrics(tmp_path / "a", "fp32", range(1, 17), rng)
    out_json = tmp_path / "out.json"
    args = ["--arm", f"{tmp_path / 'a'}:fp32", "--seeds", "8", "--splits", "4", "--ratio", "64",
            "--json", str(out_json)]  # fmt: skip
    assert cal.main(args) == 0
    text = capsys.readouterr().out
    for what in cal.SCALES.values():
        assert f"| null | {what} |" in text
        for form in cal.FORMS:
            assert f"| 64x {form} | {what} |" in text
    import json

    got = json.loads(out_json.read_text())["splits"]
    assert got["64x whole dJ"].count("supported") >= 3  # 64x on 8 vs 8 seeds is found
    assert len(got["null log_kl"]) == 4
    assert set(got["null dJ"]) <= {"supported", "inconclusive", "contradicted"}


@pytest.mark.slow
def test_twin_pairs_are_every_ordered_pair_of_the_folder_arms(cal, tmp_path):
    rng = np.random.default_rng(2)
    frames = [
        write_metrics(tmp_path / arm, arm, range(1, 9), rng) for arm in ("fp32", "fp32_twin", "fp32_twin2")
    ]
    (tmp_path / "all" / "analysis").mkdir(parents=True)
    pd.concat(frames).to_parquet(tmp_path / "all" / "analysis" / "metrics.parquet")
    table = cal.twin_table(tmp_path / "all")
    assert len(table) == 6 * len(cal.SCALES)  # 3 arms: 6 ordered pairs, every scale
    assert {(r, a) for r, a, _, _ in table} == {
        ("fp32", "fp32_twin"), ("fp32", "fp32_twin2"), ("fp32_twin", "fp32"), ("fp32_twin", "fp32_twin2"),
        ("fp32_twin2", "fp32"), ("fp32_twin2", "fp32_twin"),
    }  # fmt: skip
