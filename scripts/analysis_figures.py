"""Snakemake adapter for workflow_scripts.figures (one PNG per named output; logic and tests there)."""

from workflow_scripts import figures
from workflow_scripts.smk import rule_logging

snakemake = globals()["snakemake"]
with rule_logging(snakemake.log[0]):
    inp = snakemake.input
    argv = ["--metrics", inp.metrics, "--curves", inp.curves, "--sparsity", inp.sparsity,
            "--stats", inp.stats,
            "--precisions", *snakemake.params.precisions,
            "--out", *(f"{name}={path}" for name, path in snakemake.output.items())]  # fmt: skip
    figures.main(argv)
