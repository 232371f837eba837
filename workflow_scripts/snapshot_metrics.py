"""snapshot_metrics stage: the reference's evaluated snapshots (config ``snapshots``) as one table.

Runs ``<ref>-s<seed>@step<k>`` evaluated on the off-task tasks (rules/evaluate.smk, evaluate_snapshot)
are read by the aggregate stage's own reader (``aggregate.aggregate``: the same columns as
metrics.parquet, dJ against the run's reference base, every KL estimator), with the base runs' summaries
beside them, and written to analysis/snapshot_metrics.parquet for the movement-matched comparison
(statistics/matched.py, read by the stats stage). Apart from metrics.parquet: a snapshot is not a
seed's final policy, so nothing else in the analysis may see it.
"""

from workflow_scripts.runtime import startup  # noqa: F401  first: no garbage collection during imports

# isort: split

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from workflow_scripts.measures.aggregate_join import aggregate
from workflow_scripts.runtime import paths
from workflow_scripts.runtime.atomic import write_parquet
from workflow_scripts.runtime.smk import main_from


def snapshot_table(
    evals: Sequence[str | os.PathLike],
    kls: Sequence[str | os.PathLike],
    roles: Mapping[str, str],
    precisions: Sequence[str],
    references: Mapping[str, str],
) -> pd.DataFrame:
    """metrics.parquet's columns for the snapshot runs (base rows kept: the statistics read their noise)
    and a ``step`` column (the snapshot's optimizer step; null for a base run)."""
    table = aggregate(evals, kls, [], [], roles, precisions, (), references)[0]
    return table.assign(step=pd.array([paths.parse_run(r).step for r in table["run"]], dtype="Int64"))


def run(
    *,
    evals: Sequence[str | os.PathLike],
    kls: Sequence[str | os.PathLike],
    roles: Mapping[str, str],
    precisions: Sequence[str],
    references: Mapping[str, str],
    out: str | os.PathLike,
) -> pd.DataFrame:
    table = snapshot_table(evals, kls, roles, precisions, references)
    write_parquet(out, table)
    print(f"snapshot_metrics: {len(table)} run x task rows -> {out}", file=sys.stderr)
    return table


def from_snakemake(smk: Any) -> None:
    run(
        evals=list(smk.input.evals),
        kls=list(smk.input.kls),
        roles=dict(smk.params.roles),
        precisions=list(smk.params.precisions),
        references=dict(smk.params.references),
        out=smk.output.table,
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m workflow_scripts.snapshot_metrics", description=__doc__)
    p.add_argument("--evals", nargs="+", required=True, help="eval summaries (snapshots and base runs)")
    p.add_argument("--kls", nargs="+", required=True, help="their KL summaries")
    p.add_argument("--config", default="config.yaml", help="task roles, arm order and each arm's base run")
    p.add_argument("--out", default=str(paths.analysis_dir() / "snapshot_metrics.parquet"))
    args = p.parse_args(argv)
    from workflow_scripts.runtime.config import load_config

    cfg = load_config(args.config, check_files=False)
    run(
        evals=args.evals,
        kls=args.kls,
        roles={t: s["role"] for t, s in cfg["data"]["tasks"].items()},
        precisions=list(cfg["precisions"]),
        references={p: paths.reference_run(cfg, paths.run_name(p, 0)) for p in cfg["precisions"]},
        out=args.out,
    )
    return 0


if __name__ == "__main__":
    main_from(globals())
