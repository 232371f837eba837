"""Tests of the statistics: calibration by simulation (coverage, false positives, power for every structure of
seed variance, H1's guard), the mixed model against statsmodels, the power module against the simulated
detection rate, the gate, controls, noise shares, diverged runs, and graceful degradation on degenerate
tables.

The H2/H3 statistic compares the whole seed variance of a task (shared seed effect + seed x task effect,
known eval noise held out). Its calibration draws tables from ``workflow_scripts.statistics.simulation`` at
the default's size (8 seeds per arm, 4 off-task tasks) with the eval noise of the noise budget (issue 22:
noise = 1/3 of the reference's observed across-seed variance): a null, and the three alternatives of
``simulation.STRUCTURES`` (the whole seed variance 12x the reference's, the increase in the shared part,
in the seed x task part, or in both). Rates are checked against binomial bounds stated where they are
used; all simulations are seeded. ``test_an_analysis_that_always_says_*`` prove the checks have teeth.
The default tier runs a smaller replicate of the calibration (``QUICK``: 120 null tables, 50 per alternative
structure and for H1, 320 in all; each bound the binomial one at that size) and of the H2 "contradicted"
level (120 tables per seed count); ``pytest -m extended`` runs both at full size (700 tables and 2 x 300, as
the default tier did before) and the calibration at 5x that (~2-6 min). Run alone with OMP_NUM_THREADS=1 on a
shared 2-core machine the calibration block took 26 s, the 2 x 120 "contradicted" tables 20 s.
"""

from __future__ import annotations

import functools
import itertools
import json

import numpy as np
import pandas as pd
import pytest
from scipy import stats as st

from workflow_scripts import stats
from workflow_scripts.statistics import power, scopes, simulation, stat_tests, variance_model, verdicts

ALPHA = 0.05
ARMS = ["fp32", "bf16"]
BASE_VAR = 4e-4  # simulation's default shared seed variance (sd 0.02)
CFG = {**stats.analysis_defaults(), "bootstrap": 100, "power_simulations": 0}
SMALL = {**CFG, "power_simulations": 20, "max_seeds": 12}
# For the tests of what the analysis of an unusual table holds (none reads a power or yardstick number): both
# still run, on 5 power simulations and 20 reference splits (with 20 and the default 200, two of these
# analyses took 10-11 s each; the power search's bootstrap cut has a fixed cost of its own)
SHAPE = {**SMALL, "power_simulations": 5, "null_splits": 20}
VERDICTS = {"supported", "contradicted", "inconclusive", "not testable"}

# The calibration design: the default's seeds and off-task tasks; reference shared = seed x task variance
# (as measured on the default, issue 22); 300 problems x 8 samples put the eval noise (p(1-p)/2400 at
# p = 0.3..0.6, mean 9.8e-5) at 1/3 of the reference's observed across-seed variance (2e-4 + 9.8e-5).
CAL_SEEDS, CAL_OFF = 8, 4
CAL_SHARED = CAL_TASK = 1e-4
CAL_NOISE = {"n_problems": 300, "n_samples": 8}
CAL_RATIO = 9.0
# Tables under the null, and per alternative structure (and of H1's guard): the full calibration
# (`pytest -m extended`, beside the 5x run) and the default tier's smaller replicate of it. Each check's bound
# is the binomial one at the size it runs at (QUICK: false positives <= 0.117, power >= 0.6, coverage of the
# 240 intervals in [0.9, 0.9875]).
N_NULL, N_ALT = 300, 100
QUICK = (120, 50)
SIZES = [
    pytest.param(QUICK, id="quick"),
    pytest.param((N_NULL, N_ALT), id="full", marks=pytest.mark.extended),
]
DETECT = 0.8  # required detection rate at DETECT_RATIO for every alternative structure
# The rule's seed-permutation check (robust to outlying seeds, which real runs have) costs power under
# normal effects: at 9x and 8 seeds the shared structure was detected in 0.79 of the tables (0.90 with
# the bootstrap alone), task 0.87 (0.99), both 0.91 (0.98); so the power criterion is checked at 12x.
DETECT_RATIO = 12.0
BOUND_CONF = 0.999  # one-sided binomial bounds: a correct analysis fails about once in a thousand seeds


# ----------------------------------------------------------------------------- calibration helpers


def binomial_band(n: int, p: float, conf: float = BOUND_CONF) -> tuple[float, float]:
    lo, hi = st.binom.interval(conf, n, p)
    return lo / n, hi / n


def upper_bound(n: int, p: float, conf: float = BOUND_CONF) -> float:
    """Largest rate out of n a test of true rate p gives with probability conf (one-sided binomial)."""
    return float(st.binom.ppf(conf, n, p)) / n


def check_at_most(hits: np.ndarray, p: float, what: str) -> None:
    """Rate <= p within simulation error: at most the one-sided binomial bound of ``upper_bound``."""
    rate, hi = float(np.mean(hits)), upper_bound(len(hits), p)
    assert rate <= hi, f"{what}: rate {rate:.3f} above {hi:.3f}, the {BOUND_CONF:.1%} binomial bound at {p}"


def check_at_least(hits: np.ndarray, p: float, what: str) -> None:
    rate, (lo, _) = float(np.mean(hits)), binomial_band(len(hits), p)
    assert rate >= lo, f"{what}: rate {rate:.3f} below the band's bottom {lo:.3f} around {p}"


def check_rate_at_least(hits: np.ndarray, p: float, what: str) -> None:
    """The observed rate itself is >= p (no allowance: the requirement is on the rate)."""
    rate = float(np.mean(hits))
    assert rate >= p, f"{what}: rate {rate:.3f} below {p} ({len(hits)} tables)"


def check_power(hits: np.ndarray, what: str) -> None:
    """At the full size (N_ALT tables or more) the observed rate itself is >= DETECT
    (``check_rate_at_least``); a smaller replicate allows for simulation error: >= the bottom of the 99.9%
    binomial band around DETECT (0.6 at 50 tables: a rule with half that power, 0.4, passes it once in ~300
    seeds)."""
    if len(hits) >= N_ALT:
        check_rate_at_least(hits, DETECT, what)
    else:
        check_at_least(hits, DETECT, what)


def check_coverage(covered: np.ndarray, level: float = 0.95) -> None:
    check_at_least(covered, level, "coverage")
    _, hi = binomial_band(len(covered), level)
    assert np.mean(covered) <= hi, f"coverage: rate {np.mean(covered):.3f} above the band's top {hi:.3f}"


def _role(table: pd.DataFrame, role: str, rows: pd.DataFrame | None = None, quantity: str = "dJ") -> dict:
    rows = stats._prepare(table, [])[0] if rows is None else rows
    tasks = sorted(rows.loc[rows["role"] == role, "task"].unique())
    return scopes.model_scope(rows, tasks, ARMS, quantity, CFG, role, None)


