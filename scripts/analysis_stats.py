"""Snakemake adapter: stats.json = stats.analyze(metrics, config analysis) via workflow_scripts.report."""

import json

from workflow_scripts import report
from workflow_scripts.smk import rule_logging

snakemake = globals()["snakemake"]
with rule_logging(snakemake.log[0]):
    argv = ["stats", "--metrics", snakemake.input.metrics, "--out", snakemake.output.stats,
            "--config", json.dumps(dict(snakemake.params.analysis)),
            "--precisions", *snakemake.params.precisions]  # fmt: skip
    report.main(argv)
