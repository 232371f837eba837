"""Snakemake adapter for workflow_scripts.train (logic and tests live there).

The run sees only what the rule's params carry (the train section, this precision mode, the base
model's dtype/trust flags), so a setting outside them can never change training silently.
"""

from pathlib import Path

from workflow_scripts.gpu_slots import gpu_slot
from workflow_scripts.smk import rule_logging
from workflow_scripts.train import train_run

snakemake = globals()["snakemake"]
with rule_logging(snakemake.log[0]), gpu_slot(snakemake.resources.get("gpu", 0)):
    precision = snakemake.wildcards.precision
    config = {
        "train": dict(snakemake.params.train),
        "precisions": {precision: dict(snakemake.params.precision)},
        "model": dict(snakemake.params.model),
    }
    train_run(
        config,
        precision,
        int(snakemake.wildcards.seed),
        Path(snakemake.input.train).parent,
        Path(snakemake.input.base),
        Path(snakemake.output.run).parent,
        Path(snakemake.params.checkpoints),
        threads=snakemake.threads,
    )
