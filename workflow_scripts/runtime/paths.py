"""Run names and the results/ layout: the one mapping from (stage, run, task) to a file.

Used by the rules (common.smk), the command lines and the stage modules, so a path or a run name is
spelled once. Every function takes plain strings, so ``train_dir("{precision}", "{seed}")`` is also the
Snakemake pattern of that folder.

Run names (folders under results/eval/):

| run | what | model folder |
| --- | --- | --- |
| ``base`` | the base model in ``model.dtype`` | ``results/models/base`` |
| ``base-<dtype>`` | the base loaded in an arm's ``param_dtype`` != model.dtype | ``results/models/base`` |
| ``<precision>-s<seed>`` | a trained run | ``results/train/<precision>/seed<seed>/model`` |
| ``<precision>-s<seed>-r<k>`` | repeat k >= 2 of it (config ``repeats``) | ``.../seed<seed>-r<k>/model`` |
| ``<arm>-s<seed>@step<k>`` | it at step k (``snapshots``) | ``.../seed<seed>/snapshots/step<k>`` |

A trained run is compared (dJ, KL) with the base run of its arm's param dtype (``reference_run``), so a
difference measures training, not the cast. A repeat (the numerical noise floor, ``noise_floor``) is the
same (precision, seed) trained again: its evaluation draws the eval streams of the run it repeats
(``stream_run``), so two repeats differ only where their numerics do. Config validation refuses task
and precision names that would collide with these names (``config.name_collisions``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

RESULTS = "results"
BASE = "base"
_TRAINED_RE = re.compile(r"^(?P<precision>.+)-s(?P<seed>\d+)(?:-r(?P<repeat>\d+))?(?:@step(?P<step>\d+))?$")
DTYPES = ("float32", "bfloat16", "float16")  # the schema's dtype enum
_BASE_RE = re.compile(rf"^{BASE}(?:-(?P<dtype>{'|'.join(DTYPES)}))?$")


# ------------------------------------------------------------------------------------------ run names


def _repeat_suffix(repeat: int | str) -> str:
    """No suffix for the first run of a (precision, seed), ``-r<k>`` for repeat k (or "{repeat}")."""
    return "" if str(repeat) == "1" else f"-r{repeat}"


def run_name(precision: str, seed: int | str, repeat: int | str = 1) -> str:
    """The run name of a trained model: ``run_name("bf16", 3) == "bf16-s3"``, repeat 2: ``"bf16-s3-r2"``."""
    return f"{precision}-s{seed}{_repeat_suffix(repeat)}"


def base_run(dtype: str | None = None, model_dtype: str | None = None) -> str:
    """``base`` (the base in model.dtype: ``dtype`` None or ``== model_dtype``) or ``base-<dtype>``."""
    return BASE if dtype is None or dtype == model_dtype else f"{BASE}-{dtype}"


@dataclass(frozen=True)
class Run:
    """A parsed run name: a base (``dtype`` None for model.dtype) or a trained (precision, seed)."""

    name: str
    precision: str | None = None
    seed: int | None = None
    dtype: str | None = None
    repeat: int | None = None  # trained runs: 1 for the first run of (precision, seed), k >= 2 for repeats
    step: int | None = (
        None  # a snapshot of the run at this optimizer step (config ``snapshots``); None: final
    )

    @property
    def is_base(self) -> bool:
        return self.precision is None


def parse_run(run: str) -> Run:
    """Inverse of the run naming: ``bf16-s3`` -> Run(precision="bf16", seed=3); ``base-bfloat16`` ->
    Run(dtype="bfloat16"). Base names win: config validation keeps precisions from looking like them."""
    base = _BASE_RE.match(run)
    if base:
        return Run(run, dtype=base["dtype"])
    trained = _TRAINED_RE.match(run)
    repeat = int(trained["repeat"]) if trained and trained["repeat"] is not None else 1
    if not trained or (repeat < 2 and trained["repeat"] is not None):
        raise ValueError(
            f"not a run name: {run!r} (expected base, base-<dtype>, <precision>-s<seed>, "
            "<precision>-s<seed>-r<k> with k >= 2, or <precision>-s<seed>@step<k>)"
        )
    step = int(trained["step"]) if trained["step"] is not None else None
    return Run(run, precision=trained["precision"], seed=int(trained["seed"]), repeat=repeat, step=step)


def snapshot_run(precision: str, seed: int | str, step: int | str) -> str:
    """The run name of a snapshot: ``snapshot_run("fp32", 3, 12) == "fp32-s3@step12"``."""
    return f"{run_name(precision, seed)}@step{step}"


def stream_run(run: str) -> str:
    """The run whose evaluation random streams ``run`` uses: a repeat uses those of the run it repeats, a
    snapshot those of its run (common random numbers along the run: its steps differ by training only)."""
    parsed = parse_run(run)
    return run if parsed.is_base else run_name(parsed.precision, parsed.seed)


def base_dtypes(config: Mapping) -> list[str]:
    """The param dtypes of the arms that differ from model.dtype, in arm order (one base run each)."""
    model_dtype = config["model"]["dtype"]
    dtypes: list[str] = []
    for mode in config["precisions"].values():
        dtype = mode["param_dtype"]
        if dtype != model_dtype and dtype not in dtypes:
            dtypes.append(dtype)
    return dtypes


def reference_run(config: Mapping, run: str) -> str:
    """The base run ``run`` is compared with: its arm's param dtype (a base run is its own reference)."""
    parsed = parse_run(run)
    if parsed.is_base:
        return run
    return base_run(config["precisions"][parsed.precision]["param_dtype"], config["model"]["dtype"])


