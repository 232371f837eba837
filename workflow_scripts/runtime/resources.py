"""What each workflow job asks the scheduler for (GPUs, threads, memory), from config `resources:`.

One place turns the config's ``resources:`` section (schema: ``schemas/config.schema.yaml``) into the
``threads:`` and ``resources:`` of every rule (``rules/common.smk`` calls ``job_threads`` and
``snakemake_resources``), so no rule file holds a GPU count, and a local run (``--cores``,
``--resources gpu=N``, ``gpu_slots``) and a SLURM run (``profiles/slurm``) read the same numbers. Torch-free.

| config key (per rule)  | Snakemake                 | sbatch flag (snakemake-executor-plugin-slurm 2.8.0)  |
|------------------------|---------------------------|------------------------------------------------------|
| gpus                   | resources.gpu             | --gpus=N (none when 0)                               |
| cpus                   | threads (CPU cores of the | CPU job: --cpus-per-task=threads; GPU job:           |
|                        | whole job)                | --cpus-per-gpu=ceil(threads / gpus) (cpus_per_gpu)   |
| mem_mb                 | resources.mem_mb          | --mem=mem_mb (MB per node; the job has one node)     |
| runtime_min (train,    | resources.runtime =       | --time (null: the profile's default-resources)       |
| evaluate, base_model)  | min(runtime_min x attempt,|                                                      |
|                        | the partition's limit)    |                                                      |

The train job's threads are at least its training processes (``train.distributed.processes``, or one per
GPU when that is null): every process of a multi-process run needs a core of its own.

A GPU evaluate job without ``runtime_min`` gets an estimate (``evaluate_minutes``), made when the job is
submitted, from its tasks' problem counts (lines of its eval data files; before they exist, in a dry
run, the profile's 60 min): sampling tokens = problems x ``eval.n_samples`` x max_new_tokens x
EVAL_MEAN_LENGTH at ``resources.evaluate.tokens_per_s``, plus KL tokens = min(problems,
``eval.kl_prompts``) x ``eval.kl_samples`` x max_new_tokens x EVAL_MEAN_LENGTH at ``kl_tokens_per_s``
(the HF sampler and two teacher-forced models), plus EVAL_STARTUP_MIN, times EVAL_MARGIN. The rates are
assumptions, not measurements: set them from a run's own ``completions_per_s`` (its {task}.json timing),
or set ``runtime_min``, which always wins. A retried job resumes per task (``evaluate.run_tasks``).
A base_model job that loads a model (not ``tiny``) gets the same kind of estimate (``base_model_minutes``:
greedy plus pass@8 on the on-task set with the HF sampler), and a retry resumes per chunk of prompts.
A train job without ``runtime_min`` asks its estimate (``estimate_min``, else the cluster plan's).
Under a SLURM profile every runtime is capped at the ``limit`` of the partitions the job can go to
(``retries.py``: it also sets how many attempts the rule gets, so a run longer than the limit finishes
by resuming).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

from workflow_scripts.training.launch import resolve_processes

KEYS = ("gpus", "cpus", "mem_mb")
DEFAULT = "default"
EVAL_STARTUP_MIN = 10  # vLLM engine start (compile, CUDA graphs), policy and base loads
EVAL_MEAN_LENGTH = 0.5  # mean completion / max_new_tokens: most answers end in half the budget
EVAL_MARGIN = 1.5
EVAL_UNKNOWN_MIN = 60  # the eval data do not exist yet (a dry run): the SLURM profile's default


def rule_resources(config: Mapping, rule: str) -> dict[str, int]:
    """``{gpus, cpus, mem_mb}`` of one rule's job in a validated config (defaults already filled).

    ``resources.<rule>`` key by key, a key it leaves out (or a rule without an entry) from
    ``resources.default``. The schema fills the listed rules' own defaults, so only the other rules
    fall back to ``default``.
    """
    section = config["resources"]
    entry = section.get(rule) or {}
    return {key: int(entry.get(key, section[DEFAULT][key])) for key in KEYS}


def train_processes(config: Mapping) -> int:
    """Processes of one training run, by the train stage's own rule (``launch.resolve_processes``)."""
    return resolve_processes(config["train"].get("distributed"), rule_resources(config, "train")["gpus"])


def job_threads(config: Mapping, rule: str) -> int:
    """The rule's ``threads:``: its ``cpus``; for train at least one core per training process."""
    cpus = rule_resources(config, rule)["cpus"]
    if rule == "train":
        return max(cpus, train_processes(config))
    return cpus


