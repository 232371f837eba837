"""The held-out curve of a training run: J of the current policy on every task's slice, during training.

``HeldOutCurves`` (a TrainerCallback) measures at step 0 (before any update), after every
``train.eval_every``-th optimizer step and after the last (``heldout_spec.heldout_steps``), and writes one
line per (step, task) to ``heldout.jsonl`` (keys: ``LINE_KEYS``). What it measures is the final
evaluation on a smaller slice (``heldout_spec``): pass@1 of ``eval_samples`` samples per problem at the
evaluation's temperature and top_p, in eval mode (no dropout), scored by the task's verifier, with the
same summary (``eval_summary.summarize``: SE, eval-noise variance, per-problem counts).

- It never changes the trajectory: sampling runs under ``torch.random.fork_rng`` and the model's train
  flags are restored, so a run with curves trains bit-identical to one without (tested).
- Streams: seed = derive_seed(eval.seed, run, task, "heldout", step); independent between runs, so the
  across-seed variance of J at a step is the runs' spread plus each run's ``eval_noise_var``.
- Numerics: the final evaluation's. The HF sampler (``generation.sample_completions``) runs the policy in
  its parameters' dtype without autocast (an autocast arm's saved fp32 masters are evaluated in fp32:
  accelerate's autocast wrapper of the forward is set aside while it samples, ``as_evaluated``), under the
  arm's bf16 product path (the callback runs inside the trainer's ``bf16_matmul`` context); with
  ``train.use_vllm`` the trainer's colocated engine, after a weight sync (``_sample_vllm``), as the
  rollouts are drawn.
- Ranks. With the colocated vLLM engine the slice is split: every engine (``world / tensor_parallel_size``
  of them; the ranks of one tensor-parallel group share one and send it the same requests) samples a
  contiguous share of each task's problems (``engine_share``), seeded as the whole slice would seed those
  problems (``vllm_backend.sample_llm``'s ``first_index``: prompt i draws from streams seed + i*n + j
  whoever samples it), the first rank of each group scores its share, and rank 0 gathers the scored
  samples (``gather_shares``) and summarizes them: the same lines as one process writes (up to the
  engine's own batch-dependent numerics, as on one rank; generate_s and score_s are the slowest
  share's), at 1/engines of the work. The HF sampler is
  not split. Under FSDP every rank must run the same forwards (each all-gathers the shards for every
  forward, and how many forwards a decode takes depends on its draws): every rank samples the whole slice
  in ``generation.lockstep``, decoding rank 0's tokens (rank 0 writes). And the HF sampler's draws depend
  on the batch a sample is drawn in (one seeded generator over length-sorted batches), so a share drawn
  on another rank would not give one process's numbers: with DDP rank 0 alone samples.
- Resume: the live file sits in the checkpoint folder; a resumed run keeps its lines up to the
  checkpoint's step (``metrics_log.truncate_metrics``) and continues; step 0 is measured only by a run
  that starts at step 0.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import torch
from transformers import TrainerCallback

from workflow_scripts.measures.eval_summary import finite, score, summarize
from workflow_scripts.runtime.seeds import derive_seed, seeded_subset
from workflow_scripts.tasks.rows import Row, read_rows
from workflow_scripts.training.heldout_spec import heldout_steps

log = logging.getLogger("train")

LINE_KEYS = (
    "run", "precision", "seed", "repeat", "step", "task", "role", "kind", "pass_at_1", "pass_at_1_se",
    "eval_noise_var", "n_problems", "n_samples", "sampling_seed", "backend", "dtype", "phase", "problem_ids",
    "correct_counts", "generate_s", "score_s",
)  # fmt: skip


def engine_share(rank: int, world: int, tensor_parallel: int = 1) -> tuple[int, int, bool]:
    """(engines, this rank's engine, whether it leads its engine's tensor-parallel group): TRL groups
    ranks [0, tp), [tp, 2tp), ... around one colocated engine each."""
    tp = max(1, int(tensor_parallel))
    if world % tp:
        raise ValueError(f"tensor_parallel_size {tp} does not divide the world size {world}")
    return world // tp, rank // tp, rank % tp == 0


def share_bounds(n: int, parts: int, index: int) -> tuple[int, int]:
    """[start, stop) of share ``index`` of ``n`` items in ``parts`` contiguous shares, the first n % parts
    one longer; shares past n are empty."""
    size, extra = divmod(n, parts)
    start = index * size + min(index, extra)
    return start, start + size + (index < extra)


def gather_shares(piece, group=None) -> list | None:
    """Every rank's ``piece`` on rank 0, in rank order (None elsewhere): a collective."""
    import torch.distributed as dist

    gathered = [None] * dist.get_world_size(group) if dist.get_rank(group) == 0 else None
    dist.gather_object(piece, gathered, dst=0, group=group)
    return gathered


