"""The sampler-trainer gap (``sampler_gap``): pinned on crafted tensors, then on tiny real runs."""

from __future__ import annotations

import json
import math

import pytest
import torch

from workflow_scripts.train import train_run
from workflow_scripts.training.metrics_log import (
    GAP_KEYS,
    GAP_POSITION_BINS,
    gap_summary,
    position_bin_label,
    read_metrics,
)
from workflow_scripts.training.sampler_gap import (
    TOTALS_SIZE,
    combine_totals,
    first_step_of_round,
    gap_metrics,
    gap_totals,
    position_bins,
)

DROPOUT_ARM = {"param_dtype": "float32", "autocast": None, "deterministic": True, "dropout": 0.1}


def test_gap_totals_count_only_loss_tokens_and_the_clip_range_both_ways():
    trainer = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.5, -9.0]])
    sampler = torch.tensor([[-1.5, -2.0, float("nan")], [-0.5, 0.0, -1.0]])  # nan: vLLM could not score it
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])  # the last token is padding
    advantages = torch.tensor([1.0, -1.0])
    totals = gap_totals(trainer, sampler, sampler, mask, advantages, 0.2, 0.28)
    # gaps 0.5, 0, (nan left out), 0, 0.5 -> sum 1.0 over 4 tokens, max 0.5
    # ratios exp(0.5)=1.65 (A>0: clipped), 1, nan (not outside), 1, exp(-0.5)=0.61 (A<0: clipped)
    assert totals[:6].tolist() == [1.0, 4.0, 0.5, 5.0, 2.0, 2.0]  # the layout's first six, unchanged
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
        **dict.fromkeys(GAP_KEYS.values()),  # every gap statistic null: nothing measured
        "sampler_gap/outside_clip": 0.0, "sampler_gap/clipped": 0.0,
    }  # fmt: skip
    both = combine_totals(
        totals, gap_totals(trainer, trainer + 1, None, torch.ones(2, 3), torch.ones(2), 0.2, 0.3)
    )
    assert gap_metrics(both)["sampler_gap/max"] == pytest.approx(1.0) and both[3] == 12


# two completions of 4 tokens: the second is 3 long (one pad), the first has a token vLLM could not score
KL_TRAINER = torch.tensor([[-1.0, -1.0, -1.0, -1.0], [-2.0, -2.0, -2.0, -2.0]])
KL_SAMPLER = torch.tensor([[-1.5, -1.0, -0.5, float("nan")], [-2.0, -3.0, -2.0, -7.0]])
KL_MASK = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])


def _kl_metrics(rows: slice = slice(None)) -> dict:
    totals = gap_totals(
        KL_TRAINER[rows], KL_SAMPLER[rows], None, KL_MASK[rows], torch.ones(2)[rows], 0.2, 0.2
    )
    return gap_metrics(totals)


def test_the_kl_estimates_log_ppl_difference_and_position_bins_match_a_hand_computation():
    m = _kl_metrics()
    # log p_s - log p_t over the 6 scored tokens: -0.5, 0, 0.5 (nan left out) | 0, -1, 0 (pad left out)
    assert m["sampler_gap/mean"] == pytest.approx(2 / 6) and m["sampler_gap/max"] == 1.0
    assert m["sampler_gap/kl_k1"] == pytest.approx(-1 / 6)
    k3 = (math.exp(0.5) - 1.5) + (math.exp(-0.5) - 0.5) + (math.exp(1.0) - 2.0)  # r = log p_t - log p_s
    assert m["sampler_gap/kl_k3"] == pytest.approx(k3 / 6)
    # per sequence |mean Δ|: |0 / 3| and |-1 / 3|, averaged over the 2 sequences
    assert m["sampler_gap/log_ppl_abs_diff"] == pytest.approx(1 / 6)
    # halves: sequence 1 (length 4) first = columns 0, 1, second = 2 (3 is nan); sequence 2 (length 3)
    # first = column 0, the middle column 1 in neither, second = column 2: (0.5 / 2) / (0.5 / 3)
    assert m["sampler_gap/growth"] == pytest.approx(1.5)
    # bins 0 | 1 | 2-3: column 0 (0.5, 0), column 1 (0, 1), columns 2-3 (0.5, 0; nan and pad left out)
    assert [m[f"sampler_gap/pos_{k}"] for k in range(4)] == pytest.approx([0.25, 0.5, 0.25, None])
    assert all(m[f"sampler_gap/pos_{k}"] is None for k in range(3, GAP_POSITION_BINS))


def test_a_nan_sampler_entry_counts_in_no_gap_statistic_but_in_the_token_shares():
    totals = gap_totals(KL_TRAINER, KL_SAMPLER, None, KL_MASK, torch.ones(2), 0.2, 0.2)
    assert totals.numel() == TOTALS_SIZE
    assert totals[1] == 6 and totals[3] == 7  # gap tokens (scored) vs loss tokens
    hidden = KL_SAMPLER.clone()
    hidden[0, 3] = 50.0  # what the nan hid: a huge gap would dominate every statistic
    assert _kl_metrics() != gap_metrics(
        gap_totals(KL_TRAINER, hidden, None, KL_MASK, torch.ones(2), 0.2, 0.2)
    )


