# Everything that is not a rule: config validation, wildcard constraints, input functions.
import sys

from snakemake.exceptions import WorkflowError

from workflow_scripts.config import ConfigError, run_names, validate_config

try:
    validate_config(config, source=(workflow.configfiles or ["config"])[-1])
except ConfigError as err:
    raise WorkflowError(str(err)) from None

RESULTS = "results"
TASKS = list(config["data"]["tasks"])
PRECISIONS = list(config["precisions"])
SEEDS = list(config["seeds"])
RUNS = run_names(config)


wildcard_constraints:
    precision="|".join(PRECISIONS),
    seed=r"\d+",
    task="|".join(TASKS),
    run="|".join(RUNS),


def data_outputs():
    return {
        "train": f"{RESULTS}/data/train.jsonl",
        "sft": f"{RESULTS}/data/sft.jsonl",
        "summary": f"{RESULTS}/data/prepare.json",
        "evals": expand(f"{RESULTS}/data/eval/{{task}}.jsonl", task=TASKS),
    }


def all_targets():
    targets = [f"{RESULTS}/models/base.json"]
    targets += expand(f"{RESULTS}/train/{{precision}}/seed{{seed}}/run.json", precision=PRECISIONS, seed=SEEDS)
    targets += expand(f"{RESULTS}/eval/{{run}}/{{task}}.json", run=RUNS, task=TASKS)
    targets += expand(f"{RESULTS}/eval/{{run}}/{{task}}.kl.json", run=RUNS, task=TASKS)
    targets += expand(f"{RESULTS}/sparsity/{{precision}}/seed{{seed}}.parquet", precision=PRECISIONS, seed=SEEDS)
    targets += expand(f"{RESULTS}/sparsity/{{precision}}/overlap.parquet", precision=PRECISIONS)
    targets += [f"{RESULTS}/analysis/stats.json", f"{RESULTS}/analysis/report.md"]
    return targets


# ------------------------------------------------------------------ evaluate / kl (rules/evaluate.smk)


def get_model_dir(wildcards):
    """The model folder of run wildcards.run (the same mapping as evaluate.run_model_dir)."""
    from workflow_scripts.config import parse_run

    parsed = parse_run(wildcards.run)
    if parsed is None:
        return f"{RESULTS}/models/base"
    precision, seed = parsed
    return f"{RESULTS}/train/{precision}/seed{seed}/model"


def evaluate_inputs(wildcards):
    """Model, eval data and (for a non-base run) the base samples of the same task, for paired dJ."""
    inputs = {"model": get_model_dir(wildcards), "data": f"{RESULTS}/data/eval/{wildcards.task}.jsonl"}
    if wildcards.run != "base":
        inputs["base_samples"] = f"{RESULTS}/eval/base/{wildcards.task}.samples.parquet"
    return inputs
