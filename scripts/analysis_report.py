"""Snakemake adapter: report.md from stats.json and the tidy table (workflow_scripts.report)."""

from workflow_scripts import report
from workflow_scripts.smk import rule_logging

snakemake = globals()["snakemake"]
with rule_logging(snakemake.log[0]):
    paths = dict(zip(snakemake.params.figures, snakemake.input.figures, strict=True))
    argv = ["markdown", "--stats", snakemake.input.stats, "--metrics", snakemake.input.metrics,
            "--out", snakemake.output.report, "--precisions", *snakemake.params.precisions,
            "--figure", *(f"{name}={path}" for name, path in paths.items())]  # fmt: skip
    report.main(argv)