def _h1_block(table: pd.DataFrame) -> tuple[dict, dict]:
    """(mean comparison, model comparison) of on-task dJ, margin = 25% of the reference gain."""
    rows, _, _, _ = stats._prepare(table, [])
    units = scopes.units(rows, ["on0"])
    ref, x = (units[units["precision"] == a].sort_values("seed")["y"].to_numpy() for a in ARMS)
    mean = stat_tests.compare_means(x, ref, (x, ref), ALPHA, 0.25 * ref.mean())
    return mean, _role(table, "on_task", rows)


def calibration_table(rng: np.random.Generator, structure: str, ratio: float = CAL_RATIO) -> pd.DataFrame:
    seed_var, task_var = simulation.structure(structure, ratio, CAL_SHARED, CAL_TASK)
    return simulation.simulate_table(
        rng,
        n_seeds=CAL_SEEDS,
        n_off=CAL_OFF,
        seed_var=seed_var,
        task_var=task_var,
        shared_default=CAL_SHARED,
        task_default=CAL_TASK,
        **CAL_NOISE,
    )


@functools.cache
def simulations(n_null: int, n_alt: int) -> dict[str, list]:
    """Off-task dJ fits of n_null null tables and n_alt tables per alternative structure, and n_alt H1
    tables (on-task seed variance 4x), fitted once per session."""
    rng = np.random.default_rng(2024)
    out: dict[str, list] = {s: [] for s in simulation.STRUCTURES}
    for structure in simulation.STRUCTURES:
        for _ in range(n_null if structure == "null" else n_alt):
            ratio = CAL_RATIO if structure == "null" else DETECT_RATIO
            out[structure].append(_role(calibration_table(rng, structure, ratio), "off_task"))
    out["h1_ratio4"] = [
        _h1_block(simulation.simulate_table(rng, seed_var={("bf16", "on_task"): 4 * BASE_VAR}))
        for _ in range(n_alt)
    ]
    return out


def h2_verdicts(blocks: list[dict]) -> np.ndarray:
    return np.array(
        [verdicts.verdict_variance(b["comparisons"]["bf16"], {}, None, CFG, "off-task dJ")[0] for b in blocks]
    )


def h1_verdicts(blocks: list[tuple[dict, dict]]) -> np.ndarray:
    return np.array(
        [verdicts.verdict_h1(mean, model["comparisons"]["bf16"], {}, None, CFG)[0] for mean, model in blocks]
    )


def calibration_rates(sims: dict[str, list]) -> dict[str, float]:
    return {s: float(np.mean(h2_verdicts(sims[s]) == "supported")) for s in simulation.STRUCTURES}


def check_all(sims: dict[str, list]) -> None:
    """Every calibration criterion of issues 12 and 22 on one set of simulations."""
    whole = CAL_SHARED + CAL_TASK
    covered = [
        lo <= whole <= hi for b in sims["null"] for lo, hi in (b["arms"][a]["whole_var_ci"] for a in ARMS)
    ]
    check_coverage(np.array(covered))
    check_at_most(h2_verdicts(sims["null"]) == "supported", ALPHA, "H2 false positives (equal variances)")
    for structure in simulation.STRUCTURES[1:]:
        hits = h2_verdicts(sims[structure]) == "supported"
        check_power(hits, f"H2 power at a {DETECT_RATIO:g}x ratio ({structure} structure)")
    check_at_most(h1_verdicts(sims["h1_ratio4"]) == "supported", 0.05, "H1 supported at a 4x on-task ratio")


# ----------------------------------------------------------------------------- calibration


@pytest.mark.slow
@pytest.mark.parametrize("size", SIZES)
def test_the_model_fits_every_simulated_table_or_reports_why(size: tuple[int, int]):
    sims = simulations(*size)
    blocks = [b for s in simulation.STRUCTURES for b in sims[s]] + [m for _, m in sims["h1_ratio4"]]
    for b in blocks:
        assert b["status"] == "ok" or b.get("reason"), b
    assert all(b["status"] == "ok" for b in blocks)  # at these sizes every fit succeeds
    failed = _role(simulation.simulate_table(np.random.default_rng(0), n_seeds=1), "off_task")
    assert failed["status"] == "failed" and "seeds" in failed["reason"]


@pytest.mark.slow
@pytest.mark.parametrize("size", SIZES)
def test_calibration_coverage_false_positives_power_for_every_structure_and_h1_guard(size: tuple[int, int]):
    """8 seeds, 4 off-task tasks, eval noise 1/3 of the observed variance: H2 is supported in >= 80% of the
    tables for each alternative structure (whole seed variance 12x, the increase shared, seed x task, or
    both; at the quick size within its binomial band) and in at most alpha under the null (one-sided 99.9%
    binomial bound: 0.093 at 300 tables, 0.117 at 120)."""
    check_all(simulations(*size))


@pytest.mark.slow
@pytest.mark.parametrize("size", SIZES)
def test_the_two_parts_locate_where_the_extra_seed_variance_is(size: tuple[int, int]):
    """Shared-only: the shared ratio is the larger part; task-only: the seed x task ratio (medians)."""
    sims = simulations(*size)

    def median_ratio(structure: str, part: str) -> float:
        ratios = [b["comparisons"]["bf16"]["parts"][part]["ratio"] for b in sims[structure]]
        return float(np.nanmedian(np.array(ratios, dtype=float)))  # NaN: both parts fitted 0

    assert median_ratio("shared", "shared") > 3 * median_ratio("shared", "task")
    assert median_ratio("task", "task") > 3 * median_ratio("task", "shared")
    assert 0.5 < median_ratio("null", "shared") < 2 and 0.5 < median_ratio("null", "task") < 2


@pytest.mark.slow
def test_an_analysis_that_always_says_supported_fails_calibration(monkeypatch):
    """The checks have teeth at the default tier's size, whose bounds are the loosest."""
    sims = simulations(*QUICK)
    monkeypatch.setattr(verdicts, "verdict_variance", lambda *a, **k: ("supported", "always"))
    monkeypatch.setattr(verdicts, "verdict_h1", lambda *a, **k: ("supported", "always"))
    with pytest.raises(AssertionError, match="H2 false positives"):
        check_all(sims)
    with pytest.raises(AssertionError, match="H1 supported"):
        check_at_most(h1_verdicts(sims["h1_ratio4"]) == "supported", 0.05, "H1 supported")


@pytest.mark.slow
def test_an_analysis_that_always_says_different_fails_calibration(monkeypatch):
    """'Different': every variance comparison rejects equality, every H1 is contradicted."""
    sims = simulations(*QUICK)
    monkeypatch.setattr(verdicts, "verdict_variance", lambda *a, **k: ("supported", "always different"))
    monkeypatch.setattr(verdicts, "verdict_h1", lambda *a, **k: ("contradicted", "always different"))
    with pytest.raises(AssertionError, match="H2 false positives"):
        check_all(sims)


