"""Snakemake adapter for workflow_scripts.sparsity (logic and tests live there)."""

from workflow_scripts import sparsity
from workflow_scripts.smk import rule_logging

snakemake = globals()["snakemake"]
with rule_logging(snakemake.log[0]):
    argv = ["--base", snakemake.input.base, "--final", snakemake.input.final,
            "--out", snakemake.output.table, "--summary", snakemake.output.summary,
            "--precision", snakemake.wildcards.precision, "--seed", snakemake.wildcards.seed,
            "--threads", str(snakemake.threads), "--cast-base-to-final",
            "--etas", *map(str, snakemake.params.etas)]  # fmt: skip
    sparsity.main(argv)
