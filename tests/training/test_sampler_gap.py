"""The sampler-trainer gap (``sampler_gap``): pinned on crafted tensors, then on tiny real runs."""

from __future__ import annotations

import json
import math

import pytest
import torch

from workflow_scripts.train import train_run
from workflow_scripts.training.metrics_log import GAP_KEYS, gap_summary, read_metrics
from workflow_scripts.training.sampler_gap import combine_totals, first_step_of_round, gap_metrics, gap_totals

DROPOUT_ARM = {"param_dtype": "float32", "autocast": None, "deterministic": True, "dropout": 0.1}


def test_gap_totals_count_only_loss_tokens_and_the_clip_range_both_ways():
    trainer = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.5, -9.0]])
    sampler = torch.tensor([[-1.5, -2.0, float("nan")], [-0.5, 0.0, -1.0]])  # nan: vLLM could not score it
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])  # the last token is padding
    advantages = torch.tensor([1.0, -1.0])
    totals = gap_totals(trainer, sampler, sampler, mask, advantages, 0.2, 0.28)
    # gaps 0.5, 0, (nan left out), 0, 0.5 -> sum 1.0 over 4 tokens, max 0.5
    # ratios exp(0.5)=1.65 (A>0: clipped), 1, nan (not outside), 1, exp(-0.5)=0.61 (A<0: clipped)
    assert totals.tolist() == [1.0, 4.0, 0.5, 5.0, 2.0, 2.0]
    m = gap_metrics(totals)
    assert list(m) == list(GAP_KEYS.values())
    assert m["sampler_gap/mean"] == 0.25 and m["sampler_gap/max"] == 0.5
    assert m["sampler_gap/outside_clip"] == m["sampler_gap/clipped"] == 0.4
    flipped = gap_totals(trainer, sampler, sampler, mask, -advantages, 0.2, 0.28)
    assert flipped[4] == 2 and flipped[5] == 0  # outside the range, but the clip does not act


def test_without_sampler_log_probs_the_gap_is_null_and_the_ratio_exactly_one():
    trainer = torch.randn(2, 3)
    totals = gap_totals(trainer, None, None, torch.ones(2, 3), torch.ones(2), 0.2, 0.28)
    assert gap_metrics(totals) == {
        "sampler_gap/mean": None, "sampler_gap/max": None,
        "sampler_gap/outside_clip": 0.0, "sampler_gap/clipped": 0.0,
    }  # fmt: skip
    both = combine_totals(
        totals, gap_totals(trainer, trainer + 1, None, torch.ones(2, 3), torch.ones(2), 0.2, 0.3)
    )
    assert gap_metrics(both)["sampler_gap/max"] == pytest.approx(1.0) and both[3] == 12


@pytest.mark.parametrize(
    ("generate_every", "accumulation", "first"),
    [
        (4, 1, [0, 4, 8]),  # the default: a round of 4 optimizer steps, the first before any update
        (4, 2, [0, 1, 4, 5, 8, 9]),  # two micro-batches per optimizer step (or 2 per round x 2 passes)
        (2, 2, list(range(10))),  # one round per optimizer step: every step is a first step
    ],
)
def test_the_first_step_of_a_round_is_the_one_before_any_update_on_it(generate_every, accumulation, first):
    assert [s for s in range(10) if first_step_of_round(s, generate_every, accumulation)] == first


# ------------------------------------------------------------------------------------ real tiny runs


def _run(tiny_base, tmp_path, precision: str, **train) -> tuple[list[dict], dict]:
    config = json.loads(json.dumps(tiny_base["config"]))
    settings = {"max_steps": 4, "steps_per_generation": 2, "kl_every": 100, "kl_prompts": 2, "kl_samples": 1,
                "learning_rate": 1e-3, "checkpoint_every": 100}  # fmt: skip
    config["train"].update({**settings, **train})
    config["precisions"]["fp32_dropout"] = dict(DROPOUT_ARM)
    out = tmp_path / precision
    record = train_run(
        config, precision, 1, tiny_base["data_dir"], tiny_base["base_dir"], out, tmp_path / "ck"
    )
    return read_metrics(out / "metrics.jsonl"), record