def test_two_micro_batches_combined_give_the_statistics_of_one_batch():
    one = gap_totals(KL_TRAINER, KL_SAMPLER, None, KL_MASK, torch.ones(2), 0.2, 0.2)
    parts = [gap_totals(KL_TRAINER[i : i + 1], KL_SAMPLER[i : i + 1], None, KL_MASK[i : i + 1],
                        torch.ones(1), 0.2, 0.2) for i in (0, 1)]  # fmt: skip
    both = combine_totals(*parts)
    assert torch.allclose(both, one)
    assert gap_metrics(both) == pytest.approx(gap_metrics(one))


def test_the_gap_growth_says_whether_the_gap_grows_along_the_completion():
    trainer = torch.zeros(1, 8)
    rising = -torch.arange(8.0).unsqueeze(0) / 10  # |Δ| = 0, 0.1, ..., 0.7
    m = gap_metrics(gap_totals(trainer, rising, None, torch.ones(1, 8), torch.ones(1), 0.2, 0.2))
    assert m["sampler_gap/growth"] == pytest.approx((0.4 + 0.5 + 0.6 + 0.7) / (0.0 + 0.1 + 0.2 + 0.3))
    assert m["sampler_gap/pos_3"] == pytest.approx((0.4 + 0.5 + 0.6 + 0.7) / 4)  # positions 4-7
    flat_start = torch.cat([torch.zeros(1, 4), rising[:, 4:]], dim=1)  # first half exactly 0: x / 0
    m = gap_metrics(gap_totals(trainer, flat_start, None, torch.ones(1, 8), torch.ones(1), 0.2, 0.2))
    assert m["sampler_gap/growth"] is None and m["sampler_gap/kl_k3"] > 0


def test_position_bins_are_log2_with_a_fixed_last_open_bin():
    bins = position_bins(5000).tolist()
    assert bins[:9] == [0, 1, 2, 2, 3, 3, 3, 3, 4]
    assert bins[2047] == 11 and bins[2048] == 12 and bins[4095] == 12 and bins[4096] == bins[4999] == 13
    assert GAP_POSITION_BINS == 14
    labels = [position_bin_label(k) for k in range(GAP_POSITION_BINS)]
    assert labels[:5] == ["0", "1", "2-3", "4-7", "8-15"] and labels[-1] == "4096+"


def test_the_run_summary_averages_the_new_statistics_over_the_rounds_that_measured_them():
    rounds = [
        {"generation_step": True, "sampler_gap_outside_clip": 0.0, "sampler_gap_kl_k3": 0.2,
         "sampler_gap_growth": None, "sampler_gap_pos_0": 0.1},
        {"generation_step": False, "sampler_gap_outside_clip": 0.0, "sampler_gap_kl_k3": 0.2},
        {"generation_step": True, "sampler_gap_outside_clip": 0.0, "sampler_gap_kl_k3": 0.4,
         "sampler_gap_growth": 2.0, "sampler_gap_pos_0": 0.3},
    ]  # fmt: skip
    summary = gap_summary(rounds)
    assert summary["kl_k3_mean"] == pytest.approx(0.3) and summary["growth_mean"] == 2.0
    assert summary["by_position"][0] == pytest.approx(0.2) and summary["by_position"][1] is None
    assert summary["kl_k1_mean"] is None and summary["log_ppl_abs_diff_mean"] is None


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
    for row in fresh:  # the KL estimates, log-ppl and position bins are exactly 0 too; growth 0/0: null
        assert (row["sampler_gap_kl_k1"], row["sampler_gap_kl_k3"], row["sampler_gap_log_ppl_abs_diff"]) == (
            0,
            0,
            0,
        )
        assert row["sampler_gap_growth"] is None and row["sampler_gap_pos_0"] == 0

    dropout, record = _run(tiny_base, tmp_path, "fp32_dropout")
    first = [r for r in dropout if r["generation_step"]]
    assert all(r["sampler_gap_mean"] > 1e-3 and r["sampler_gap_outside_clip"] > 0 for r in first)
    assert all(r["sampler_gap_max"] >= r["sampler_gap_mean"] for r in first)
    for r in first:  # dropout noise: KL(sampler || trainer) > 0 (k3 >= 0 always), every scored position
        assert r["sampler_gap_kl_k3"] > 0 and r["sampler_gap_log_ppl_abs_diff"] > 0
        assert r["sampler_gap_pos_0"] is not None and r["sampler_gap_growth"] is not None
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

    from workflow_scripts.statistics.mismatch_report import mismatch_section

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
    text = mismatch_section(pd.DataFrame([base, *rows]), ["fp32", "bf16"])
    lines = [line for line in text.splitlines() if line.startswith("| fp32") or line.startswith("| bf16")]
    # precision, seeds, sampler / trainer, mean, max, k1, k3, log-ppl, outside clip, clipped, growth, source
    assert lines == [
        "| fp32 | 1 | n/a | 0 | n/a | n/a | n/a | n/a | 0 | n/a | n/a | n/a |",
        "| bf16 | 2 | n/a | 0.3 | n/a | n/a | n/a | n/a | 0.25 | n/a | n/a | n/a |",
    ]  # the repeat is left out; no run.json read: the source is n/a
    assert mismatch_section(pd.DataFrame([base]), ["fp32"]) == ""
