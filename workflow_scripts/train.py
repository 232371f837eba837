"""train stage: GRPO configured as DAPO, with TRL's GRPOTrainer, for one (precision, seed).

``train_run`` fine-tunes the base policy on the training prompts with the training task's verifier as
the reward (``verifiers.make_reward_function``; the same module scores evaluation) and writes:

- ``{out}/model/``: the final policy (safetensors, in ``param_dtype``) and tokenizer;
- ``{out}/metrics.jsonl``: one line per optimizer step (schema below);
- ``{out}/run.json``: provenance (versions, config hash, precision mode, dtypes at start and as saved,
  autocast observed, device, steps, seed, wall time, reward statistics, resume information).

The config's ``train`` section maps to ``GRPOConfig`` in one function, ``grpo_config``:

| train key                   | GRPOConfig field(s)                                                         |
|-----------------------------|-----------------------------------------------------------------------------|
| max_steps, learning_rate,   | same names (warm-up 0, optimizer adamw_torch)                               |
| lr_scheduler_type,          |                                                                             |
| weight_decay, max_grad_norm |                                                                             |
| prompts_per_step,           | per_device_train_batch_size = prompts_per_step * num_generations /          |
| num_generations,            | (gradient_accumulation_steps * world_size) completions; num_generations;    |
| gradient_accumulation_steps | gradient_accumulation_steps. An optimizer step sees prompts_per_step *      |
|                             | num_generations completions.                                                |
| steps_per_generation        | steps_per_generation: micro-batches per generation round (TRL's unit; a     |
|                             | multiple of gradient_accumulation_steps). A round samples prompts_per_step  |
|                             | * steps_per_generation / gradient_accumulation_steps prompts. Larger than   |
|                             | gradient_accumulation_steps (or num_iterations > 1) makes the policy ratio  |
|                             | differ from 1, i.e. makes DAPO's clipping act.                              |
| num_iterations              | num_iterations                                                              |
| temperature                 | temperature; top_p 1, top_k 0 (samples from pi_theta itself)                |
| max_completion_length       | max_completion_length                                                       |
| loss_type                   | loss_type (dapo: token-level loss normalised over the global batch)         |
| epsilon, epsilon_high       | epsilon (low clip), epsilon_high (clip-higher)                              |
| beta                        | beta (0: TRL loads no reference model and logs no KL; we log it)            |
| mask_truncated_completions  | mask_truncated_completions                                                  |
| overlong_buffer,            | reward_weights [1, overlong_penalty] over [the verifier reward, TRL's       |
| overlong_penalty            | get_soft_overlong_punishment(max_completion_length, overlong_buffer)]       |
| checkpoint_every            | save_steps, rounded up to whole generation rounds (see below);              |
|                             | save_strategy steps, save_total_limit 1, output_dir = the checkpoint folder |
| use_vllm                    | use_vllm, vllm_mode colocate (vllm is imported only then: gate_vllm)        |
| kl_every, kl_prompts,       | not TRL: our KL log (MetricsLogger) and the reward's verifier timeout       |
| kl_samples, reward_timeout  |                                                                             |
| (precision mode)            | bf16 / fp16 = autocast (ALWAYS explicit), disable_dropout False,            |
|                             | full_determinism False: see ``precision``                                   |
| (fixed)                     | seed = run seed, activation_checkpointing False, logging_steps 1, report_to |
|                             | none, disable_tqdm, scale_rewards group, shuffle_dataset, use_cpu when      |
|                             | there is no CUDA device (bf16 autocast on CPU needs it)                     |

metrics.jsonl, one line per optimizer step ``step`` (1..max_steps), every key on every line:
``reward``, ``reward_std`` (total reward, TRL ``reward``/``reward_std``), ``accuracy`` (the verifier
reward's mean), ``overlong_reward`` (null unless on), ``informative_frac`` (1 - frac_reward_zero_std:
the fraction of prompt groups whose rewards differ, i.e. that carry a gradient), ``completion_length``
(mean tokens), ``truncation_rate`` (completions/clipped_ratio: hit max_completion_length) are
rollout statistics: TRL computes them only when it generates (every steps_per_generation /
gradient_accumulation_steps optimizer steps); on the other steps the last value is carried forward and
``generation_step`` is false (average over ``generation_step`` lines to weight each rollout once).
Per step: ``clip_low``, ``clip_high``, ``clip_region`` (token fractions clipped below 1-epsilon with
A<0, above 1+epsilon_high with A>0, either), ``entropy``, ``grad_norm``, ``learning_rate``, ``loss``,
``step_time_s`` (TRL's), ``wall_time_s`` (cumulative training wall time), ``epoch``. Every
``kl_every`` steps and at the last step ``kl_k1``, ``kl_k1_se``, ``kl_k3``, ``kl_k3_se``: KL(pi_theta ||
pi_0) to the base model (loaded in ``model.dtype``) estimated by ``kl.estimate_kl`` on ``kl_prompts``
training prompts x ``kl_samples`` samples (TRL logs none with beta 0); null on other lines. The KL
measurement runs under ``torch.random.fork_rng`` and restores train mode, so it never changes the
training trajectory (a run with another ``kl_every`` trains bit-identically).

Checkpoints and resume. Checkpoints go to ``ckpt_dir`` (``results/checkpoints/{precision}/seed{seed}``),
OUTSIDE the rule's outputs: Snakemake deletes ``directory()`` outputs, and the outputs of a failed job,
before the job reruns. Every ``save_steps`` steps the Trainer saves weights, optimizer, scheduler, RNG
states (rng_state.pth: python, numpy, torch CPU and CUDA generators) and trainer state; only the latest
is kept. The live metrics file is ``ckpt_dir/metrics.jsonl`` (lines flushed as they are written); it is
copied atomically to the output at the end. A rerun resumes from the newest COMPLETE checkpoint
(trainer_state.json written, which the Trainer does last; incomplete ones are deleted), truncates the
live metrics to the checkpoint's step (no duplicate or missing steps) and continues. Checkpoints are
placed on generation-round boundaries (save_steps rounded up) because TRL keeps the current round's
rollouts only in memory: resuming mid-round would resample them. The Trainer restores the RNG states
after fast-forwarding the data loader; the training sampler is TRL's RepeatSampler made epoch-aware
(``EpochRepeatSampler``: the permutation of epoch e is the one an uninterrupted run draws), so a
resumed deterministic run ends bit-identical to an uninterrupted one. The RNG/optimizer files are
read with ``torch.load(weights_only=True)`` by transformers; they are this run's own files anyway. A
``run_key.json`` (hash of the train section, mode, seed and the base-model/data files) guards the
folder: checkpoints of a different configuration are deleted, never resumed. After a successful run
the checkpoint folder is deleted (optimizer state is ~3x the model; the final model is the output).

GPU path: ``train.use_vllm`` generates with vLLM colocated on the training GPUs (``pip install
'.[gpu]'``; vllm is imported only when enabled). Several GPUs (data parallel) run through accelerate::

    accelerate launch --num_processes 4 -m workflow_scripts.train --config config.yaml \\
        --precision bf16 --seed 1 --threads 8

(the per-device batch is divided by the world size, so the effective batch is unchanged). The
Snakemake rule runs the single-process path; its ``gpu`` resource is the hook for GPU slots.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import platform
import shutil
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import torch
from transformers import TrainerCallback

from workflow_scripts.atomic import atomic_dir, write_json, write_text
from workflow_scripts.config import ConfigError, load_config, section_hash
from workflow_scripts.kl import estimate_kl
from workflow_scripts.modeling import load_model, load_tokenizer
from workflow_scripts.precision import (
    AutocastProbe,
    PrecisionError,
    PrecisionMode,
    apply_determinism,
    check_param_dtypes,
    check_supported,
    load_policy,
    mode_from_config,
    model_dropouts,
    saved_dtypes,
    summarize_dtypes,
    trainer_precision_args,
)
from workflow_scripts.rows import read_rows
from workflow_scripts.verifiers import make_reward_function

log = logging.getLogger("train")

METRIC_KEYS = {  # metrics.jsonl key -> TRL log key, logged every optimizer step
    "clip_low": "clip_ratio/low_mean",
    "clip_high": "clip_ratio/high_mean",
    "clip_region": "clip_ratio/region_mean",
    "entropy": "entropy",
    "grad_norm": "grad_norm",
    "learning_rate": "learning_rate",
    "loss": "loss",
    "step_time_s": "step_time",
    "epoch": "epoch",
}
ROLLOUT_KEYS = (  # computed by TRL only when it generates: carried forward on the other steps
    "reward",
    "reward_std",
    "accuracy",
    "overlong_reward",
    "informative_frac",
    "completion_length",
    "truncation_rate",
)
KL_KEYS = ("kl_k1", "kl_k1_se", "kl_k3", "kl_k3_se")
OVERLONG_NAME = "soft_overlong_punishment_reward"


# ------------------------------------------------------------------------------ config -> GRPOConfig


def generation_period(train_cfg: Mapping) -> int:
    """Optimizer steps per generation round (checkpoints must fall on multiples of it)."""
    micro = train_cfg["steps_per_generation"] * train_cfg.get("num_iterations", 1)
    ga = train_cfg["gradient_accumulation_steps"]
    return math.lcm(micro, ga) // ga


def save_steps(train_cfg: Mapping) -> int:
    period = generation_period(train_cfg)
    return math.ceil(train_cfg["checkpoint_every"] / period) * period


def _world_size(world_size: int | None) -> int:
    return int(world_size if world_size is not None else os.environ.get("WORLD_SIZE", "1"))


def check_train_config(train_cfg: Mapping, world_size: int = 1) -> None:
    """Constraints between train keys that the schema cannot express (ConfigError naming the key)."""
    ga, spg = train_cfg["gradient_accumulation_steps"], train_cfg["steps_per_generation"]
    completions = train_cfg["prompts_per_step"] * train_cfg["num_generations"]
    if completions % (ga * world_size):
        raise ConfigError(
            f"train.prompts_per_step: prompts_per_step * num_generations ({completions}) must be "
            f"divisible by "
            f"gradient_accumulation_steps * world_size ({ga} * {world_size})"
        )
    if spg % ga:
        raise ConfigError(
            f"train.steps_per_generation: must be a multiple of gradient_accumulation_steps ({ga})"
        )
    buffer = train_cfg.get("overlong_buffer")
    if buffer is not None and buffer >= train_cfg["max_completion_length"]:
        raise ConfigError("train.overlong_buffer: must be smaller than train.max_completion_length")
    if train_cfg.get("epsilon_high", 0) < train_cfg.get("epsilon", 0):
        raise ConfigError("train.epsilon_high: must be >= train.epsilon (clip-higher)")


def gate_vllm(use_vllm: bool) -> None:
    """Keep vllm out of a process that does not use it.

    TRL imports vllm at import time whenever it is installed (trl.generation.vllm_generation), which on
    a GPU box costs seconds and initialises CUDA state. With ``use_vllm`` false this marks vllm as
    absent (``sys.modules['vllm'] = None``: find_spec returns None, ``import vllm`` raises) before TRL is
    imported, so it is never imported. Call it before the first TRL import of the process.
    """
    if use_vllm:
        if "vllm" in sys.modules and sys.modules["vllm"] is None:
            del sys.modules["vllm"]
        check_vllm_available()
    elif "vllm" not in sys.modules:
        sys.modules["vllm"] = None  # type: ignore[assignment]


def check_vllm_available() -> None:
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        raise ConfigError(
            "train.use_vllm: true, but vllm is not installed on this machine. Install the GPU extra "
            "(pip install '.[gpu]') on a CUDA machine, or set train.use_vllm: false."
        )


def grpo_config(
    train_cfg: Mapping,
    mode: PrecisionMode,
    seed: int,
    out_dir: str | os.PathLike,
    world_size: int | None = None,
):
    """The GRPOConfig for one run: the whole mapping from the config's train section (see the table)."""
    from trl import GRPOConfig

    world = _world_size(world_size)
    check_train_config(train_cfg, world)
    if train_cfg.get("use_vllm"):
        check_vllm_available()
    ga = train_cfg["gradient_accumulation_steps"]
    per_device = train_cfg["prompts_per_step"] * train_cfg["num_generations"] // (ga * world)
    overlong = train_cfg.get("overlong_buffer") is not None
    kwargs = dict(
        output_dir=str(out_dir),
        seed=seed,
        max_steps=train_cfg["max_steps"],
        learning_rate=train_cfg["learning_rate"],
        lr_scheduler_type=train_cfg["lr_scheduler_type"],
        warmup_steps=0,
        weight_decay=train_cfg["weight_decay"],
        max_grad_norm=train_cfg["max_grad_norm"],
        optim="adamw_torch",
        per_device_train_batch_size=per_device,
        gradient_accumulation_steps=ga,
        num_generations=train_cfg["num_generations"],
        steps_per_generation=train_cfg["steps_per_generation"],
        num_iterations=train_cfg["num_iterations"],
        temperature=train_cfg["temperature"],
        top_p=1.0,
        top_k=0,
        max_completion_length=train_cfg["max_completion_length"],
        loss_type=train_cfg["loss_type"],
        epsilon=train_cfg["epsilon"],
        epsilon_high=train_cfg["epsilon_high"],
        beta=train_cfg["beta"],
        scale_rewards="group",
        mask_truncated_completions=train_cfg["mask_truncated_completions"],
        reward_weights=[1.0, float(train_cfg["overlong_penalty"])] if overlong else None,
        use_vllm=bool(train_cfg.get("use_vllm")),
        vllm_mode="colocate",
        activation_checkpointing=False,  # TRL defaults gradient checkpointing ON
        save_strategy="steps",
        save_steps=save_steps(train_cfg),
        save_total_limit=1,
        save_only_model=False,
        logging_steps=1,
        logging_strategy="steps",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
        use_cpu=not torch.cuda.is_available(),
        shuffle_dataset=True,
        log_completions=False,
        **trainer_precision_args(mode),
    )
    return GRPOConfig(**kwargs)


