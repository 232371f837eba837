"""The verdicts' words and corrections: Holm's adjusted p (against statsmodels), findings from intervals,
and when the absolute and matched-drift scales disagree."""

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
    assert v == "inconclusive" and "not after Holm's correction over the 4 arms" in why
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


@pytest.mark.parametrize(
    ("absolute", "drift", "agree"),
    [
        ("smaller", "larger", False),
        ("larger", "not larger than r0=2", False),
        ("smaller", "not larger than r0=2", True),
        ("larger", "larger", True),
        ("smaller", "inconclusive", None),
        ("not testable", "larger", None),
    ],
)
def test_the_scales_disagree_only_where_one_finds_larger_and_the_other_does_not(absolute, drift, agree):
    assert vd.scales_agree(absolute, drift) is agree
