# fetch_dataset / fetch_model: what the config reads from the Hugging Face hub (hub datasets without a
# `path`, a hub model id), copied into results/hub/ by LOCAL rules: under the SLURM profile they run in the
# Snakemake process on the login node, where the network is. Every other job runs with HF_HUB_OFFLINE=1
# (rules/common.smk) and reads these copies (workflow_scripts/runtime/hub_copies.py).
import re


wildcard_constraints:
    dataset="|".join(HUB_DATASETS) or "^$",  # "^$": no job can match
    model=re.escape(hub_copies.model_copy(HUB_MODEL).name) if HUB_MODEL else "^$",


rule fetch_dataset:
    output:
        dataset=str(hub_copies.dataset_copy("{dataset}")),
    params:
        code=code("fetch"),
    log:
        "logs/fetch/{dataset}.log",
    benchmark:
        "benchmarks/fetch/{dataset}.tsv"
    localrule: True
    conda:
        "../envs/core.yaml"
    threads: job_threads("fetch_dataset")
    resources:
        **job_resources("fetch_dataset"),
    script:
        "../workflow_scripts/fetch.py"


rule fetch_model:
    output:
        model=directory(str(hub_copies.model_copy("{model}"))),
    params:
        source=HUB_MODEL,
        code=code("fetch"),
    log:
        "logs/fetch/{model}.log",
    benchmark:
        "benchmarks/fetch/{model}.tsv"
    localrule: True
    conda:
        "../envs/core.yaml"
    threads: job_threads("fetch_model")
    resources:
        **job_resources("fetch_model"),
    script:
        "../workflow_scripts/fetch.py"