def snakemake_resources(
    config: Mapping, rule: str, limit: int | None = None, estimate: int | None = None
) -> dict:
    """The rule's ``resources:``: ``gpu`` and ``mem_mb``, ``cpus_per_gpu`` on a GPU job, and ``runtime``
    where the config sets ``runtime_min`` or it is estimated (train: ``estimate``, the plan's,
    ``retries.train_plan``), each attempt's at most ``limit`` minutes (the partition's time limit,
    ``retries.SlurmProfile.limit``; None: no cap).

    ``cpus_per_gpu`` exists because the SLURM plugin sends ``--cpus-per-task=threads`` even for a GPU
    job unless it is set (snakemake_executor_plugin_slurm_jobstep.get_cpu_setting); rounding up keeps
    the job's cores >= its threads.
    """
    res = rule_resources(config, rule)
    out: dict = {"gpu": res["gpus"], "mem_mb": res["mem_mb"]}
    if res["gpus"] > 0:
        out["cpus_per_gpu"] = math.ceil(job_threads(config, rule) / res["gpus"])
    entry = config["resources"].get(rule) or {}
    minutes = entry.get("runtime_min") or (entry.get("estimate_min") or estimate if rule == "train" else None)
    if minutes:
        out["runtime"] = runtime(int(minutes), limit)
    elif rule == "evaluate" and res["gpus"] > 0:
        out["runtime"] = evaluate_runtime(config, limit)
    elif rule == "base_model" and config["model"]["source"] != "tiny":
        out["runtime"] = base_model_runtime(config, limit)
    elif limit is not None:
        out["runtime"] = runtime(EVAL_UNKNOWN_MIN, limit)
    return out


def capped(minutes: int, limit: int | None) -> int:
    """``minutes``, at most ``limit`` (None: no cap)."""
    return minutes if limit is None else min(minutes, limit)


def evaluate_minutes(config: Mapping, problems: Mapping[str, int]) -> int:
    """One attempt's minutes for an evaluate job of ``problems`` (task -> problem count; the module
    docstring gives the formula and its assumptions)."""
    ev, tasks, res = config["eval"], config["data"]["tasks"], config["resources"]["evaluate"]
    sample = kl = 0.0
    for task, n in problems.items():
        length = tasks[task]["max_new_tokens"] * EVAL_MEAN_LENGTH
        sample += n * ev["n_samples"] * length
        kl += min(n, ev["kl_prompts"]) * ev["kl_samples"] * length
    seconds = sample / res["tokens_per_s"] + kl / res["kl_tokens_per_s"]
    return math.ceil(EVAL_MARGIN * (EVAL_STARTUP_MIN + seconds / 60))


def evaluate_runtime(config: Mapping, limit: int | None = None):
    """The evaluate job's ``runtime`` resource: ``evaluate_minutes`` of its eval data files x attempt,
    at most ``limit``."""

    def per_attempt(wildcards, input, attempt: int) -> int:  # input: Snakemake passes it by this name
        files = [input.data] if isinstance(input.data, str) else list(input.data)
        try:
            problems = {}
            for file in files:
                with open(file, encoding="utf-8") as fh:
                    problems[Path(file).stem] = sum(1 for line in fh if line.strip())
        except FileNotFoundError:
            return capped(EVAL_UNKNOWN_MIN * attempt, limit)
        return capped(evaluate_minutes(config, problems) * attempt, limit)

    return per_attempt


def base_model_minutes(config: Mapping, problems: int, k: int = 8) -> int:
    """One attempt's minutes for base_model scoring a loaded model on ``problems`` on-task problems: greedy
    plus ``k`` samples each (base_model.headroom) of up to max_new_tokens x EVAL_MEAN_LENGTH tokens with
    the HF sampler, at ``resources.evaluate.kl_tokens_per_s`` (the schema's assumed HF sampling rate),
    plus EVAL_STARTUP_MIN, times EVAL_MARGIN. A killed attempt resumes per chunk of prompts."""
    on_task = next(t for t in config["data"]["tasks"].values() if t["role"] == "on_task")
    tokens = problems * (1 + k) * on_task["max_new_tokens"] * EVAL_MEAN_LENGTH
    seconds = tokens / config["resources"]["evaluate"]["kl_tokens_per_s"]
    return math.ceil(EVAL_MARGIN * (EVAL_STARTUP_MIN + seconds / 60))


def base_model_runtime(config: Mapping, limit: int | None = None):
    """The base_model job's ``runtime`` (a loaded model): ``base_model_minutes`` of its on-task eval file
    x attempt (before the file exists, in a dry run, the profile's 60 min x attempt), at most ``limit``."""

    def per_attempt(wildcards, input, attempt: int) -> int:  # input: Snakemake passes it by this name
        try:
            with open(input.on_task, encoding="utf-8") as fh:
                problems = sum(1 for line in fh if line.strip())
        except FileNotFoundError:
            return capped(EVAL_UNKNOWN_MIN * attempt, limit)
        return capped(base_model_minutes(config, problems) * attempt, limit)

    return per_attempt


def runtime(minutes: int, limit: int | None = None):
    """Snakemake's ``runtime`` resource: ``minutes`` per attempt, k x ``minutes`` for attempt k, at most
    ``limit``."""

    def per_attempt(wildcards, attempt: int) -> int:
        return capped(minutes * attempt, limit)

    return per_attempt
