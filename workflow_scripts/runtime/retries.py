"""How many SLURM attempts each long job needs when its estimate is longer than its partition's time limit.

A job that runs past its ``--time`` is killed by SLURM; Snakemake resubmits it (``retries``) and it resumes
where it stopped: train from its newest checkpoint (results/checkpoints/), evaluate per task
(results/resume/evaluate/<run>/), base_model per chunk of 64 prompts. So a 150 h run on a 48 h partition
finishes in 4 attempts if the rule's ``retries`` allows them. This module works out, per rule, the plan:

| quantity         | train                                  | evaluate / base_model                       |
|------------------|----------------------------------------|---------------------------------------------|
| estimate (min)   | resources.train.estimate_min, else the | resources.<rule>.runtime_min, else the      |
|                  | cluster plan's slow end (GPU job: the  | estimate of resources.py from the eval data |
|                  | slowest arm's), else runtime_min       | (before it exists: cluster_plan's counts)   |
| limit (min)      | the highest max_runtime of the partitions the job can go to (partitions.yaml;  |
|                  | GPU job: max_gpu >= its GPUs, CPU job: no GPUs), or runtime_min where lower    |
| lost per attempt | startup_min + one checkpoint interval  | EVAL_STARTUP_MIN + one task / chunk         |
|                  | (estimate x checkpoint_every/max_steps)|                                             |
| attempts         | 1 if estimate <= limit, else 1 + ceil((estimate - limit) / (limit - lost))    |
| rule retries     | attempts - 1 + the profile's ``retries`` (kept for failures that are not the  |
|                  | time limit); unknown estimate or no limit: the profile's ``retries``           |

Each attempt asks ``min(minutes x attempt, limit)`` (``resources.snakemake_resources``), so an attempt never
asks for more than a partition gives (the plugin would find no partition for it).

Where the limits come from: Snakemake hands a workflow neither its profile nor the executor's settings
while the Snakefile is read, so ``slurm_profile`` reads the command line (``--profile`` or
``$SNAKEMAKE_PROFILE``, ``--executor``/``-e``, ``--slurm-partition-config``, ``--retries``) and the
profile's config.yaml, as Snakemake and snakemake-executor-plugin-slurm do. Only a run whose executor is
``slurm`` gets limits; a local run and the job step on a compute node get none (no cap, the profile's
retries). ``python -m workflow_scripts.runtime.retries --configfile X --profile profiles/slurm`` prints
the plan without Snakemake; a ``snakemake --profile profiles/slurm`` run (and its dry run) prints it too.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from workflow_scripts.runtime import cluster_plan, paths
from workflow_scripts.runtime.resources import (
    EVAL_MARGIN,
    EVAL_STARTUP_MIN,
    base_model_minutes,
    evaluate_minutes,
    rule_resources,
)

BASE_MODEL_CHUNK = 64  # base_model.HEADROOM_CHUNK (a torch module): prompts between two resume points
PROFILE_FILES = ("config.yaml", "profile.yaml")


@dataclass(frozen=True)
class SlurmProfile:
    """What a SLURM run's profile says about time: partitions' max_runtime (minutes, None = no limit),
    their GPUs per node, and the profile's ``retries``."""

    partitions: Mapping[str, tuple[int, float | None]]  # name -> (max_gpu, max_runtime)
    retries: int = 0

    def limit(self, gpus: int) -> int | None:
        """Minutes one attempt of a job with ``gpus`` GPUs may run: the highest max_runtime among the
        partitions it can go to (GPU job: max_gpu >= gpus; CPU job: partitions without GPUs, or all if
        none); None where one of them has no limit."""
        fits = [rt for g, rt in self.partitions.values() if (g >= gpus if gpus else g == 0)]
        if not fits and not gpus:
            fits = [rt for _, rt in self.partitions.values()]
        if not fits or any(rt is None for rt in fits):
            return None
        return int(max(fits))