@pytest.mark.slow
def test_an_analysis_that_never_rejects_fails_the_power_check(monkeypatch):
    monkeypatch.setattr(verdicts, "verdict_variance", lambda *a, **k: ("inconclusive", "never"))
    with pytest.raises(AssertionError, match="power"):
        check_all(simulations(*QUICK))


@pytest.mark.slow
@pytest.mark.parametrize("size", SIZES)
def test_a_test_of_the_shared_seed_variance_alone_fails_the_task_structure_check(size: tuple[int, int]):
    """The pre-issue-22 statistic (shared part only) misses seed x task variance: the check catches it."""
    sims = simulations(*size)

    def shared_only(comp: dict) -> str:
        part = comp["parts"]["shared"]
        return "supported" if part["ratio_ci"][0] > 1 else "inconclusive"

    hits = np.array([shared_only(b["comparisons"]["bf16"]) == "supported" for b in sims["task"]])
    with pytest.raises(AssertionError, match="task structure"):
        check_power(hits, "H2 power (task structure)")


def test_coverage_check_fails_for_intervals_that_are_too_wide_or_too_narrow():
    with pytest.raises(AssertionError, match="coverage"):
        check_coverage(np.ones(240, dtype=bool))
    with pytest.raises(AssertionError, match="coverage"):
        check_coverage(np.random.default_rng(1).random(240) < 0.8)


def test_the_false_positive_bound_is_meaningful():
    """At 300 tables the bound on a 5% rate is < 10%: an analysis with a 12% false-positive rate fails; at the
    quick size's 120 it is < 12%: one with 15% fails. Its power bound at 50 tables fails a rate of 0.5."""
    assert upper_bound(N_NULL, ALPHA) < 0.1
    with pytest.raises(AssertionError, match="false positives"):
        check_at_most(np.arange(N_NULL) < 0.12 * N_NULL, ALPHA, "false positives")
    n_null, n_alt = QUICK
    assert upper_bound(n_null, ALPHA) < 0.12
    with pytest.raises(AssertionError, match="false positives"):
        check_at_most(np.arange(n_null) < 0.15 * n_null, ALPHA, "false positives")
    with pytest.raises(AssertionError, match="power"):
        check_power(np.arange(n_alt) < 0.5 * n_alt, "power")
    check_power(np.arange(n_alt) < DETECT * n_alt, "power")  # a rule at exactly DETECT passes


@pytest.mark.extended  # the same checks at 5x the tables (~2 min): `pytest -m extended`, not in CI's run
def test_calibration_with_five_times_more_tables():
    check_all(simulations(5 * N_NULL, 5 * N_ALT))


@pytest.mark.slow
@pytest.mark.parametrize(
    "n_tables", [pytest.param(120, id="quick"), pytest.param(300, id="full", marks=pytest.mark.extended)]
)
@pytest.mark.parametrize("n_seeds", [4, 10])
def test_h2_is_contradicted_at_most_at_alpha_when_the_true_ratio_is_r0(n_seeds: int, n_tables: int):
    """'Contradicted' claims the ratio is below r0: at a true ratio of exactly r0 that is a false claim (at
    most alpha: <= 0.117 at the default tier's 120 tables, <= 0.093 at 300; measured 0.06 of 300 tables at 4
    seeds and at 10)."""
    rng = np.random.default_rng(31 + n_seeds)
    r0 = CFG["variance_ratio_margin"]
    blocks = [
        _role(
            simulation.simulate_table(rng, n_seeds=n_seeds, seed_var={("bf16", "off_task"): r0 * BASE_VAR}),
            "off_task",
        )
        for _ in range(n_tables)
    ]
    check_at_most(h2_verdicts(blocks) == "contradicted", ALPHA, "H2 contradicted at the margin")


def test_h3_sees_a_task_specific_kl_seed_effect():
    """H3 uses the same statistic on KL k3: a 9x seed x task KL variance (shared part equal) is detected."""
    table = simulation.simulate_table(
        np.random.default_rng(41),
        n_seeds=CAL_SEEDS,
        kl_task_var={("bf16", "off_task"): 9 * (simulation.KL_SEED_VAR + simulation.KL_TASK_VAR)},
    )
    # H3 alone as the primary family: the planted effect is sized for one claim (with H2 in the family
    # too, Holm doubles its p: tests/statistics/test_findings.py checks that correction)
    out = stats.analyze(table, {**SMALL, "primary": {"hypotheses": ["H3"]}}, precisions=ARMS)
    assert out["verdicts"]["H3"]["verdict"] == "supported", out["verdicts"]["H3"]["reason"]
    parts = out["mixed_model"]["off_task"]["kl"]["comparisons"]["bf16"]["parts"]
    assert parts["task"]["ratio"] > parts["shared"]["ratio"]


# ----------------------------------------------------------------------------- the mixed model itself


def test_reml_matches_statsmodels_mixedlm_when_there_is_no_eval_noise():
    """Without known noise the model is a random-intercept model statsmodels fits: same REML estimates."""
    from statsmodels.regression.mixed_linear_model import MixedLM

    rng = np.random.default_rng(3)
    y = 0.1 * rng.normal(size=(12, 1)) + 0.05 * rng.normal(size=(12, 4)) + np.arange(4) * 0.1
    data = variance_model.arm_data(y, np.zeros(4))
    scale = variance_model.scale_of(data)
    fit = variance_model.fit_arm(data, variance_model.Grid.around(scale), scale * 1e-12)
    frame = pd.DataFrame(
        {"y": y.ravel(), "seed": np.repeat(np.arange(12), 4), "task": np.tile(np.arange(4), 12)}
    )
    exog = pd.get_dummies(frame["task"], dtype=float).to_numpy()
    ref = MixedLM(frame["y"].to_numpy(), exog, frame["seed"].to_numpy()).fit(reml=True)
    assert fit.sigma2 == pytest.approx(float(np.asarray(ref.cov_re)[0, 0]), rel=0.02)
    assert fit.tau2 == pytest.approx(float(ref.scale), rel=0.02)


def test_known_eval_noise_is_not_counted_as_seed_variance():
    rng = np.random.default_rng(4)
    v = np.array([1e-4, 4e-4, 9e-4, 1.6e-3])  # task-specific eval noise, 16x apart
    y = np.sqrt(2e-4) * rng.normal(size=(400, 1)) + rng.normal(size=(400, 4)) * np.sqrt(v)
    data = variance_model.arm_data(y, v)
    scale = variance_model.scale_of(data)
    fit = variance_model.fit_arm(data, variance_model.Grid.around(scale), scale * 1e-12)
    assert fit.sigma2 == pytest.approx(2e-4, rel=0.2)
    assert fit.tau2 < 5e-5


