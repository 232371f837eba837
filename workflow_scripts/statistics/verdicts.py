"""The decision rules: the training-worked gate and the H1-H3 verdicts, each stated with its power.

Pure functions over blocks that ``stats.analyze`` computed. A verdict is one of 'supported',
'contradicted', 'inconclusive' or 'not testable'; every one carries a reason with the numbers it
rests on and the power (or minimal detectable ratio, MDE) of the decision, so "inconclusive" says what
it would take and "supported" cannot come from a test that could not have rejected.

Gate: the reference arm's on-task dJ (mean over on-task tasks, one value per seed; each dJ is already
paired with the base by problem) must be significantly above 0 (one-sided t across seeds, p < alpha).
Otherwise every verdict is 'not testable: training did not improve the on-task score', because with
no on-task gain "equal on-task change" and "larger off-task spread" say nothing about precision.

r0 = ``variance_ratio_margin``; ratios are WHOLE seed variances arm / reference from the mixed model
(``variance_model``: per task, across seeds, shared seed effect + seed x task effect, known eval noise
held out): CI = (1-alpha) profile interval, equivalence CI = (1-2 alpha), p = one-sided test of equal
whole seed variances calibrated by a parametric bootstrap.

- H1 (on-task dJ) supported: the mean difference is equivalent (paired TOST, margin =
  ``mean_margin_fraction`` x the reference arm's gain) AND the equivalence CI of the ratio lies inside
  (1/r0, r0). Contradicted: the mean difference's (1-alpha) CI lies outside +-margin, or the ratio's
  CI lies outside [1/r0, r0]. Else inconclusive (with the equivalence power, seeds needed and MDE).
- H2 (off-task dJ) supported: the one-sided (1-alpha) lower bound of the ratio (the lower end of the
  (1-2 alpha) profile interval) exceeds 1 and the bootstrap-calibrated test rejects (p < alpha): H2 is
  directional ("larger in bf16"), so both are one-sided alpha tests, and the bootstrap keeps the
  false-positive rate at alpha where the chi-square calibration of the profile bound alone is liberal
  (few seeds); and the same LRT calibrated by permuting the seeds between the arms rejects too
  (``variance_model.permutation_lrt``): the bootstrap assumes normal seed effects, and real ones have
  outlying seeds that it reads as a larger variance.
  Contradicted: the (1-alpha) CI's upper bound is below r0 (no bootstrap calibrates this
  side, so it keeps the two-sided interval: about alpha/2 nominal, at most alpha measured). Else
  inconclusive (with power at r0, seeds needed for it, and MDE).
- H3 (KL, ``analysis.kl_estimator``): the H2 rule on the off-task KL; the on-task KL ratio is reported
  beside it (the hypothesis says on-task KL stays leashed).

If the model fit failed for a comparison, the verdict falls back to the classical tests on the same
unit (the per-task variance across seeds pooled over the role's tasks: BF on each seed's mean absolute
deviation for the test, the seed bootstrap CI for the bounds) and the reason says so.

Findings (``judge_variance``, ``finding_h1``): each verdict also in words that say what was found:
larger, smaller (the ratio's CI below 1), not larger than r0 (below r0), equivalent, mean lower /
higher, inconclusive. One primary analysis (``analysis.primary``: the absolute scale, H2 and H3): every
variance claim the summary states (larger or smaller, every arm, H2 and H3) is one member of one Holm
family (``family_adjusted``): the arms share the reference's runs, so a low draw of its spread makes
every arm look larger at once, and the summary picks from all of them. "Not larger than r0" bounds the
ratio and is corrected over the same comparisons apart. An "inconclusive" whose interval excludes 1
says "not after Holm" with the adjusted p. Each arm's row carries the null yardstick
(``yardstick``: the ratio over random splits of the reference's seeds) and any negative control's
ratio on the same comparison. The divisor scales (dJ / sqrt(KL), log KL) enter no verdict. This
module is long on purpose: the rules, their words and their correction must be read together.

Controls: a precision entry with ``control: negative`` (the reference under another name) or
``control: positive`` (the reference with added update noise) is not a precision arm: it is left out
of H1-H3 and judged in ``control_outcomes`` by the H2 rule on its off-task dJ and the H3 rule on its
off-task KL, without the gate (the instrument is what is checked): a negative control passes iff
neither comparison is 'supported', a positive control iff both are (KL where it was measured).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from scipy import stats as st

NOT_TESTABLE = "the gate did not pass (no significant on-task gain in the reference arm)"
SCOPES = {"H1": ("on_task", "dJ"), "H2": ("off_task", "dJ"), "H3": ("off_task", "kl")}  # (role, quantity)
CONTROL_KINDS = ("negative", "positive")


def control_arms(precisions: Mapping[str, Any]) -> dict[str, str]:
    """{arm: negative | positive} from the config's precisions section (each entry's ``control``)."""
    return {
        p: str(spec["control"])
        for p, spec in precisions.items()
        if isinstance(spec, Mapping) and spec.get("control")
    }


def _f(x: Any, d: int = 3) -> str:
    try:
        x = float(x)
    except (TypeError, ValueError):
        return "n/a"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return f"{x:.{d}g}" if math.isfinite(x) else "n/a"


def _ci(lo_hi: Sequence[Any] | None) -> str:
    return f"[{_f(lo_hi[0])}, {_f(lo_hi[1])}]" if lo_hi else "[n/a]"


def gate(values: Sequence[float], alpha: float, arm: str, base_noise: float = 0.0) -> dict[str, Any]:
    """Is the reference arm's on-task dJ (one value per seed) significantly above 0?

    ``base_noise``: eval-noise variance of the base's on-task J, shared by every seed's dJ, so it adds
    to the SE of the mean and not to the spread across seeds.
    """
    x = [float(v) for v in values]
    n = len(x)
    if n < 2:
        return {
            "passed": False,
            "arm": arm,
            "n_seeds": n,
            "mean": x[0] if x else None,
            "reason": f"{arm} has {n} seed(s): a gain across seeds cannot be tested",
        }
    mean = sum(x) / n
    se = math.sqrt(float(np.var(x, ddof=1)) / n + max(base_noise, 0.0))
    t = mean / se if se > 0 else (math.inf if mean > 0 else 0.0)
    p = float(st.t.sf(t, n - 1))
    passed = bool(mean > 0 and p < alpha)
    word = "improved" if passed else "did not significantly improve"
    return {
        "passed": passed,
        "arm": arm,
        "n_seeds": n,
        "mean": mean,
        "se": se,
        "t": t,
        "p": p,
        "alpha": alpha,
        "base_noise_var": base_noise,
        "reason": f"{arm} on-task dJ {_f(mean)} ± {_f(se, 2)} (SE, {n} seeds), one-sided t p={_f(p)}: "
        f"training {word} the on-task score",
    }


def _power_text(power: Mapping | None, equivalence: bool) -> str:
    if not power or power.get("status") != "ok":
        return f"power not computed ({(power or {}).get('reason', 'no model fit')})"
    n = power["n_seeds"]
    if equivalence:
        need = power.get("seeds_needed_equivalence")
        need_s = f"{need} seeds per arm" if need else f"> {power['max_seeds']} seeds per arm"
        return (
            f"power to show equivalence at ratio 1: {_f(power.get('equivalence_power'), 2)} with {n} seeds "
            f"({need_s} for {power['target']:.0%})"
        )
    mde = power.get("mde_ratio")
    mde_s = f"MDE {_f(mde)}x" if mde else f"MDE > {max(float(r) for r in power['power_by_ratio']):g}x"
    if (power.get("family") or 1) > 1:
        single = power.get("mde_ratio_single")
        mde_s += (f" (Holm over {power['family']} arms; as one comparison "
                  f"{f'{_f(single)}x' if single else 'not reached'})")  # fmt: skip
    need = power.get("seeds_needed_r0")
    need_s = f"{need} seeds per arm" if need else f"> {power['max_seeds']} seeds per arm"
    return (
        f"power at ratio {_f(power['r0'])}: {_f(power.get('power_at_r0'), 2)} with {n} seeds ({need_s} "
        f"for {power['target']:.0%}); {mde_s} at {power['target']:.0%} power"
    )


def _bounds(model: Mapping, classical: Mapping) -> tuple[list | None, list | None, float | None, str]:
    """(CI, equivalence CI, p, source) from the model, else from the classical tests."""
    if model.get("status") == "ok":
        return model["ratio_ci"], model["ratio_ci_equivalence"], model["p"], "mixed model"
    boot = classical.get("bootstrap") or {}
    bf = classical.get("brown_forsythe") or {}
    ci = [boot["ratio_ci_low"], boot["ratio_ci_high"]] if boot.get("status") == "ok" else None
    p = bf.get("p") if bf.get("status") == "ok" else None
    if p is not None and (classical.get("ratio") or 0) <= 1:
        p = 1.0  # one-sided: only a larger arm variance counts
    why = model.get("reason") or "not fitted"
    return ci, ci, p, f"classical tests (mixed model failed: {why})"


def _parts(model: Mapping) -> str:
    """' (shared x, seed x task y)': the two parts' ratios, where the model separated them."""
    parts = model.get("parts") or {}
    if model.get("status") != "ok" or any(
        (parts.get(k) or {}).get("status") != "ok" for k in ("shared", "task")
    ):
        return ""
    return f" (shared {_f(parts['shared']['ratio'])}, seed x task {_f(parts['task']['ratio'])})"


