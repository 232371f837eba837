"""bench/calibrate_scales.py: both scales of the H2/H3 rule on real-shaped runs: null splits, planted
effects of each form, null twins."""

import numpy as np
import pandas as pd
import pytest
from conftest import bench_module
from test_null_splits import TASKS, write_metrics

# The rule's bootstrap tables and seed permutations per comparison in these tests (the analysis default,
# 2000, took 5x the time: 30 s against 6 s for the script's test): p resolves to 1/201, enough for alpha
# 0.05 and for the planted effects and twin pairs checked here.
BOOTSTRAP = 200


@pytest.fixture(scope="module")
def cal():
    return bench_module("calibrate_scales")


@pytest.fixture
def quick_bootstrap(cal, monkeypatch: pytest.MonkeyPatch) -> None:
    """The functions called directly use BOOTSTRAP too (what ``main`` sets from --bootstrap)."""
    monkeypatch.setattr(cal, "BOOTSTRAP", BOOTSTRAP)


def test_a_planted_effect_multiplies_the_whole_seed_variance_in_its_form(cal):
    rng = np.random.default_rng(0)
    n = 4000  # runs of arm A: the variance ratios below are within a few % of their truth
    sd = {t: 0.1 * (i + 1) for i, t in enumerate(TASKS)}  # tasks differ in spread
    rows = pd.DataFrame([{"unit": u, "task": t, "precision": "A" if u < n else "B",
                          "dJ": rng.normal(0, sd[t]), "noise": 0.0}
                         for u in range(n + 8) for t in TASKS])  # fmt: skip
    wide = lambda r: r[r["precision"] == "A"].pivot_table(index="unit", columns="task", values="dJ")  # noqa: E731
    before = wide(rows)
    for form in cal.FORMS:
        after = wide(cal.plant(rows, "dJ", 4.0, form, np.random.default_rng(1)))
        assert np.allclose(after.var() / before.var(), 4.0, rtol=0.1), form  # the whole variance, per task
        added = (after - before) / np.sqrt(3.0 * pd.Series(sd) ** 2)  # the planted effect in SD units
        if form == "whole":
            assert np.allclose(after - after.mean(), 2.0 * (before - before.mean()))  # the real shape kept
        elif form == "shared":
            spread = added.std(axis=1) / added.abs().mean(axis=1)  # one effect for all tasks of a run
            assert (spread < 0.05).all()  # (up to the table's estimate of each task's variance)
        else:
            assert abs(np.corrcoef(added.to_numpy().T)[0, 1]) < 0.1  # independent across tasks
    b = cal.plant(rows, "dJ", 4.0, "shared", np.random.default_rng(1))
    assert b.loc[b["precision"] == "B", "dJ"].equals(rows.loc[rows["precision"] == "B", "dJ"])


@pytest.mark.slow
def test_the_script_prints_every_scale_and_form_and_finds_a_large_planted_effect(cal, tmp_path, capsys):
    rng = np.random.default_rng(1)
    write_metrics(tmp_path / "a", "fp32", range(1, 17), rng)
    out_json = tmp_path / "out.json"
    args = ["--arm", f"{tmp_path / 'a'}:fp32", "--seeds", "8", "--splits", "4", "--ratio", "64", "--parts",
            "--bootstrap", str(BOOTSTRAP), "--json", str(out_json)]  # fmt: skip
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
    for case in [f"64x {form}" for form in cal.FORMS] + ["null"]:  # --parts: each condition of the rule alone
        for q in cal.SCALES:
            alone = [got[f"{case} [{guard}] {q}"] for guard in cal.GUARDS]
            assert all(set(g) <= {"supported", "not"} and len(g) == 4 for g in alone)
            # "larger" exactly where all three conditions hold (the rule is their conjunction)
            assert [v == "supported" for v in got[f"{case} {q}"]] == [
                all(g[k] == "supported" for g in alone) for k in range(4)
            ], (case, q)
    assert got["64x whole [bound] dJ"].count("supported") >= 3
    assert f"| 64x whole [permutation] | {cal.SCALES['dJ']} |" in text


@pytest.mark.slow
def test_twin_pairs_are_every_ordered_pair_of_the_folder_arms(cal, quick_bootstrap, tmp_path):
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


@pytest.mark.slow
def test_twin_sets_cut_the_pooled_runs_into_disjoint_sets_and_compare_every_ordered_pair(
    cal, quick_bootstrap, tmp_path
):
    from null_splits import pooled_runs

    rng = np.random.default_rng(3)
    write_metrics(tmp_path / "a", "fp32", range(1, 15), rng)  # 14 runs: two sets of 6, two runs left over
    table = cal.twin_sets(pooled_runs([f"{tmp_path / 'a'}:fp32"]), 6, ["dJ", "kl"])
    assert [(r, a, q) for r, a, q, _ in table] == [
        (r, a, q) for r, a in (("set1", "set2"), ("set2", "set1")) for q in ("dJ", "kl")
    ]
    assert {v for *_, v in table} <= {"supported", "inconclusive", "contradicted"}


@pytest.mark.slow
def test_random_partitions_count_larger_pairs_among_sets_cut_from_a_shuffled_order(
    cal, quick_bootstrap, tmp_path, capsys
):
    from null_splits import pooled_runs

    rng = np.random.default_rng(4)
    write_metrics(tmp_path / "big", "fp32", range(1, 7), rng, spread=0.1)  # units 1-6: 100x the variance
    write_metrics(tmp_path / "small", "fp32_twin", range(1, 7), rng)  # units 7-12
    arms = [f"{tmp_path / 'big'}:fp32", f"{tmp_path / 'small'}:fp32_twin"]
    pool = pooled_runs(arms)
    verdicts = lambda table: [(r, a, v == "supported") for r, a, _, v in table]  # noqa: E731
    in_order = cal.twin_sets(pool, 6, ["dJ"])  # set1 = the big runs: larger as the arm
    assert verdicts(in_order) == [("set1", "set2", False), ("set2", "set1", True)]
    shuffled = cal.twin_sets(pool, 6, ["dJ"], np.unique(pool["unit"])[::-1])  # set1 = the small runs
    assert verdicts(shuffled) == [("set1", "set2", True), ("set2", "set1", False)]
    args = [*(x for arm in arms for x in ("--arm", arm)), "--seeds", "6", "--splits", "1", "--null-only",
            "--scales", "dJ", "--twin-sets", "--partitions", "3", "--bootstrap", str(BOOTSTRAP),
            "--json", str(tmp_path / "p.json")]  # fmt: skip
    assert cal.main(args) == 0
    text = capsys.readouterr().out
    assert "| 3 random partitions: mean [5%, 50%, 95%] |" in text
    assert "| off-task dJ | 1/2 |" in text  # the real sets: one of the two ordered pairs larger
    import json

    counts = json.loads((tmp_path / "p.json").read_text())["partitions"]
    assert len(counts) == 3 and all(0 <= c["dJ"] <= 2 for c in counts)  # 2 ordered pairs a partition
