"""Tests of workflow_scripts.stats: calibration (false positives at alpha, power), recovery of planted
effects, and graceful degradation on tiny or degenerate tables.

Calibration tests compare a rejection rate with the 99.9% binomial interval around its nominal value, so
a correct test fails them about once in a thousand runs (all simulations use fixed seeds, so in practice
never); ``test_calibration_guard_rejects_a_test_that_always_says_different`` proves the guard has teeth.
"""

from __future__ import annotations

import itertools
import json

import numpy as np
import pandas as pd
import pytest
from scipy import stats as st

from workflow_scripts import stats

ALPHA = 0.05
CFG = {"alpha": ALPHA, "tost_margin": 0.05, "bootstrap": 200, "power_simulations": 100, "seed": 0}
FAST = {**CFG, "max_seeds": 12, "power_simulations": 50}
VERDICTS = {"supported", "contradicted", "inconclusive"}


# ----------------------------------------------------------------------------- helpers

def binomial_band(n_sims: int, p: float, conf: float = 0.999) -> tuple[float, float]:
    lo, hi = st.binom.interval(conf, n_sims, p)
    return lo / n_sims, hi / n_sims


def assert_calibrated(rejected: np.ndarray, p: float = ALPHA) -> None:
    """The rejection rate lies in the 99.9% binomial band around ``p`` (too many = false positives)."""
    rate = float(np.mean(rejected))
    lo, hi = binomial_band(len(rejected), p)
    assert rate <= hi, f"false-positive rate {rate:.3f} above the band [{lo:.3f}, {hi:.3f}] around {p}"
    assert rate >= lo, f"rejection rate {rate:.3f} below the band [{lo:.3f}, {hi:.3f}] around {p}"


def make_table(n_seeds: int = 3, arms: tuple[str, ...] = ("fp32", "bf16"), n_on: int = 1, n_off: int = 5,
               sd: dict | None = None, seed: int = 0, noise: float = 1e-5, kl: bool = True) -> pd.DataFrame:
    """Tidy table with a per-run shift per role (sd by (precision, role)) plus a little task-level noise."""
    rng = np.random.default_rng(seed)
    roles = {**{f"on{k}": "on_task" for k in range(n_on)}, **{f"off{k}": "off_task" for k in range(n_off)}}
    sd = sd or {}
    rows = [{"run": "base", "precision": None, "seed": np.nan, "task": t, "role": r, "J": 0.4, "dJ": 0.0,
             "eval_noise_var": noise, "kl_k3": 0.0, "kl_k3_se": 0.0} for t, r in roles.items()]
    for a in arms:
        for s in range(1, n_seeds + 1):
            shift = {r: rng.normal(0, sd.get((a, r), 0.02)) for r in ("on_task", "off_task")}
            kl_shift = rng.normal(0, sd.get((a, "kl"), 0.01))
            for t, r in roles.items():
                rows.append({"run": f"{a}-s{s}", "precision": a, "seed": s, "task": t, "role": r,
                             "J": 0.45, "dJ": 0.05 + shift[r] + rng.normal(0, 0.005),
                             "eval_noise_var": noise, "kl_k3": 0.1 + kl_shift + rng.normal(0, 0.002),
                             "kl_k3_se": 0.001})
    table = pd.DataFrame(rows)
    return table if kl else table.drop(columns=["kl_k3", "kl_k3_se"])


def units_frame(x: np.ndarray, y: np.ndarray, arms: tuple[str, str] = ("fp32", "bf16")) -> pd.DataFrame:
    """Per-run units for one scope: reference values ``y``, other arm ``x``, same seeds."""
    n = len(x)
    return pd.DataFrame({"precision": [arms[0]] * n + [arms[1]] * n, "seed": list(range(n)) * 2,
                         "y": np.r_[y, x], "noise": 0.0, "kl": np.nan, "kl_noise": 0.0})


# ----------------------------------------------------------------------------- calibration guard

def test_calibration_guard_rejects_a_test_that_always_says_different():
    always_different = np.ones(200, dtype=bool)
    with pytest.raises(AssertionError, match="false-positive rate"):
        assert_calibrated(always_different)
    # and one that rejects twice as often as it should
    rng = np.random.default_rng(0)
    with pytest.raises(AssertionError):
        assert_calibrated(rng.random(2000) < 2 * ALPHA)


