"""Snakemake adapter for workflow_scripts.evaluate.kl_run (logic and tests live there; estimator: kl.py)."""

from workflow_scripts.evaluate import kl_run
from workflow_scripts.gpu_slots import gpu_slot
from workflow_scripts.smk import rule_logging

snakemake = globals()["snakemake"]
with rule_logging(snakemake.log[0]), gpu_slot(snakemake.resources.get("gpu", 0)):
    kl_run(
        snakemake.input.model,
        snakemake.input.base,
        snakemake.input.data,
        snakemake.output.kl,
        dict(snakemake.params.eval),
        dict(snakemake.params.task),
        snakemake.wildcards.run,
        snakemake.wildcards.task,
        threads=snakemake.threads,
        trust_remote_code=snakemake.params.trust_remote_code,
    )