def robust_check(model: Mapping) -> float | None:
    """The seed-permutation p a model-based 'supported' must also pass (``variance_model.permutation_lrt``);
    None where the model failed or did not run it (the verdict then rests on what there is)."""
    perm = (model.get("permutation") or {}) if model.get("status") == "ok" else {}
    return float(perm["p"]) if perm.get("status") == "ok" else None


def _robust_text(p: float | None) -> str:
    return "" if p is None else f", seed permutation p={_f(p)}"


def verdict_variance(
    model: Mapping, classical: Mapping, power: Mapping | None, cfg: Mapping, what: str
) -> tuple[str, str]:
    """H2/H3 rule for one arm (see module docstring)."""
    alpha, r0 = float(cfg["alpha"]), float(cfg["variance_ratio_margin"])
    ci, one_sided, p, source = _bounds(model, classical)
    ratio = model.get("ratio") if model.get("status") == "ok" else classical.get("ratio")
    pw = _power_text(power, equivalence=False)
    if ci is None or p is None:
        return "inconclusive", f"{what}: no variance comparison ({source}); {pw}"
    nums = (f"{what} whole seed-variance ratio {_f(ratio)} {_ci(ci)} (one-sided bound {_f(one_sided[0])}), "
            f"p={_f(p)} ({source}){_parts(model)}")  # fmt: skip
    if one_sided[0] is not None and one_sided[0] > 1 and p < alpha:
        robust = robust_check(model)
        if robust is None or robust < alpha:
            return (
                "supported",
                f"{nums}: one-sided bound above 1 and the test rejects{_robust_text(robust)}; {pw}",
            )
        return "inconclusive", (
            f"{nums}: the bootstrap rejects but the seed permutation does not (p={_f(robust)}): the excess "
            f"may rest on a few outlying seeds; {pw}"
        )
    if ci[1] is not None and ci[1] < r0:
        return "contradicted", f"{nums}: CI below r0={_f(r0)}; {pw}"
    return "inconclusive", f"{nums}: neither above 1 with p < {alpha:g} nor below {_f(r0)}; {pw}"


