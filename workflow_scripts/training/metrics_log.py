"""metrics.jsonl of a training run: the one owner of its keys, its reader and its summaries.

The writer, the TrainerCallback ``MetricsLogger``, lives in ``metrics_callback`` (torch, transformers),
which imports its keys from here; nothing here imports it, so readers (aggregate) never import torch.

One line per optimizer step ``step`` (1..max_steps), every key on every line:

- rollout statistics (``ROLLOUT_KEYS``), computed by TRL only when it generates (every
  steps_per_generation / gradient_accumulation_steps optimizer steps); on the other steps the last value
  is carried forward and ``generation_step`` is false, so average over ``generation_step`` lines
  (``rollout_rows``) to weight each rollout once. ``reward``, ``reward_std`` (total reward), ``accuracy``
  (the verifier reward's mean), ``overlong_reward`` (null unless on), ``informative_frac`` (1 -
  frac_reward_zero_std: prompt groups whose rewards differ), ``completion_length``, ``truncation_rate``
  average over every group generated in the round (refills of dynamic sampling included: what the
  policy sampled). ``rollouts_drawn`` (prompt groups generated this round, refills included),
  ``groups_kept`` (groups of the loss batch with reward spread), ``groups_zero_spread`` (zero-spread
  groups the loss saw: with dynamic sampling 0 unless the refill cap was hit), ``dynamic_cap_hit``.
- per step (``METRIC_KEYS``): ``clip_low``, ``clip_high``, ``clip_region`` (token fractions clipped
  below 1-epsilon with A<0, above 1+epsilon_high with A>0, either), ``entropy``, ``grad_norm``,
  ``learning_rate``, ``loss``, ``step_time_s`` (TRL's), ``epoch``; ``wall_time_s`` (cumulative).
- the sampler-trainer gap (``GAP_KEYS``, ``sampler_gap``; rollout keys, measured at the first optimizer
  step of each round, before any update on it): ``sampler_gap_mean`` / ``sampler_gap_max`` (mean and
  max |log p_sampler - log p_trainer| over the loss's completion tokens; null without sampler log-probs),
  ``sampler_gap_outside_clip`` (share of those tokens whose ratio is already outside [1 - epsilon,
  1 + epsilon_high]), ``sampler_gap_clipped`` (share the loss clips there); over the same tokens
  ``sampler_gap_kl_k1`` / ``sampler_gap_kl_k3`` (KL(sampler || trainer), k1 and k3 estimates),
  ``sampler_gap_log_ppl_abs_diff`` (per sequence |mean log p_sampler - mean log p_trainer|, averaged),
  ``sampler_gap_growth`` (mean |gap| on completions' second halves / first halves) and
  ``sampler_gap_pos_0`` .. ``_pos_{GAP_POSITION_BINS - 1}`` (mean |gap| per log2 position bin of the
  completion: 0, 1, 2-3, 4-7, ..., the last open; ``position_bin_label``); null where nothing was
  measured (table: ``sampler_gap``'s docstring). With vLLM and its
  importance-sampling correction on, TRL's own statistics (``VLLM_KEYS``): ``vllm_logp_diff_mean`` /
  ``_max`` (vLLM vs the trainer's eval-mode recomputation), ``vllm_is_ratio_min`` / ``_mean`` / ``_max``.
- ``SCALER_KEYS`` per step, when the optimizer has a loss scaler (fp16 autocast on CUDA: accelerate's
  GradScaler): ``loss_scale`` (the scale after the step's update) and ``step_skipped`` (the scaler
  found inf/NaN gradients and skipped the optimizer step; the scale drops); null without a scaler.
- ``phase`` (the ``train.curriculum`` phase the schedule assigns the step, 0-based) and ``phase_name``
  (its family, or its source); ``phase_drawn`` (a rollout key): the phase of the prompts the round's
  rollouts were really drawn from (the mean over its rows, refills included: a round never mixes
  phases, so it is an integer), what the sampler did rather than what it was told. Null without a
  curriculum.
- ``KL_KEYS`` every ``kl_every`` steps and at the last step: KL(pi_theta || pi_0) to the base model
  estimated by ``kl.estimate_kl`` (TRL logs none with beta 0); null on other lines. The measurement
  runs under ``torch.random.fork_rng`` in eval mode, so it never changes the training trajectory.

The live file sits in the checkpoint folder (lines flushed as written); the stage copies it atomically
to the output at the end. aggregate.py and rows.py read it through ``read_metrics`` / ``rollout_rows``
/ ``reward_summary`` only.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from workflow_scripts.runtime.atomic import write_text

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
DYNAMIC_KEYS = {  # metrics.jsonl key -> log key written by grpo_trainer once per generation round
    "rollouts_drawn": "dynamic/rollouts_drawn",
    "groups_kept": "dynamic/groups_kept",
    "groups_zero_spread": "dynamic/groups_zero_spread",
    "dynamic_cap_hit": "dynamic/cap_hit",
}
GAP_POSITION_BINS = 14  # log2 bins of the completion position: 0, 1, 2-3, ..., 2048-4095, 4096+
GAP_POSITION_KEYS = tuple(f"sampler_gap_pos_{k}" for k in range(GAP_POSITION_BINS))
GAP_KEYS = {  # metrics.jsonl key -> log key written by sampler_gap once per generation round
    "sampler_gap_mean": "sampler_gap/mean",
    "sampler_gap_max": "sampler_gap/max",
    "sampler_gap_outside_clip": "sampler_gap/outside_clip",
    "sampler_gap_clipped": "sampler_gap/clipped",
    "sampler_gap_kl_k1": "sampler_gap/kl_k1",
    "sampler_gap_kl_k3": "sampler_gap/kl_k3",
    "sampler_gap_log_ppl_abs_diff": "sampler_gap/log_ppl_abs_diff",
    "sampler_gap_growth": "sampler_gap/growth",
    **{key: "sampler_gap/" + key.removeprefix("sampler_gap_") for key in GAP_POSITION_KEYS},
}
VLLM_KEYS = {  # metrics.jsonl key -> TRL log key, once per round with vLLM and its correction on
    "vllm_logp_diff_mean": "sampling/sampling_logp_difference/mean",
    "vllm_logp_diff_max": "sampling/sampling_logp_difference/max",
    "vllm_is_ratio_min": "sampling/importance_sampling_ratio/min",
    "vllm_is_ratio_mean": "sampling/importance_sampling_ratio/mean",
    "vllm_is_ratio_max": "sampling/importance_sampling_ratio/max",
}
ROLLOUT_KEYS = (  # computed only when TRL generates: carried forward on the other steps
    "reward",
    "reward_std",
    "accuracy",
    "overlong_reward",
    "informative_frac",
    "completion_length",
    "truncation_rate",
    *DYNAMIC_KEYS,
    "phase_drawn",
    *GAP_KEYS,
    *VLLM_KEYS,
)
PHASE_DRAWN_KEY = "curriculum/phase"  # log key written by grpo_trainer once per round (train.curriculum)
SCALER_KEYS = ("loss_scale", "step_skipped")  # per step, from the optimizer's GradScaler (fp16); else null
KL_KEYS = ("kl_k1", "kl_k1_se", "kl_k3", "kl_k3_se", "kl_rb", "kl_rb_se")
OVERLONG_NAME = "soft_overlong_punishment_reward"


def position_bin_label(k: int) -> str:
    """The completion positions of gap bin ``k`` in words: "0", "1", "2-3", ..., "4096+" (the last)."""
    if k == 0 or k == 1:
        return str(k)
    low = 2 ** (k - 1)
    return f"{low}+" if k == GAP_POSITION_BINS - 1 else f"{low}-{2 * low - 1}"


def read_metrics(path: str | os.PathLike) -> list[dict]:
    """The lines of a metrics.jsonl ([] when absent). A torn LAST line (a kill mid-write) is dropped;
    a bad line elsewhere is a ValueError naming ``path:line``."""
    path = Path(path)
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    rows = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as err:
            if number == len(lines):
                break
            raise ValueError(f"{path}:{number}: not a JSON line ({err.msg})") from err
    return rows


def truncate_metrics(path: Path, step: int) -> list[dict]:
    """Keep the lines of steps 1..step (a resumed run continues at step+1); return them."""
    kept = [r for r in read_metrics(path) if r["step"] <= step]
    write_text(path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in kept))
    return kept


def rollout_rows(metrics: list[dict]) -> list[dict]:
    """The lines where TRL generated (each rollout once; the generation_step default is False)."""
    return [r for r in metrics if r.get("generation_step", False)]


def _mean(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def reward_summary(metrics: list[dict]) -> dict:
    """Mean reward of the first and last 10% of rollouts, clip, KL and dynamic-sampling summaries."""
    fresh = rollout_rows(metrics)
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
        "rollouts_drawn": sum(r.get("rollouts_drawn") or 0 for r in fresh),
        "groups_kept": sum(r.get("groups_kept") or 0 for r in fresh),
        "groups_zero_spread": sum(r.get("groups_zero_spread") or 0 for r in fresh),
        "dynamic_cap_hits": sum(1 for r in fresh if r.get("dynamic_cap_hit")),
    }


def gap_summary(metrics: list[dict]) -> dict:
    """run.json's ``sampler_gap``: per-round gap statistics over the run (each round once; means over
    the rounds that measured them; ``by_position``: one mean per position bin)."""
    fresh = [r for r in rollout_rows(metrics) if r.get("sampler_gap_outside_clip") is not None]
    maxima = [r["sampler_gap_max"] for r in fresh if r.get("sampler_gap_max") is not None]
    vllm = [r["vllm_logp_diff_max"] for r in fresh if r.get("vllm_logp_diff_max") is not None]
    return {
        "rounds_measured": len(fresh),
        "mean": _mean([r.get("sampler_gap_mean") for r in fresh]),
        "max": max(maxima) if maxima else None,
        "outside_clip_mean": _mean([r.get("sampler_gap_outside_clip") for r in fresh]),
        "clipped_mean": _mean([r.get("sampler_gap_clipped") for r in fresh]),
        "kl_k1_mean": _mean([r.get("sampler_gap_kl_k1") for r in fresh]),
        "kl_k3_mean": _mean([r.get("sampler_gap_kl_k3") for r in fresh]),
        "log_ppl_abs_diff_mean": _mean([r.get("sampler_gap_log_ppl_abs_diff") for r in fresh]),
        "growth_mean": _mean([r.get("sampler_gap_growth") for r in fresh]),
        "by_position": [_mean([r.get(k) for r in fresh]) for k in GAP_POSITION_KEYS],
        "vllm_logp_diff_mean": _mean([r.get("vllm_logp_diff_mean") for r in fresh]),
        "vllm_logp_diff_max": max(vllm) if vllm else None,
    }


def scaler_summary(metrics: list[dict]) -> dict | None:
    """run.json's ``loss_scale``: the fp16 loss-scale trajectory in brief (None without a scaler)."""
    scales = [r["loss_scale"] for r in metrics if r.get("loss_scale") is not None]
    if not scales:
        return None
    return {
        "initial": scales[0],
        "final": scales[-1],
        "min": min(scales),
        "skipped_steps": sum(1 for r in metrics if r.get("step_skipped")),
    }


def kl_prompt_sample(prompts: list[str], n: int) -> list[str]:
    """``n`` evenly spaced training prompts: the same for every run (independent of seed and precision)."""
    n = min(n, len(prompts))
    return [prompts[(i * len(prompts)) // n] for i in range(n)]
