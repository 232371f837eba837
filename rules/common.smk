# Everything that is not a rule: the config (which file, validation), run names, wildcard
# constraints, code versions. Paths and run names come from workflow_scripts/runtime/paths.py, config rules
# from workflow_scripts/runtime/config.py; nothing here re-implements them.
import os
import re
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError

from workflow_scripts.runtime import eval_matmul, memory_plan, paths, shipped_base
from workflow_scripts.runtime import hub_copies, retries
from workflow_scripts.runtime.codehash import code_version
from workflow_scripts.runtime.config import ConfigError, workflow_config
from workflow_scripts.runtime.config_files import snakemake_sources
from workflow_scripts.runtime.resources import job_threads as _job_threads, rule_resources, snakemake_resources
from workflow_scripts.runtime.resources import train_processes
from workflow_scripts.training.curriculum import data_phases
from workflow_scripts.training.heldout_spec import HELDOUT_FILE, heldout_spec, without_heldout

# `--configfile X` means X alone: the Snakefile declares no `configfile:`, so config.yaml is read only
# when no --configfile is given (Snakemake would otherwise deep-merge X over config.yaml), or when X says
# `extends: config.yaml` (an experiment file). workflow_config rebuilds the config from the files (their
# `extends` chains followed) and the --config pairs; what Snakemake parsed is replaced by its result.
# The two come from Snakemake internals (no public API has them): `snakemake_sources` reads them, and
# tests/runtime/test_snakemake_sources.py fails if a Snakemake upgrade moves them.
try:
    _files, _overrides = snakemake_sources(workflow)
    _validated, CONFIG_SOURCE = workflow_config(config, _files, overrides=_overrides)
except ConfigError as err:
    raise WorkflowError(str(err)) from None
config.clear()
config.update(_validated)
# The GPU memory plan of a config whose train job has GPUs (a config that does not fit was refused above).
if _plan := memory_plan.table(config):
    print(_plan, file=sys.stderr)
# Inherited by every job (jobs copy this process's environment; Snakemake itself sets
# OMP_NUM_THREADS & co to the rule's threads). The OpenMP wait policy is left to each job
# (workflow_scripts/runtime/threads.py): passive, unless the job's threads cover every CPU it may use.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# No job reaches the Hugging Face hub (compute nodes often have no network): the local fetch rules
# (rules/fetch.smk) copy what the config reads from it first, under the HF_HUB_OFFLINE the run started with
# (kept in hub_copies.OFFLINE_ENV); a SLURM job inherits both and re-reads this file.
hub_copies.offline_jobs()

RESULTS = paths.RESULTS
TASKS = list(config["data"]["tasks"])
PRECISIONS = list(config["precisions"])
SEEDS = list(config["seeds"])
RUNS = paths.run_names(config)
# the reference's snapshots (config snapshots): evaluated on the off-task tasks, read by the matched
# comparison only (statistics/matched.py), never by aggregate
SNAPSHOT_STEPS = paths.snapshot_steps(config, PRECISIONS[0])
SNAPSHOT_RUNS = paths.snapshot_runs(config)
OFF_TASKS = [t for t, spec in config["data"]["tasks"].items() if spec["role"] == "off_task"]
REPEATS = paths.repeats(config)  # (precision, seed, repeat >= 2): config `repeats`, the noise floor


wildcard_constraints:
    precision="|".join(PRECISIONS),
    seed=r"\d+",
    task="|".join(TASKS),
    run="|".join(re.escape(r) for r in RUNS),  # snapshots: rule evaluate_snapshot's own constraint
    repeat=r"[2-9]|[1-9]\d+",


# The code each stage runs (its module and the package modules it imports): a rule passes
# `code=code(<stage>)` in params, so editing that code reruns the rule and what depends on it.
# A cosmetic edit (comments, docstrings, formatting) changes no hash; see docs/design.md, "The DAG and when
# a stage reruns".
CODE_ROOT = Path(workflow.basedir) / "workflow_scripts"


def code(stage):
    return code_version(stage, CODE_ROOT)


# -------------------------------------------- what each job asks for (config `resources:`, per rule)
# The rules' only source of threads, GPUs and memory (workflow_scripts/runtime/resources.py): no rule holds a
# count, and the SLURM profile adds only cluster matters (partition, runtime, one node).


# Under a SLURM profile (executor slurm; retries.slurm_profile reads its partitions.yaml) each job's runtime
# is capped at the max_runtime of the partitions it can go to, and the long rules (train, evaluate,
# base_model) get the retries their estimate needs to finish by resuming; the plan is printed (a dry run too).
# A train job without runtime_min asks its plan's estimate (estimate_min, else the cluster plan's) x attempt.
SLURM = retries.slurm_profile()
ATTEMPTS = {plan.rule: plan for plan in retries.plans(config, SLURM)}
RETRIES = {rule: retries.rule_retries(plan, SLURM) for rule, plan in ATTEMPTS.items()}
if SLURM:
    print(retries.table(list(ATTEMPTS.values()), SLURM), file=sys.stderr)


def job_threads(rule):
    return _job_threads(config, rule)


def job_resources(rule):
    """gpu, mem_mb (and cpus_per_gpu for a GPU job), runtime: `resources: **job_resources("<rule>")`."""
    limit = SLURM.limit(rule_resources(config, rule)["gpus"]) if SLURM else None
    return snakemake_resources(config, rule, limit, ATTEMPTS["train"].estimate if rule == "train" else None)


def job_retries(rule):
    """The rule's `retries:` under a SLURM profile (its plan's attempts - 1 + the profile's retries);
    None (the profile's retries) otherwise."""
    return RETRIES.get(rule)


# ------------------------------------------------------------------ data (rules/prepare_data.smk)