def verdict_h1(
    mean: Mapping, model: Mapping, classical: Mapping, power: Mapping | None, cfg: Mapping
) -> tuple[str, str]:
    """H1 rule for one arm (see module docstring): mean AND variance equivalence."""
    r0 = float(cfg["variance_ratio_margin"])
    ci, eq_ci, _, source = _bounds(model, classical)
    pw = _power_text(power, equivalence=True)
    if mean.get("status") != "ok":
        return "inconclusive", f"mean comparison skipped: {mean.get('reason')}; {pw}"
    tost = mean["tost"]
    margin = tost["margin"]
    mean_s = (
        f"mean dJ difference {_f(mean['diff'])} (CI {_ci([mean['ci_low'], mean['ci_high']])}, "
        f"margin ±{_f(margin)}, TOST p={_f(tost['p'])})"
    )
    ratio = model.get("ratio") if model.get("status") == "ok" else classical.get("ratio")
    var_s = f"whole seed-variance ratio {_f(ratio)} {_ci(eq_ci)} ({source})"
    if mean["ci_low"] > margin or mean["ci_high"] < -margin:
        return "contradicted", f"{mean_s}: the means differ by more than the margin; {var_s}; {pw}"
    if ci is not None and (ci[0] > r0 or ci[1] < 1 / r0):
        return "contradicted", f"{var_s}: outside [{_f(1 / r0)}, {_f(r0)}]; {mean_s}; {pw}"
    var_eq = eq_ci is not None and eq_ci[0] > 1 / r0 and eq_ci[1] < r0
    if tost["equivalent"] and var_eq:
        return "supported", f"{mean_s} and {var_s} inside ({_f(1 / r0)}, {_f(r0)}); {pw}"
    missing = [w for w, ok in (("mean", tost["equivalent"]), ("variance", var_eq)) if not ok]
    return "inconclusive", f"equivalence not shown for the {' and '.join(missing)}: {mean_s}; {var_s}; {pw}"


