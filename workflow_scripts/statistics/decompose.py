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

from collections.abc import Mapping, Sequence
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


def contrast(table: pd.DataFrame, weights: Mapping[str, float], alpha: float) -> dict[str, Any]:
    """Mean of sum_a w_a x_a,s over the seeds every weighted arm has, its (1-alpha) t CI and two-sided p."""
    cols = [a for a in weights if weights[a]]
    if any(a not in table.columns for a in cols):
        return {"status": "skipped", "reason": "an arm has no runs"}
    sub = table[cols].dropna()
    n = len(sub)
    if n < 2:
        return {"status": "skipped", "reason": f"{n} seed(s) shared by the arms", "n": n}
    c = sub.to_numpy() @ np.array([weights[a] for a in cols], dtype=float)
    mean, sd = float(c.mean()), float(c.std(ddof=1))
    se = sd / np.sqrt(n)
    half = float(st.t.ppf(1 - alpha / 2, n - 1)) * se
    p = float(2 * st.t.sf(abs(mean) / se, n - 1)) if se > 0 else (0.0 if mean else 1.0)
    return {"status": "ok", "mean": mean, "se": se, "ci": [mean - half, mean + half], "p": p, "n": n}


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
) -> dict[str, Any]:
    """stats.json ``decomposition``: main effects of every single-factor arm and, per bundle arm whose
    every factor has a single-factor arm, the bundle's effect, its parts and their interaction."""
    order = list(arms)
    if len(order) < 2:
        return {"status": "skipped", "reason": "fewer than two arms"}
    ref = order[0]
    values = run_values(rows, tasks_by_role)
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
        entry["nested"] = nested_contrasts(arm, arms, order, values, alpha)
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
        bundles[arm] = entry
    return {
        "status": "ok",
        "reference": ref,
        "alpha": alpha,
        "quantities": {q: QUANTITIES[q][2] for q in values},
        "main_effects": main,
        "bundles": bundles,
    }


def nested_contrasts(
    arm: str,
    arms: Mapping[str, Mapping],
    order: Sequence[str],
    values: Mapping[str, pd.DataFrame],
    alpha: float,
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


def _sum_weights(parts: Sequence[str] | Any, ref: str) -> dict[str, float]:
    w: dict[str, float] = {ref: 0.0}
    for a in parts:
        w[a] = w.get(a, 0.0) + 1.0
        w[ref] -= 1.0
    return w


def _largest(parts: Mapping[str, Mapping]) -> str | None:
    ok = {a: abs(c["mean"]) for a, c in parts.items() if c.get("status") == "ok"}
    return max(ok, key=ok.__getitem__) if ok else None