def heldout_slices(spec: dict, data_dir: Path) -> dict[str, list[Row]]:
    """Every task's slice: ``spec['problems']`` rows of data_dir/eval/{task}.jsonl, a seeded sample that
    depends on (eval.seed, task) only, so every run and step is measured on the same problems."""
    slices = {}
    for task, cfg in spec["tasks"].items():
        path = Path(data_dir) / "eval" / f"{task}.jsonl"
        rows = read_rows(path)
        if not rows:
            raise ValueError(f"{path}: no problems for the held-out slice of task {task!r}")
        if {r["kind"] for r in rows} != {cfg["kind"]}:
            raise ValueError(f"{path}: rows are not all of the task's kind {cfg['kind']!r}")
        chosen = seeded_subset(len(rows), spec["problems"], derive_seed(spec["seed"], task, "heldout-slice"))
        slices[task] = [rows[i] for i in chosen]
    return slices


@contextlib.contextmanager
def as_evaluated(model, probe=None) -> Iterator[None]:
    """Inside: ``model`` computes as the evaluate stage computes its saved weights: accelerate's autocast
    wrapper (``model.forward`` of an autocast arm; the unwrapped one is ``_original_forward``) is set
    aside and autocast is off; ``probe`` (the run's ``AutocastProbe``) ignores these forwards."""
    wrapped = model.__dict__.get("forward")
    original = getattr(model, "_original_forward", None)
    if wrapped is not None and original is not None:
        model.forward = original
    device = next(model.parameters()).device.type
    try:
        with torch.autocast(device, enabled=False), probe.paused() if probe else contextlib.nullcontext():
            yield
    finally:
        if wrapped is not None and original is not None:
            model.forward = wrapped