def reward_functions(train_cfg: Mapping, kind: str) -> list:
    """[the verifier reward of ``kind``] (+ TRL's soft overlong punishment when overlong_buffer is set)."""
    funcs = [make_reward_function(kind, timeout=train_cfg.get("reward_timeout", 5.0))]
    if train_cfg.get("overlong_buffer") is not None:
        from trl.rewards import get_soft_overlong_punishment

        funcs.append(
            get_soft_overlong_punishment(train_cfg["max_completion_length"], train_cfg["overlong_buffer"])
        )
    return funcs


def make_trainer_class():
    """GRPOTrainer with an epoch-aware training sampler (exact resume across epochs); nothing else."""
    from trl import GRPOTrainer
    from trl.trainer.utils import RepeatSampler

    class EpochRepeatSampler(RepeatSampler):
        """TRL's RepeatSampler draws a new permutation from its own generator at every ``__iter__``; a
        resumed run iterates fewer times, so it would replay epoch 0's order. Here ``set_epoch(e)``
        (called by the Trainer before each epoch) rewinds the generator to the state an uninterrupted
        run has at epoch e: the same orders as RepeatSampler, but reproducible from the epoch alone."""

        def set_epoch(self, epoch: int) -> None:
            if self.seed is None or not self.shuffle:
                return
            self.generator.manual_seed(self.seed)
            for _ in range(epoch):
                torch.randperm(self.num_samples, generator=self.generator)

    class Trainer(GRPOTrainer):
        def _get_train_sampler(self, dataset=None):
            base = super()._get_train_sampler(dataset)
            return EpochRepeatSampler(
                data_source=base.data_source,
                mini_repeat_count=base.mini_repeat_count,
                batch_size=base.batch_size,
                repeat_count=base.repeat_count,
                shuffle=base.shuffle,
                seed=base.seed,
            )

    return Trainer