def test_equal_variance_test_is_exact_under_the_model():
    """Under the model itself, the bootstrap-calibrated one-sided test rejects at alpha."""
    rng = np.random.default_rng(5)
    cov = variance_model.covariance(4e-4, 1e-4, np.full(4, 3e-5))
    rejected = []
    for _ in range(100):
        arms = [
            variance_model.arm_data(rng.multivariate_normal(np.zeros(4), cov, 10), np.full(4, 3e-5))
            for _ in range(2)
        ]
        scale = variance_model.scale_of(*arms)
        grid, floor = variance_model.Grid.around(scale), scale * 1e-12
        fa, fr = (variance_model.fit_arm(d, grid, floor) for d in arms)
        comp = variance_model.compare_arms(fa, fr, grid, ALPHA, 100, rng, floor)
        rejected.append(comp["p"] < ALPHA)
    check_at_most(np.array(rejected), ALPHA, "bootstrap test level")
    check_at_least(np.array(rejected), ALPHA, "bootstrap test level")


def _fits(
    table: pd.DataFrame, role: str = "off_task"
) -> tuple[variance_model.ArmFit, variance_model.ArmFit, float]:
    """(arm fit, reference fit, floor) of one role's dJ."""
    rows = stats._prepare(table, [])[0]
    tasks = sorted(rows.loc[rows["role"] == role, "task"].unique())
    datas = {a: scopes.arm_data_of(rows, a, tasks, "dJ", "noise") for a in ARMS}
    scale = variance_model.scale_of(*datas.values())
    grid, floor = variance_model.Grid.around(scale), scale * 1e-12
    fr, fa = (variance_model.fit_arm(datas[a], grid, floor) for a in ARMS)
    return fa, fr, floor


def test_power_grows_with_the_ratio_and_the_mde_and_seeds_needed_agree_with_it():
    fa, fr, floor = _fits(simulation.simulate_table(np.random.default_rng(21)))
    whole = BASE_VAR + simulation.TASK_VAR  # the simulation's truth
    null = variance_model.NullFit(whole, BASE_VAR / whole, BASE_VAR / whole)
    cfg = {**CFG, "power_simulations": 300, "max_seeds": 128}
    block = power.power_block(fa, fr, null, cfg, np.random.default_rng(22), floor, equivalence=False)
    # the curve runs in the order of power.RATIOS up to the first ratio whose power reaches the target
    assert list(block["power_by_ratio"]) == [f"{r:g}" for r in power.RATIOS[: len(block["power_by_ratio"])]]
    curve = list(block["power_by_ratio"].values())
    target = cfg["power_target"]
    assert all(b >= a - 0.08 for a, b in itertools.pairwise(curve)) and curve[-1] >= target
    assert all(c < target for c in curve[:-1])
    assert block["mde_ratio"] == next(r for r in power.RATIOS if block["power_by_ratio"][f"{r:g}"] >= 0.8)
    assert all(block["power_single"][k] >= v for k, v in block["power_by_ratio"].items())  # family of 1
    need = block["seeds_needed_r0"]
    assert need is not None and need > 10  # a 2x ratio needs far more than 10 seeds
    rng = np.random.default_rng(23)
    assert power.detect_power(null, 2.0, fa, fr, need, ALPHA, 400, rng, floor) >= 0.72
    eq = power.power_block(fa, fr, null, cfg, np.random.default_rng(22), floor, equivalence=True)
    assert eq["equivalence_power"] < 0.2  # showing equivalence within 2x at 10 seeds: hopeless
    assert eq["seeds_needed_equivalence"] > 10 and "power_by_ratio" not in eq and "mde_ratio" not in eq
    assert (
        power.smallest([1, 2, 3, 4, 5], lambda n: n >= 4) == 4
        and power.smallest([1, 2], lambda n: False) is None
    )


@pytest.mark.slow
@pytest.mark.parametrize("size", SIZES)
def test_the_power_module_predicts_the_detection_rate_of_the_calibration_tables(size: tuple[int, int]):
    """power.py simulates the rule the verdicts apply, guards included: its power for the shared structure
    at the ratio the calibration tables were drawn at (arm shared fraction 17/18 at 9x, reference 1/2)
    matches the rate of "supported" over those tables, each through the profile bound, the bootstrap and
    the seed permutation (binomial error of both, 99.9%). The profile bound alone predicts a higher rate."""
    sims = simulations(*size)
    fa, fr, floor = _fits(calibration_table(np.random.default_rng(24), "null"))
    whole = CAL_SHARED + CAL_TASK
    seed_var, _ = simulation.structure("shared", DETECT_RATIO, CAL_SHARED, CAL_TASK)
    null = variance_model.NullFit(
        whole, seed_var[("bf16", "off_task")] / (DETECT_RATIO * whole), CAL_SHARED / whole
    )
    n_sim = 400
    predicted = power.detect_power(
        null, DETECT_RATIO, fa, fr, CAL_SEEDS, ALPHA, n_sim, np.random.default_rng(25), floor
    )
    observed = calibration_rates(sims)["shared"]
    se = np.sqrt(observed * (1 - observed) * (1 / len(sims["shared"]) + 1 / n_sim))
    assert abs(predicted - observed) <= st.norm.ppf(1 - (1 - BOUND_CONF) / 2) * se + 0.02, (
        predicted,
        observed,
    )


def test_the_minimal_detectable_ratio_at_eight_seeds():
    """The simulated MDE (80% power, ratio grid of ``power.RATIOS``) at the default's 8 seeds and 4 tasks.
    Task-specific seed variance without eval noise: <= 4x (power ~0.8 at 3x; the pooled F of issue 22 with
    28 df each gives 2.6x at a 5% one-sided level, 2.9x at the 2.5% of the CI rule). With a noise share of
    1/3: <= 6x mostly task-specific, <= 9x half shared (a shared effect is seen through 7 df only, and the
    seed permutation costs power there; the profile bound alone gave 6x)."""
    whole = CAL_SHARED + CAL_TASK
    cfg = {**CFG, "power_simulations": 400, "max_seeds": 8}
    quiet = simulation.simulate_table(
        np.random.default_rng(26), n_seeds=CAL_SEEDS, n_off=CAL_OFF, n_problems=10**6, n_samples=100
    )
    noisy = calibration_table(np.random.default_rng(26), "null")
    mde = {}
    for name, table, rho in (("task, no noise", quiet, 0.0), ("task 90%", noisy, 0.1), ("half", noisy, 0.5)):
        fa, fr, floor = _fits(table)
        null = variance_model.NullFit(whole, rho, rho)
        mde[name] = power.power_block(fa, fr, null, cfg, np.random.default_rng(27), floor, False)["mde_ratio"]
    assert mde["task, no noise"] <= 4 and mde["task 90%"] <= 6 and mde["half"] <= 9, mde