SYNTHETIC_SOURCES = ("train_val", "synthetic")
REAL_TASKS = [t for t, spec in config["data"]["tasks"].items() if spec["source"] not in SYNTHETIC_SOURCES]
CURRICULUM = data_phases(config["train"])  # train.curriculum's prompt sets (training/curriculum.py)
CURRICULUM_FILES = {f"phase{k}": str(paths.curriculum_data(k)) for k in range(len(CURRICULUM))}
ON_TASK = next(t for t, spec in config["data"]["tasks"].items() if spec["role"] == "on_task")
HUB_DATASETS = hub_copies.hub_datasets(config["data"], CURRICULUM)  # fetched by rules/fetch.smk
HUB_MODEL = hub_copies.hub_model(config["model"])  # a hub id, fetched by rules/fetch.smk; else None


def hub_inputs(entries):
    """The hub copies the data entries (tasks, data.train, phases) read: a prepare job's `hub` input."""
    return [str(hub_copies.dataset_copy(e["source"])) for e in entries
            if e.get("source") in HUB_DATASETS and not e.get("path")]  # fmt: skip


def prepare_eval_data(wildcards):
    """What one task's eval set depends on: its entry, data.seed, data.train for a train_val split."""
    data = config["data"]
    task = data["tasks"][wildcards.task]
    sub = {"seed": data["seed"], "tasks": {wildcards.task: task}}
    if task["source"] == "train_val":
        sub["train"] = data["train"]
    if wildcards.task in REAL_TASKS:
        sub["on_bad_row"] = data["on_bad_row"]
    return sub


def prepare_train_data():
    """The data section minus the synthetic tasks (which never collide with training data)."""
    data = config["data"]
    return {**data, "tasks": {t: data["tasks"][t] for t in REAL_TASKS}}


def train_outputs(name):
    """``name`` (run.json, metrics.jsonl) of every trained run: each (precision, seed), then the repeats."""
    dirs = [paths.train_dir(p, s) for p in PRECISIONS for s in paths.arm_seeds(config, p)]
    dirs += [paths.train_dir(p, s, repeat=k) for p, s, k in REPEATS]
    return [str(d / name) for d in dirs]


def all_targets():
    targets = [str(paths.base_record())]
    targets += train_outputs("run.json")
    targets += [str(paths.eval_summary(r, t)) for r in RUNS for t in TASKS]
    targets += [str(paths.kl_summary(r, t)) for r in RUNS for t in TASKS]
    targets += [str(paths.sparsity_table(p, s)) for p in PRECISIONS for s in paths.arm_seeds(config, p)]
    targets += [str(paths.overlap_table(p)) for p in PRECISIONS]
    targets += [str(paths.kl_summary(r, t)) for r in SNAPSHOT_RUNS for t in OFF_TASKS]
    targets += [str(paths.analysis_dir() / "stats.json"), str(paths.analysis_dir() / "report.md")]
    return targets


# ------------------------------------------------------------ base model (rules/base_model.smk)

SHIPPED_BASE = config["model"].get("shipped")


def base_model_inputs(wildcards):
    inputs = {"sft": rules.prepare_train.output.sft, "on_task": str(paths.eval_data(ON_TASK))}
    if HUB_MODEL:  # the hub model's copy (rules/fetch.smk): the job itself is offline
        inputs["hub_model"] = str(hub_copies.model_copy(HUB_MODEL))
    if SHIPPED_BASE:
        inputs["shipped"] = shipped_base.shipped_inputs(SHIPPED_BASE, workflow.basedir)
    return inputs



# ------------------------------------------------------------ evaluate (rules/evaluate.smk, H-fast's)


# The job's shape (config eval.jobs): one (run, task), or every task of a run.
EVAL_PER_RUN = config["eval"]["jobs"] == "per_run"
EVALUATE_JOB = "{run}" if EVAL_PER_RUN else "{run}/{task}"


def evaluate_outputs(path_of):
    """The evaluate job's files of one kind: {run}/{task} (per_task), or every task of {run} (per_run)."""
    if EVAL_PER_RUN:
        return [str(path_of("{run}", t)) for t in TASKS]
    return str(path_of("{run}", "{task}"))


def evaluate_task_names(wildcards):
    """The tasks of one evaluate job: its task (eval.jobs per_task), every task (per_run), or the off-task
    tasks of a snapshot (rule evaluate_snapshot)."""
    if "task" in wildcards.keys():
        return [wildcards.task]
    return OFF_TASKS if paths.parse_run(wildcards.run).step is not None else TASKS


def evaluate_inputs(wildcards):
    """Model, base model, the job's tasks' eval data and (for a trained run) its reference base run's
    samples of them (a list per key in a per_run job, in the order of evaluate_tasks)."""
    tasks = evaluate_task_names(wildcards)
    inputs = {
        "model": str(paths.model_dir(wildcards.run)),
        "base": str(paths.base_model_dir()),
        "data": [str(paths.eval_data(t)) for t in tasks],
    }
    reference = paths.reference_run(config, wildcards.run)
    if reference != wildcards.run:
        inputs["base_samples"] = [str(paths.eval_samples(reference, t)) for t in tasks]
    return inputs


def evaluate_reference(wildcards):
    """{reference_run, policy_dtype, reference_dtype} of the run."""
    return paths.reference_spec(config, wildcards.run)


def evaluate_matmul(wildcards):
    """The bf16_matmul of the run's training (a bf16 base run: its arms' shared one; eval_matmul.py)."""
    return eval_matmul.bf16_matmul(config, wildcards.run)


def evaluate_tasks(wildcards):
    """{task: its data.tasks entry} of the job's tasks, in job order."""
    return {t: config["data"]["tasks"][t] for t in evaluate_task_names(wildcards)}
