"""The learning_curves stage: every run's heldout.jsonl read into heldout_curves.parquet (one row per run x
step x task, dJ from the arm's mean step-0 J) and learning_curves.json; bad input names file and field.

``write_heldout`` makes the training side's files (tests/test_figures.py and test_report.py use it too).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from workflow_scripts import learning_curves as lc

ROLES = {"add_sub": "on_task", "mul": "off_task", "chain": "off_task"}
STEPS = (0, 4, 8)
FAST = {"bootstrap": 200, "seed": 0}


def heldout_line(precision: str, seed: int, step: int, task: str, p: float, repeat: int = 1, **extra) -> dict:
    """One line as training writes it (pass@1 over 10 problems x 4 samples)."""
    counts = [round(p * 4)] * 10
    run = f"{precision}-s{seed}" + (f"-r{repeat}" if repeat > 1 else "")
    line = {
        "run": run, "precision": precision, "seed": seed, "repeat": repeat, "step": step, "task": task,
        "role": ROLES.get(task, "off_task"), "kind": "integer", "pass_at_1": float(np.mean(counts) / 4),
        "pass_at_1_se": 0.05, "eval_noise_var": 1e-3, "n_problems": 10, "n_samples": 4,
        "sampling_seed": 1000 * seed + step, "backend": "hf", "dtype": "float32",
        "problem_ids": [f"{task}-{i}" for i in range(10)], "correct_counts": counts, "generate_s": 0.5,
        "score_s": 0.01, "phase": None,
    }  # fmt: skip
    return {**line, **extra}


def write_heldout(
    root: Path,
    precisions: tuple[str, ...] = ("fp32", "bf16"),
    seeds: tuple[int, ...] = (1, 2, 3),
    steps: tuple[int, ...] = STEPS,
    tasks: tuple[str, ...] = tuple(ROLES),
    repeats: tuple[tuple[str, int, int], ...] = (),
    rng: np.random.Generator | None = None,
) -> list[Path]:
    """results/train/{precision}/seed{seed}[-r{k}]/heldout.jsonl for every run; pass@1 rises with the step,
    bf16 a little faster, each seed by its own noise."""
    rng = rng or np.random.default_rng(0)
    runs = [(p, s, 1) for p in precisions for s in seeds] + list(repeats)
    files = []
    for precision, seed, repeat in runs:
        lines = []
        for step in steps:
            for task in tasks:
                p = 0.3 + 0.04 * step * (1.5 if precision == "bf16" else 1.0) + rng.normal(0, 0.05)
                lines.append(heldout_line(precision, seed, step, task, float(np.clip(p, 0, 1)), repeat))
        path = (
            root
            / "train"
            / precision
            / (f"seed{seed}" + (f"-r{repeat}" if repeat > 1 else ""))
            / "heldout.jsonl"
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(line) + "\n" for line in lines))
        files.append(path)
    return files


def run_stage(tmp_path: Path, files, **kw) -> tuple[pd.DataFrame, dict]:
    table, stats = tmp_path / "heldout_curves.parquet", tmp_path / "learning_curves.json"
    kw = {"roles": ROLES, "precisions": ["fp32", "bf16"], "analysis": FAST, **kw}
    lc.run(heldout=files, table_out=table, stats_out=stats, **kw)
    return pd.read_parquet(table), json.loads(stats.read_text())


def test_the_table_has_a_row_per_run_step_and_task_in_config_order(tmp_path):
    files = write_heldout(tmp_path / "results", repeats=(("bf16", 2, 2),))
    table, result = run_stage(tmp_path, files[::-1], precisions=["fp32", "bf16"])
    assert list(table.columns) == list(lc.COLUMNS)
    assert len(table) == (6 + 1) * len(STEPS) * len(ROLES)
    assert table["precision"].drop_duplicates().tolist() == ["fp32", "bf16"]
    assert table["task"].iloc[:3].tolist() == list(ROLES) and table["step"].iloc[:3].tolist() == [0, 0, 0]
    first = table.drop_duplicates(["precision", "seed", "repeat"])[["precision", "seed", "repeat"]]
    assert first.values.tolist() == [["fp32", 1, 1], ["fp32", 2, 1], ["fp32", 3, 1], ["bf16", 1, 1],
                                     ["bf16", 2, 1], ["bf16", 2, 2], ["bf16", 3, 1]]  # fmt: skip
    # dJ: J minus the arm's mean step-0 J over its first runs (the repeat is left out of the offset)
    start = table[(table["step"] == 0) & (table["repeat"] == 1)].groupby(["precision", "task"])["dJ"].mean()
    assert np.allclose(start.to_numpy(), 0.0)
    row = table[(table["run"] == "bf16-s2-r2") & (table["step"] == 8) & (table["task"] == "mul")].iloc[0]
    j0 = table[(table["precision"] == "bf16") & (table["repeat"] == 1) & (table["step"] == 0)
               & (table["task"] == "mul")]["J"].mean()  # fmt: skip
    assert row["dJ"] == pytest.approx(row["J"] - j0) and row["role"] == "off_task"
    assert str(table["phase"].dtype) == "Int64" and table["backend"].eq("hf").all()
    assert result["reference"] == "fp32" and result["n_seeds"] == {"fp32": 3, "bf16": 3}
    assert result["steps"] == list(STEPS) and result["tested_steps"] == [4, 8]
    assert result["tasks"] == {"on_task": ["add_sub"], "off_task": ["mul", "chain"]}
    assert result["source"]["files"] == 7 and result["source"]["rows"] == len(table)
    assert set(result["comparisons"]["bf16"]) >= {"on_task_mean", "off_task_variance", "design"}


def test_null_noise_is_filled_from_the_counts_and_config_roles_win(tmp_path):
    files = write_heldout(tmp_path / "results", seeds=(1, 2))
    lines = [json.loads(x) for x in files[0].read_text().splitlines()]
    lines[0]["eval_noise_var"] = None  # fp32 seed 1, step 0, add_sub: counts [1]*10 of 4 -> p = 0.25
    lines[0]["correct_counts"] = [1] * 10
    files[0].write_text("".join(json.dumps(x) + "\n" for x in lines))
    table, result = run_stage(tmp_path, files, roles={**ROLES, "chain": "on_task"})
    filled = table[(table["run"] == "fp32-s1") & (table["step"] == 0) & (table["task"] == "add_sub")]
    assert filled["eval_noise_var"].iloc[0] == pytest.approx(10 * 0.25 * 0.75 / 3 / 100)
    assert set(table.loc[table["task"] == "chain", "role"]) == {"on_task"}
    assert any("eval_noise_var null in 1 line" in w for w in result["warnings"])
    assert any("task chain" in w for w in result["warnings"])


def _edit(path: Path, index: int | None, change) -> None:
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    if index is None:
        lines = change(lines)
    else:
        change(lines[index])
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))


def _drop_task(lines: list[dict]) -> list[dict]:
    return [x for x in lines if x["task"] != "chain"]


BAD = {  # case -> (how the first file is spoilt, what the error says)
    "malformed line": (lambda f: f.write_text(f.read_text() + "{not json\n"),
                       r"seed1/heldout.jsonl:10: not valid JSON"),
    "missing field": (lambda f: _edit(f, 2, lambda d: d.pop("pass_at_1")),
                      r"heldout.jsonl:3: field 'pass_at_1' is missing"),
    "mistyped field": (lambda f: _edit(f, 0, lambda d: d.update(step="4")), r":1: field 'step' must be int"),
    "out of range": (lambda f: _edit(f, 0, lambda d: d.update(pass_at_1=1.5)),
                     r"field 'pass_at_1' must lie in"),
    "missing step": (lambda f: _edit(f, None, lambda ls: ls[:-1]),
                     r"field 'step': task 'chain' lacks step\(s\) \[8\]"),
    "no step 0": (lambda f: _edit(f, None, lambda ls: ls[3:]), r"field 'step': no step 0"),
    "twice": (lambda f: _edit(f, None, lambda ls: [*ls, ls[0]]),
              r"field 'step': step 0 of task 'add_sub' appears twice"),
    "two runs": (lambda f: _edit(f, 0, lambda d: d.update(seed=9)), r"field 'seed' takes several values"),
    "other grid": (lambda f: _edit(f, None, lambda ls: ls[:-3]),
                   r"seed1/heldout.jsonl: field 'step': steps \[0, 4\] differ from .*seed2"),
    "other tasks": (lambda f: _edit(f, None, _drop_task), r"field 'task': tasks"),
    "empty": (lambda f: f.write_text("\n"), r"heldout.jsonl: no lines"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_names_the_file_and_the_field(case, tmp_path):
    files = write_heldout(tmp_path / "results", precisions=("fp32",), seeds=(1, 2))
    spoil, message = BAD[case]
    spoil(files[0])
    with pytest.raises(lc.CurveError, match=message):
        lc.build_table([files[1], files[0]], ROLES, ["fp32"])


def test_a_missing_file_and_a_duplicate_run_are_errors(tmp_path):
    files = write_heldout(tmp_path / "results", precisions=("fp32",), seeds=(1, 2))
    with pytest.raises(lc.CurveError, match=r"nope\.jsonl: file not found"):
        lc.build_table([*files, tmp_path / "nope.jsonl"], ROLES)
    copy = tmp_path / "copy.jsonl"
    copy.write_text(files[0].read_text())
    with pytest.raises(lc.CurveError, match="field 'run': run 'fp32-s1' is also in"):
        lc.build_table([*files, copy], ROLES)


def test_the_cli_reads_a_config(tmp_path, monkeypatch):
    files = write_heldout(tmp_path / "results", seeds=(1, 2, 3))
    config = Path(__file__).parent / "config.test.yaml"
    out = tmp_path / "lc.json"
    argv = ["--heldout", *map(str, files), "--config", str(config), "--table", str(tmp_path / "t.parquet"),
            "--out", str(out)]  # fmt: skip
    assert lc.main(argv) == 0
    result = json.loads(out.read_text())
    assert result["reference"] == "fp32" and result["alpha"] == 0.05
    assert "bf16" in result["comparisons"]


@pytest.mark.slow
def test_the_rule_runs_the_stage_on_every_runs_heldout_file(tmp_path, tmp_path_factory):
    """snakemake runs workflow_scripts/learning_curves.py on the train rule's declared heldout.jsonl outputs
    (upstream outputs are placeholders marked done; the heldout files are written, then the two outputs
    of learning_curves are deleted, so only that job runs)."""
    from conftest import load_test_config, mark_done, placeholder_workflow, run_snakemake

    config = load_test_config()
    wf = placeholder_workflow(tmp_path_factory, tmp_path / "wf")
    tasks = tuple(config["data"]["tasks"])
    write_heldout(wf / "results", tuple(config["precisions"]), tuple(config["seeds"]), tasks=tasks)
    mark_done(wf)
    analysis = wf / "results" / "analysis"
    for name in ("heldout_curves.parquet", "learning_curves.json"):
        (analysis / name).unlink()
    proc = run_snakemake(wf, "results/analysis/learning_curves.json", timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    table = pd.read_parquet(analysis / "heldout_curves.parquet")
    n_runs = len(config["precisions"]) * len(config["seeds"])
    assert len(table) == n_runs * len(STEPS) * len(tasks) and list(table.columns) == list(lc.COLUMNS)
    result = json.loads((analysis / "learning_curves.json").read_text())
    assert result["precisions"] == list(config["precisions"]) and result["tasks"]["on_task"] == ["add_sub"]
    assert "learning curves" in (wf / "logs" / "learning_curves" / "learning_curves.log").read_text()
