"""What the training stage's held-out curves measure, from the config: torch-free (the Snakefile reads it).

A run's held-out curve is J (pass@1 by sampling) of its current policy on a slice of every evaluation
task, at step 0, every ``train.eval_every`` optimizer steps and at the last step (``heldout_steps``). The
slice is ``train.eval_problems`` problems of the task's evaluation set (a seeded sample that depends on
(eval.seed, task) only: every run and step sees the same problems), ``train.eval_samples`` samples each,
at the evaluation's temperature, top_p and max_new_tokens, scored by the task's verifier: the final
evaluation's settings on fewer samples. ``heldout_spec`` collects exactly what the measurement reads, so
the train rule reruns when one of them changes and never for another eval setting (n_samples, KL).
The curve covers every task unless ``train.eval_tasks`` lists some: with the default, adding a task to
``data.tasks`` retrains every run (its curve is measured during training); a list pins the curve's tasks,
so a task added later gets its final evaluation only.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

HELDOUT_FILE = "heldout.jsonl"
TRAIN_KEYS = ("eval_every", "eval_problems", "eval_samples", "eval_tasks")  # reach training via the spec only
EVAL_KEYS = (
    "temperature",
    "top_p",
    "seed",
    "batch_size",
    "memory_budget_gb",
    "verify_timeout",
    "code_timeout",
)
TASK_KEYS = ("kind", "role", "max_new_tokens", "verifier")


def heldout_spec(config: Mapping) -> dict:
    """The held-out measurement's settings of a (validated) config: the ``train.eval_*`` keys, the
    evaluation's sampling and verifier settings, and every task's kind, role, length and verifier."""
    train, evaluation = config["train"], config["eval"]
    tasks = config["data"]["tasks"]
    chosen = train.get("eval_tasks") or list(tasks)
    return {
        "every": int(train["eval_every"]),
        "problems": int(train["eval_problems"]),
        "samples": int(train["eval_samples"]),
        **{key: evaluation.get(key) for key in EVAL_KEYS},
        "tasks": {name: {key: tasks[name].get(key) for key in TASK_KEYS} for name in tasks if name in chosen},
    }


def without_heldout(train: Mapping) -> dict:
    """The train section minus the held-out keys: what the training itself reads. The train rule's
    ``train`` param, so the curve's settings count once, through ``heldout_spec`` (pinning eval_tasks to
    the tasks a finished run was measured on reruns nothing)."""
    return {key: value for key, value in train.items() if key not in TRAIN_KEYS}


def heldout_steps(every: int, max_steps: int) -> list[int]:
    """The steps measured: 0, every ``every``-th step and the last one."""
    if every < 1:
        raise ValueError(f"train.eval_every: must be >= 1, got {every}")
    return sorted({0, max_steps, *range(every, max_steps + 1, every)})


def problems(config: Mapping) -> Iterator[tuple[str, str]]:
    """``train.eval_tasks`` names tasks of ``data.tasks``."""
    unknown = sorted(set(config["train"].get("eval_tasks") or ()) - set(config["data"]["tasks"]))
    if unknown:
        yield "train.eval_tasks", f"not in data.tasks: {', '.join(unknown)}"
