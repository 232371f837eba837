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
    return targets
