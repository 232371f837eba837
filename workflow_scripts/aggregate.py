"""aggregate stage: every upstream result joined into tidy tables for the statistics and the figures.

Reads only the declared outputs of the upstream rules (never a model or a samples parquet):

| input (under results/)                        | per                  | table columns                  |
| --------------------------------------------- | -------------------- | ------------------------------ |
| eval/{run}/{task}.json                        | run x task (+ base)  | J, J_se, dJ, dJ_se, eval_...   |
| eval/{run}/{task}.kl.json                     | run x task           | kl_k1, kl_k1_se, kl_k3, ...    |
| train/{precision}/seed{seed}/metrics.jsonl    | trained run          | train_* summaries; curves      |
| train/{precision}/seed{seed}/run.json         | trained run          | train_wall_s, train_steps,     |
|                                               |                      | diverged, health_reasons,      |
|                                               |                      | representable_update_*         |
| sparsity/{precision}/seed{seed}.summary.json  | trained run          | changed_frac_eta_*, equal_*    |
| sparsity/{precision}/overlap.parquet          | precision x seed pair| overlap.parquet (as is)        |

Outputs:

- ``metrics.parquet``: one row per run x task (``METRIC_COLUMNS`` + one ``changed_frac_eta_{label}`` per
  eta), the input of ``stats.analyze``. The base row is kept: precision and seed null, dJ = 0 (the base
  is its own reference; stats ignores base rows), training and sparsity columns null. ``role`` comes from
  the config (``data.tasks[task].role``), not from the eval file, so re-labelling a task needs no rerun
  of evaluation. Run-level columns (train_*, sparsity) repeat on every task row of the run.
- ``training_curves.parquet``: one row per run x optimizer step, ``CURVE_COLUMNS`` (rollout statistics
  are carried forward between generation rounds; ``generation_step`` marks the fresh ones; KL is null
  except every ``kl_every`` steps). The sampler-trainer gap per round: ``sampler_gap_*`` scalars and the
  gap by position, one column per log2 bin (``sampler_gap_pos_<k>``, ``metrics_log.GAP_POSITION_KEYS``).
- ``sparsity.parquet``: one row per run x scope (model / module / layer) x group x eta: changed_fraction,
  equal_bf16_fraction, equal_stored_fraction, numel, n_tensors; plus, per run and module type, the
  representable-update fraction (scope ``representable``, eta null) from run.json.
- ``overlap.parquet``: the overlap rule's cross-seed Jaccard tables of every precision, concatenated.

Repeats (config ``repeats``, runs ``<precision>-s<seed>-r<k>``: the numerical noise floor) get rows of
their own with ``repeat`` k (1 for every first run, null for base rows; run.json's ``repeat`` names their
training files); they have no sparsity summaries. Training columns include the sampler-trainer gap
(``sampler_gap_*`` incl. kl_k1, kl_k3, log_ppl_abs_diff, growth; ``vllm_logp_diff_mean``:
``metrics_log.gap_summary``, means over rounds) and, for fp16 arms, the final loss scale and the skipped
steps (``metrics_log.scaler_summary``).

Base runs are ``base`` and ``base-<dtype>`` (``paths.parse_run``); a trained run's dJ and KL are relative
to the base of its arm's param dtype, named by the eval file's ``reference_run`` (else by ``references``,
the rule's ``paths.reference_run`` per precision), and ``base_J`` is that base's pass@1. run.json's
``health`` gives ``diverged`` (true/false; null for results written before the health record, with a
warning) and ``representable_update`` the fraction of weights a step of size lr can change in the arm's
param dtype (null, with a warning, when absent).

Missing pieces degrade to nulls with a logged warning (a run without KL, a summary without an eta); a
malformed input (bad JSON, a missing required key, a duplicate run x task) raises ``AggregateError``
naming the file, because a silently wrong table would reach the verdicts.
"""

from workflow_scripts.runtime import startup  # noqa: F401  first: no garbage collection during imports

# isort: split

import argparse
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from workflow_scripts.runtime import paths
from workflow_scripts.runtime.atomic import write_parquet
from workflow_scripts.runtime.smk import main_from, parse_pairs

log = logging.getLogger("aggregate")


# the tables' columns, train_summary and AggregateError stay readable here (tests/test_aggregate.py)
from workflow_scripts.measures.aggregate_inputs import (  # noqa: E402,F401
    CURVE_COLUMNS,
    METRIC_COLUMNS,
    SPARSITY_TABLE_COLUMNS,
    AggregateError,
    train_summary,
)
from workflow_scripts.measures.aggregate_join import aggregate  # noqa: E402