@dataclass(frozen=True)
class Plan:
    """One rule's attempts: ``estimate`` (minutes uninterrupted, None = not known yet), ``limit`` (one
    attempt's minutes, None = no limit), ``lost`` (minutes an attempt redoes after a kill)."""

    rule: str
    estimate: float | None
    limit: int | None
    lost: float

    @property
    def attempts(self) -> int | None:
        """Attempts needed; None when the estimate is unknown or no attempt can progress (``problem``)."""
        if self.estimate is None or self.problem:
            return None
        return attempts_needed(self.estimate, self.limit, self.lost)

    @property
    def problem(self) -> str | None:
        """Why resubmitting cannot finish the job (an attempt shorter than what each one redoes), or None."""
        try:
            if self.estimate is not None:
                attempts_needed(self.estimate, self.limit, self.lost)
        except ValueError as err:
            return f"{self.rule}: {err}; it gets the profile's retries only"
        return None


def attempts_needed(estimate: float, limit: float | None, lost: float) -> int:
    """Attempts of ``limit`` minutes that finish ``estimate`` minutes of work when every attempt after a
    kill redoes ``lost`` minutes (start-up plus the work since the last resume point)."""
    if limit is None or estimate <= limit:
        return 1
    if limit <= lost:
        raise ValueError(
            f"a {limit}-minute attempt cannot progress: its start-up and one checkpoint interval "
            f"take {lost:g} min"
        )
    return 1 + math.ceil((estimate - limit) / (limit - lost))


def rule_retries(plan: Plan, profile: SlurmProfile | None) -> int | None:
    """The rule's ``retries:``: the attempts its plan needs beyond the first, plus the profile's retries
    (for failures that are not the time limit); None (the profile's) without a limit or an estimate."""
    if profile is None or plan.limit is None or plan.attempts is None:
        return None
    return plan.attempts - 1 + profile.retries


# ----------------------------------------------------------------------------------- the plans


def _problems(files: Sequence[Path]) -> dict[str, int] | None:
    """Problems per task (lines of its eval file); None while one of the files does not exist yet."""
    counts = {}
    for file in files:
        try:
            with open(file, encoding="utf-8") as fh:
                counts[Path(file).stem] = sum(1 for line in fh if line.strip())
        except FileNotFoundError:
            return None
    return counts


def _shorter(limit: int | None, runtime_min: int | None) -> int | None:
    """One attempt's minutes for the plan: the partition's limit or the config's runtime_min, the lower
    (an attempt asks runtime_min x attempt: counting runtime_min alone errs on the side of more retries)."""
    given = [m for m in (limit, runtime_min) if m]
    return min(given) if given else None


def train_plan(config: Mapping, limit: int | None) -> Plan:
    """A train job: its estimate is ``resources.train.estimate_min`` (a pilot's measurement), else for a GPU
    job the cluster plan's slow end for the slowest arm (``cluster_plan.train_hours``), else runtime_min.
    A kill loses the start-up and at most one checkpoint interval (checkpoint_every of max_steps; the
    trainer rounds it up to whole generation rounds)."""
    res, train = config["resources"]["train"], config["train"]
    estimate = res.get("estimate_min")
    if not estimate and rule_resources(config, "train")["gpus"] > 0:
        estimate = math.ceil(
            60 * max(cluster_plan.train_hours(config, arm)[1] for arm in config["precisions"])
        )
    estimate = estimate or res.get("runtime_min")
    interval = (estimate or 0) * min(1.0, train["checkpoint_every"] / train["max_steps"])
    return Plan("train", estimate, _shorter(limit, res.get("runtime_min")), res["startup_min"] + interval)


def _task_problems(config: Mapping, results: str | os.PathLike) -> dict[str, int]:
    """Problems per task: the prepared eval files' lines, before they exist the cluster plan's counts
    (a public set's size, a synthetic task's n)."""
    return _problems([paths.eval_data(t, results) for t in config["data"]["tasks"]]) or (
        cluster_plan.task_problems(config)
    )


