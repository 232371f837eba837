"""A bundle arm's effect taken apart into the factors that single-factor arms carry.

The default's bf16 arm changes two things at once (bf16 round-to-nearest masters and dropout 0.1), so
its effect alone cannot say which part did what. Where the config carries, for every factor of a bundle,
an arm that differs from the reference in that factor alone (``arms.arms_block``), each quantity is split
by paired contrasts over the seeds all those arms share (seed s of every arm shares the prompt order
and the sampling seed):

| contrast     | per seed s                                   | reads                                     |
|--------------|----------------------------------------------|-------------------------------------------|
| bundle       | B_s - R_s                                    | the bundle's whole effect                 |
| main effect  | A_f,s - R_s for each factor f                | what factor f does alone                  |
| interaction  | B_s - R_s - sum_f (A_f,s - R_s)              | what the factors do together beyond a sum |

each with its mean, a (1-alpha) t interval across seeds and a two-sided p. A bundle whose parts are not
all present as single-factor arms still gets its whole effect (B_s - R_s), and, where another arm carries
all its factors but one (e.g. a bf16 sampler, and the same with truncated importance sampling), the
effect of that one factor given the others: B_s - A_s ("nested", e.g. what the correction changes in an
arm that has the mismatch it corrects). Quantities: the on-task and
off-task mean dJ of a run (mean over the role's tasks) and the log of its mean off-task KL (KL effects
are multiplicative: an arm that drifts a tenth as far is -2.3 on this scale whatever the reference's
drift). Every single-factor arm's main effects are listed too, bundle or not. The seed-variance side of
a factor is its single-factor arm's comparison in the verdicts (ratios with intervals, both scales).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats as st

from workflow_scripts.statistics import scopes as sc

QUANTITIES = {
    "on_task_dJ": ("on_task", "y", "on-task dJ"),
    "off_task_dJ": ("off_task", "y", "off-task dJ"),
    "off_task_log_kl": ("off_task", "log_kl", "log off-task KL"),
}


def run_values(rows: pd.DataFrame, tasks_by_role: Mapping[str, Sequence[str]]) -> dict[str, pd.DataFrame]:
    """{quantity: seeds x arms table} of one value per run (``sc.units``: mean over the role's tasks)."""
    out = {}
    for q, (role, col, _) in QUANTITIES.items():
        tasks = list(tasks_by_role.get(role) or [])
        if not tasks:
            continue
        u = sc.units(rows, tasks)
        if col == "log_kl":
            kl = u["kl"].where(u["kl"] > 0)
            if kl.isna().any():
                continue  # KL missing or not positive for some run: no log scale
            u = u.assign(log_kl=np.log(kl))
        out[q] = u.pivot_table(index="seed", columns="precision", values=col, aggfunc="first")
    return out


def base_noise(rows: pd.DataFrame, base: pd.DataFrame, arms: Sequence[str]) -> dict[str, dict[str, Any]]:
    """{arm: {base: its name, noise: {task: eval-noise variance of the base evaluation the arm's dJ is
    measured from}}} (the
    ``reference_run`` column of aggregate: base-bfloat16 for bf16 arms, else ``base``; the base's rows
    give ``noise``). Every seed of an arm shares that evaluation, so its noise is not in the spread
    across seeds: a contrast between arms measured from different bases must add it."""
    out: dict[str, dict[str, Any]] = {}
    if base.empty or "noise" not in base.columns:
        return out
    runs = base["run"].astype(str)
    for arm in arms:
        arm_rows = rows[rows["precision"] == arm]
        name = "base"
        if "reference_run" in arm_rows.columns and arm_rows["reference_run"].notna().any():
            name = str(arm_rows["reference_run"].dropna().iloc[0])
        b = base[runs == name]
        out[arm] = {
            "base": name,
            "noise": {str(t): float(v) for t, v in zip(b["task"], b["noise"], strict=True)},
        }
    return out


def base_var(weights: Mapping[str, float], bases: Mapping[str, Mapping], tasks: Sequence[str]) -> float:
    """Variance the base evaluations add to sum_a w_a dJ_a (dJ a mean over ``tasks``): per base, the
    squared sum of the weights of the arms measured from it, times that base's noise of the task mean."""
    by_base: dict[str, float] = {}
    noise: dict[str, float] = {}
    for arm, w in weights.items():
        b = bases.get(arm)
        if not b or not w:
            continue
        name = str(b["base"])
        by_base[name] = by_base.get(name, 0.0) + w
        noise[name] = sum(float(b["noise"].get(t, 0.0)) for t in tasks) / max(len(tasks), 1) ** 2
    return float(sum(w**2 * noise[name] for name, w in by_base.items() if abs(w) > 1e-12))


def _contrast(
    table: pd.DataFrame, weights: Mapping[str, float], alpha: float, extra_var: float = 0.0
) -> dict[str, Any]:
    """Mean of sum_a w_a x_a,s over the seeds every weighted arm has, its (1-alpha) t CI and two-sided p;
    ``extra_var``: a variance shared by every seed's contrast (the base evaluations' noise, ``base_var``)
    added to the SE of the mean (t kept at n - 1 df)."""
    cols = [a for a in weights if weights[a]]
    if any(a not in table.columns for a in cols):
        return {"status": "skipped", "reason": "an arm has no runs"}
    sub = table[cols].dropna()
    n = len(sub)
    if n < 2:
        return {"status": "skipped", "reason": f"{n} seed(s) shared by the arms", "n": n}
    c = sub.to_numpy() @ np.array([weights[a] for a in cols], dtype=float)
    mean, sd = float(c.mean()), float(c.std(ddof=1))
    se = float(np.sqrt(sd**2 / n + max(extra_var, 0.0)))
    half = float(st.t.ppf(1 - alpha / 2, n - 1)) * se
    p = float(2 * st.t.sf(abs(mean) / se, n - 1)) if se > 0 else (0.0 if mean else 1.0)
    out = {"status": "ok", "mean": mean, "se": se, "ci": [mean - half, mean + half], "p": p, "n": n}
    return out | ({"base_var": float(extra_var)} if extra_var > 0 else {})


def single_factor_arms(arms: Mapping[str, Mapping]) -> dict[tuple[str, str], str]:
    """{(factor, arm value): arm} for the arms that differ from the reference in one factor only."""
    out = {}
    for arm, block in arms.items():
        diff = block.get("differences") or {}
        if block.get("kind") == "single factor" and not (block.get("description") or {}).get("control"):
            ((factor, (_, value)),) = diff.items()
            out.setdefault((factor, repr(value)), arm)
    return out


def decompose(
    rows: pd.DataFrame,
    tasks_by_role: Mapping[str, Sequence[str]],
    arms: Mapping[str, Mapping],
    alpha: float,
    bases: Mapping[str, Mapping] | None = None,
) -> dict[str, Any]:
    """stats.json ``decomposition``: main effects of every single-factor arm and, per bundle arm whose
    every factor has a single-factor arm, the bundle's effect, its parts, their interaction and the
    difference of every two parts (``part_differences``: "carries the most" needs it). ``bases``
    (``base_noise``): the dJ contrasts between arms measured from different bases carry those bases'
    eval noise."""
    order = list(arms)
    if len(order) < 2:
        return {"status": "skipped", "reason": "fewer than two arms"}
    ref = order[0]
    raw = run_values(rows, tasks_by_role)

    def contrast(t: tuple[str, pd.DataFrame], weights: Mapping[str, float], alpha: float) -> dict[str, Any]:
        q, table = t
        role, col, _ = QUANTITIES[q]
        extra = base_var(weights, bases or {}, list(tasks_by_role.get(role) or [])) if col == "y" else 0.0
        return _contrast(table, weights, alpha, extra)

    values = {q: (q, t) for q, t in raw.items()}
    singles = single_factor_arms({a: arms[a] for a in order[1:]})
    main: dict[str, Any] = {}
    for (factor, _), arm in singles.items():
        effect = arms[arm]["effects"][0]
        main[arm] = {"factor": factor, "effect": effect, **{
            q: contrast(t, {arm: 1.0, ref: -1.0}, alpha) for q, t in values.items()
        }}  # fmt: skip
    bundles: dict[str, Any] = {}
    for arm in order[1:]:
        block = arms[arm]
        if block.get("kind") != "bundle" or (block.get("description") or {}).get("control"):
            continue
        parts = {f: singles.get((f, repr(v[1]))) for f, v in block["differences"].items()}
        missing = [arms[arm]["effects"][i] for i, (f, a) in enumerate(parts.items()) if a is None]
        entry: dict[str, Any] = {
            "effects": block["effects"],
            "parts": {f: a for f, a in parts.items() if a},
        }
        entry["nested"] = nested_contrasts(arm, arms, order, values, alpha, contrast)
        if missing:
            entry.update(status="incomplete", reason=f"no single-factor arm for: {', '.join(missing)}")
            entry["whole"] = {q: contrast(t, {arm: 1.0, ref: -1.0}, alpha) for q, t in values.items()}
            bundles[arm] = entry
            continue
        entry["status"] = "ok"
        for q, t in values.items():
            interaction = {arm: 1.0, ref: -1.0 + len(parts)}
            for a in parts.values():
                interaction[a] = interaction.get(a, 0.0) - 1.0
            entry[q] = {
                "bundle": contrast(t, {arm: 1.0, ref: -1.0}, alpha),
                "parts": {a: contrast(t, {a: 1.0, ref: -1.0}, alpha) for a in parts.values()},
                "sum_of_parts": contrast(t, _sum_weights(parts.values(), ref), alpha),
                "interaction": contrast(t, interaction, alpha),
            }
            entry[q]["largest_part"] = _largest(entry[q]["parts"])
            entry[q]["part_differences"] = part_differences(t, entry[q]["parts"], ref, alpha, contrast)
            entry[q]["carries_most"] = carries_most(entry[q]["part_differences"], entry[q]["largest_part"])
        bundles[arm] = entry
    return {
        "status": "ok",
        "reference": ref,
        "alpha": alpha,
        "quantities": {q: QUANTITIES[q][2] for q in values},
        "base_noise": bool(bases),
        "main_effects": main,
        "bundles": bundles,
    }


def nested_contrasts(
    arm: str,
    arms: Mapping[str, Mapping],
    order: Sequence[str],
    values: Mapping[str, Any],
    alpha: float,
    contrast: Callable[..., dict[str, Any]],
) -> dict[str, Any]:
    """{other arm: {factor, effect, given, quantities...}} for each arm (not the reference, not a control)
    whose differences from the reference are this arm's but one: ``arm - other`` is that factor's effect
    given the factors they share."""
    mine = arms[arm].get("differences") or {}
    out: dict[str, Any] = {}
    for other in order[1:]:
        block = arms[other]
        theirs = block.get("differences") or {}
        if other == arm or not theirs or (block.get("description") or {}).get("control"):
            continue
        extra = [f for f in mine if f not in theirs]
        shared = all(mine.get(f) == v for f, v in theirs.items())
        if len(mine) != len(theirs) + 1 or len(extra) != 1 or not shared:
            continue
        (factor,) = extra
        effect = arms[arm]["effects"][list(mine).index(factor)]
        given = list(block.get("effects") or [])
        out[other] = {"factor": factor, "effect": effect, "given": given}
        out[other].update({q: contrast(t, {arm: 1.0, other: -1.0}, alpha) for q, t in values.items()})
    return out


def part_differences(
    t: Any, parts: Mapping[str, Mapping], ref: str, alpha: float, contrast: Callable[..., dict[str, Any]]
) -> dict[str, Any]:
    """{"a|b": contrast} for every two parts: |effect a| - |effect b| as the paired contrast
    sign_a (A - R) - sign_b (B - R) (signs: each part's estimated direction), with its interval: a part
    "carries the most" only where this is shown above 0 for every other part."""
    ok = {a: c for a, c in parts.items() if c.get("status") == "ok"}
    out = {}
    names = list(ok)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            sa, sb = (1.0 if ok[a]["mean"] >= 0 else -1.0), (1.0 if ok[b]["mean"] >= 0 else -1.0)
            w = {a: sa, b: -sb, ref: sb - sa}
            out[f"{a}|{b}"] = {"first": a, "second": b, **contrast(t, w, alpha)}
    return out


def carries_most(diffs: Mapping[str, Mapping], largest: str | None) -> dict[str, Any]:
    """Whether the part with the largest |effect| is shown larger than every other part: {arm, supported,
    reason}; not supported where any difference's interval reaches 0 (or was not computed)."""
    if largest is None or not diffs:
        return {"arm": largest, "supported": False, "reason": "fewer than two parts with an effect"}
    weak = []
    for d in diffs.values():
        if largest not in (d["first"], d["second"]):
            continue
        if d.get("status") != "ok":
            weak.append(f"{d['first']} vs {d['second']}: not computed")
            continue
        sign = 1.0 if d["first"] == largest else -1.0
        lo = min(sign * d["ci"][0], sign * d["ci"][1])
        if lo <= 0:
            weak.append(f"{d['first']} vs {d['second']}")
    if weak:
        return {
            "arm": largest,
            "supported": False,
            "reason": "interval of |difference| reaches 0: " + "; ".join(weak),
        }
    return {"arm": largest, "supported": True, "reason": "its |effect| exceeds every other part's"}


def _sum_weights(parts: Sequence[str] | Any, ref: str) -> dict[str, float]:
    w: dict[str, float] = {ref: 0.0}
    for a in parts:
        w[a] = w.get(a, 0.0) + 1.0
        w[ref] -= 1.0
    return w


def _largest(parts: Mapping[str, Mapping]) -> str | None:
    ok = {a: abs(c["mean"]) for a, c in parts.items() if c.get("status") == "ok"}
    return max(ok, key=ok.__getitem__) if ok else None