# ------------------------------------------------------------------------------ metrics callback


def read_metrics(path: str | os.PathLike) -> list[dict]:
    path = Path(path)
    if not path.exists():
        return []
    rows = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                break  # a line cut by a kill: everything after it is discarded
    return rows


def truncate_metrics(path: Path, step: int) -> list[dict]:
    """Keep the lines of steps 1..step (a resumed run continues at step+1); return them."""
    kept = [r for r in read_metrics(path) if r["step"] <= step]
    write_text(path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in kept))
    return kept


def kl_prompt_sample(prompts: list[str], n: int) -> list[str]:
    """``n`` evenly spaced training prompts: the same for every run (independent of seed and precision)."""
    n = min(n, len(prompts))
    return [prompts[(i * len(prompts)) // n] for i in range(n)]


class MetricsLogger(TrainerCallback):
    """Writes one metrics.jsonl line per optimizer step (flushed), the KL log, and a progress line."""

    def __init__(
        self,
        path: Path,
        max_steps: int,
        kind: str,
        reference=None,
        tokenizer=None,
        kl_prompts: list[str] | None = None,
        kl_every: int = 0,
        kl_samples: int = 4,
        max_new_tokens: int = 8,
        previous: list[dict] | None = None,
    ) -> None:
        self.path = Path(path)
        self.max_steps = max_steps
        self.accuracy_key = f"rewards/{kind}_reward/mean"
        self.reference, self.tokenizer = reference, tokenizer
        self.kl_prompts, self.kl_every, self.kl_samples = kl_prompts or [], kl_every, kl_samples
        self.max_new_tokens = max_new_tokens
        previous = previous or []
        self.carry = (
            {k: previous[-1].get(k) for k in ROLLOUT_KEYS} if previous else dict.fromkeys(ROLLOUT_KEYS)
        )
        self.wall_offset = previous[-1]["wall_time_s"] if previous else 0.0
        self.start = time.perf_counter()
        self.first_step: int | None = None
        self._fh = None

    def _handle(self):
        if self._fh is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - kept open across steps
        return self._fh

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def on_train_begin(self, args, state, control, **kwargs):
        self.start = time.perf_counter()
        self.first_step = state.global_step

    def measure_kl(self, model, step: int) -> dict:
        devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
        was_training = model.training
        with torch.random.fork_rng(devices=devices):
            estimate = estimate_kl(
                model,
                self.reference,
                self.tokenizer,
                self.kl_prompts,
                n_samples=self.kl_samples,
                max_new_tokens=self.max_new_tokens,
                seed=step,
            )
        model.train(was_training)
        return {
            "kl_k1": estimate.k1_mean,
            "kl_k1_se": estimate.k1_se,
            "kl_k3": estimate.k3_mean,
            "kl_k3_se": estimate.k3_se,
        }

    def on_log(self, args, state, control, logs=None, model=None, **kwargs):
        logs = logs or {}
        if "train_runtime" in logs or not state.is_world_process_zero:
            return
        step = state.global_step
        row: dict = {"step": step}
        for key, trl_key in METRIC_KEYS.items():
            row[key] = logs.get(trl_key)
        fresh = "reward" in logs
        row["generation_step"] = fresh
        if fresh:
            zero_std = logs.get("frac_reward_zero_std")
            self.carry = {
                "reward": logs.get("reward"),
                "reward_std": logs.get("reward_std"),
                "accuracy": logs.get(self.accuracy_key),
                "overlong_reward": logs.get(f"rewards/{OVERLONG_NAME}/mean"),
                "informative_frac": None if zero_std is None else 1.0 - zero_std,
                "completion_length": logs.get("completions/mean_length"),
                "truncation_rate": logs.get("completions/clipped_ratio"),
            }
        row.update(self.carry)
        row.update(dict.fromkeys(KL_KEYS))
        if (
            self.reference is not None
            and self.kl_every
            and (step % self.kl_every == 0 or step == self.max_steps)
        ):
            row.update(self.measure_kl(model, step))
        row["wall_time_s"] = round(self.wall_offset + time.perf_counter() - self.start, 3)
        fh = self._handle()
        fh.write(json.dumps(row, sort_keys=True) + "\n")
        fh.flush()
        done = step - (self.first_step or 0)
        eta = (time.perf_counter() - self.start) / max(1, done) * (self.max_steps - step)
        kl = f" kl_k3 {row['kl_k3']:.2e}" if row["kl_k3"] is not None else ""
        log.info(
            "step %d/%d reward %.3f clip %.4f entropy %.3f grad_norm %.3f%s | %.0fs left",
            step,
            self.max_steps,
            _num(row["reward"]),
            _num(row["clip_region"]),
            _num(row["entropy"]),
            _num(row["grad_norm"]),
            kl,
            eta,
        )

    def on_train_end(self, args, state, control, **kwargs):
        self.close()


def _num(x) -> float:
    return float("nan") if x is None else float(x)


# ------------------------------------------------------------------------------ checkpoints


def checkpoint_step(path: Path) -> int:
    return int(path.name.rsplit("-", 1)[1])


def is_complete_checkpoint(path: Path) -> bool:
    """The Trainer writes trainer_state.json after weights, optimizer, scheduler and RNG state."""
    try:
        json.loads((path / "trainer_state.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return any(path.glob("*.safetensors")) and (path / "optimizer.pt").exists()


def latest_complete_checkpoint(ckpt_dir: Path, remove_incomplete: bool = True) -> Path | None:
    """The newest complete ``checkpoint-N`` folder; incomplete ones (a kill mid-save) are deleted."""
    if not ckpt_dir.is_dir():
        return None
    found = sorted(
        (p for p in ckpt_dir.glob("checkpoint-*") if p.name.rsplit("-", 1)[1].isdigit()), key=checkpoint_step
    )
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


def prepare_checkpoint_dir(ckpt_dir: Path, key: str) -> Path | None:
    """Create/validate the checkpoint folder; return the checkpoint to resume from (or None)."""
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
    return latest_complete_checkpoint(ckpt_dir)


# ------------------------------------------------------------------------------ the stage


def _device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _train_dataset(rows: list[dict]):
    from datasets import Dataset

    return Dataset.from_list(
        [
            {
                "id": r["id"],
                "prompt": r["prompt"],
                "answer": str(r["answer"]),
                "kind": r["kind"],
                "meta": json.dumps(r.get("meta") or {}, sort_keys=True),
            }
            for r in rows
        ]
    )


def _mean(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def reward_summary(metrics: list[dict]) -> dict:
    """Mean reward of the first and last 10% of rollouts (= of steps), clip and KL summaries."""
    fresh = [r for r in metrics if r.get("generation_step")]
    k = max(1, len(fresh) // 10)
    kl = [r for r in metrics if r.get("kl_k3") is not None]
    return {
        "rollouts": len(fresh),
        "reward_first10": _mean([r["reward"] for r in fresh[:k]]),
        "reward_last10": _mean([r["reward"] for r in fresh[-k:]]),
        "reward_mean": _mean([r["reward"] for r in fresh]),
        "final_reward": fresh[-1]["reward"] if fresh else None,
        "final_reward_std": fresh[-1]["reward_std"] if fresh else None,
        "clip_region_mean": _mean([r["clip_region"] for r in metrics]),
        "clip_region_max": max((r["clip_region"] or 0.0 for r in metrics), default=None),
        "steps_with_clipping": sum(1 for r in metrics if (r.get("clip_region") or 0) > 0),
        "final_kl_k1": kl[-1]["kl_k1"] if kl else None,
        "final_kl_k3": kl[-1]["kl_k3"] if kl else None,
    }


def _versions() -> dict:
    import accelerate
    import transformers
    import trl

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "trl": trl.__version__,
        "accelerate": accelerate.__version__,
    }


def train_run(
    config: Mapping,
    precision: str,
    seed: int,
    data_dir,
    base_dir,
    out_dir,
    ckpt_dir,
    threads: int = 1,
    callbacks: list | None = None,
) -> dict:
    """Train one (precision, seed); write model/, metrics.jsonl and run.json under ``out_dir``."""
    started = time.time()
    data_dir, base_dir, out_dir, ckpt_dir = map(Path, (data_dir, base_dir, out_dir, ckpt_dir))
    train_cfg = dict(config["train"])
    mode = mode_from_config(config, precision)
    gate_vllm(bool(train_cfg.get("use_vllm")))
    torch.set_num_threads(threads)
    device = _device()
    check_supported(mode, device)
    determinism = apply_determinism(mode)
    world = _world_size(None)
    check_train_config(train_cfg, world)

    rows = read_rows(data_dir / "train.jsonl")
    kinds = sorted({r["kind"] for r in rows})
    if len(kinds) != 1:
        raise ValueError(
            f"{data_dir / 'train.jsonl'}: training rows must share one verifier kind, got {kinds}"
        )
    kind = kinds[0]

    key = run_key(train_cfg, mode, seed, base_dir, data_dir)
    resume = prepare_checkpoint_dir(ckpt_dir, key)
    resume_step = checkpoint_step(resume) if resume else 0
    live_metrics = ckpt_dir / "metrics.jsonl"
    previous = truncate_metrics(live_metrics, resume_step) if resume else []
    if not resume and live_metrics.exists():
        live_metrics.unlink()
    if resume and [r["step"] for r in previous] != list(range(1, resume_step + 1)):
        raise RuntimeError(f"{live_metrics}: metrics do not cover steps 1..{resume_step} of {resume}")
    log.info(
        "%s seed %d: %s on %s (%s)",
        precision,
        seed,
        f"resuming from step {resume_step}" if resume else "starting",
        device,
        mode,
    )

    trust = config.get("model", {}).get("trust_remote_code", False)
    tokenizer = load_tokenizer(base_dir, trust)
    policy = load_policy(base_dir, mode, trust)
    start_dtypes = check_param_dtypes(policy, mode)
    reference = load_model(base_dir, config.get("model", {}).get("dtype", "float32"), trust).to(device).eval()
    for p in reference.parameters():
        p.requires_grad_(False)

    args = grpo_config(train_cfg, mode, seed, ckpt_dir, world)
    if args.steps_per_generation * args.num_iterations <= args.gradient_accumulation_steps:
        log.warning(
            "steps_per_generation * num_iterations <= gradient_accumulation_steps: the policy ratio "
            "is 1 and DAPO's clipping never acts"
        )
    logger = MetricsLogger(
        live_metrics,
        train_cfg["max_steps"],
        kind,
        reference=reference,
        tokenizer=tokenizer,
        kl_prompts=kl_prompt_sample([r["prompt"] for r in rows], train_cfg["kl_prompts"]),
        kl_every=train_cfg["kl_every"],
        kl_samples=train_cfg["kl_samples"],
        max_new_tokens=train_cfg["max_completion_length"],
        previous=previous,
    )
    from transformers.trainer_callback import PrinterCallback

    trainer = make_trainer_class()(
        model=policy,
        reward_funcs=reward_functions(train_cfg, kind),
        args=args,
        train_dataset=_train_dataset(rows),
        processing_class=tokenizer,
        callbacks=[logger, *(callbacks or [])],
    )
    trainer.remove_callback(PrinterCallback)
    probe = AutocastProbe(trainer.model)
    train_start = time.perf_counter()
    try:
        trainer.train(resume_from_checkpoint=str(resume) if resume else None)
    finally:
        logger.close()
        probe.close()
    train_wall = time.perf_counter() - train_start
    model = trainer.accelerator.unwrap_model(trainer.model)
    end_dtypes = check_param_dtypes(model, mode)

    record: dict = {}
    if trainer.accelerator.is_main_process:
        metrics = read_metrics(live_metrics)
        steps = [r["step"] for r in metrics]
        if steps != list(range(1, train_cfg["max_steps"] + 1)):
            raise RuntimeError(
                f"{live_metrics}: expected steps 1..{train_cfg['max_steps']}, got {len(steps)} lines"
            )
        model_dir = out_dir / "model"
        with atomic_dir(model_dir) as tmp:
            model.save_pretrained(tmp, safe_serialization=True)
            tokenizer.save_pretrained(tmp)
            written = saved_dtypes(tmp)
            wrong = {n: d for n, d in written.items() if d != mode.param_dtype}
            if wrong:
                raise PrecisionError(f"saved tensors not in {mode.param_dtype}: {sorted(wrong.items())[:8]}")
        write_text(out_dir / "metrics.jsonl", live_metrics.read_text(encoding="utf-8"))
        record = {
            "precision": precision,
            "mode": mode.as_dict(),
            "seed": seed,
            "device": device,
            "world_size": world,
            "threads": threads,
            "versions": _versions(),
            "config_hash": section_hash(train_cfg, mode.as_dict(), seed),
            "run_key": key,
            "train": train_cfg,
            "trainer": {
                "per_device_train_batch_size": args.per_device_train_batch_size,
                "generation_batch_size": args.generation_batch_size,
                "steps_per_generation": args.steps_per_generation,
                "save_steps": args.save_steps,
                "bf16": args.bf16,
                "fp16": args.fp16,
            },
            "determinism": determinism,
            "dropout": model_dropouts(model),
            "dtypes_start": summarize_dtypes(start_dtypes),
            "dtypes_end": summarize_dtypes(end_dtypes),
            "dtypes_saved": summarize_dtypes(written),
            "trainable_tensors": len(start_dtypes),
            "autocast": {"requested": mode.autocast, "observed": probe.record},
            "steps": train_cfg["max_steps"],
            "steps_this_session": trainer.state.global_step - resume_step,
            "resumed": resume is not None,
            "resumed_from_step": resume_step if resume else None,
            "train_wall_s": round(train_wall, 3),
            "wall_time_s": round(time.time() - started, 3),
            "s_per_step": round(train_wall / max(1, trainer.state.global_step - resume_step), 4),
            "rewards": reward_summary(metrics),
        }
        write_json(out_dir / "run.json", record)
        shutil.rmtree(ckpt_dir, ignore_errors=True)
        log.info("done: %s", json.dumps(record["rewards"]))
    trainer.accelerator.wait_for_everyone()
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", default="config.yaml")
    parser.add_argument("--precision", required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--data", default="results/data")
    parser.add_argument("--base", default="results/models/base")
    parser.add_argument("--out", default=None, help="default results/train/{precision}/seed{seed}")
    parser.add_argument("--ckpt", default=None, help="default results/checkpoints/{precision}/seed{seed}")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    config = load_config(args.config)
    out = args.out or f"results/train/{args.precision}/seed{args.seed}"
    ckpt = args.ckpt or f"results/checkpoints/{args.precision}/seed{args.seed}"
    train_run(config, args.precision, args.seed, args.data, args.base, out, ckpt, args.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
