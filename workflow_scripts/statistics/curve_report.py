"""report.md's "Learning curves" section: from learning_curves.json, per arm against the reference, the first
measured step at which the on-task means and the off-task variances differ, each with its uncertainty, or
that they do not differ at any measured step; and the step-0 check that the seeds' spread is eval noise.

Pure formatting (``curve_tests`` decided everything), so the report and learning_curves.json agree.
"""

from collections.abc import Mapping
from typing import Any

from workflow_scripts.statistics.report_tables import fmt, get, table

QUANTITIES = {"on_task_mean": "on-task means", "off_task_variance": "off-task variances"}
NOISE_CHECK_BAND = (0.5, 2.0)  # step-0 variance / eval noise outside it gets a remark


def _percent(x: Any) -> str:
    return f"{100 * float(x):.3g}%" if x is not None else "n/a"


def first_differ_text(block: Mapping[str, Any]) -> str:
    """'step 24 (parted in (12, 24], p ...; seed bootstrap ...)', 'no measured step', or why not tested."""
    if block.get("status") != "ok":
        return f"not tested ({block.get('reason', 'no data')})"
    first = block.get("first_differ") or {}
    boot = first.get("bootstrap") or {}
    if boot.get("n"):
        lo, hi = boot.get("ci_low"), boot.get("ci_high")
        span = "never" if lo is None else f"{lo} to {'never' if hi is None else hi}"
        resampled = (
            f"seed bootstrap {_percent(boot.get('level'))}: {span}; "
            f"never in {_percent(boot.get('never_share'))} of {boot['n']} resamples"
        )
    else:
        resampled = "no seed bootstrap"
    if first.get("step") is None:
        return f"do not differ at any measured step ({resampled})"
    parted = f"parted in ({first['after_step']}, {first['step']}]"
    return f"step {first['step']} ({parted}, p {fmt(first['p'])}; {resampled})"


def _effect(block: Mapping[str, Any], key: str) -> str:
    """The effect at the first differing step, else at the last step, with its interval."""
    if block.get("status") != "ok" or not block.get("by_step"):
        return "n/a"
    step = get(block, "first_differ", "step")
    at = next((s for s in block["by_step"] if s["step"] == step), block["by_step"][-1])
    level = _percent(block.get("ci_level"))
    if key == "on_task_mean":
        return f"step {at['step']}: {fmt(at['diff'])} [{fmt(at['ci_low'])}, {fmt(at['ci_high'])}] ({level})"
    ci = f"[{fmt(at['ratio_ci_low'])}, {fmt(at['ratio_ci_high'])}]"
    return f"step {at['step']}: ratio {fmt(at['ratio'])} {ci} ({level}), raw {fmt(at['ratio_raw'])}"


def _noise_lines(curves: Mapping[str, Any]) -> list[str]:
    lines = []
    low, high = NOISE_CHECK_BAND
    for arm, roles in (curves.get("noise_check") or {}).items():
        parts, odd = [], []
        for role, c in roles.items():
            parts.append(f"{role.replace('_', '-')} {fmt(c.get('ratio'))}")
            ratio = c.get("ratio")
            if ratio is not None and not low <= ratio <= high:
                odd.append(role.replace("_", "-"))
        remark = ""
        if odd:
            remark = (
                f" (outside {low}-{high} for {', '.join(odd)}: near 0, the seeds share a sampling seed; "
                "well above 1, they did not start alike or the noise is underestimated)"
            )
        lines.append(f"- {arm}: {', '.join(parts)}{remark}")
    return lines


def learning_curves_section(curves: Mapping[str, Any] | None) -> str:
    """The section, or "" when there is no learning_curves.json content."""
    if not curves:
        return ""
    ref = curves.get("reference") or "the reference"
    steps = ", ".join(str(s) for s in curves.get("steps") or [])
    n_tested = len(curves.get("tested_steps") or [])
    out = [
        "## Learning curves (held-out pass@1 during training)",
        "",
        f"Measured at steps {steps or 'n/a'} on a slice of every task (each run's heldout.jsonl). Per arm "
        f"against {ref}: the first measured step at which the on-task mean dJ differs (paired t across "
        "seeds) and the first at which the off-task across-seed variance of dJ differs (seed-row "
        f"permutation test; ratio with the eval noise taken out), each step tested at alpha / {n_tested} = "
        f"{fmt(curves.get('level_per_step'))} (Bonferroni over the steps > 0). 'Parted in (a, b]': the "
        "change happened after the step measured before b, at or before b; the seed bootstrap shows how the "
        "first step moves with the seeds drawn (an indication, not a calibrated interval).",
        "",
    ]
    comparisons = curves.get("comparisons") or {}
    if comparisons:
        rows = [
            [arm, *(first_differ_text(comp.get(q) or {}) for q in QUANTITIES)]
            for arm, comp in comparisons.items()
        ]
        out += [table(["arm", *(f"{q}: first step that differs" for q in QUANTITIES.values())], rows), ""]
        rows = [
            [arm, *(_effect(comp.get(q) or {}, q) for q in QUANTITIES)] for arm, comp in comparisons.items()
        ]
        header = ["arm", "on-task mean dJ, arm - reference", "off-task variance ratio (noise taken out)"]
        out += ["At that step (or the last one when none differs):", "", table(header, rows), ""]
    else:
        out += ["No arm to compare (one arm, or only step 0 measured).", ""]
    noise = _noise_lines(curves)
    if noise:
        out += [
            "Step-0 check: every seed of an arm starts from the same weights, so the across-seed variance "
            "at step 0 should be about the eval noise (variance / noise near 1):",
            "",
            *noise,
            "",
        ]
    return "\n".join(out)
