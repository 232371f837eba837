"""Snakemake adapter for workflow_scripts.evaluate.evaluate_run (logic and tests live there)."""

from workflow_scripts.evaluate import evaluate_run
from workflow_scripts.gpu_slots import gpu_slot
from workflow_scripts.smk import rule_logging

snakemake = globals()["snakemake"]
with rule_logging(snakemake.log[0]), gpu_slot(snakemake.resources.get("gpu", 0)):
    evaluate_run(
        snakemake.input.model,
        snakemake.input.data,
        snakemake.output.samples,
        snakemake.output.summary,
        dict(snakemake.params.eval),
        dict(snakemake.params.task),
        snakemake.wildcards.run,
        snakemake.wildcards.task,
        base_samples=snakemake.input.get("base_samples"),
        threads=snakemake.threads,
        trust_remote_code=snakemake.params.trust_remote_code,
    )