def test_twelve_seeds_shrink_the_mde_of_a_shared_seed_effect():
    """Why the default has 12 seeds: a seed effect shared by the tasks (what the default's fp32 off-task dJ
    fits) is seen through S - 1 degrees of freedom, so only seeds shrink its MDE. At the calibration's
    noise share of 1/3, all shared: 16x at 8 seeds, 9x at 12 (the whole rule simulated, its seed permutation
    included; the profile bound alone gave 9x and 6x)."""
    whole = CAL_SHARED + CAL_TASK
    cfg = {**CFG, "power_simulations": 400, "max_seeds": 12}
    mde = {}
    for n in (8, 12):
        design = {"n_off": CAL_OFF, "shared_default": CAL_SHARED, "task_default": CAL_TASK, **CAL_NOISE}
        table = simulation.simulate_table(np.random.default_rng(26), n_seeds=n, **design)
        fa, fr, floor = _fits(table)
        null = variance_model.NullFit(whole, 1.0, 1.0)
        mde[n] = power.power_block(fa, fr, null, cfg, np.random.default_rng(27), floor, False)["mde_ratio"]
    assert mde[12] <= 9 < mde[8], mde


# ----------------------------------------------------------------------------- gate, verdicts, fallback


def test_controls_are_judged_apart_negative_not_different_positive_detected():
    """A negative control (the reference under another name) must not be called different; a positive one
    (24x seed x task variance of dJ and 24x the seed variance of KL) must be detected on both, and one that
    moves dJ only fails on KL; none enters the H1-H3 verdicts. Each control is judged as one more arm
    of the H2/H3 family (Holm over bf16 and the control: p < alpha/2 for the first), so the planted
    effect is twice the calibration's detection ratio."""
    arms = ("fp32", "bf16", "fp32_copy", "fp32_noisy", "fp32_dud", "fp32_dj_only")
    r = 2 * DETECT_RATIO
    _, task_var = simulation.structure("task", r, BASE_VAR, simulation.TASK_VAR, arm="fp32_noisy")
    task_var[("fp32_dj_only", "off_task")] = task_var[("fp32_noisy", "off_task")]
    kl_seed_var = {("fp32_noisy", "off_task"): r * (simulation.KL_SEED_VAR + simulation.KL_TASK_VAR)}
    table = simulation.simulate_table(
        np.random.default_rng(51), n_seeds=CAL_SEEDS, arms=arms, task_var=task_var, kl_seed_var=kl_seed_var
    )
    specs = {
        "fp32": {},
        "bf16": {},
        "fp32_copy": {"control": "negative"},
        "fp32_noisy": {"control": "positive"},
        "fp32_dud": {"control": "positive"},  # a positive control without added noise: must fail
        "fp32_dj_only": {"control": "positive"},  # noisier dJ, KL as the reference's: must fail on KL
    }
    # H2 alone as the primary family: the controls' planted effects are sized for the arms' dJ family
    out = stats.analyze(table, {**CFG, "primary": {"hypotheses": ["H2"]}}, precisions=specs)
    c = out["controls"]
    assert set(c) == {"fp32_copy", "fp32_noisy", "fp32_dud", "fp32_dj_only"}
    assert c["fp32_copy"]["passed"] is True and c["fp32_copy"]["outcome"] != "supported"
    assert c["fp32_copy"]["kl_passed"] is True and c["fp32_copy"]["kl_outcome"] != "supported"
    assert c["fp32_noisy"]["passed"] is True and c["fp32_noisy"]["outcome"] == "supported"
    assert c["fp32_noisy"]["kl_outcome"] == "supported"
    assert c["fp32_dud"]["passed"] is False and c["fp32_dud"]["expected"] == "supported"
    only = c["fp32_dj_only"]
    assert only["dJ_passed"] is True and only["kl_passed"] is False and only["passed"] is False
    assert "whole seed-variance ratio" in c["fp32_noisy"]["reason"]
    for h in ("H1", "H2", "H3"):
        assert set(out["verdicts"][h]["by_arm"]) == {"bf16"}
    assert verdicts.control_arms(specs) == {
        "fp32_copy": "negative",
        "fp32_noisy": "positive",
        "fp32_dud": "positive",
        "fp32_dj_only": "positive",
    }


def test_noise_share_is_mean_noise_over_the_pooled_across_seed_variance_and_flags_verdicts():
    table = simulation.simulate_table(
        np.random.default_rng(52), n_seeds=CAL_SEEDS, n_problems=20, n_samples=4
    )
    out = stats.analyze(table, CFG, precisions=ARMS)
    ns = out["noise_share"]
    for arm in ARMS:
        sub = table[(table["precision"] == arm) & (table["role"] == "off_task")]
        y = sub.pivot(index="seed", columns="task", values="dJ").to_numpy()
        noise = sub["eval_noise_var"].mean()
        expect = noise / y.var(axis=0, ddof=1).mean()
        got = ns["by_role"]["off_task"]["dJ"][arm]
        assert got["share"] == pytest.approx(expect) and got["noise_var"] == pytest.approx(noise)
    assert ns["warn_above"] == 0.5 and expect > 0.5
    assert set(ns["at_risk"]["H2"]) == set(ARMS)  # 80 samples per task: the noise dominates
    assert "H3" not in ns["at_risk"]  # KL: noise SE 0.002 against seed sd 0.01


def test_simulated_kl_noise_across_runs_is_the_mc_var_column_not_the_prompt_level_se():
    """The simulation's KL: only the Monte-Carlo part differs between runs; the prompt-set deviation is
    fixed per task (so kl_rb_se^2 overstates the noise), as in the experiment (``kl``)."""
    zero = {(a, r): 0.0 for a in simulation.ARMS for r in simulation.ROLES}
    seeds = 200
    table = simulation.simulate_table(
        np.random.default_rng(56), n_seeds=seeds, kl_seed_var=zero, kl_task_var=0.0
    )
    runs = table[table["run"] != "base"]
    mc, se = runs["kl_rb_mc_var"].unique(), runs["kl_rb_se"].unique()
    assert len(mc) == 1 and len(se) == 1 and se[0] ** 2 > 2 * mc[0]
    df = seeds - 1
    lo, hi = st.chi2.ppf([0.0005, 0.9995], df) / df  # a variance from `seeds` draws, per arm x task
    ratio = runs.groupby(["precision", "task"])["kl_rb"].var() / mc[0]
    assert ratio.between(lo, hi).all(), ratio
    means = runs.groupby("task")["kl_rb"].mean() - 0.05  # the fixed deviation, shared by both arms
    assert (means.abs() > 4 * np.sqrt(mc[0] / (2 * seeds))).any()