def overall(per_arm: Mapping[str, Mapping]) -> tuple[str, str]:
    """One verdict over the non-reference arms: theirs when they agree, else inconclusive."""
    if not per_arm:
        return "inconclusive", "no non-reference precision arm (controls are judged apart)"
    verdicts = {v["verdict"] for v in per_arm.values()}
    if len(verdicts) == 1:
        only = next(iter(per_arm.values()))
        if len(per_arm) == 1 or len({v["reason"] for v in per_arm.values()}) == 1:
            return only["verdict"], only["reason"]  # one shared reason (e.g. the gate) is worth repeating
        return only["verdict"], f"all arms: {only['verdict']}"
    return "inconclusive", "arms disagree: " + ", ".join(f"{a}={v['verdict']}" for a, v in per_arm.items())


RULES = {
    "H1": "on-task dJ: supported iff mean difference equivalent within mean_margin_fraction x the "
    "reference gain (paired TOST) and the (1-2alpha) CI of the whole seed-variance ratio inside (1/r0, "
    "r0); contradicted iff a (1-alpha) CI lies outside the margin; else inconclusive",
    "H2": "off-task dJ, absolute scale (the primary analysis): 'larger' iff the one-sided (1-alpha) lower "
    "bound of the whole seed-variance ratio (per task across seeds, shared + seed x task, eval noise held "
    "out) is above 1 and the bootstrap-calibrated one-sided test rejects at alpha and so does the "
    "seed-permutation test, and the larger of their p survives Holm's correction over every variance "
    "claim of the primary family (larger or smaller, every arm, H2 and H3); 'smaller' (contradicted) iff "
    "the profile test of ratio >= 1 survives that correction; 'not larger than r0' (contradicted) iff the "
    "profile test of ratio >= r0 survives Holm over the same comparisons (the bounds family); else "
    "inconclusive, with the adjusted p where the uncorrected interval excludes 1",
    "H3": "off-task KL: the H2 rule, in the same primary family; the on-task KL ratio is reported beside it",
}
# One primary analysis (analysis.primary): the absolute scale, and one Holm family of every variance claim
# the summary states: for each (hypothesis, arm) of H2 and H3 the claim its estimate points to, "larger"
# (p: the larger of the bootstrap and seed-permutation p) or "smaller" (p: the profile LRT of ratio >= 1,
# two-sided convention, so uncorrected it is the 95% interval below 1). "Not larger than r0" bounds the
# ratio rather than claiming a difference: its family (the same comparisons, p of ratio >= r0) is
# corrected apart. H1 needs none: its 'supported' is an intersection-union test (mean AND variance
# equivalence, each at alpha), whose size is at most alpha, and its 'contradicted' needs a (1-alpha)
# interval outside the margin. The divisor scales (dJ / sqrt(KL), log KL) are exploratory: they enter no
# verdict and no family.