def evaluate_plan(config: Mapping, limit: int | None, results: str | os.PathLike = paths.RESULTS) -> Plan:
    """The largest evaluate job: every task of a run (eval.jobs per_run) or the largest task (per_task),
    by ``resources.evaluate_minutes`` (a CPU job without runtime_min: not estimated); a killed attempt
    redoes at most its largest task."""
    minutes = (config["resources"].get("evaluate") or {}).get("runtime_min")
    limit = _shorter(limit, minutes)
    problems = _task_problems(config, results)
    task_minutes = {t: evaluate_minutes(config, {t: n}) for t, n in problems.items()}
    if minutes or rule_resources(config, "evaluate")["gpus"] == 0:
        estimate = minutes
    elif config["eval"]["jobs"] == "per_run":
        estimate = evaluate_minutes(config, problems)
    else:
        estimate = max(task_minutes.values())
    return Plan("evaluate", estimate, limit, EVAL_STARTUP_MIN + max(task_minutes.values()))


def base_model_plan(config: Mapping, limit: int | None, results: str | os.PathLike = paths.RESULTS) -> Plan:
    """A loaded model's scoring (``resources.base_model_minutes``; a tiny model is built in minutes: one
    attempt); a kill redoes one chunk of prompts."""
    minutes = (config["resources"].get("base_model") or {}).get("runtime_min")
    limit = _shorter(limit, minutes)
    if config["model"]["source"] == "tiny":
        return Plan("base_model", minutes, limit, EVAL_STARTUP_MIN)
    on_task = next(t for t, spec in config["data"]["tasks"].items() if spec["role"] == "on_task")
    n = _task_problems(config, results)[on_task]
    estimate = minutes or base_model_minutes(config, n)
    chunk = base_model_minutes(config, min(n, BASE_MODEL_CHUNK)) - EVAL_STARTUP_MIN * EVAL_MARGIN
    return Plan("base_model", estimate, limit, EVAL_STARTUP_MIN + max(0, chunk))


def plans(
    config: Mapping, profile: SlurmProfile | None, results: str | os.PathLike = paths.RESULTS
) -> list[Plan]:
    """The plan of every long rule under ``profile``'s partition limits (none without a profile)."""

    def limit(rule: str) -> int | None:
        return profile.limit(rule_resources(config, rule)["gpus"]) if profile else None

    return [
        train_plan(config, limit("train")),
        evaluate_plan(config, limit("evaluate"), results),
        base_model_plan(config, limit("base_model"), results),
    ]


def table(plans_: Sequence[Plan], profile: SlurmProfile | None) -> str:
    """The plan as text: per rule its estimate, one attempt's limit, the attempts it needs and retries."""

    def minutes(value) -> str:
        return "-" if value is None else f"{value:g} min ({value / 60:.1f} h)"

    lines = [
        "SLURM attempts (workflow_scripts/runtime/retries.py): a job longer than its partition's limit is "
        "killed and resubmitted, and resumes",
        f"{'rule':<11} {'estimate':>20} {'limit/attempt':>20} {'lost/attempt':>13} {'attempts':>8} "
        f"{'retries':>11}",
    ]
    for plan in plans_:
        attempts = ("never" if plan.problem else "?") if plan.attempts is None else str(plan.attempts)
        retries = rule_retries(plan, profile)
        shown = f"{profile.retries if profile else 0} (profile)" if retries is None else str(retries)
        estimate = minutes(plan.estimate) if plan.estimate is not None else "not estimated"
        lost = f"{plan.lost:.0f} min"
        lines.append(
            f"{plan.rule:<11} {estimate:>20} {minutes(plan.limit):>20} {lost:>13} {attempts:>8} {shown:>11}"
        )
    lines += [f"warning: {plan.problem}" for plan in plans_ if plan.problem]
    return "\n".join(lines)


# ------------------------------------------------------------------------ the profile in use