def run(
    *,
    evals: Sequence[str | os.PathLike],
    kls: Sequence[str | os.PathLike],
    train_metrics: Sequence[str | os.PathLike],
    train_runs: Sequence[str | os.PathLike],
    sparsity: Sequence[str | os.PathLike],
    overlap: Sequence[str | os.PathLike],
    roles: Mapping[str, str],
    precisions: Sequence[str],
    references: Mapping[str, str],
    out_metrics: str | os.PathLike,
    out_curves: str | os.PathLike,
    out_sparsity: str | os.PathLike,
    out_overlap: str | os.PathLike,
) -> list[str]:
    """The aggregate stage: read every upstream output, write the four tables; returns the warnings."""
    if len(train_metrics) != len(train_runs):
        raise AggregateError("train metrics and run.json files must pair up (same length and order)")
    metrics, curves, sparse, warnings, overlap_table = aggregate(
        evals,
        kls,
        list(zip(train_metrics, train_runs, strict=True)),
        sparsity,
        roles,
        precisions,
        overlap,
        references,
    )
    write_parquet(out_metrics, metrics)
    write_parquet(out_curves, curves)
    write_parquet(out_sparsity, sparse)
    write_parquet(out_overlap, overlap_table)
    print(
        f"aggregate: {len(metrics)} run x task rows, {len(curves)} training steps, {len(sparse)} sparsity "
        f"rows, {len(overlap_table)} overlap rows -> {out_metrics}",
        file=sys.stderr,
    )
    return warnings


def from_snakemake(smk: Any) -> None:
    inp, out = smk.input, smk.output
    run(
        evals=list(inp.evals),
        kls=list(inp.kls),
        train_metrics=list(inp.train_metrics),
        train_runs=list(inp.train_runs),
        sparsity=list(inp.sparsity),
        overlap=list(inp.overlap),
        roles=dict(smk.params.roles),
        precisions=list(smk.params.precisions),
        references=dict(smk.params.references),
        out_metrics=out.metrics,
        out_curves=out.curves,
        out_sparsity=out.sparsity,
        out_overlap=out.overlap,
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m workflow_scripts.aggregate",
        description="Join evaluation, KL, training and sparsity outputs into tidy tables.",
    )
    p.add_argument("--eval", nargs="+", required=True, help="results/eval/{run}/{task}.json files")
    p.add_argument("--kl", nargs="*", default=[], help="results/eval/{run}/{task}.kl.json files")
    p.add_argument(
        "--train-metrics", nargs="*", default=[], help="train/{precision}/seed{seed}/metrics.jsonl"
    )
    p.add_argument("--train-runs", nargs="*", default=[], help="the matching run.json files, same order")
    p.add_argument("--sparsity", nargs="*", default=[], help="sparsity/{precision}/seed{seed}.summary.json")
    p.add_argument("--overlap", nargs="*", default=[], help="sparsity/{precision}/overlap.parquet")
    p.add_argument(
        "--roles", nargs="+", required=True, metavar="TASK=ROLE", help="task roles from the config"
    )
    p.add_argument("--precisions", nargs="*", default=[], help="precision order (reference first)")
    p.add_argument(
        "--references",
        nargs="*",
        default=[],
        metavar="PRECISION=BASE_RUN",
        help="base run of each arm (used when an eval file lacks reference_run)",
    )
    analysis = paths.analysis_dir()
    p.add_argument("--out", default=str(analysis / "metrics.parquet"), help="metrics.parquet")
    p.add_argument(
        "--curves", default=str(analysis / "training_curves.parquet"), help="training_curves.parquet"
    )
    p.add_argument("--sparsity-out", default=str(analysis / "sparsity.parquet"), help="sparsity.parquet")
    p.add_argument("--overlap-out", default=str(analysis / "overlap.parquet"), help="overlap.parquet")
    args = p.parse_args(argv)
    try:
        roles, refs = parse_pairs(args.roles, "TASK=ROLE"), parse_pairs(args.references, "PRECISION=BASE_RUN")
    except ValueError as err:
        raise SystemExit(f"aggregate: {err}") from None
    run(
        evals=args.eval,
        kls=args.kl,
        train_metrics=args.train_metrics,
        train_runs=args.train_runs,
        sparsity=args.sparsity,
        overlap=args.overlap,
        roles=roles,
        precisions=args.precisions,
        references=refs,
        out_metrics=args.out,
        out_curves=args.curves,
        out_sparsity=args.sparsity_out,
        out_overlap=args.overlap_out,
    )
    return 0


if __name__ == "__main__":
    main_from(globals())