def finding_variance(verdict: str, model: Mapping, classical: Mapping, cfg: Mapping) -> str:
    """The H2/H3 verdict in words that say what was found: larger, smaller (CI below 1), not larger than
    r0 (CI below r0 but containing 1), inconclusive, not testable. ``decide`` passes the Holm-corrected
    verdict and the claim that survived; this reads the interval alone."""
    if verdict == "supported":
        return "larger"
    if verdict == "contradicted":
        ci = _bounds(model, classical)[0]
        if ci is not None and ci[1] is not None and ci[1] < 1:
            return "smaller"
        return f"not larger than r0={_f(cfg['variance_ratio_margin'])}"
    return verdict


def finding_h1(verdict: str, mean: Mapping, model: Mapping, classical: Mapping, cfg: Mapping) -> str:
    """H1 in words: equivalent, mean lower / higher (beyond the margin), variance differs, inconclusive."""
    if verdict == "supported":
        return "equivalent"
    if verdict != "contradicted":
        return verdict
    if mean.get("status") == "ok" and mean["ci_high"] < -mean["tost"]["margin"]:
        return "mean lower"
    if mean.get("status") == "ok" and mean["ci_low"] > mean["tost"]["margin"]:
        return "mean higher"
    ci = _bounds(model, classical)[0]
    return "variance larger" if ci is not None and ci[0] is not None and ci[0] > 1 else "variance smaller"


def evidence_p(model: Mapping, classical: Mapping) -> float | None:
    """The p a 'larger' rests on: the larger of the bootstrap p and the seed-permutation p (both must
    reject), or the classical p where the model failed."""
    p = _bounds(model, classical)[2]
    if p is None:
        return None
    robust = robust_check(model)
    return max(float(p), robust) if robust is not None else float(p)


def holm(pvalues: Mapping[Any, float | None]) -> dict[Any, float]:
    """Holm's step-down adjusted p-values (keys with p None are left out)."""
    items = sorted(((p, k) for k, p in pvalues.items() if p is not None), key=lambda x: x[0])
    m, out, running = len(items), {}, 0.0
    for i, (p, k) in enumerate(items):
        running = max(running, min(1.0, (m - i) * p))
        out[k] = running
    return out


QUANTITY = {"H2": ("dJ", "off-task dJ"), "H3": ("kl", "off-task KL")}


def claim(comp: Mapping, q: str) -> dict[str, Any]:
    """The variance claim one comparison points to: {direction: larger | smaller | None, p, p_r0}; p of
    "larger" = ``evidence_p``, of "smaller" = the model's profile test of ratio >= 1 (None where the model
    failed: the classical tests give no p for it); p_r0 = that of ratio >= r0 (the bounds family)."""
    model, classical = comp.get(f"{q}_model") or {}, comp.get(f"{q}_var") or {}
    ok = model.get("status") == "ok"
    ratio = model.get("ratio") if ok else classical.get("ratio")
    if ratio is None or (isinstance(ratio, float) and math.isnan(ratio)):
        return {"direction": None, "p": None, "p_r0": None}
    if ratio > 1:
        return {"direction": "larger", "p": evidence_p(model, classical), "p_r0": None}
    return {
        "direction": "smaller",
        "p": model.get("p_smaller") if ok else None,
        "p_r0": model.get("p_below_r0") if ok else None,
    }


