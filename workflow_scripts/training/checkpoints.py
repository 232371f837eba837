"""Resumable training checkpoints: where they live, which one a rerun resumes from, and when to discard.

Checkpoints go to ``ckpt_dir`` (``results/checkpoints/{precision}/seed{seed}``), OUTSIDE the rule's
outputs: Snakemake deletes ``directory()`` outputs, and the outputs of a failed job, before the job
reruns. Every ``save_steps`` steps the Trainer saves weights, optimizer, scheduler, RNG states
(rng_state.pth: python, numpy, torch CPU and CUDA generators) and trainer state; only the latest is kept.
A rerun resumes from the newest COMPLETE checkpoint (trainer_state.json written, which the Trainer does
last; incomplete ones are deleted). Checkpoints sit on generation-round boundaries
(``grpo_config.save_steps``) because TRL keeps the current round's rollouts only in memory. A
``run_key.json`` (hash of the train section, mode, seed and the base-model/data files) guards the
folder: checkpoints of a different configuration are deleted, never resumed. The RNG/optimizer files
are read with ``torch.load(weights_only=True)`` by transformers; they are this run's own files anyway.

Snapshots (config ``snapshots``, ``Snapshots``): the reference arm's policy at a few steps, for the
movement-matched comparison (statistics/matched.py), saved in the checkpoint folder too (so a resumed run
keeps the ones it took) and copied into the run's outputs at the end.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import zipfile
from collections.abc import Mapping
from pathlib import Path

from transformers import TrainerCallback

from workflow_scripts.runtime.atomic import atomic_dir, write_json
from workflow_scripts.runtime.config import section_hash
from workflow_scripts.training.precision import PrecisionMode

log = logging.getLogger("train")


def checkpoint_step(path: Path) -> int:
    return int(path.name.rsplit("-", 1)[1])


def numbered_checkpoints(ckpt_dir: Path) -> list[Path]:
    """The ``checkpoint-N`` folders of ``ckpt_dir``, by step (other names left alone)."""
    found = (p for p in ckpt_dir.glob("checkpoint-*") if p.name.rsplit("-", 1)[1].isdigit())
    return sorted(found, key=checkpoint_step)


def is_complete_checkpoint(path: Path, world: int | None = None) -> bool:
    """Rank 0 writes trainer_state.json after the weights, optimizer, scheduler and its own RNG state; with
    ``world`` > 1 processes (default: the launcher's WORLD_SIZE) every other rank writes its
    rng_state_<rank>.pth with no barrier before it, so a kill can land between them: each rank's file
    must be there, whole (torch.save writes a zip: a cut one has no end record). A resume without one
    restores no RNG on that rank and leaves the uninterrupted run's trajectory (seen under load)."""
    try:
        json.loads((path / "trainer_state.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    world = int(os.environ.get("WORLD_SIZE", "1")) if world is None else int(world)
    if world > 1 and not all(zipfile.is_zipfile(path / f"rng_state_{r}.pth") for r in range(world)):
        return False
    return any(path.glob("*.safetensors")) and (path / "optimizer.pt").exists()


def latest_complete_checkpoint(
    ckpt_dir: Path, remove_incomplete: bool = True, before: int | None = None
) -> Path | None:
    """The newest complete ``checkpoint-N`` folder (with N < ``before`` when given); incomplete ones (a kill
    mid-save) are deleted.

    ``before`` = max_steps: the Trainer also saves at the run's last step, and resumed there it trains one
    step more than max_steps (which the train stage refuses, on every retry). A job killed after that save
    but before run.json (or ended as TIMEOUT by SLURM just past its limit) keeps no earlier checkpoint
    (save_total_limit 1), so it starts again; ``prepare_checkpoint_dir`` removes the unusable one."""
    if not ckpt_dir.is_dir():
        return None
    found = [p for p in numbered_checkpoints(ckpt_dir) if before is None or checkpoint_step(p) < before]
    latest = None
    for path in found:
        if is_complete_checkpoint(path):
            latest = path
        elif remove_incomplete:
            log.warning("removing incomplete checkpoint %s", path)
            shutil.rmtree(path, ignore_errors=True)
    return latest


def _file_signature(paths: list[Path]) -> list:
    return [[p.name, p.stat().st_size, p.stat().st_mtime_ns] for p in paths if p.is_file()]


def run_key(train_cfg: Mapping, mode: PrecisionMode, seed: int, base_dir: Path, data_dir: Path) -> str:
    files = [*sorted(base_dir.glob("*.safetensors")), base_dir / "config.json", data_dir / "train.jsonl"]
    return section_hash(dict(train_cfg), mode.as_dict(), seed, _file_signature(files))


def prepare_checkpoint_dir(ckpt_dir: Path, key: str, before: int | None = None) -> Path | None:
    """Create/validate the checkpoint folder; return the checkpoint to resume from (or None; ``before``:
    as ``latest_complete_checkpoint``'s)."""
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    key_file = ckpt_dir / "run_key.json"
    stored = None
    if key_file.exists():
        with contextlib.suppress(OSError, ValueError):
            stored = json.loads(key_file.read_text(encoding="utf-8")).get("key")
    if stored != key:
        if any(ckpt_dir.iterdir()):
            log.warning("checkpoint folder %s belongs to another configuration: starting fresh", ckpt_dir)
        for child in ckpt_dir.iterdir():
            shutil.rmtree(child) if child.is_dir() else child.unlink()
        write_json(key_file, {"key": key})
        return None
    if before is not None:  # checkpoints a resume cannot use (see latest_complete_checkpoint)
        for path in numbered_checkpoints(ckpt_dir):
            if checkpoint_step(path) >= before:
                log.warning("removing %s: a run resumed at its last step would train past it", path)
                shutil.rmtree(path, ignore_errors=True)
    return latest_complete_checkpoint(ckpt_dir, before=before)


class Snapshots(TrainerCallback):
    """Save the policy (weights and tokenizer, as the final model) after each of ``steps`` into
    ``ckpt_dir``/snapshots/step<k>; ``publish`` copies them to the run's output folders at the end.

    Saving reads the weights only (no random draw, no change): a run with snapshots trains bit-identical
    to one without. One process only: under FSDP the weights are shards (refused by the train stage)."""

    def __init__(self, ckpt_dir: Path, steps: list[int], tokenizer) -> None:
        self.root, self.steps, self.tokenizer = Path(ckpt_dir) / "snapshots", sorted(set(steps)), tokenizer

    def path(self, step: int) -> Path:
        return self.root / f"step{step}"

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step in self.steps and state.is_world_process_zero and model is not None:
            with atomic_dir(self.path(state.global_step)) as tmp:
                model.save_pretrained(tmp, safe_serialization=True)
                self.tokenizer.save_pretrained(tmp)
            log.info("snapshot of step %d saved", state.global_step)

    def publish(self, outputs: Mapping[int, Path]) -> None:
        """Copy each step's snapshot to ``outputs[step]`` (the train rule's snapshot folders)."""
        for step, dest in outputs.items():
            source = self.path(int(step))
            if not (source / "config.json").is_file():
                raise RuntimeError(
                    f"{source}: the snapshot of step {step} is missing (the run resumed past it?)"
                )
            with atomic_dir(dest) as tmp:
                shutil.copytree(source, tmp, dirs_exist_ok=True)