# ----------------------------------------------------------------------------- Brown-Forsythe

def test_vectorised_brown_forsythe_equals_scipy():
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(50, 7)), rng.normal(0, 2, size=(50, 9))
    expected = [st.levene(a, b, center="median").pvalue for a, b in zip(x, y, strict=True)]
    np.testing.assert_allclose(stats.bf_pvalues(x, y), expected, rtol=1e-10)


def test_brown_forsythe_false_positive_rate_is_alpha():
    rng = np.random.default_rng(2)
    rejected = [stats.brown_forsythe(rng.normal(0, 0.03, 10), rng.normal(0.1, 0.03, 10))["p"] < ALPHA
                for _ in range(200)]
    assert_calibrated(np.array(rejected))


def test_brown_forsythe_detects_a_9x_variance_ratio():
    """BF's true power at 9x with 10 seeds per arm is ~0.65 (20k simulations; an F test would give 0.89
    but is not robust to outlying seeds), so the bar is 0.55 at 10 seeds and 0.9 at 20."""
    rng = np.random.default_rng(3)
    for n, bar in ((10, 0.55), (20, 0.9)):
        rejected = [stats.brown_forsythe(rng.normal(0, 0.09, n), rng.normal(0, 0.03, n))["p"] < ALPHA
                    for _ in range(400)]
        assert np.mean(rejected) > bar, n


def _h2_outcomes(ratio: float, n_sims: int, seed: int) -> np.ndarray:
    """H2 verdicts through the path analyze uses (scope_stats -> verdicts), 10 seeds per arm."""
    rng = np.random.default_rng(seed)
    cfg = {**stats.DEFAULTS, **CFG}
    outcome = []
    for i in range(n_sims):
        units = units_frame(rng.normal(0, 0.03 * np.sqrt(ratio), 10), rng.normal(0, 0.03, 10))
        scope = stats.scope_stats(units, ["fp32", "bf16"], cfg, f"sim{i}")
        outcome.append(stats.verdicts({"off_task": scope}, ["fp32", "bf16"], cfg)["H2"]["verdict"])
    return np.array(outcome)


def test_h2_decision_false_positive_rates():
    """'supported' is a one-sided BF rejection: under equal variances its rate sits at alpha/2.
    'contradicted' claims ratio < variance_ratio_margin (2): at a true ratio of 2 it is a false positive
    and must stay at about alpha/2 too (one side of a 1-alpha CI)."""
    assert_calibrated(_h2_outcomes(1.0, 200, 4) == "supported", ALPHA / 2)
    wrong = _h2_outcomes(2.0, 200, 5) == "contradicted"
    assert np.mean(wrong) <= binomial_band(200, ALPHA / 2)[1], np.mean(wrong)


def test_h2_calibration_fails_for_a_test_that_always_says_different(monkeypatch):
    monkeypatch.setattr(stats, "brown_forsythe", lambda x, y: {"status": "ok", "statistic": 1e9, "p": 0.0})
    with pytest.raises(AssertionError, match="false-positive rate"):
        assert_calibrated(_h2_outcomes(1.0, 40, 4) == "supported", ALPHA / 2)


def test_full_analyze_h2_false_positive_rate():
    """The same through analyze itself (tidy table in, verdict out), fewer simulations for time."""
    cfg = {**CFG, "bootstrap": 100, "power_simulations": 10, "max_seeds": 4, "mixed_model": False}
    verdicts = [stats.analyze(make_table(10, n_on=1, n_off=1, seed=100 + i), cfg)["verdicts"]["H2"]["verdict"]
                for i in range(120)]
    assert_calibrated(np.array(verdicts) == "supported", ALPHA / 2)


def test_h2_supported_for_a_planted_9x_ratio():
    table = make_table(n_seeds=10, sd={("bf16", "off_task"): 0.09, ("fp32", "off_task"): 0.03}, seed=5)
    out = stats.analyze(table, {**FAST, "mixed_model": False})
    assert out["verdicts"]["H2"]["verdict"] == "supported"
    assert out["by_task_type"]["off_task"]["comparisons"]["bf16"]["dJ_var"]["ratio"] > 3