def test_fp32_without_dropout_has_exactly_zero_gap_and_dropout_alone_opens_one(tiny_base, tmp_path):
    plain, record = _run(tiny_base, tmp_path, "fp32")
    fresh = [r for r in plain if r["generation_step"]]
    assert [r["step"] for r in fresh] == [1, 3]
    for row in plain:  # eval-mode old log-probs and the dropout-free loss forward agree bit for bit
        assert (row["sampler_gap_mean"], row["sampler_gap_max"], row["sampler_gap_outside_clip"]) == (0, 0, 0)
    assert record["sampler_gap"]["rounds_measured"] == 2 and record["sampler_gap"]["max"] == 0.0

    dropout, record = _run(tiny_base, tmp_path, "fp32_dropout")
    first = [r for r in dropout if r["generation_step"]]
    assert all(r["sampler_gap_mean"] > 1e-3 and r["sampler_gap_outside_clip"] > 0 for r in first)
    assert all(r["sampler_gap_max"] >= r["sampler_gap_mean"] for r in first)
    # at a round's first step the loss's clip share is the gap's: TRL's count (clip_region), ours, same tokens
    assert any(r["clip_region"] > 0 for r in first)
    for r in first:
        assert r["sampler_gap_clipped"] == pytest.approx(r["clip_region"], abs=1e-6)
    assert dropout[1]["sampler_gap_mean"] == dropout[0]["sampler_gap_mean"]  # carried to step 2
    assert record["sampler_gap"] == gap_summary(dropout)
    assert record["sampler_gap"]["mean"] == pytest.approx(sum(r["sampler_gap_mean"] for r in first) / 2)


def test_without_old_log_probs_the_gap_is_null_and_nothing_is_clipped(tiny_base, tmp_path):
    """steps_per_generation == gradient_accumulation_steps: TRL reuses the loss's own log-probs."""
    rows, record = _run(tiny_base, tmp_path, "fp32_dropout", steps_per_generation=1, max_steps=2)
    assert all(r["sampler_gap_mean"] is None and r["sampler_gap_outside_clip"] == 0.0 for r in rows)
    assert record["sampler_gap"]["mean"] is None and record["sampler_gap"]["rounds_measured"] == 2
    assert not math.isnan(record["rewards"]["reward_mean"])


def test_the_report_shows_one_gap_line_per_arm_over_first_runs_only():
    import pandas as pd

    from workflow_scripts.statistics.report_tables import sampler_gap_section

    runs = [
        ("fp32-s1", "fp32", 1, 0.0, 0.0),
        ("bf16-s1", "bf16", 1, 0.4, 0.3),
        ("bf16-s2", "bf16", 1, 0.2, 0.2),
        ("bf16-s1-r2", "bf16", 2, 9.0, 0.9),
    ]
    gap = ("sampler_gap_mean", "sampler_gap_outside_clip")
    rows = [
        {"run": r, "precision": p, "repeat": k, "task": t, gap[0]: g, gap[1]: o}
        for r, p, k, g, o in runs
        for t in ("add_sub", "mul")
    ]
    base = {"run": "base", "precision": None, "repeat": None, "task": "add_sub"}
    text = sampler_gap_section(pd.DataFrame([base, *rows]), ["fp32", "bf16"])
    lines = [line for line in text.splitlines() if line.startswith("| fp32") or line.startswith("| bf16")]
    assert lines == ["| fp32 | 1 | 0 | 0 |", "| bf16 | 2 | 0.3 | 0.25 |"]  # the repeat is left out
    assert sampler_gap_section(pd.DataFrame([base]), ["fp32"]) == ""
