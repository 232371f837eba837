"""The sampler-trainer mismatch in report.md: per arm, the gap at each round's first step and where it
comes from (``arms.gap_source``), as the report's table (``mismatch_section``) and as the words
"What this run says" adds to each arm (``gap_words``); both read ``gaps_by_arm``.
"""

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from workflow_scripts.statistics.arms import ZERO_GAP, describe_setup, gap_source
from workflow_scripts.statistics.noise_floor import without_repeats
from workflow_scripts.statistics.report_tables import fmt, table

GAP_COLUMNS = (  # metrics.parquet column -> header of the mismatch table
    ("sampler_gap_mean", "mean |Δ log p|"),
    ("sampler_gap_max", "max |Δ log p|"),
    ("sampler_gap_kl_k1", "KL k1"),
    ("sampler_gap_kl_k3", "KL k3"),
    ("sampler_gap_log_ppl_abs_diff", "log-ppl abs diff"),
    ("sampler_gap_outside_clip", "outside clip"),
    ("sampler_gap_clipped", "clipped"),
    ("sampler_gap_growth", "growth (2nd / 1st half)"),
)
GAP_OTHER_COLUMNS = (  # beside it where logged: clip share over all steps, TRL's vLLM view, fp16 scaler
    ("clip_region_mean", "clip frac (all steps)"),
    ("vllm_logp_diff_mean", "vLLM vs trainer |Δ log p|"),
    ("loss_scale_final", "final loss scale"),
    ("skipped_steps", "skipped steps"),
)
MISMATCH_NOTE = (
    "Before any update on a generation round the trainer's weights are the sampler's, so Δ = log p_sampler "
    "- log p_trainer there is numerics or dropout, not learning. Per arm, means over seeds of each run's "
    "mean over rounds, on the completion tokens the loss sees: k1 = mean(-r) and k3 = mean(exp(r) - 1 - r), "
    "r = log p_trainer - log p_sampler, estimate KL(sampler ‖ trainer) (the tokens were drawn from the "
    "sampler); log-ppl abs diff = |mean log p_sampler - mean log p_trainer| per sequence; outside clip / "
    "clipped: shares of tokens whose ratio is already outside [1 - epsilon, 1 + epsilon_high] / that the "
    "loss clips; growth > 1: the gap grows along the completion. Source: numerics (another dtype or engine "
    "than the loss forward), dropout (train-mode loss forward, eval-mode sampler), both, or none expected "
    f"(the gap must then be 0: unexplained if its mean exceeds {ZERO_GAP:g} nats)."
)
SOURCE_WORDS = {  # gap_source -> why, in the summary's words
    "numerics": "from numerics",
    "dropout": "from dropout (train-mode loss, eval-mode sampler), not numerics",
    "both": "from numerics and dropout",
    "unexplained": "unexplained: the arm's numerics predict none",
}


def gaps_by_arm(
    metrics: pd.DataFrame, precisions: Sequence[str], setups: Mapping[str, Any] | None = None
) -> dict[str, dict[str, Any]]:
    """arm -> {seeds, sampler (``describe_setup``), source, and each gap column's mean over its first
    runs}, in ``precisions`` order; empty where no run logged a gap and no run's setup is known."""
    if metrics.empty or "precision" not in metrics.columns:
        return {}
    runs = without_repeats(metrics[metrics["precision"].notna()]).drop_duplicates("run")
    known = any(v is not None for v in (setups or {}).values())
    if runs.empty or not (known or any(c in runs.columns and runs[c].notna().any() for c, _ in GAP_COLUMNS)):
        return {}
    columns = [c for c, _ in GAP_COLUMNS] + [c for c, _ in GAP_OTHER_COLUMNS if c in runs.columns]
    runs = runs.reindex(columns=list(dict.fromkeys([*runs.columns, *columns])))
    order = [p for p in precisions if p in set(runs["precision"])]
    order += [p for p in runs["precision"].unique() if p not in order]
    out = {}
    for arm in order:
        sel = runs[runs["precision"] == arm]
        found = [(setups or {}).get(str(r)) for r in sel["run"]]
        gaps = [None if pd.isna(g) else float(g) for g in sel["sampler_gap_mean"]]
        out[arm] = {
            "seeds": len(sel),
            "sampler": "; ".join(dict.fromkeys(describe_setup(x) for x in found)),  # runs that differ
            "source": "; ".join(dict.fromkeys(gap_source(x, g) for x, g in zip(found, gaps, strict=True))),
            **{c: sel[c].mean() for c in columns},
        }
    return out


def gap_words(gap: Mapping[str, Any] | None) -> str | None:
    """An arm's gap in a clause ("mean sampler-trainer gap 0.574 nats, 36% of tokens outside the clip
    range, from dropout ..."); none where no gap is expected and none was measured, or the source is
    unknown."""
    words = SOURCE_WORDS.get(str((gap or {}).get("source")))
    if not words:
        return None
    text = f"mean sampler-trainer gap {fmt(gap.get('sampler_gap_mean'))} nats"
    outside = gap.get("sampler_gap_outside_clip")
    if outside is not None and not pd.isna(outside) and outside > 0:
        text += f", {fmt(100 * outside, 2)}% of tokens outside the clip range"
    return f"{text}, {words}"


def mismatch_section(
    metrics: pd.DataFrame, precisions: Sequence[str], setups: Mapping[str, Any] | None = None
) -> str:
    """Per arm (first runs only) the sampler-trainer gap (``sampler_gap``) and where it comes from
    (``arms.gap_source``); ``setups``: run -> ``arms.sampler_setup`` (none: source n/a)."""
    return mismatch_table(gaps_by_arm(metrics, precisions, setups))


def mismatch_table(by_arm: Mapping[str, Mapping[str, Any]]) -> str:
    """The report's mismatch section from ``gaps_by_arm``; empty without gaps."""
    if not by_arm:
        return ""
    other = [(c, n) for c, n in GAP_OTHER_COLUMNS if any(not pd.isna(g.get(c)) for g in by_arm.values())]
    rows = [
        [arm, str(g["seeds"]), g["sampler"], *(fmt(g[c]) for c, _ in GAP_COLUMNS), g["source"]]
        for arm, g in by_arm.items()
    ]
    head = ["precision", "seeds", "sampler / trainer", *(n for _, n in GAP_COLUMNS), "where it comes from"]
    parts = ["## Sampler-trainer mismatch (mean over seeds)", "", MISMATCH_NOTE, "", table(head, rows), ""]
    if other:
        others = [[arm, str(g["seeds"]), *(fmt(g[c]) for c, _ in other)] for arm, g in by_arm.items()]
        parts += [table(["precision", "seeds", *(n for _, n in other)], others), ""]
    return "\n".join(parts)