def test_kl_noise_is_the_mc_var_and_falls_back_to_the_prompt_level_se_with_a_warning():
    table = simulation.simulate_table(np.random.default_rng(55), n_seeds=CAL_SEEDS)

    def kl_noise(t: pd.DataFrame) -> tuple[float, list[str]]:
        out = stats.analyze(t, CFG, precisions=ARMS)
        return out["noise_share"]["by_role"]["off_task"]["kl"]["fp32"]["noise_var"], out["warnings"]

    noise, warnings = kl_noise(table)
    assert noise == pytest.approx(simulation.KL_MC_SD**2)
    assert not any("kl_rb_mc_var" in w for w in warnings)
    se2 = simulation.KL_MC_SD**2 + simulation.KL_PROMPT_SD**2
    one_sample = table.assign(kl_rb_mc_var=np.where(table["run"] == "fp32-s1", np.nan, table["kl_rb_mc_var"]))
    noise, warnings = kl_noise(one_sample)  # kl_samples 1 in one run: null mc var, that run falls back
    assert noise == pytest.approx(simulation.KL_MC_SD**2 + (se2 - simulation.KL_MC_SD**2) / CAL_SEEDS)
    n_rows = int((table["run"] == "fp32-s1").sum())
    assert [w for w in warnings if "kl_rb_mc_var" in w] == [
        f"kl_rb_mc_var missing for {n_rows} row(s): their KL eval noise is kl_rb_se^2, the conservative "
        "prompt-level bound (it counts the fixed between-prompt spread as noise)"
    ]
    noise, warnings = kl_noise(table.drop(columns="kl_rb_mc_var"))  # results from before the column
    assert noise == pytest.approx(se2) and any("conservative prompt-level bound" in w for w in warnings)


def test_brown_forsythe_on_one_task_is_the_classical_test():
    rng = np.random.default_rng(53)
    x, y = rng.normal(0, 1, 9), rng.normal(0, 2, 8)
    assert stat_tests.brown_forsythe(x, y)["p"] == pytest.approx(st.levene(x, y, center="median").pvalue)


def test_the_classical_fallback_sees_task_specific_seed_variance():
    """The fallback tests the same unit as the model (per-task variance pooled over the tasks): with the
    model failed, a 9x seed x task structure is still supported in >= 80% of 40 tables."""
    rng = np.random.default_rng(54)
    hits = []
    for _ in range(40):
        rows = stats._prepare(calibration_table(rng, "task"), [])[0]
        tasks = sorted(rows.loc[rows["role"] == "off_task", "task"].unique())
        comp = scopes.classical_scope(rows, tasks, ARMS, CFG, "fallback", 0.01)["comparisons"]["bf16"]
        failed = {"status": "failed", "reason": "simulated failure"}
        v, why = verdicts.verdict_variance(failed, comp["dJ_var"], None, CFG, "off-task dJ")
        hits.append(v == "supported")
    assert "mixed model failed" in why and comp["dJ_var"]["n_tasks"] == CAL_OFF
    check_rate_at_least(np.array(hits), DETECT, "fallback power (task structure)")


def test_gate_makes_every_verdict_not_testable_with_the_numbers():
    table = simulation.simulate_table(np.random.default_rng(6), gain={"on_task": 0.0})
    out = stats.analyze(table, CFG, precisions=ARMS)
    assert out["gate"]["passed"] is False
    for h in ("H1", "H2", "H3"):
        v = out["verdicts"][h]
        assert v["verdict"] == "not testable"
        assert "the gate did not pass" in v["reason"]
        assert "on-task dJ" in v["reason"] and "p=" in v["reason"]


def test_gate_passes_and_h2_is_supported_for_a_planted_9x_ratio_with_power_stated():
    table = simulation.simulate_table(np.random.default_rng(7), seed_var={("bf16", "off_task"): 9 * BASE_VAR})
    out = stats.analyze(table, SMALL, precisions=ARMS)
    assert out["gate"]["passed"] and out["gate"]["margin"] == pytest.approx(0.25 * out["gate"]["mean"])
    h2 = out["verdicts"]["H2"]
    assert h2["verdict"] == "supported", h2["reason"]
    assert "MDE" in h2["reason"] and "seeds per arm" in h2["reason"]
    comp = out["mixed_model"]["off_task"]["dJ"]["comparisons"]["bf16"]
    assert comp["ratio_ci"][0] > 1 and comp["p"] < ALPHA and comp["p_source"] == "parametric bootstrap"
    assert comp["power"]["status"] == "ok" and comp["power"]["mde_ratio"] is not None
    h1 = out["verdicts"]["H1"]["reason"]
    assert "MDE" not in h1 and "power to show equivalence" in h1  # H1 is an equivalence verdict


def test_h1_supported_only_with_mean_and_variance_equivalence():
    mean = {
        "status": "ok",
        "diff": 0.001,
        "ci_low": -0.004,
        "ci_high": 0.006,
        "tost": {"margin": 0.02, "p": 0.001, "equivalent": True},
    }
    inside = {
        "status": "ok",
        "ratio": 1.1,
        "ratio_ci": [0.6, 1.9],
        "ratio_ci_equivalence": [0.7, 1.7],
        "p": 0.4,
    }
    wide = {**inside, "ratio_ci": [0.3, 4.0], "ratio_ci_equivalence": [0.4, 3.0]}
    outside = {**inside, "ratio": 8.0, "ratio_ci": [2.5, 20.0], "ratio_ci_equivalence": [3.0, 15.0]}
    assert verdicts.verdict_h1(mean, inside, {}, None, CFG)[0] == "supported"
    assert verdicts.verdict_h1(mean, wide, {}, None, CFG)[0] == "inconclusive"
    assert verdicts.verdict_h1(mean, outside, {}, None, CFG)[0] == "contradicted"
    shifted = {
        **mean,
        "diff": 0.05,
        "ci_low": 0.03,
        "ci_high": 0.07,
        "tost": {**mean["tost"], "equivalent": False},
    }
    assert verdicts.verdict_h1(shifted, inside, {}, None, CFG)[0] == "contradicted"


def test_h2_contradicted_when_the_ratio_is_shown_below_r0():
    shown_small = {
        "status": "ok",
        "ratio": 0.9,
        "ratio_ci": [0.4, 1.8],
        "ratio_ci_equivalence": [0.5, 1.6],
        "p": 0.6,
    }
    assert verdicts.verdict_variance(shown_small, {}, None, CFG, "x")[0] == "contradicted"
    unsure = {**shown_small, "ratio_ci": [0.4, 3.5]}
    assert verdicts.verdict_variance(unsure, {}, None, CFG, "x")[0] == "inconclusive"
    big_but_untested = {**shown_small, "ratio": 5, "ratio_ci": [1.2, 20], "p": 0.2}
    assert verdicts.verdict_variance(big_but_untested, {}, None, CFG, "x")[0] == "inconclusive"


def test_a_failed_fit_falls_back_to_the_classical_tests_and_says_so():
    classical = {
        "ratio": 6.0,
        "brown_forsythe": {"status": "ok", "p": 0.01},
        "bootstrap": {"status": "ok", "ratio_ci_low": 1.5, "ratio_ci_high": 20.0},
    }
    model = {"status": "failed", "reason": "estimate at the upper edge of the variance grid"}
    v, why = verdicts.verdict_variance(model, classical, None, CFG, "off-task dJ")
    assert v == "supported" and "mixed model failed" in why and "upper edge" in why


