"""metrics.jsonl of a training run: the one owner of its keys, its reader and its summaries.

The writer, the TrainerCallback ``MetricsLogger``, lives in ``metrics_callback`` (torch, transformers)
and is re-exported here lazily, so readers (aggregate) never import torch.

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
from typing import Any

from workflow_scripts.atomic import write_text

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
ROLLOUT_KEYS = (  # computed only when TRL generates: carried forward on the other steps
    "reward",
    "reward_std",
    "accuracy",
    "overlong_reward",
    "informative_frac",
    "completion_length",
    "truncation_rate",
    *DYNAMIC_KEYS,
)
KL_KEYS = ("kl_k1", "kl_k1_se", "kl_k3", "kl_k3_se")
OVERLONG_NAME = "soft_overlong_punishment_reward"


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


def kl_prompt_sample(prompts: list[str], n: int) -> list[str]:
    """``n`` evenly spaced training prompts: the same for every run (independent of seed and precision)."""
    n = min(n, len(prompts))
    return [prompts[(i * len(prompts)) // n] for i in range(n)]


def __getattr__(name: str) -> Any:
    """``metrics_log.MetricsLogger``: imported on first use (it needs torch and transformers)."""
    if name == "MetricsLogger":
        from workflow_scripts.metrics_callback import MetricsLogger

        return MetricsLogger
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
