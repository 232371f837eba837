"""The verdicts' words and corrections: Holm's adjusted p (against statsmodels), findings from intervals,
and the primary family's correction of larger and smaller together."""

from __future__ import annotations

import numpy as np
import pytest
from statsmodels.stats.multitest import multipletests

from workflow_scripts.statistics import verdicts as vd

CFG = {"alpha": 0.05, "variance_ratio_margin": 2.0}


@pytest.mark.parametrize("seed", range(5))
def test_holm_adjusted_p_values_equal_statsmodels(seed):
    p = np.random.default_rng(seed).uniform(0, 0.2, size=6)
    ours = vd.holm({f"arm{i}": float(x) for i, x in enumerate(p)})
    theirs = multipletests(p, method="holm")[1]
    assert np.allclose([ours[f"arm{i}"] for i in range(6)], theirs)


def test_holm_leaves_out_untested_arms_and_a_single_test_is_unchanged():
    assert vd.holm({"a": 0.01, "b": None}) == {"a": 0.01}
    assert vd._corrected("supported", "why", 0.03, 1, 0.05) == ("supported", "why")
    v, why = vd._corrected("supported", "why", 0.06, 4, 0.05)
    assert v == "inconclusive" and "not after Holm's correction over the 4 variance claims" in why
    assert vd._corrected("contradicted", "why", 0.9, 4, 0.05) == ("contradicted", "why")


def _model(lo: float, hi: float) -> dict:
    return {
        "status": "ok",
        "ratio": (lo + hi) / 2,
        "ratio_ci": [lo, hi],
        "ratio_ci_equivalence": [lo, hi],
        "p": 1,
    }


@pytest.mark.parametrize(
    ("verdict", "ci", "finding"),
    [
        ("supported", (1.2, 5.0), "larger"),
        ("contradicted", (0.1, 0.8), "smaller"),
        ("contradicted", (0.5, 1.7), "not larger than r0=2"),
        ("inconclusive", (0.5, 4.0), "inconclusive"),
        ("not testable", (0.5, 4.0), "not testable"),
    ],
)
def test_variance_findings_say_what_the_interval_shows(verdict, ci, finding):
    assert vd.finding_variance(verdict, _model(*ci), {}, CFG) == finding


def test_h1_findings_name_the_mean_or_the_variance_that_differs():
    tost = {"margin": 0.05}
    lower = {"status": "ok", "ci_low": -0.2, "ci_high": -0.1, "tost": tost}
    assert vd.finding_h1("contradicted", lower, _model(0.5, 1.5), {}, CFG) == "mean lower"
    higher = {"status": "ok", "ci_low": 0.1, "ci_high": 0.2, "tost": tost}
    assert vd.finding_h1("contradicted", higher, _model(0.5, 1.5), {}, CFG) == "mean higher"
    equal = {"status": "ok", "ci_low": -0.01, "ci_high": 0.01, "tost": tost}
    assert vd.finding_h1("contradicted", equal, _model(2.5, 9.0), {}, CFG) == "variance larger"
    assert vd.finding_h1("supported", equal, _model(0.8, 1.2), {}, CFG) == "equivalent"


def _comp(ratio: float, ci: tuple[float, float], p: float, p_smaller: float, p_r0: float) -> dict:
    model = {**_model(*ci), "ratio": ratio, "p": p, "p_smaller": p_smaller, "p_below_r0": p_r0}
    return {"dJ_model": model, "dJ_var": {}, "kl_model": model, "kl_var": {}}


def test_smaller_and_larger_are_corrected_together_and_an_inconclusive_says_why():
    """One family over H2 and H3 of two arms (4 claims): a 'smaller' at p 0.03 survives no Holm
    step with a 0.01 beside it (4 x 0.01 = 0.04, then 2 x 0.03 = 0.06), and its reason names the
    adjusted p; a bound at p 0.001 still reads 'not larger than r0'."""
    big = _comp(5.0, (1.5, 12.0), 0.01, 1.0, 1.0)
    small = _comp(0.3, (0.1, 0.9), 1.0, 0.03, 0.3)
    bounded = _comp(0.3, (0.1, 0.9), 1.0, 0.03, 0.001)
    by_role = {"off_task": {"comparisons": {"a": big, "b": small}}}
    adj = vd.family_adjusted(by_role, ["ref", "a", "b"], {}, ("H2", "H3"))
    assert adj["differences"][("H2", "a")] == pytest.approx(0.04)
    v, finding, why, p = vd.judge_variance(small, "H2", CFG, adj, ("H2", "b"))
    assert (v, finding) == ("inconclusive", "inconclusive") and p == pytest.approx(0.06)
    assert "lies below 1 uncorrected, but not after Holm over the 4 variance claims" in why
    assert "adjusted p=0.06" in why
    v, finding, _, _ = vd.judge_variance(big, "H2", CFG, adj, ("H2", "a"))
    assert (v, finding) == ("supported", "larger")
    by_role = {"off_task": {"comparisons": {"a": big, "b": bounded}}}
    adj = vd.family_adjusted(by_role, ["ref", "a", "b"], {}, ("H2", "H3"))
    v, finding, why, _ = vd.judge_variance(bounded, "H3", CFG, adj, ("H3", "b"))
    assert (v, finding) == ("contradicted", "not larger than r0=2")
    assert "'smaller' is not after Holm" in why
    assert vd.family_size(4, ["H2", "H3"]) == 8
