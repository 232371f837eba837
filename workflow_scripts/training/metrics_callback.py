"""The metrics.jsonl writer: the TrainerCallback that logs one line per optimizer step, and the KL log.

Kept apart from ``metrics_log`` (keys, reader, summaries) because it needs torch and transformers, which
the readers (aggregate) must not pay for. The line format is documented in ``metrics_log``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import TrainerCallback

from workflow_scripts.measures.kl import estimate_kl
from workflow_scripts.training.metrics_log import (
    DYNAMIC_KEYS,
    GAP_KEYS,
    KL_KEYS,
    METRIC_KEYS,
    OVERLONG_NAME,
    PHASE_DRAWN_KEY,
    ROLLOUT_KEYS,
    SCALER_KEYS,
    VLLM_KEYS,
)

log = logging.getLogger("train")


def _num(x) -> float:
    return float("nan") if x is None else float(x)


def scaler_state(optimizer) -> dict:
    """``SCALER_KEYS`` of the step just taken: accelerate's AcceleratedOptimizer holds the GradScaler
    (``scaler``, fp16 autocast on CUDA) and whether it skipped the step (``step_was_skipped``: the
    scaled gradients had inf/NaN, so the step was not applied and the scale dropped). Nulls without one."""
    scaler = getattr(optimizer, "scaler", None)
    if scaler is None:
        return dict.fromkeys(SCALER_KEYS)
    return {"loss_scale": float(scaler.get_scale()), "step_skipped": bool(optimizer.step_was_skipped)}


class MetricsLogger(TrainerCallback):
    """Writes one metrics.jsonl line per optimizer step (flushed), the KL log, and a progress line.

    ``on_row`` (optional) sees every finished line before it is written: the health checks use it.
    """

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
        on_row: Callable[[dict], None] | None = None,
        sharded: bool = False,
        phase_of: Callable[[int], int | None] | None = None,
        phase_names: list[str] | None = None,
    ) -> None:
        self.path = Path(path)
        self.max_steps = max_steps
        self.accuracy_key = f"rewards/{kind}_reward/mean"
        self.reference, self.tokenizer = reference, tokenizer
        self.kl_prompts, self.kl_every, self.kl_samples = kl_prompts or [], kl_every, kl_samples
        self.max_new_tokens = max_new_tokens
        self.on_row = on_row
        self.sharded = sharded  # FSDP: every rank measures KL, in lockstep with rank 0 (KLPartner)
        self.phase_of, self.phase_names = phase_of, phase_names or []  # train.curriculum (curriculum)
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
        """The KL log of ``step``. Sharded (FSDP: a collective that every rank runs, ``KLPartner``): every
        rank decodes rank 0's tokens in batches bounded by the ranks' smallest memory budget, so all ranks
        run the same forwards and none waits for an all-gather that never comes (``generation.lockstep``)."""
        from workflow_scripts.models.generation import agreed_memory_budget_gb, lockstep

        devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
        was_training = model.training
        budget, together = None, contextlib.nullcontext()
        if self.sharded:
            budget = agreed_memory_budget_gb(next(model.parameters()).device)
            together = lockstep()
        with torch.random.fork_rng(devices=devices), together:
            estimate = estimate_kl(
                model,
                self.reference,
                self.tokenizer,
                self.kl_prompts,
                n_samples=self.kl_samples,
                max_new_tokens=self.max_new_tokens,
                seed=step,
                memory_budget_gb=budget,
            )
        model.train(was_training)
        return {
            "kl_k1": estimate.k1_mean,
            "kl_k1_se": estimate.k1_se,
            "kl_k3": estimate.k3_mean,
            "kl_k3_se": estimate.k3_se,
            "kl_rb": estimate.rb_mean,
            "kl_rb_se": estimate.rb_se,
        }

    def row(self, logs: dict, step: int, model, optimizer=None) -> dict:
        row: dict = {"step": step}
        for key, trl_key in METRIC_KEYS.items():
            row[key] = logs.get(trl_key)
        row.update(scaler_state(optimizer))
        phase = self.phase_of(step) if self.phase_of else None
        row["phase"] = phase
        row["phase_name"] = None if phase is None else self.phase_names[phase]
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
            for key, log_key in DYNAMIC_KEYS.items():
                value = logs.get(log_key)
                if value is not None:
                    value = bool(value) if key == "dynamic_cap_hit" else int(value)
                self.carry[key] = value
            for key, log_key in {**GAP_KEYS, **VLLM_KEYS, "phase_drawn": PHASE_DRAWN_KEY}.items():
                self.carry[key] = logs.get(log_key)
        row.update(self.carry)
        row.update(dict.fromkeys(KL_KEYS))
        if (
            self.reference is not None
            and self.kl_every
            and (step % self.kl_every == 0 or step == self.max_steps)
        ):
            row.update(self.measure_kl(model, step))
        row["wall_time_s"] = round(self.wall_offset + time.perf_counter() - self.start, 3)
        return row

    def on_log(self, args, state, control, logs=None, model=None, **kwargs):
        logs = logs or {}
        if "train_runtime" in logs or not state.is_world_process_zero:
            return
        step = state.global_step
        row = self.row(logs, step, model, kwargs.get("optimizer"))
        fh = self._handle()
        fh.write(json.dumps(row, sort_keys=True) + "\n")
        fh.flush()
        if self.on_row is not None:
            self.on_row(row)
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