def family_adjusted(
    by_role: Mapping[str, Mapping],
    arms: Sequence[str],
    controls: Mapping[str, str],
    hypotheses: Sequence[str] = ("H2", "H3"),
    extra: str | None = None,
) -> dict[str, dict[tuple[str, str], float]]:
    """Holm-adjusted p of the primary family: {"differences": {(h, arm): p}, "bounds": {(h, arm): p}}.
    Members: every precision arm compared with the reference (controls left out, so adding a control
    changes no arm's verdict) under each of ``hypotheses``, plus ``extra`` (a control judged as one more
    arm of the family: it faces the correction the arms face)."""
    comps = (by_role.get("off_task") or {}).get("comparisons") or {}
    members = [a for a in arms[1:] if a not in controls] + ([extra] if extra else [])
    claims = {(h, a): claim(comps[a], QUANTITY[h][0]) for h in hypotheses for a in members if a in comps}
    return {
        "differences": holm({k: c["p"] for k, c in claims.items()}),
        "bounds": holm({k: c["p_r0"] for k, c in claims.items()}),
    }


def family_size(n_arms: int, hypotheses: Sequence[str]) -> int:
    """Members of the primary family (the Holm divisor of its first step, which the power simulation
    applies to a 'larger'): every compared arm under every primary hypothesis."""
    return max(1, n_arms * len(hypotheses))


def _corrected(v: str, why: str, adjusted: float | None, m: int, alpha: float) -> tuple[str, str]:
    """A 'supported' that does not survive Holm's correction over the family becomes inconclusive."""
    if v != "supported" or adjusted is None:
        return v, why
    if m <= 1:
        return v, why
    if adjusted < alpha:
        return v, f"{why}; Holm over the {m} variance claims of the primary family: adjusted p={_f(adjusted)}"
    return "inconclusive", (
        f"{why}; but not after Holm's correction over the {m} variance claims of the primary family "
        f"(adjusted p={_f(adjusted)} >= {alpha:g})"
    )


def judge_variance(
    comp: Mapping, h: str, cfg: Mapping, adjusted: Mapping[str, Mapping], key: Any
) -> tuple[str, str, str, float | None]:
    """(verdict, finding, reason, adjusted p) of one H2/H3 comparison under the primary family's
    correction (module docstring; ``adjusted``: ``family_adjusted``, ``key``: (h, arm))."""
    q, what = QUANTITY[h]
    alpha, r0 = float(cfg["alpha"]), float(cfg["variance_ratio_margin"])
    model, classical = comp[f"{q}_model"], comp[f"{q}_var"]
    v, why = verdict_variance(model, classical, comp.get(f"{q}_power"), cfg, what)
    diff, bounds = adjusted["differences"], adjusted["bounds"]
    m, m_r0 = len(diff), len(bounds)
    c = claim(comp, q)
    adj = diff.get(key)
    ci = _bounds(model, classical)[0]
    if v == "supported":
        v, why = _corrected(v, why, adj, m, alpha)
        return v, "larger" if v == "supported" else "inconclusive", why, adj
    if c["direction"] == "smaller" and adj is not None and adj < alpha:
        why = (f"{why.split(': CI below')[0]}: smaller, profile test of ratio >= 1 p={_f(c['p'])}, Holm-"
               f"adjusted over the {m} variance claims of the primary family p={_f(adj)}")  # fmt: skip
        return "contradicted", "smaller", why, adj
    adj_r0 = bounds.get(key)
    if adj_r0 is not None and adj_r0 < alpha:
        note = ""
        if ci is not None and ci[1] is not None and ci[1] < 1:
            note = f"; its interval is below 1 uncorrected, but 'smaller' is not after Holm (p={_f(adj)})"
        why = (f"{why.split(': CI below')[0]}: not larger than r0={_f(r0)}, profile test of ratio >= r0 "
               f"p={_f(c['p_r0'])}, Holm-adjusted over the {m_r0} bounds p={_f(adj_r0)}{note}")  # fmt: skip
        return "contradicted", f"not larger than r0={_f(r0)}", why, adj_r0
    if v == "contradicted":  # the uncorrected interval is below r0, the corrected test is not
        v = "inconclusive"
        why = f"{why}; but not after Holm over the {m_r0} bounds (adjusted p={_f(adj_r0)})"
    excludes = ci is not None and ((ci[0] is not None and ci[0] > 1) or (ci[1] is not None and ci[1] < 1))
    if excludes:
        side = "above" if ci[0] is not None and ci[0] > 1 else "below"
        why = (f"{why}; its interval lies {side} 1 uncorrected, but not after Holm over the {m} variance "
               f"claims of the primary family (adjusted p={_f(adj)})")  # fmt: skip
    return v, v, why, adj


