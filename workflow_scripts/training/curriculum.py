"""``train.curriculum``: training phases, each on its own prompt set for a number of optimizer steps.

The seed trainer this project grew from trains on an easier arithmetic set first so that early groups
carry signal; here a run can do the same: ``[{family: add_sub_small, steps: 24}, {source: train,
steps: 24}]`` trains 24 steps on small operands, then 24 on data.train's prompts. prepare_train writes
phase k's prompts to data/curriculum/phase{k}.jsonl (``paths.curriculum_data``); the trainer draws each
generation round's prompts from the phase of the round's steps (``grpo_trainer``'s curriculum sampler,
and dynamic sampling's refills), and metrics.jsonl logs the phase of every step. A phase boundary must
fall between generation rounds: a round's prompts are drawn once, for all of its optimizer steps.

Torch-free: the config checks and the Snakefile read it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

from workflow_scripts.runtime import paths
from workflow_scripts.tasks.rows import read_rows

PHASE_DEFAULTS = {"source": "synthetic", "n": 2000, "path": None}


def phases(train: Mapping) -> list[dict]:
    """The configured phases with their defaults ([] when the run trains on data.train throughout)."""
    return [{**PHASE_DEFAULTS, **phase} for phase in train.get("curriculum") or []]


def data_phases(train: Mapping) -> list[dict]:
    """What prepare_train needs of the phases (no step counts: changing them re-prepares nothing)."""
    return [{k: v for k, v in phase.items() if k != "steps"} for phase in phases(train)]


def steps_per_round(train: Mapping) -> int:
    """Optimizer steps one generation round feeds (TRL generates every steps_per_generation x
    num_iterations micro-steps; gradient_accumulation_steps micro-steps make an optimizer step)."""
    micro = int(train["steps_per_generation"]) * int(train.get("num_iterations", 1))
    return max(1, micro // int(train["gradient_accumulation_steps"]))


def phase_of_step(train: Mapping, step: int) -> int | None:
    """The phase whose prompts optimizer step ``step`` (1-based; 0 = before training: the first phase)
    trains on; None without a curriculum."""
    bounds, end = [], 0
    for phase in phases(train):
        end += int(phase["steps"])
        bounds.append(end)
    if not bounds:
        return None
    for index, last in enumerate(bounds):
        if step <= last:
            return index
    return len(bounds) - 1


def phase_name(phase: Mapping) -> str:
    """A phase as metrics.jsonl names it: the family (synthetic) or the source."""
    return phase["family"] if phase["source"] == "synthetic" else phase["source"]


def round_phases(train: Mapping) -> list[int]:
    """The phase of every generation round of the run (a round's first step decides; rounds never
    straddle a boundary: ``problems``)."""
    per = steps_per_round(train)
    rounds = -(-int(train["max_steps"]) // per)
    return [phase_of_step(train, r * per + 1) for r in range(rounds)]


def schedule(train: Mapping, data_dir: Path, rows: list[dict], kind: str) -> tuple[list[dict], dict]:
    """The training rows and the phase schedule {phase_of: step -> phase, names, sampler: the
    ``CurriculumSampler``'s rounds and ranges}: with a curriculum every phase's rows (data/curriculum/
    phase{k}.jsonl, each tagged with its phase) concatenated; else ``rows`` (data.train's) and no phases."""
    listed = phases(train)
    if not listed:
        return rows, {"phase_of": None, "names": [], "sampler": None}
    all_rows, ranges = [], []
    for index in range(len(listed)):
        path = paths.curriculum_file(data_dir, index)
        phase_rows = read_rows(path)
        if not phase_rows:
            raise ValueError(f"{path}: train.curriculum.{index} has no rows")
        kinds = sorted({row["kind"] for row in phase_rows})
        if kinds != [kind]:
            raise ValueError(f"{path}: rows of kind(s) {kinds}; the training reward's is {kind!r}")
        ranges.append((len(all_rows), len(all_rows) + len(phase_rows)))
        all_rows += [dict(row, phase=index) for row in phase_rows]
    sampler = {"rounds": round_phases(train), "ranges": ranges, "steps_per_round": steps_per_round(train)}
    names = [phase_name(phase) for phase in listed]
    return all_rows, {"phase_of": lambda step: phase_of_step(train, step), "names": names, "sampler": sampler}


def problems(config: Mapping) -> Iterator[tuple[str, str]]:
    """The curriculum's consistency: steps add up to max_steps, boundaries between generation rounds,
    synthetic phases name a family, every phase's rows have data.train's verifier kind."""
    from workflow_scripts.tasks.synthetic import FAMILIES

    train = config["train"]
    listed = phases(train)
    if not listed:
        return
    total = sum(int(p["steps"]) for p in listed)
    if total != train["max_steps"]:
        yield (
            "train.curriculum",
            f"the phases' steps add up to {total}, not train.max_steps ({train['max_steps']})",
        )
    per = steps_per_round(train)
    kind, real = config["data"]["train"]["kind"], config["data"]["train"]["source"]
    for index, phase in enumerate(listed):
        key = f"train.curriculum.{index}"
        if int(phase["steps"]) % per:
            yield f"{key}.steps", f"must be a multiple of the optimizer steps of one generation round ({per})"
        if phase["source"] == "synthetic":
            family = phase.get("family")
            if family is None:
                yield f"{key}.family", "required when source is 'synthetic'"
            elif FAMILIES[family][1] != kind:
                what = f"{family} rows have verifier kind {FAMILIES[family][1]!r}"
                yield f"{key}.family", f"{what}, the training reward's is {kind!r} (data.train.kind)"
        elif "family" in phase:
            yield f"{key}.family", f"only for source 'synthetic' (source is {phase['source']!r})"
        if phase["source"] not in ("synthetic", "train", real):
            yield (
                f"{key}.source",
                f"a real phase source must be data.train's ({real}): its rows carry that kind",
            )