def test_diverged_runs_are_excluded_and_counted():
    table = simulation.simulate_table(np.random.default_rng(8))
    table.loc[table["run"] == "bf16-s3", "diverged"] = True
    table.loc[table["run"] == "bf16-s3", "dJ"] = -0.9  # a collapsed policy
    table["health_reasons"] = np.where(table["run"] == "bf16-s3", "entropy collapsed", "")
    out = stats.analyze(table, CFG, precisions=ARMS)
    assert out["excluded_runs"]["count"] == 1 and out["excluded_runs"]["diverged"] == ["bf16-s3"]
    assert out["excluded_runs"]["reasons"]["bf16-s3"] == "entropy collapsed"
    assert out["n"]["seeds"] == {"fp32": 10, "bf16": 9}
    assert out["by_task_type"]["off_task"]["comparisons"]["bf16"]["paired"]  # 9 shared seeds


# ----------------------------------------------------------------------------- classical tests


@pytest.mark.parametrize("paired", [True, False])
def test_tost_equivalent_for_equal_means_and_not_for_shifted(paired):
    rng = np.random.default_rng(6)
    y = rng.normal(0.05, 0.01, 10)
    x_same, x_shift = y + rng.normal(0, 0.01, 10), y + 0.1 + rng.normal(0, 0.01, 10)
    pairs = (lambda x: (x, y)) if paired else (lambda x: None)
    same = stat_tests.compare_means(x_same, y, pairs(x_same), ALPHA, 0.05)
    shifted = stat_tests.compare_means(x_shift, y, pairs(x_shift), ALPHA, 0.05)
    assert same["design"] == ("paired" if paired else "welch")
    assert same["tost"]["equivalent"] and same["tost"]["p"] < ALPHA
    assert not shifted["tost"]["equivalent"] and shifted["p"] < ALPHA


def test_brown_forsythe_and_pitman_morgan_hold_their_level():
    rng = np.random.default_rng(2)
    bf = [
        stat_tests.brown_forsythe(rng.normal(0, 0.03, 10), rng.normal(0.1, 0.03, 10))["p"] < ALPHA
        for _ in range(200)
    ]
    check_at_most(np.array(bf), ALPHA, "BF level")
    cov = [[1.0, 0.5], [0.5, 1.0]]
    pm = [
        stat_tests.pitman_morgan(*rng.multivariate_normal([0, 0], cov, 10).T)["p"] < ALPHA for _ in range(200)
    ]
    check_at_most(np.array(pm), ALPHA, "Pitman-Morgan level")


def test_pairing_uses_the_seeds_both_arms_have():
    x, y = np.array([1.0, 2.0, 3.0]), np.array([10.0, 30.0])
    px, py = stat_tests.paired(x, np.array([1, 2, 3]), y, np.array([3, 1]))
    assert px.tolist() == [1.0, 3.0] and py.tolist() == [30.0, 10.0]


def test_sampling_noise_var_is_unbiased():
    rng = np.random.default_rng(14)
    p, n = rng.beta(2, 3, 200), 8
    counts = rng.binomial(n, p, size=(200, 200))
    estimates = [stats.sampling_noise_var(c, n) for c in counts]
    true = np.sum(p * (1 - p) / n) / 200**2
    assert abs(np.mean(estimates) / true - 1) < 0.02


# ----------------------------------------------------------------------------- analyze: shape, degenerate


def _check_output(out: dict) -> None:
    json.dumps(out, allow_nan=False)
    for h in ("H1", "H2", "H3"):
        assert out["verdicts"][h]["verdict"] in VERDICTS
        assert out["verdicts"][h]["reason"] and out["verdicts"][h]["rule"]


def test_defaults_come_from_the_schema_only():
    assert not hasattr(stats, "DEFAULTS")
    defaults = stats.analysis_defaults()
    assert {
        "alpha",
        "mean_margin_fraction",
        "variance_ratio_margin",
        "power_target",
        "bootstrap",
        "seed",
    } <= set(defaults)
    out = stats.analyze(
        simulation.simulate_table(np.random.default_rng(9), n_seeds=3),
        {"power_simulations": 10, "bootstrap": 100, "max_seeds": 12},  # a search to 128 seeds: 1.5x the time
    )
    assert out["config"]["mean_margin_fraction"] == defaults["mean_margin_fraction"]


def test_analyze_one_seed_is_not_an_error():
    out = stats.analyze(simulation.simulate_table(np.random.default_rng(10), n_seeds=1), SMALL)
    _check_output(out)
    assert {v["verdict"] for v in out["verdicts"].values()} == {"not testable"}
    assert out["mixed_model"]["off_task"]["dJ"]["status"] == "failed"


def test_analyze_constant_dj_and_missing_kl_and_noise_columns():
    table = simulation.simulate_table(np.random.default_rng(11), n_seeds=4)
    table = table.drop(columns=["kl_rb", "kl_rb_se", "eval_noise_var", "J"])
    table.loc[table["run"] != "base", "dJ"] = 0.01
    out = stats.analyze(table, SMALL, precisions=ARMS)
    _check_output(out)
    assert out["eval_noise_source"] == "none"
    assert any("kl_rb" in w for w in out["warnings"])
    assert out["mixed_model"]["off_task"]["kl"]["status"] == "failed"


def test_analyze_three_arms_unpaired_seeds_and_config_order():
    table = simulation.simulate_table(np.random.default_rng(12), n_seeds=4, arms=("bf16", "fp32", "fp16"))
    table = table[~((table["precision"] == "fp16") & (table["seed"] == 4))]
    out = stats.analyze(table, SHAPE, precisions=["fp32", "bf16", "fp16"])
    _check_output(out)
    assert out["reference"] == "fp32"
    comps = out["by_task_type"]["off_task"]["comparisons"]
    assert set(comps) == {"bf16", "fp16"}
    assert set(out["verdicts"]["H2"]["by_arm"]) == {"bf16", "fp16"}


def test_analyze_single_arm_and_missing_task_rows():
    out = stats.analyze(
        simulation.simulate_table(np.random.default_rng(13), n_seeds=3, arms=("fp32",)), SHAPE
    )
    _check_output(out)
    table = simulation.simulate_table(np.random.default_rng(13), n_seeds=3)
    table = table[~((table["run"] == "bf16-s2") & (table["task"] == "off1"))]
    out = stats.analyze(table, SHAPE)
    assert "off1" not in out["tasks"]["off_task"]
    assert any("off1" in w for w in out["warnings"])


def test_analyze_rejects_malformed_tables():
    table = simulation.simulate_table(np.random.default_rng(14), n_seeds=2)
    with pytest.raises(ValueError, match="lacks column"):
        stats.analyze(table.drop(columns=["role"]), CFG)
    with pytest.raises(ValueError, match="duplicate"):
        stats.analyze(pd.concat([table, table.tail(1)]), CFG)


def test_json_safe_replaces_non_finite_numbers():
    out = stats.json_safe({"a": np.float64("nan"), "b": [np.inf, np.int64(2)], 3: (np.bool_(True), None)})
    assert out == {"a": None, "b": [None, 2], "3": [True, None]}


# ----------------------------------------------------------------------------- degenerate but legal tables

SIX_ARMS = ["fp32", "fp32_drop", "bf16", "bf16_drop", "autocast", "autocast_drop"]