# ----------------------------------------------------------------------------- TOST / means

@pytest.mark.parametrize("paired", [True, False])
def test_tost_equivalent_for_equal_means_and_not_for_shifted(paired):
    rng = np.random.default_rng(6)
    y = rng.normal(0.05, 0.01, 10)
    x_same, x_shift = y + rng.normal(0, 0.01, 10), y + 0.1 + rng.normal(0, 0.01, 10)
    pairs = (lambda x: (x, y)) if paired else (lambda x: None)
    same = stats.compare_means(x_same, y, pairs(x_same), ALPHA, 0.05)
    shifted = stats.compare_means(x_shift, y, pairs(x_shift), ALPHA, 0.05)
    assert same["design"] == ("paired" if paired else "welch")
    assert same["tost"]["equivalent"] and same["tost"]["p"] < ALPHA
    assert not shifted["tost"]["equivalent"] and shifted["p"] < ALPHA
    assert shifted["ci_low"] < 0.1 < shifted["ci_high"]


def test_h1_verdicts_follow_the_rule():
    rng = np.random.default_rng(7)
    cfg = {**stats.DEFAULTS, **CFG}
    y = rng.normal(0.05, 0.01, 12)
    same = stats.scope_stats(units_frame(y + rng.normal(0, 0.005, 12), y), ["fp32", "bf16"], cfg, "a")
    shifted = stats.scope_stats(units_frame(y + 0.2, y), ["fp32", "bf16"], cfg, "b")
    assert stats.verdicts({"on_task": same}, ["fp32", "bf16"], cfg)["H1"]["verdict"] == "supported"
    assert stats.verdicts({"on_task": shifted}, ["fp32", "bf16"], cfg)["H1"]["verdict"] == "contradicted"


# ----------------------------------------------------------------------------- Pitman-Morgan, bootstrap

def _paired_normal(rng, n, ratio, rho=0.5):
    cov = [[ratio, rho * np.sqrt(ratio)], [rho * np.sqrt(ratio), 1.0]]
    xy = rng.multivariate_normal([0, 0], cov, size=n)
    return xy[:, 0], xy[:, 1]


def test_pitman_morgan_detects_known_ratio_and_is_calibrated_under_equality():
    rng = np.random.default_rng(8)
    res = stats.pitman_morgan(*_paired_normal(rng, 30, 4.0))
    assert res["p"] < 0.01 and res["r"] > 0
    rejected = [stats.pitman_morgan(*_paired_normal(rng, 10, 1.0))["p"] < ALPHA for _ in range(200)]
    assert_calibrated(np.array(rejected))


@pytest.mark.parametrize("paired", [False, True])
def test_bootstrap_ci_covers_the_true_log_ratio(paired):
    rng = np.random.default_rng(9)
    covered = []
    for _ in range(60):
        x, y = _paired_normal(rng, 20, 4.0) if paired else (rng.normal(0, 2, 20), rng.normal(0, 1, 20))
        ci = stats.bootstrap_log_var_ratio(x, y, paired, 400, ALPHA, rng)
        covered.append(ci["ci_low"] <= np.log(4) <= ci["ci_high"])
    # nominal 95%; BCa at 20 seeds is slightly liberal, so allow down to 85%
    assert np.mean(covered) >= 0.85


# ----------------------------------------------------------------------------- power

def test_power_is_monotone_in_seeds_and_matches_a_direct_simulation():
    ns = [3, 5, 10, 20, 40]
    curve = stats._power_curve(4.0, 1.0, 0.0, ALPHA, 400, ns, np.random.default_rng(10))
    powers = [curve[n] for n in ns]
    assert powers[0] == 0.0  # with 3 seeds per arm BF cannot reject at 5%
    assert all(b >= a - 0.02 for a, b in itertools.pairwise(powers)) and powers[-1] > 0.9
    rng = np.random.default_rng(11)
    direct = []
    for _ in range(400):
        x, y = rng.normal(0, 2, 10), rng.normal(0, 1, 10)
        direct.append(st.levene(x, y, center="median").pvalue < ALPHA and x.var() > y.var())
    assert abs(np.mean(direct) - curve[10]) < 0.12