class HeldOutCurves(TrainerCallback):
    """Measures and writes the held-out curve (module docstring). ``trainer`` is set after the trainer is
    built (its colocated vLLM engine, when it has one) and ``probe`` (the run's AutocastProbe, which must
    not take these forwards for rollouts); ``phase_of``: step -> curriculum phase (or None)."""

    def __init__(self, path: Path, spec: dict, slices: dict[str, list[Row]], run: dict, max_steps: int,
                 tokenizer, *, sharded: bool = False, is_main: bool = True,
                 previous: list[dict] | None = None, phase_of=None, workers: int = 1) -> None:  # fmt: skip
        self.path = Path(path)
        self.spec, self.slices, self.run, self.tokenizer = spec, slices, run, tokenizer
        self.max_steps = max_steps
        self.steps = set(heldout_steps(spec["every"], max_steps))
        self.sharded, self.is_main, self.workers = sharded, is_main, workers
        self.measured = {r["step"] for r in previous or []}
        self.phase_of = phase_of or (lambda step: None)
        self.trainer = None
        self.probe = None

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if state.global_step == 0 and 0 not in self.measured:
            self.measure(model, 0)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step in self.steps and state.global_step not in self.measured:
            self.measure(model, state.global_step)

    def _uses_vllm(self) -> bool:
        return bool(getattr(self.trainer, "use_vllm", False))

    def measure(self, model, step: int) -> None:
        """Every task's J at ``step``: sampled (every rank that must, each its share when split), scored
        and written by rank 0."""
        self.measured.add(step)
        vllm = self._uses_vllm()
        if not (self.is_main or self.sharded or vllm):  # DDP, HF sampler: rank 0 alone samples
            return
        devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
        was_training = model.training
        parts, index, scorer = self._share() if vllm else (1, 0, self.is_main)
        lines = []
        with torch.random.fork_rng(devices=devices), self._together(model), as_evaluated(model, self.probe):
            if vllm:
                self._sync_vllm()
            for task, rows in self.slices.items():
                cfg = self.spec["tasks"][task]
                seed = derive_seed(self.spec["seed"], self.run["stream"], task, "heldout", step)
                first, stop = share_bounds(len(rows), parts, index)
                start = time.perf_counter()
                completions, dtype = self._sample(model, [r["prompt"] for r in rows[first:stop]], cfg, seed,
                                                  first)  # fmt: skip
                generate_s = time.perf_counter() - start
                piece = None
                if scorer and completions:
                    start = time.perf_counter()
                    samples = self._score(task, cfg, rows, completions)
                    piece = (samples, generate_s, time.perf_counter() - start)
                if parts > 1:
                    pieces = [p for p in gather_shares(piece) or [] if p is not None]
                    piece = pieces and (pd.concat([p[0] for p in pieces], ignore_index=True),
                                        max(p[1] for p in pieces), max(p[2] for p in pieces))  # fmt: skip
                if self.is_main:
                    lines.append(self._line(step, task, cfg, seed, dtype, *piece))
        model.train(was_training)
        if vllm:
            self._sleep_vllm()
        if self.is_main:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a", encoding="utf-8") as fh:
                fh.write("".join(json.dumps(line, sort_keys=True) + "\n" for line in lines))
            log.info(
                "held-out step %d: %s", step, ", ".join(f"{x['task']} {x['pass_at_1']:.3f}" for x in lines)
            )

    def _share(self) -> tuple[int, int, bool]:
        """(engines, this rank's engine, whether this rank scores its engine's share): the vLLM split."""
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return 1, 0, True
        tp = getattr(self.trainer.vllm_generation, "tensor_parallel_size", 1)
        return engine_share(dist.get_rank(), dist.get_world_size(), tp)

    def _together(self, model):
        if not self.sharded or self._uses_vllm():
            return contextlib.nullcontext()
        from workflow_scripts.models.generation import lockstep

        return lockstep()

    def _budget(self, model) -> float | None:
        if not self.sharded:
            return self.spec.get("memory_budget_gb")
        from workflow_scripts.models.generation import agreed_memory_budget_gb

        return agreed_memory_budget_gb(next(model.parameters()).device)

    def _sample(self, model, prompts: list[str], cfg: dict, seed: int, first: int = 0):
        spec = self.spec
        common = {"n_samples": spec["samples"], "temperature": spec["temperature"], "top_p": spec["top_p"],
                  "max_new_tokens": cfg["max_new_tokens"], "seed": seed}  # fmt: skip
        if self._uses_vllm():
            from workflow_scripts.models.generation import stop_token_ids
            from workflow_scripts.models.vllm_backend import sample_llm

            llm = self.trainer.vllm_generation.llm
            stops = stop_token_ids(model, self.tokenizer)
            completions = []
            if prompts:  # a share past the slice's end (more engines than problems) samples nothing
                completions, _ = sample_llm(llm, self.tokenizer, stops, prompts, **common, first_index=first)
            return completions, self.trainer.vllm_engine_args.get("model_dtype")  # engine_record's
        from workflow_scripts.models.generation import sample_completions

        completions = sample_completions(model, self.tokenizer, prompts, batch_size=self.spec["batch_size"],
                                         memory_budget_gb=self._budget(model), **common)  # fmt: skip
        return completions, str(next(model.parameters()).dtype).removeprefix("torch.")

    def _sync_vllm(self) -> None:
        """The engine's weights are the last round's: push the current ones (TRL syncs again, harmlessly,
        at its next round), and wake its KV cache under sleep mode (the sync wakes the weights)."""
        generation = self.trainer.vllm_generation
        generation.sync_weights()
        if generation.enable_sleep_mode:
            generation.llm.wake_up(tags=["kv_cache"])

    def _sleep_vllm(self) -> None:
        generation = self.trainer.vllm_generation
        if generation.enable_sleep_mode:  # as TRL leaves it after a round: the next one re-syncs
            generation.llm.sleep(level=2)
            generation._llm_weights_sleeping = True

    def _score(self, task: str, cfg: dict, rows: list[Row], completions):
        return score(rows, completions, cfg["kind"], self.spec, workers=self.workers, run=self.run["run"],
                     task=task, settings=cfg.get("verifier"))  # fmt: skip

    def _line(self, step: int, task: str, cfg: dict, seed: int, dtype: str, samples, generate_s: float,
              score_s: float) -> dict:  # fmt: skip
        summary = summarize(samples, self.spec["samples"])
        line = {
            "run": self.run["run"],
            "precision": self.run["precision"],
            "seed": self.run["seed"],
            "repeat": self.run["repeat"],
            "step": step,
            "task": task,
            "role": cfg["role"],
            "kind": cfg["kind"],
            "pass_at_1": summary["pass_at_1"],
            "pass_at_1_se": summary["pass_at_1_se"],
            "eval_noise_var": summary["eval_noise_var"],
            "n_problems": summary["N"],
            "n_samples": summary["n"],
            "sampling_seed": seed,
            "backend": "vllm" if self._uses_vllm() else "hf",
            "dtype": dtype,
            "phase": self.phase_of(step),
            "problem_ids": [str(i) for i in summary["problem_ids"]],
            "correct_counts": summary["correct_counts"],
            "generate_s": round(generate_s, 3),
            "score_s": round(score_s, 3),
        }
        return finite(line)


def check_heldout(lines: list[dict], path: Path, spec: dict, max_steps: int) -> None:
    """Every task at every measured step, once: else a RuntimeError naming the file (a run is not done
    without its curve)."""
    want = {(step, task) for step in heldout_steps(spec["every"], max_steps) for task in spec["tasks"]}
    have = [(line["step"], line["task"]) for line in lines]
    if sorted(have) != sorted(want):
        missing, extra = sorted(want - set(have))[:5], sorted(set(have) - want)[:5]
        raise RuntimeError(f"{path}: held-out lines do not cover (step, task) once each: missing {missing}, "
                           f"unexpected or repeated {extra or 'repeats'}")  # fmt: skip


def heldout_record(spec: dict | None, lines: list[dict]) -> dict | None:
    """run.json's summary of the held-out curve: its settings, steps, sampler and cost."""
    if spec is None:
        return None
    return {
        "every": spec["every"],
        "problems": spec["problems"],
        "samples": spec["samples"],
        "tasks": list(spec["tasks"]),
        "steps": sorted({line["step"] for line in lines}),
        "backend": sorted({line["backend"] for line in lines}),
        "measure_s": round(sum(line["generate_s"] + line["score_s"] for line in lines), 3),
    }
