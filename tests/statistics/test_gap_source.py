"""Where each arm's sampler-trainer gap comes from (``arms.gap_source``), what a run samples and trains in
(``arms.sampler_setup``: run.json's ``sampler`` entry, else its config copy), and the report's mismatch
table that says both per arm."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from workflow_scripts import report, stats
from workflow_scripts.statistics import arms
from workflow_scripts.statistics.mismatch_report import GAP_COLUMNS, mismatch_section

FP32 = {"param_dtype": "float32", "autocast": None, "dropout": 0.0}
BF16 = {"param_dtype": "bfloat16", "autocast": None, "dropout": 0.0}
AUTOCAST = {"param_dtype": "float32", "autocast": "bfloat16", "dropout": 0.0}
HF, VLLM = {"use_vllm": False}, {"use_vllm": True}


@pytest.mark.parametrize(
    ("entry", "train", "measured", "source"),
    [
        (FP32, HF, 0.0, "none expected"),  # same weights, dtype and kernels, eval mode on both sides
        (BF16, HF, None, "none expected"),  # not measured: the expectation stands
        (FP32, HF, 0.02, "unexplained"),  # expected 0, measured not
        ({**FP32, "dropout": 0.1}, HF, 0.25, "dropout"),
        (BF16, VLLM, 0.01, "numerics"),  # another engine, same dtype
        ({**FP32, "sampler_dtype": "bfloat16"}, HF, 0.01, "numerics"),  # a bf16 copy samples an fp32 trainer
        ({**AUTOCAST, "sampler_dtype": "bfloat16"}, HF, 0.0, "numerics"),  # own bf16 copy vs bf16 autocast
        ({**FP32, "sampler_dtype": "float32"}, HF, 0.0, "none expected"),  # the masters' dtype: no copy
        ({**BF16, "dropout": 0.1}, VLLM, 0.3, "both"),
    ],
)
def test_the_gap_source_of_each_kind_of_arm(entry, train, measured, source):
    assert arms.gap_source(arms.arm_setup(entry, train), measured) == source


def test_without_a_setup_the_source_is_not_guessed():
    assert arms.gap_source(None, 0.3) == "n/a" and arms.describe_setup(None) == "n/a"


def test_the_sampler_entry_of_run_json_wins_over_the_config_copy():
    record = {"precision": "bf16", "seed": 1, "mode": {**BF16, "dropout": 0.1}, "train": HF}
    assert arms.sampler_setup(record) == {"backend": "hf", "dtype": "bfloat16", "trainer_dtype": "bfloat16",
                                          "dropout": 0.1, "copies": False}  # fmt: skip
    record["sampler"] = {
        "backend": "vllm",
        "dtype": "torch.float16",
        "trainer_dtype": "bfloat16",
        "reason": None,
    }
    setup = arms.sampler_setup(record)
    assert (setup["backend"], setup["dtype"], setup["dropout"]) == ("vllm", "float16", 0.1)
    assert (
        arms.gap_source(setup, 0.1) == "both"
        and arms.describe_setup(setup) == "vLLM fp16 / bf16, dropout 0.1"
    )
    bare = {
        "precision": "x",
        "seed": 1,
        "sampler": {"backend": "hf", "dtype": "float32", "trainer_dtype": "float32"},
    }
    assert arms.gap_source(arms.sampler_setup(bare), 0.0) == "none expected"
    assert arms.sampler_setup({"precision": "x", "seed": 1}) is None  # neither: unknown


def test_a_sampler_with_weights_of_its_own_is_numerics_even_in_the_trainer_s_dtype():
    """run.json says what really sampled: vLLM's CPU build has no fp16 kernels, so a config asking vLLM
    fp16 samples with an HF fp16 copy; an own bf16 copy beside bf16 autocast keeps no op in fp32."""
    mode = {**AUTOCAST, "sampler_dtype": "bfloat16"}
    record = {"precision": "a", "seed": 1, "mode": mode, "train": VLLM}
    record["sampler"] = {"backend": "hf", "dtype": "bfloat16", "trainer_dtype": "bfloat16", "copies": True,
                         "correction": None, "reason": "vLLM's CPU build has no float16 kernels"}  # fmt: skip
    setup = arms.sampler_setup(record)
    assert (
        arms.describe_setup(setup) == "HF bf16 (own copy) / bf16"
        and arms.gap_source(setup, 0.0) == "numerics"
    )
    record["sampler"]["copies"] = False  # the trained model itself samples: nothing but dropout could differ
    assert arms.gap_source(arms.sampler_setup(record), 0.0) == "none expected"


def test_run_setups_name_runs_and_repeats_and_skip_other_records():
    records = [
        {"precision": "fp32", "seed": 2, "mode": FP32, "train": HF},
        {"precision": "fp32", "seed": 2, "repeat": 2, "mode": FP32, "train": VLLM},
        {"numerics": {}},  # base.json
        None,  # unreadable
    ]
    setups = arms.run_setups(records)
    assert list(setups) == ["fp32-s2", "fp32-s2-r2"] and setups["fp32-s2-r2"]["backend"] == "vllm"


def _metrics(gaps: dict[str, float]) -> pd.DataFrame:
    rows = []
    for run, gap in gaps.items():
        arm, seed = run.rsplit("-s", 1)
        for task in ("add_sub", "mul"):  # run-level columns repeat on every task row
            rows.append({"run": run, "precision": arm, "seed": int(seed), "repeat": 1, "task": task,
                         **{c: gap for c, _ in GAP_COLUMNS}, "sampler_gap_growth": 1.5})  # fmt: skip
    return pd.DataFrame(rows)


SETUPS = {  # run -> (config entry, train section)
    "fp32-s1": (FP32, HF),
    "fp32_drop-s1": ({**FP32, "dropout": 0.1}, HF),
    "bf16_vllm-s1": (BF16, VLLM),
    "bf16_vllm_drop-s1": ({**BF16, "dropout": 0.1}, VLLM),
    "bf16-s1": (BF16, HF),
}
GAPS = {"fp32-s1": 0.0, "fp32_drop-s1": 0.2, "bf16_vllm-s1": 0.01, "bf16_vllm_drop-s1": 0.2, "bf16-s1": 0.03}


def test_the_mismatch_table_has_the_field_s_measures_and_a_source_per_arm():
    setups = {run: arms.arm_setup(*v) for run, v in SETUPS.items()}
    text = mismatch_section(_metrics(GAPS), ["fp32"], setups)
    header = next(line for line in text.splitlines() if line.startswith("| precision"))
    for name in ("mean |Δ log p|", "max |Δ log p|", "KL k1", "KL k3", "log-ppl abs diff", "outside clip",
                 "clipped", "growth (2nd / 1st half)", "where it comes from"):  # fmt: skip
        assert f"| {name} |" in header + " |", name
    cells = [[c.strip() for c in line.strip("| ").split(" | ")] for line in text.splitlines()]
    rows = {c[0]: c for c in cells if len(c) == 12 and c[0] in {r.split("-s")[0] for r in GAPS}}
    assert {arm: c[-1] for arm, c in rows.items()} == {
        "fp32": "none expected", "fp32_drop": "dropout", "bf16_vllm": "numerics",
        "bf16_vllm_drop": "both", "bf16": "unexplained",
    }  # fmt: skip
    assert rows["bf16_vllm_drop"][2] == "vLLM bf16 / bf16, dropout 0.1" and rows["fp32"][3] == "0"
    assert rows["bf16"][10] == "1.5"  # growth
    assert next(iter(rows)) == "fp32"  # the configured order first


def test_the_report_reads_each_run_s_setup_from_its_run_json(tmp_path):
    """report.run hands the run.json records it reads for provenance to the mismatch table."""
    from test_figures import make_data

    data = make_data(tmp_path / "r", precisions=("fp32", "bf16"), seeds=(1,))
    metrics = data.metrics.assign(
        sampler_gap_mean=[0.0 if p != "bf16" else 0.02 for p in data.metrics["precision"]]
    )
    metrics.to_parquet(tmp_path / "metrics.parquet")
    (tmp_path / "stats.json").write_text(json.dumps(stats.json_safe(data.stats)))
    records = []
    for arm, entry in (("fp32", FP32), ("bf16", BF16)):
        path = tmp_path / f"{arm}.run.json"
        path.write_text(json.dumps({"precision": arm, "seed": 1, "mode": entry, "train": VLLM}))
        records.append(path)
    text = report.run(
        stats=tmp_path / "stats.json",
        metrics=tmp_path / "metrics.parquet",
        out=tmp_path / "report.md",
        figures={},
        precisions=["fp32", "bf16"],
        records=records,
    )
    section = text.split("## Sampler-trainer mismatch")[1].split("\n## ")[0]
    assert "| fp32 | 1 | vLLM fp32 / fp32 |" in section and section.count("| numerics |") == 2
