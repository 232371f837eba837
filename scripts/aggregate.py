"""Snakemake adapter for workflow_scripts.aggregate (logic and tests live there)."""

from workflow_scripts import aggregate
from workflow_scripts.smk import rule_logging

snakemake = globals()["snakemake"]
with rule_logging(snakemake.log[0]):
    inp, out = snakemake.input, snakemake.output
    argv = ["--eval", *inp.evals, "--kl", *inp.kls, "--train-metrics", *inp.train_metrics,
            "--train-runs", *inp.train_runs, "--sparsity", *inp.sparsity,
            "--roles", *(f"{t}={r}" for t, r in snakemake.params.roles.items()),
            "--precisions", *snakemake.params.precisions,
            "--out", out.metrics, "--curves", out.curves, "--sparsity-out", out.sparsity]  # fmt: skip
    aggregate.main(argv)