def reference_spec(config: Mapping, run: str) -> dict:
    """How the evaluate job loads ``run`` and its reference: {reference_run, policy_dtype (None: as saved),
    reference_dtype (the base's dtype for KL; None: the policy's)} (H-fast, for rules/evaluate.smk)."""
    parsed = parse_run(run)
    if parsed.is_base:  # base (as saved) or base-<dtype> (a cast): its own reference
        return {"reference_run": run, "policy_dtype": parsed.dtype, "reference_dtype": parsed.dtype}
    arm_dtype = config["precisions"][parsed.precision]["param_dtype"]
    return {"reference_run": reference_run(config, run), "policy_dtype": None, "reference_dtype": arm_dtype}


def base_runs(config: Mapping) -> list[str]:
    return [base_run(), *(base_run(d) for d in base_dtypes(config))]


def arm_seeds(config: Mapping, precision: str) -> list[int]:
    """The seeds ``precision`` trains: its own ``seeds`` (e.g. a reference of 16), else config ``seeds``.

    Seed s of two arms shares the prompt order and the sampling seed, so the seeds two arms have in
    common are their pairs (the default: 1-8 of every arm; the reference's 9-16 are unpaired)."""
    own = (config["precisions"][precision] or {}).get("seeds")
    return list(own) if own else list(config["seeds"])


def run_precision(config: Mapping, precision: str) -> dict:
    """The arm's config entry as one run of it sees it: without ``seeds`` (which runs exist is not how a
    run trains), so adding a seed to an arm's list reruns only the new seed's jobs."""
    return {k: v for k, v in (config["precisions"][precision] or {}).items() if k != "seeds"}


def overlap_seeds(config: Mapping, precision: str) -> list[int]:
    """The seeds of the arm's overlap table: those among config ``seeds`` (the paired ones, the same
    number in every arm), else all its own; seed pairs grow as n^2, so a 16-seed reference would
    cost ~4x the others' overlap job for nothing the comparison uses."""
    own = arm_seeds(config, precision)
    return [s for s in own if s in config["seeds"]] or own


def snapshot_steps(config: Mapping, precision: str) -> list[int]:
    """The steps ``precision`` saves snapshots at (config ``snapshots.steps``): the reference arm (the
    first of precisions) only, the steps before the last."""
    steps = (config.get("snapshots") or {}).get("steps") or []
    if not steps or precision != next(iter(config["precisions"])):
        return []
    return sorted(int(s) for s in steps if int(s) < int(config["train"]["max_steps"]))


def snapshot_runs(config: Mapping) -> list[str]:
    """Every snapshot run (``<arm>-s<seed>@step<k>``): evaluated, but not in run_names (not a seed's
    final policy: the statistics read them apart, statistics/matched.py)."""
    return [
        snapshot_run(p, s, k)
        for p in config["precisions"]
        for s in arm_seeds(config, p)
        for k in snapshot_steps(config, p)
    ]


def trained_runs(config: Mapping) -> list[str]:
    return [run_name(p, s) for p in config["precisions"] for s in arm_seeds(config, p)]


def repeats(config: Mapping) -> list[tuple[str, int, int]]:
    """(precision, seed, repeat k >= 2) of every repeat run of config ``repeats`` (``copies`` each)."""
    return [
        (entry["precision"], int(entry["seed"]), k)
        for entry in config.get("repeats") or []
        for k in range(2, int(entry.get("copies", 1)) + 2)
    ]


def repeat_runs(config: Mapping) -> list[str]:
    return [run_name(p, s, k) for p, s, k in repeats(config)]


