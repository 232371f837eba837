"""snapshot_metrics: the reference's snapshot runs read through aggregate's join, with their step."""

import json
import shutil
from pathlib import Path

import pandas as pd
from test_aggregate import TASKS, write_fake_results

from workflow_scripts import snapshot_metrics


def _as_snapshot(files: list[Path], run: str, step: int, root: Path) -> list[Path]:
    """The final run's files renamed as its snapshot at ``step`` (evaluate_snapshot names)."""
    out = []
    for src in files:
        if f"/{run}/" not in str(src):
            continue
        name = f"{run}@step{step}"
        dst = root / "eval" / name / src.name
        dst.parent.mkdir(parents=True, exist_ok=True)
        record = json.loads(src.read_text())
        record["run"] = name
        dst.write_text(json.dumps(record))
        out.append(dst)
    return out


def test_snapshot_rows_carry_their_step_and_the_base_rows_none(tmp_path):
    fake = write_fake_results(tmp_path / "r", precisions=("fp32",), seeds=(1, 2))
    evals = [p for p in fake["evals"] if "/base/" in str(p)]
    kls = []
    for run, step in (("fp32-s1", 6), ("fp32-s2", 12)):
        evals += _as_snapshot(fake["evals"], run, step, tmp_path / "s")
        kls += _as_snapshot(fake["kls"], run, step, tmp_path / "s")
    out = tmp_path / "snap.parquet"
    table = snapshot_metrics.run(
        evals=evals, kls=kls, roles=TASKS, precisions=["fp32"], references={"fp32": "base"}, out=out
    )
    assert out.exists()
    steps = dict(zip(table["run"], table["step"], strict=False))
    assert steps["fp32-s1@step6"] == 6 and steps["fp32-s2@step12"] == 12
    assert pd.isna(steps["base"])
    assert len(table) == 3 * len(TASKS)  # base and two snapshots, every task
    shutil.rmtree(tmp_path / "s")