def test_power_analysis_reports_seeds_needed_consistently():
    cfg = {**stats.DEFAULTS, **CFG, "power_simulations": 200, "max_seeds": 64}
    out = stats.power_analysis(10, 10, 1.0, 0.0, cfg, np.random.default_rng(12))
    r2, r4 = out["ratios"]["2"], out["ratios"]["4"]
    assert r4["seeds_needed"] is not None and r4["power_at_needed"] >= 0.8
    assert r2["seeds_needed"] is None or r2["seeds_needed"] > r4["seeds_needed"]
    assert r2["power_now"] < r4["power_now"] < 0.8
    # eval noise dilutes a seed-variance ratio: more seeds are needed
    noisy = stats.power_analysis(10, 10, 2.0, 1.0, cfg, np.random.default_rng(12))
    assert noisy["ratios"]["4"]["seeds_needed"] > r4["seeds_needed"]


# ----------------------------------------------------------------------------- mixed model

def test_mixed_model_recovers_planted_variance_components():
    rng = np.random.default_rng(13)
    sd = {("fp32", "on_task"): 0.02, ("fp32", "off_task"): 0.02,
          ("bf16", "on_task"): 0.02, ("bf16", "off_task"): 0.06}
    tasks = {f"t{k}": "on_task" if k < 5 else "off_task" for k in range(10)}
    task_eff = {t: rng.normal(0, 0.03) for t in tasks}
    rows = []
    for a in ("fp32", "bf16"):
        for s in range(30):
            shift = {r: rng.normal(0, sd[a, r]) for r in ("on_task", "off_task")}
            rows += [{"run": f"{a}-s{s}", "precision": a, "seed": s, "task": t, "role": r,
                      "dJ": 0.05 + task_eff[t] + shift[r] + rng.normal(0, 0.01)} for t, r in tasks.items()]
    out = stats.mixed_model(pd.DataFrame(rows), ["fp32", "bf16"])
    assert out["status"] in ("ok", "warning")
    for (a, r), s in sd.items():
        assert 0.5 < out["seed_var"][a][r] / s**2 < 2.0, (a, r, out["seed_var"][a][r])
    effect = out["precision_effect"]["bf16"]["off_task"]  # planted: 0
    assert abs(effect["estimate"]) < 3 * effect["se"]
    assert 0.8 < out["residual_var"] / 0.01**2 < 1.25
    assert out["lrt"]["off_task"]["p"] < 0.001
    assert out["lrt"]["on_task"]["p"] > ALPHA


# ----------------------------------------------------------------------------- noise

def test_sampling_noise_var_is_unbiased():
    rng = np.random.default_rng(14)
    p, n = rng.beta(2, 3, 200), 8
    counts = rng.binomial(n, p, size=(4000, 200))
    estimates = [stats.sampling_noise_var(c, n) for c in counts[:200]]
    true = np.sum(p * (1 - p) / n) / 200**2
    assert abs(np.var(counts.mean(axis=1) / n) / true - 1) < 0.1
    assert abs(np.mean(estimates) / true - 1) < 0.02


def test_noise_corrected_variance_subtracts_eval_noise_and_floors_at_zero():
    table = make_table(n_seeds=5, noise=1.0)  # noise far above the seed variance
    out = stats.analyze(table, {**FAST, "mixed_model": False})
    arm = out["by_task_type"]["off_task"]["arms"]["bf16"]
    assert arm["eval_noise_var"] == pytest.approx(1.0 / 5)  # mean of 5 tasks: sum/T^2
    assert arm["dJ"]["var_corrected"] == 0.0 and arm["dJ"]["var"] > 0


# ----------------------------------------------------------------------------- analyze: shape, degenerate

def _check_output(out: dict) -> None:
    json.dumps(out, allow_nan=False)
    for h in ("H1", "H2", "H3"):
        assert out["verdicts"][h]["verdict"] in VERDICTS
        assert out["verdicts"][h]["reason"] and out["verdicts"][h]["rule"]


