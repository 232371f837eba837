"""Snakemake adapter for workflow_scripts.overlap (logic and tests live there)."""

from workflow_scripts import overlap
from workflow_scripts.smk import rule_logging

snakemake = globals()["snakemake"]
with rule_logging(snakemake.log[0]):
    argv = ["--base", snakemake.input.base, "--precision", snakemake.wildcards.precision,
            "--seeds", *map(str, snakemake.params.seeds), "--finals", *snakemake.input.finals,
            "--out", snakemake.output.table, "--by-module-out", snakemake.output.by_module,
            "--threads", str(snakemake.threads), "--cast-base-to-final",
            "--etas", *map(str, snakemake.params.etas)]  # fmt: skip
    overlap.main(argv)
