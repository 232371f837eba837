"""Snakemake adapter for workflow_scripts.base_model (logic and tests live there)."""

from pathlib import Path

from workflow_scripts.base_model import build_base
from workflow_scripts.smk import rule_logging

snakemake = globals()["snakemake"]
with rule_logging(snakemake.log[0]):
    build_base(
        snakemake.config,
        Path(snakemake.input.sft).parent,
        Path(snakemake.output.model),
        Path(snakemake.output.record),
        threads=snakemake.threads,
    )