def flat_table(arms=SIX_ARMS, n_seeds: int = 2) -> pd.DataFrame:
    """What a few-step run of a tiny model gives: every dJ and KL exactly 0, no eval noise."""
    table = simulation.simulate_table(np.random.default_rng(30), n_seeds=n_seeds, n_off=1, arms=arms)
    return table.assign(dJ=0.0, J=0.0, eval_noise_var=0.0, kl_rb=0.0, kl_rb_se=0.0, kl_rb_mc_var=0.0)


def test_zero_spread_and_zero_noise_give_not_testable_verdicts_and_no_fake_ratios():
    out = stats.analyze(flat_table(), SMALL, precisions=SIX_ARMS)
    _check_output(out)
    assert out["gate"]["passed"] is False and "p=" in out["gate"]["reason"]
    for h in ("H1", "H2", "H3"):
        v = out["verdicts"][h]
        assert v["verdict"] == "not testable" and "the gate did not pass" in v["reason"]
        assert set(v["by_arm"]) == set(SIX_ARMS[1:])
    for role in ("on_task", "off_task"):
        for q in ("dJ", "kl"):
            block = out["mixed_model"][role][q]
            for arm in SIX_ARMS:
                fit = block["arms"][arm]
                assert fit["status"] == "ok" and fit["whole_var"] == 0 and fit["whole_var_ci"] == [0, 0]
            for comp in block["comparisons"].values():
                # 0/0: no number is invented, the reason says why
                assert comp["ratio"] is None and "both fitted seed variances are 0" in comp["reason"]
                assert comp["p"] == 1.0
    var = out["by_task_type"]["off_task"]["comparisons"]["autocast"]["dJ_var"]
    assert var["ratio"] is None


def test_an_arm_with_all_equal_values_and_no_noise_is_analysed_and_never_supported_by_default():
    table = simulation.simulate_table(np.random.default_rng(31), n_seeds=4, n_off=2)
    flat = (table["precision"] == "bf16") & (table["role"] == "off_task")
    table.loc[flat, "dJ"] = 0.0
    table.loc[flat, "eval_noise_var"] = 0.0
    out = stats.analyze(table, SHAPE, precisions=ARMS)
    _check_output(out)
    assert out["gate"]["passed"]
    comp = out["mixed_model"]["off_task"]["dJ"]["comparisons"]["bf16"]
    assert comp["status"] == "ok" and comp["ratio"] == 0.0 and comp["ratio_ci"][0] == 0.0
    h2 = out["verdicts"]["H2"]
    assert h2["verdict"] in {"inconclusive", "contradicted"}, h2["reason"]
    assert h2["verdict"] != "supported"


def test_an_arm_with_two_seeds_among_arms_with_more_is_analysed_with_its_limits_stated():
    table = simulation.simulate_table(np.random.default_rng(32), n_seeds=4, arms=("fp32", "bf16", "autocast"))
    table = table[~((table["precision"] == "autocast") & (table["seed"] > 2))]
    out = stats.analyze(table, SHAPE, precisions=["fp32", "bf16", "autocast"])
    _check_output(out)
    assert out["n"]["seeds"] == {"fp32": 4, "bf16": 4, "autocast": 2}
    var = out["by_task_type"]["off_task"]["comparisons"]["autocast"]["dJ_var"]
    assert var["brown_forsythe"]["status"] == "skipped" and "3 seeds" in var["brown_forsythe"]["reason"]
    assert set(out["verdicts"]["H2"]["by_arm"]) == {"bf16", "autocast"}
    fit = out["mixed_model"]["off_task"]["dJ"]["arms"]["autocast"]
    assert fit["status"] == "ok" and fit["n_seeds"] == 2


# ------------------------------------------------------------------ KL across tasks of different scales


def _kl_on_scales(seed: int, arm_factor: float = 1.0) -> pd.DataFrame:
    """A simulated table whose off-task KL lives on scales 1000x apart (the default run: mcq 3e-4 nats,
    chain 0.36): task off0 divided by 1000, values and noise alike; ``arm_factor`` scales bf16's
    deviations from its task means (its seed variance by arm_factor^2)."""
    t = simulation.simulate_table(np.random.default_rng(seed), n_seeds=8, n_problems=200, n_samples=32)
    t["kl_rb"] = t["kl_rb"].astype(float)
    bf16 = t["precision"] == "bf16"
    for task in t["task"].unique():
        sel = bf16 & (t["task"] == task)
        mean = t.loc[sel, "kl_rb"].mean()
        t.loc[sel, "kl_rb"] = mean + arm_factor * (t.loc[sel, "kl_rb"] - mean)
    small = t["task"] == "off0"
    t.loc[small, "kl_rb"] *= 1e-3
    t.loc[small, "kl_rb_se"] *= 1e-3
    t.loc[small, "kl_rb_mc_var"] *= 1e-6
    return t


def test_kl_on_task_scales_1000x_apart_is_fitted_per_task_spread_not_pinned_at_zero():
    """In nats the tiny task would pin the role's common variance at 0 and a verdict would rest on a
    degenerate fit; in units of each task's across-seed SD (common to both arms) the reference keeps
    its seed variance and equal arms are not called different."""
    for seed in range(3):
        s = stats.analyze(_kl_on_scales(seed), CFG, precisions=list(ARMS))
        kl = s["mixed_model"]["off_task"]["kl"]
        assert kl["units"] == scopes.RELATIVE["kl"] and len(kl["task_scales"]) == 4
        assert min(kl["task_scales"]) < 1e-2 * max(kl["task_scales"])  # the scales were really apart
        ref = kl["arms"]["fp32"]
        assert ref["whole_var"] > 0 and ref["whole_var_ci"][1] > 0
        assert s["verdicts"]["H3"]["verdict"] != "supported"


def test_kl_model_detects_a_more_variable_arm_across_task_scales():
    hits = 0
    for seed in range(3):
        s = stats.analyze(_kl_on_scales(seed, arm_factor=4.0), CFG, precisions=list(ARMS))  # 16x variance
        hits += s["verdicts"]["H3"]["verdict"] == "supported"
    assert hits >= 2


def test_power_is_scaled_from_the_reference_arm_not_the_common_null():
    t = _kl_on_scales(0, arm_factor=0.1)  # bf16 100x less variable than fp32
    s = stats.analyze(t, SMALL, precisions=list(ARMS))  # seeds searched to 12, not 128: the same basis
    comp = s["mixed_model"]["off_task"]["kl"]["comparisons"]["bf16"]
    ref = s["mixed_model"]["off_task"]["kl"]["arms"]["fp32"]
    assert comp["power"]["basis"].startswith("the reference's fitted whole seed variance")
    assert comp["power"]["whole_var_ref"] == pytest.approx(ref["whole_var"], rel=1e-9)
    assert comp["power"]["whole_var_ref"] > 1.5 * comp["null"]["whole_var"]  # the null sits between