def _twins(comps: Mapping, q: str, controls: Mapping[str, str]) -> dict[str, Any]:
    """The negative controls' ratios on the same comparison (what a null arm gets beside each arm's)."""
    out = {}
    for twin, kind in controls.items():
        model = (comps.get(twin) or {}).get(f"{q}_model") or {}
        if kind == "negative" and model.get("status") == "ok":
            out[twin] = {"ratio": model.get("ratio"), "ratio_ci": model.get("ratio_ci")}
    return out


def primary(cfg: Mapping) -> dict[str, Any]:
    """analysis.primary with its defaults: {scale, hypotheses}."""
    p = dict(cfg.get("primary") or {})
    return {"scale": p.get("scale", "absolute"), "hypotheses": list(p.get("hypotheses") or ("H2", "H3"))}


def decide(
    gate_block: Mapping,
    by_role: Mapping[str, Mapping],
    arms: Sequence[str],
    cfg: Mapping,
    controls: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """verdicts[H] = {verdict, finding, reason, rule, scope, by_arm{arm: {verdict, finding, reason, scale,
    twins, yardstick, holm_p, family}}}; control arms left out (but counted in the controls' own
    family)."""
    out: dict[str, Any] = {}
    controls = dict(controls or {})
    on, off = by_role.get("on_task"), by_role.get("off_task")
    prim = primary(cfg)
    adjusted = family_adjusted(by_role, arms, controls, prim["hypotheses"])
    off_comps = (off or {}).get("comparisons") or {}
    for h in ("H1", "H2", "H3"):
        per_arm = {}
        for a in (a for a in arms[1:] if a not in controls):
            scope = on if h == "H1" else off
            extra: dict[str, Any] = {"scale": "absolute"}
            if not gate_block.get("passed"):
                v, why = "not testable", f"{NOT_TESTABLE}: {gate_block.get('reason')}"
                finding = v
            elif scope is None:
                v, why = "inconclusive", f"no {'on' if h == 'H1' else 'off'}-task tasks"
                finding = v
            else:
                comp = scope["comparisons"][a]
                if h == "H1":
                    v, why = verdict_h1(
                        comp["dJ_mean"], comp["dJ_model"], comp["dJ_var"], comp.get("dJ_power"), cfg
                    )
                    finding = finding_h1(v, comp["dJ_mean"], comp["dJ_model"], comp["dJ_var"], cfg)
                else:
                    q = QUANTITY[h][0]
                    if h in prim["hypotheses"]:
                        v, finding, why, adj = judge_variance(comp, h, cfg, adjusted, (h, a))
                        family = "primary"
                    else:  # declared outside the primary family: the uncorrected rule, said so
                        v, why = verdict_variance(
                            comp[f"{q}_model"], comp[f"{q}_var"], comp.get(f"{q}_power"), cfg, QUANTITY[h][1]
                        )
                        finding, adj, family = (
                            finding_variance(v, comp[f"{q}_model"], comp[f"{q}_var"], cfg),
                            None,
                            "secondary (uncorrected)",
                        )
                        why += "; outside the primary family (analysis.primary): not corrected"
                    if h == "H3":
                        on_kl = ((on or {}).get("comparisons") or {}).get(a, {}).get("kl_model") or {}
                        if on_kl.get("status") == "ok":
                            why += f"; on-task KL ratio {_f(on_kl['ratio'])} {_ci(on_kl['ratio_ci'])}"
                    extra.update(
                        twins=_twins(off_comps, q, controls),
                        yardstick=(comp.get(f"{q}_model") or {}).get("yardstick"),
                        holm_p=adj,
                        family=family,
                    )
            per_arm[a] = {"verdict": v, "finding": finding, "reason": why, **extra}
        v, why = overall(per_arm)
        findings = {x["finding"] for x in per_arm.values()}
        role, quantity = SCOPES[h]
        scope = {"role": role, "quantity": quantity}
        out[h] = {
            "verdict": v,
            "finding": next(iter(findings)) if len(findings) == 1 else "arms differ",
            "reason": why,
            "by_arm": per_arm,
            "rule": RULES[h],
            "scope": scope,
        }
    return out


def primary_block(
    by_role: Mapping[str, Mapping], arms: Sequence[str], cfg: Mapping, controls: Mapping[str, str] | None
) -> dict[str, Any]:
    """stats.json ``primary``: the declared scale and hypotheses, and the Holm families' members with
    their adjusted p (what every H2/H3 verdict of ``decide`` was corrected against)."""
    prim = primary(cfg)
    adjusted = family_adjusted(by_role, arms, dict(controls or {}), prim["hypotheses"])
    return {
        **prim,
        "correction": "Holm",
        "family_size": len(adjusted["differences"]),
        "differences": {f"{h}/{a}": p for (h, a), p in adjusted["differences"].items()},
        "bounds_family_size": len(adjusted["bounds"]),
        "bounds": {f"{h}/{a}": p for (h, a), p in adjusted["bounds"].items()},
    }


def _as_it_must(kind: str, outcome: str) -> bool:
    """A negative control must not be 'supported', a positive one must."""
    return (outcome != "supported") if kind == "negative" else (outcome == "supported")


def control_outcomes(
    by_role: Mapping[str, Mapping],
    arms: Sequence[str],
    controls: Mapping[str, str],
    cfg: Mapping,
    gate_block: Mapping,
) -> dict[str, Any]:
    """controls[arm] = {kind, expected, outcome, reason, dJ_passed, kl_outcome, kl_reason, kl_passed,
    uncorrected {dJ, kl}, passed}: the H2 rule on the control's off-task dJ and the H3 rule on its
    off-task KL vs the reference (Holm-corrected as one more arm of the family), without the gate (see
    module docstring); ``passed`` needs both (KL: None where it was
    not testable, and then dJ alone decides)."""
    out = {}
    comps = (by_role.get("off_task") or {}).get("comparisons") or {}
    alpha = float(cfg["alpha"])
    for a, kind in controls.items():
        expected = "not supported" if kind == "negative" else "supported"
        block: dict[str, Any] = {"kind": kind, "expected": expected}
        if kind not in CONTROL_KINDS:
            out[a] = {
                **block,
                "passed": None,
                "reason": f"unknown control kind {kind!r} (one of {CONTROL_KINDS})",
            }
            continue
        if arms and a == arms[0]:
            out[a] = {**block, "passed": None, "reason": "the reference arm cannot be its own control"}
            continue
        comp = comps.get(a)
        if comp is None:
            why = "no runs of this arm" if a not in arms else "no off-task tasks"
            out[a] = {**block, "passed": None, "outcome": "not testable", "reason": why}
            continue
        v, why = verdict_variance(comp["dJ_model"], comp["dJ_var"], comp.get("dJ_power"), cfg, "off-task dJ")
        kl_v, kl_why = verdict_variance(
            comp["kl_model"], comp["kl_var"], comp.get("kl_power"), cfg, "off-task KL"
        )
        adj = family_adjusted(by_role, arms, controls, primary(cfg)["hypotheses"], a)["differences"]
        uncorrected = {"dJ": v, "kl": kl_v}
        v, why = _corrected(v, why, adj.get(("H2", a)), len(adj), alpha)
        kl_v, kl_why = _corrected(kl_v, kl_why, adj.get(("H3", a)), len(adj), alpha)
        dj_passed = _as_it_must(kind, v)
        kl_passed = None if kl_v == "not testable" else _as_it_must(kind, kl_v)
        out[a] = {
            **block,
            "outcome": v,
            "dJ_passed": dj_passed,
            "reason": why,
            "kl_outcome": kl_v,
            "kl_passed": kl_passed,
            "kl_reason": kl_why,
            "uncorrected": uncorrected,  # the outcomes before Holm's correction over the arms
            "passed": dj_passed and kl_passed is not False,
            "gate_passed": bool(gate_block.get("passed")),
        }
    return out