def test_analyze_tiny_table_with_mixed_model():
    out = stats.analyze(make_table(n_seeds=3), CFG)
    _check_output(out)
    assert out["reference"] == "fp32" and out["precisions"] == ["fp32", "bf16"]
    assert out["n"] == {"runs": 6, "seeds": {"fp32": 3, "bf16": 3}, "tasks": {"on_task": 1, "off_task": 5},
                        "rows": 36}
    assert set(out["by_task"]) == {"on0", *(f"off{k}" for k in range(5))}
    assert out["mixed_model"]["status"] in ("ok", "warning", "failed")
    assert out["power"]["off_task"]["bf16"]["dJ"]["ratios"]["2"]["power_now"] == 0.0
    assert any("power" in w for w in out["warnings"])
    assert out["by_task_type"]["off_task"]["arms"]["fp32"]["seeds"] == [1, 2, 3]


def test_analyze_one_seed_is_inconclusive_not_an_error():
    out = stats.analyze(make_table(n_seeds=1), CFG)
    _check_output(out)
    assert {v["verdict"] for v in out["verdicts"].values()} == {"inconclusive"}
    assert out["mixed_model"]["status"] == "skipped"
    off = out["by_task_type"]["off_task"]["comparisons"]["bf16"]
    assert off["dJ_var"]["brown_forsythe"]["status"] == "skipped"


def test_analyze_constant_dj_and_missing_kl_and_noise_columns():
    table = make_table(n_seeds=4, kl=False).drop(columns=["eval_noise_var"])
    table.loc[table["run"] != "base", "dJ"] = 0.01
    out = stats.analyze(table, CFG)
    _check_output(out)
    assert out["eval_noise_source"] == "none"
    assert out["verdicts"]["H3"]["verdict"] == "inconclusive"
    assert "KL" in out["verdicts"]["H3"]["reason"]
    assert any("kl_k3" in w for w in out["warnings"])
    assert out["mixed_model"]["status"] == "skipped"


def test_analyze_noise_from_j_when_column_absent():
    table = make_table(n_seeds=3).drop(columns=["eval_noise_var"]).assign(n_samples=4, n_problems=100)
    out = stats.analyze(table, {**FAST, "mixed_model": False})
    assert out["eval_noise_source"] == "upper_bound_from_J"
    noise = out["by_task"]["off0"]["arms"]["bf16"]["eval_noise_var"]
    assert noise == pytest.approx(0.45 * 0.55 / 400)


def test_analyze_three_arms_unpaired_seeds_and_config_order():
    table = make_table(n_seeds=4, arms=("bf16", "fp32", "fp16"))
    table = table[~((table["precision"] == "fp16") & (table["seed"] == 4))]
    out = stats.analyze(table, {**FAST, "mixed_model": False}, precisions=["fp32", "bf16", "fp16"])
    _check_output(out)
    assert out["reference"] == "fp32"
    comps = out["by_task_type"]["off_task"]["comparisons"]
    assert set(comps) == {"bf16", "fp16"}
    assert comps["bf16"]["paired"] and not comps["fp16"]["paired"]
    assert comps["fp16"]["dJ_mean"]["design"] == "welch"
    assert set(out["verdicts"]["H2"]["by_arm"]) == {"bf16", "fp16"}


def test_analyze_single_arm_and_missing_task_rows():
    table = make_table(n_seeds=3, arms=("fp32",))
    out = stats.analyze(table, CFG)
    _check_output(out)
    assert out["verdicts"]["H1"]["verdict"] == "inconclusive"
    table = make_table(n_seeds=3)
    table = table[~((table["run"] == "bf16-s2") & (table["task"] == "off1"))]
    out = stats.analyze(table, {**FAST, "mixed_model": False})
    assert "off1" not in out["tasks"]["off_task"]
    assert any("off1" in w for w in out["warnings"])


def test_analyze_rejects_malformed_tables():
    with pytest.raises(ValueError, match="lacks column"):
        stats.analyze(make_table().drop(columns=["role"]), CFG)
    table = make_table()
    with pytest.raises(ValueError, match="duplicate"):
        stats.analyze(pd.concat([table, table.tail(1)]), CFG)


def test_json_safe_replaces_non_finite_numbers():
    out = stats.json_safe({"a": np.float64("nan"), "b": [np.inf, np.int64(2)], 3: (np.bool_(True), None)})
    assert out == {"a": None, "b": [None, 2], "3": [True, None]}
