"""Movement matched by design: each arm's off-task seed variance beside the reference's at equal movement.

An arm that moves less from the base (smaller off-task KL) also varies less, so "smaller seed variance"
alone does not say "more stable". Instead of dividing by a drift measure (the matched-drift scales,
whose premises fail on the runs: issue 60), the reference is taken where it has moved as far as the arm:
the reference saves its policy at a few steps (config ``snapshots``), each evaluated on the off-task
tasks as run ``<ref>-s<seed>@step<k>``; for each arm, the step whose reference mean off-task KL (mean
over seeds of the mean over tasks, the estimator ``analysis.kl_estimator``) is nearest the arm's final
one, on the log scale, is its matched step: the nearest evaluated step, not an interpolation (a seed
variance cannot be interpolated between two sets of runs), and ``kl_ratio`` (arm / reference there)
says how close the match is; ``outside`` says when the arm's KL lies beyond the evaluated steps (below the
first snapshot, or above the reference's final), where the nearest step is an edge, not a match.

At that step the arm and the reference are compared with the statistics of every other comparison
(``scopes.model_scope``: the mixed model's whole seed variance, its bootstrap-calibrated test, profile
CIs and the null yardstick of reference splits), on dJ and on KL. The claims (``verdicts.claim``:
larger or smaller, with the model's p) form one Holm family of their own (every arm x {dJ, KL}), apart
from the primary H2/H3 family: this block qualifies a finding, it adds none to the primary analysis.

Pure: rows as ``stats._prepare`` makes them (columns run, precision, seed, task, dJ, noise, kl, kl_var).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from workflow_scripts.runtime import paths
from workflow_scripts.statistics import scopes as sc
from workflow_scripts.statistics import verdicts as vd
from workflow_scripts.statistics import yardstick as ys

FINAL = "final"  # the label of the reference's own final evaluation among the candidate steps
QUANTITIES = ("dJ", "kl")


def with_steps(rows: pd.DataFrame) -> pd.DataFrame:
    """``rows`` with a ``step`` column read from the run names (``<arm>-s<seed>@step<k>``)."""
    steps = [paths.parse_run(str(r)).step for r in rows["run"]]
    return rows.assign(step=steps)


def mean_kl(rows: pd.DataFrame, tasks: Sequence[str]) -> float:
    """Mean over runs of the mean over ``tasks`` of KL (one number per arm or per step)."""
    sub = rows[rows["task"].isin(tasks)]
    if sub.empty or sub["kl"].isna().all():
        return math.nan
    return float(sub.groupby("run")["kl"].mean().mean())


def match_step(target: float, curve: Mapping[Any, float]) -> dict[str, Any]:
    """The candidate step of ``curve`` ({step or FINAL: the reference's mean KL}) nearest ``target`` on the
    log scale, with the KL ratio there and whether ``target`` lies outside the curve's range."""
    usable = {s: k for s, k in curve.items() if k > 0 and math.isfinite(k)}
    if not (target > 0 and math.isfinite(target)) or not usable:
        return {"status": "skipped", "reason": "no positive mean off-task KL to match"}
    step = min(usable, key=lambda s: abs(math.log(target / usable[s])))
    low, high = min(usable.values()), max(usable.values())
    return {
        "status": "ok",
        "step": step,
        "reference_kl": usable[step],
        "arm_kl": target,
        "kl_ratio": target / usable[step],
        "outside": "below" if target < low else "above" if target > high else None,
    }


def matched(
    rows: pd.DataFrame,
    snapshot_rows: pd.DataFrame,
    arms: Sequence[str],
    tasks: Sequence[str],
    cfg: Mapping,
    controls: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """stats.json ``matched``: the reference's KL curve over its snapshot steps and, per arm (controls
    left out), its matched step and the comparison of its seed variance with the reference's there."""
    controls = dict(controls or {})
    if len(arms) < 2 or not tasks:
        return {"status": "skipped", "reason": "needs a reference, another arm and off-task tasks"}
    ref = arms[0]
    snaps = with_steps(snapshot_rows)
    snaps = snaps[(snaps["precision"] == ref) & snaps["step"].notna() & snaps["task"].isin(tasks)]
    if snaps.empty:
        return {"status": "skipped", "reason": f"no evaluated snapshots of {ref} (config snapshots)"}
    by_step = {int(k): g for k, g in snaps.groupby("step")}
    final_ref = rows[rows["precision"] == ref]
    curve: dict[Any, float] = {k: mean_kl(g, tasks) for k, g in sorted(by_step.items())}
    curve[FINAL] = mean_kl(final_ref, tasks)
    seeds = {str(k): int(g["seed"].nunique()) for k, g in by_step.items()}
    out: dict[str, Any] = {
        "status": "ok",
        "reference": ref,
        "tasks": list(tasks),
        "reference_kl": {str(k): v for k, v in curve.items()},
        "reference_seeds": {**seeds, FINAL: int(final_ref["seed"].nunique())},
        "family": "matched (its own Holm family: every arm x {dJ, KL}; not the primary H2/H3 family)",
        "arms": {},
    }
    claims: dict[tuple[str, str], float | None] = {}
    for i, arm in enumerate(a for a in arms[1:] if a not in controls):
        arm_rows = rows[rows["precision"] == arm]
        match = match_step(mean_kl(arm_rows, tasks), curve)
        block: dict[str, Any] = {"match": match}
        if match["status"] == "ok":
            at = final_ref if match["step"] == FINAL else by_step[match["step"]]
            table = pd.concat([at.assign(precision=ref), arm_rows], ignore_index=True)
            block["seeds"] = [int(arm_rows["seed"].nunique()), int(at["seed"].nunique())]  # arm, reference
            for q in QUANTITIES:
                scope = sc.model_scope(table, tasks, [ref, arm], q, cfg, f"matched/{i}/{q}", None)
                comp = (scope.get("comparisons") or {}).get(arm) or {
                    "status": "failed",
                    "reason": scope.get("reason"),
                }
                c = vd.claim({f"{q}_model": comp}, q)
                claims[(arm, q)] = c["p"]
                block[q] = {**comp, "direction": c["direction"], "p_claim": c["p"]}
                block[q].update(p_adjusted=None, finding="inconclusive")
            match["step"] = str(match["step"])
        out["arms"][arm] = block
    adjusted = vd.holm(claims)
    alpha = float(cfg["alpha"])
    for (arm, q), p_adj in adjusted.items():
        b = out["arms"][arm][q]
        b["p_adjusted"] = p_adj
        if p_adj < alpha and b["direction"]:
            b["finding"] = b["direction"]
    return out


def summary_lines(block: Mapping[str, Any]) -> list[str]:
    """One line per arm for report.md: matched step, KL match, and each quantity's ratio [CI] and finding."""
    if block.get("status") != "ok":
        return [f"Movement-matched comparison not made: {block.get('reason')}."]
    lines = []
    for arm, b in block["arms"].items():
        m = b["match"]
        if m.get("status") != "ok":
            lines.append(f"- {arm}: not matched ({m.get('reason')}).")
            continue
        where = f"step {m['step']}" if m["step"] != FINAL else "its final step"
        edge = {"below": ", below its first snapshot", "above": ", beyond its final step"}.get(
            m["outside"], ""
        )
        parts = []
        for q in QUANTITIES:
            c = b.get(q) or {}
            if c.get("status") != "ok":
                parts.append(f"{q} not compared ({c.get('reason')})")
                continue
            lo, hi = (c.get("ratio_ci") or [None, None])[:2]
            parts.append(
                f"{'dJ' if q == 'dJ' else 'KL'} seed-variance ratio {vd._f(c.get('ratio'))} "
                f"[{vd._f(lo)}, {vd._f(hi)}], {c['finding']} (Holm p {vd._f(c.get('p_adjusted'))}; "
                f"{ys.words(c.get('yardstick'))})"
            )
        lines.append(
            f"- {arm} vs {block['reference']} at {where} (KL {vd._f(m['reference_kl'])} vs the arm's "
            f"{vd._f(m['arm_kl'])}, ratio {vd._f(m['kl_ratio'])}{edge}): " + "; ".join(parts) + "."
        )
    return lines
