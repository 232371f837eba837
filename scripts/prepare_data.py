"""Snakemake adapter for workflow_scripts.prepare_data (logic and tests live there)."""

from pathlib import Path

from workflow_scripts.prepare_data import prepare
from workflow_scripts.smk import rule_logging

snakemake = globals()["snakemake"]
with rule_logging(snakemake.log[0]):
    prepare(snakemake.params.data, Path(snakemake.output.train).parent)