def run_names(config: Mapping) -> list[str]:
    """Every run the config evaluates: the base runs, one per (precision, seed), then the repeats."""
    return base_runs(config) + trained_runs(config) + repeat_runs(config)


eval_runs = run_names


# ------------------------------------------------------------------------------------------- layout


def _r(results: str | os.PathLike) -> Path:
    return Path(results)


def data_dir(results: str | os.PathLike = RESULTS) -> Path:
    return _r(results) / "data"


def eval_data(task: str, results: str | os.PathLike = RESULTS) -> Path:
    return data_dir(results) / "eval" / f"{task}.jsonl"


def curriculum_file(data: str | os.PathLike, phase: int) -> Path:
    """Phase ``phase``'s training prompts (``train.curriculum``) in the data folder ``data``."""
    return Path(data) / "curriculum" / f"phase{phase}.jsonl"


def curriculum_data(phase: int, results: str | os.PathLike = RESULTS) -> Path:
    return curriculum_file(data_dir(results), phase)


def base_model_dir(results: str | os.PathLike = RESULTS) -> Path:
    """The base model folder, saved in model.dtype; base-<dtype> runs load it in <dtype>."""
    return _r(results) / "models" / BASE


def base_record(results: str | os.PathLike = RESULTS) -> Path:
    return _r(results) / "models" / f"{BASE}.json"


def train_dir(
    precision: str, seed: int | str, results: str | os.PathLike = RESULTS, *, repeat: int | str = 1
) -> Path:
    """run.json, metrics.jsonl and model/ of one trained run (``seed<seed>-r<k>`` for repeat k)."""
    return _r(results) / "train" / precision / f"seed{seed}{_repeat_suffix(repeat)}"


def checkpoint_dir(
    precision: str, seed: int | str, results: str | os.PathLike = RESULTS, *, repeat: int | str = 1
) -> Path:
    """Outside the train outputs: Snakemake deletes outputs of a failed job, checkpoints must survive."""
    return _r(results) / "checkpoints" / precision / f"seed{seed}{_repeat_suffix(repeat)}"


def snapshot_dir(
    precision: str, seed: int | str, step: int | str, results: str | os.PathLike = RESULTS
) -> Path:
    """The policy of run (precision, seed) at optimizer step ``step`` (config ``snapshots``)."""
    return snapshot_in(train_dir(precision, seed, results), step)


def snapshot_in(run_dir: str | os.PathLike, step: int | str) -> Path:
    """The snapshot folder of step ``step`` in a trained run's folder ``run_dir``."""
    return Path(run_dir) / "snapshots" / f"step{step}"


def model_dir(run: str, results: str | os.PathLike = RESULTS) -> Path:
    """The model folder of a run name (see the table above)."""
    parsed = parse_run(run)
    if parsed.is_base:
        return base_model_dir(results)
    if parsed.step is not None:
        return snapshot_dir(parsed.precision, parsed.seed, parsed.step, results)
    return train_dir(parsed.precision, parsed.seed, results, repeat=parsed.repeat) / "model"


def eval_dir(run: str, results: str | os.PathLike = RESULTS) -> Path:
    return _r(results) / "eval" / run


def eval_resume_dir(run: str, results: str | os.PathLike = RESULTS) -> Path:
    """Outside the evaluate outputs: the finished tasks of a job that a retry must not redo."""
    return _r(results) / "resume" / "evaluate" / run


def eval_summary(run: str, task: str, results: str | os.PathLike = RESULTS) -> Path:
    return eval_dir(run, results) / f"{task}.json"


def eval_samples(run: str, task: str, results: str | os.PathLike = RESULTS) -> Path:
    return eval_dir(run, results) / f"{task}.samples.parquet"


def kl_summary(run: str, task: str, results: str | os.PathLike = RESULTS) -> Path:
    return eval_dir(run, results) / f"{task}.kl.json"


def sparsity_table(precision: str, seed: int | str, results: str | os.PathLike = RESULTS) -> Path:
    return _r(results) / "sparsity" / precision / f"seed{seed}.parquet"


def sparsity_summary(precision: str, seed: int | str, results: str | os.PathLike = RESULTS) -> Path:
    return _r(results) / "sparsity" / precision / f"seed{seed}.summary.json"


def overlap_table(precision: str, results: str | os.PathLike = RESULTS) -> Path:
    return _r(results) / "sparsity" / precision / "overlap.parquet"


def overlap_by_module(precision: str, results: str | os.PathLike = RESULTS) -> Path:
    return _r(results) / "sparsity" / precision / "overlap.by_module.parquet"


def analysis_dir(results: str | os.PathLike = RESULTS) -> Path:
    return _r(results) / "analysis"