def parse_minutes(value) -> float | None:
    """A partitions.yaml max_runtime in minutes: a number, or SLURM's forms (MM, MM:SS, HH:MM:SS, D-HH,
    D-HH:MM, D-HH:MM:SS);
    None for no limit (absent, "infinite", "UNLIMITED")."""
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return None if math.isinf(value) else float(value)
    text = str(value).strip().lower()
    if text in ("", "inf", "infinite", "unlimited"):
        return None
    days, dash, clock = text.partition("-") if "-" in text else ("0", "", text)
    parts = [float(p) for p in clock.split(":")]
    if dash:  # days-hours[:minutes[:seconds]]
        hours, minutes, seconds = [*parts, 0.0, 0.0][:3]
    elif len(parts) == 3:  # hours:minutes:seconds
        hours, minutes, seconds = parts
    else:  # minutes[:seconds]
        hours, (minutes, seconds) = 0.0, [*parts, 0.0][:2]
    return float(days) * 1440 + hours * 60 + minutes + seconds / 60


def _option(argv: Sequence[str], *names: str) -> str | None:
    """The last value given to one of ``names`` (``--name value`` or ``--name=value``)."""
    found = None
    for i, arg in enumerate(argv):
        for name in names:
            if arg == name and i + 1 < len(argv):
                found = argv[i + 1]
            elif arg.startswith(name + "="):
                found = arg.split("=", 1)[1]
    return found


def _profile_file(profile: str) -> Path | None:
    """The profile's config file, as Snakemake finds it (a path, else a name under the working directory)."""
    folder = Path(profile)
    if folder.is_file():
        return folder
    for name in PROFILE_FILES:
        if (folder / name).is_file():
            return folder / name
    return None


def slurm_profile(
    argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None
) -> SlurmProfile | None:
    """The SLURM profile of this Snakemake invocation, or None when its executor is not ``slurm``."""
    argv = list(sys.argv if argv is None else argv)
    environ = os.environ if environ is None else environ
    profile = _option(argv, "--profile") or environ.get("SNAKEMAKE_PROFILE")
    settings: dict = {}
    folder = Path(".")
    if profile and (file := _profile_file(profile)):
        settings = yaml.safe_load(file.read_text(encoding="utf-8")) or {}
        folder = file.parent
    executor = _option(argv, "--executor", "-e") or settings.get("executor")
    if executor != "slurm":
        return None
    given = _option(argv, "--slurm-partition-config")
    partition_file = (
        given or settings.get("slurm-partition-config") or environ.get("SNAKEMAKE_SLURM_PARTITIONS")
    )
    partitions: dict[str, tuple[int, float | None]] = {}
    if partition_file:
        path = Path(partition_file)
        if not given and not path.is_absolute() and (folder / path).exists():
            path = folder / path  # a profile's relative path: beside the profile's config.yaml
        entries = (yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("partitions") or {}
        for name, limits in entries.items():
            limits = limits or {}
            partitions[name] = (int(limits.get("max_gpu", 0)), parse_minutes(limits.get("max_runtime")))
    retries = _option(argv, "--retries", "--restart-times", "-T") or settings.get("retries", 0)
    return SlurmProfile(partitions, int(retries))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configfile", default="config.yaml", help="the experiment's config file")
    parser.add_argument("--profile", default="profiles/slurm", help="the SLURM profile (its partitions.yaml)")
    parser.add_argument("--results", default=paths.RESULTS, help="where the eval data are, once prepared")
    args = parser.parse_args(argv)
    from workflow_scripts.runtime.config import load_config

    config = load_config(args.configfile, check_files=False)
    profile = slurm_profile(["--profile", args.profile], environ={})
    if profile is None:
        parser.error(f"{args.profile}: not a SLURM profile (its executor is not slurm)")
    print(f"{args.configfile} under {args.profile}:")
    print(table(plans(config, profile, args.results), profile))


if __name__ == "__main__":
    main()
