"""Benchmark the evaluator's batched sampler and the KL scorer on the tiny default-size model.

- speedup: completions per second of ``generation.sample_completions`` (all prompt x sample pairs in
  batches across prompts, left padding, KV cache) over a per-prompt loop of ``model.generate`` with
  ``num_return_sequences=n`` (the obvious implementation), same prompts, n, temperature 0.7, top_p 0.8,
  max_new_tokens, in the same process. Target >= 3.
- kl_scoring_ratio: in ``kl.estimate_kl``, time teacher-forcing the samples through both models (policy
  and reference) over the time sampling them (T=1). Target <= 0.5. Where the forward pass is
  compute-bound (a CPU), sampling with the KV cache costs about one forward over every prompt+completion
  token and scoring two (one per model), so the ratio sits near 2 x (teacher-forced tokens/s per model
  relative to sampled tokens/s); the target assumes memory-bound decoding (GPUs, real model sizes),
  where a decode step costs far more per token than a parallel forward. Both throughputs are printed.

The model is results/models/base when it exists (``--model``), else an untrained Llama of the default
tiny size (hidden 128, 4 layers, char tokenizer); an untrained model rarely emits the end token, so
every sequence runs to max_new_tokens (the worst case for both paths). Each timing is the minimum
over ``--repeats`` runs (shared machines are noisy).

Usage: .venv/bin/python bench/bench_eval.py [--prompts 64] [--n 4] [--max-new-tokens 8] [--threads 1]
                                            [--repeats 3] [--model results/models/base]

``--jobs OLD_CHECKOUT`` measures instead what issue 11 asks of the merged evaluate job: the evaluation +
KL wall time of one run on every task of a config (default config.yaml: its eval and task settings, its
model architecture), as Snakemake jobs spend it: one fresh process per job, timed from spawn to exit.
Before: two processes per task (``python -m workflow_scripts.evaluate evaluate|kl`` of OLD_CHECKOUT, e.g.
a worktree of a8ce4c0); after: one (this checkout). Jobs alternate old/new task by task, in one run, so
both see the same machine load; the data come from prepare_data and the model is an untrained base of
the config's architecture (every completion runs to max_new_tokens: the most work per job).
Prints per-task seconds, the sums, after/before (target <= 0.5) and the load average.
"""

from __future__ import annotations

import argparse
import copy
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from workflow_scripts.measures.kl import estimate_kl  # noqa: E402
from workflow_scripts.models.generation import NEUTRAL_GENERATION, sample_completions, stop_token_ids  # noqa: E402
from workflow_scripts.models.modeling import (  # noqa: E402
    build_char_tokenizer,
    build_tiny_llama,
    load_model,
    load_tokenizer,
)

TINY = {"hidden_size": 128, "num_layers": 4, "num_heads": 4, "intermediate_size": 512,
        "max_position_embeddings": 128, "seed": 0}  # fmt: skip


def load(model_path: Path | None):
    if model_path is not None and model_path.is_dir():
        return load_model(model_path, "float32").eval(), load_tokenizer(model_path), str(model_path)
    tok = build_char_tokenizer()
    return build_tiny_llama(len(tok), TINY, tok).eval(), tok, "untrained tiny Llama (hidden 128, 4 layers)"


@torch.inference_mode()
def per_prompt_loop(model, tok, prompts, n, max_new_tokens, seed) -> int:
    """The baseline: one generate call per prompt with num_return_sequences=n."""
    torch.manual_seed(seed)
    kwargs = {**NEUTRAL_GENERATION, "num_return_sequences": n, "do_sample": True, "temperature": 0.7,
              "top_p": 0.8, "max_new_tokens": max_new_tokens, "pad_token_id": tok.pad_token_id,
              "eos_token_id": stop_token_ids(model, tok)}  # fmt: skip
    count = 0
    for prompt in prompts:
        enc = tok(prompt, return_tensors="pt", add_special_tokens=False)
        out = model.generate(**enc, **kwargs)
        count += out.shape[0]
    return count


def best_of(repeats: int, fn) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return min(times), result


def main(argv: list[str] | None = None) -> int:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model", type=Path, default=REPO / "results" / "models" / "base")
    parser.add_argument("--jobs", type=Path, metavar="OLD_CHECKOUT", help="time jobs: merged vs separate")
    parser.add_argument("--config", type=Path, default=REPO / "config.yaml")
    parser.add_argument("--run", default="base")
    args = parser.parse_args(argv)
    if args.jobs:
        return bench_jobs(args.jobs, args.config, args.run)
    torch.set_num_threads(args.threads)
    model, tok, what = load(args.model)
    rng = random.Random(0)
    prompts = [f"{rng.randint(0, 99)}{rng.choice('+-')}{rng.randint(0, 99)}=" for _ in range(args.prompts)]
    n, max_new = args.n, args.max_new_tokens
    print(f"model: {what}; {len(prompts)} prompts x {n} samples, max_new_tokens {max_new}, "
          f"{args.threads} thread(s), best of {args.repeats}")  # fmt: skip

    sampling = {"n_samples": n, "temperature": 0.7, "top_p": 0.8, "max_new_tokens": max_new}
    sample_completions(model, tok, prompts[:4], **sampling)  # warm-up
    t_batched, out = best_of(args.repeats, lambda: sample_completions(model, tok, prompts, **sampling))
    t_loop, count = best_of(args.repeats, lambda: per_prompt_loop(model, tok, prompts, n, max_new, 0))
    batched_cps, loop_cps = len(out) / t_batched, count / t_loop
    mean_len = sum(c.num_tokens for c in out) / len(out)
    print(f"batched:    {batched_cps:8.1f} completions/s ({t_batched:.3f}s, mean length {mean_len:.1f})")
    print(f"per-prompt: {loop_cps:8.1f} completions/s ({t_loop:.3f}s)")
    speedup = batched_cps / loop_cps
    print(f"speedup={speedup:.1f}x (target >= 3)")
    # one model row per distinct (prompt, tokens so far) against one per sample (share_prefill=False)
    t_rows, _ = best_of(args.repeats, lambda: sample_completions(model, tok, prompts, **sampling,
                                                                 share_prefill=False))  # fmt: skip
    print(f"per-sample rows: {len(out) / t_rows:8.1f} completions/s ({t_rows:.3f}s); "
          f"states_speedup={t_rows / t_batched:.1f}x")  # fmt: skip

    reference = copy.deepcopy(model)
    runs = [estimate_kl(model, reference, tok, prompts, n_samples=n, max_new_tokens=max_new, seed=s)
            for s in range(args.repeats)]  # fmt: skip
    sample_s = min(r.sample_seconds for r in runs)
    score_s = min(r.score_seconds for r in runs)
    ratio = score_s / sample_s
    tokens = sum(len(tok(p, add_special_tokens=False)["input_ids"]) * n for p in prompts)
    tokens += round(runs[0].mean_length * len(prompts) * n)
    print(
        f"kl: sampling {sample_s:.3f}s, teacher-forcing both models {score_s:.3f}s "
        f"({len(prompts) * n} sequences, {tokens} prompt+completion tokens; per model "
        f"{2 * tokens / score_s:.0f} tokens/s teacher-forced vs {tokens / sample_s:.0f} tokens/s sampled)"
    )
    print(f"kl_scoring_ratio={ratio:.2f} (target <= 0.5)")
    return 0


def _timed_process(argv: list[str], root: Path, cwd: Path) -> float:
    env = {**os.environ, "PYTHONPATH": str(root), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}  # fmt: skip
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "workflow_scripts.evaluate", *argv], cwd=cwd, env=env,
                          capture_output=True, text=True, check=False)  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"{root}: evaluate {argv} failed:\n{proc.stderr[-3000:]}")
    return time.perf_counter() - start


def bench_jobs(old_root: Path, config_path: Path, run: str) -> int:
    """Evaluation + KL seconds of one run on every task: separate jobs (old_root) vs merged (this repo)."""
    import yaml

    from workflow_scripts.prepare_data import prepare
    from workflow_scripts.runtime.config import load_config

    config = yaml.safe_load(config_path.read_text())
    # The old checkout validates with its own schema: it reads its own config.yaml, which must evaluate
    # the same way (eval settings, tasks, model) for the comparison to mean anything.
    old_config = yaml.safe_load((old_root / "config.yaml").read_text())
    for key in ("eval", "model"):
        if old_config[key] != config[key]:
            raise SystemExit(f"{key}: differs between {config_path} and {old_root}/config.yaml")
    if old_config["data"]["tasks"] != config["data"]["tasks"]:
        raise SystemExit(f"data.tasks: differs between {config_path} and {old_root}/config.yaml")
    tasks = list(config["data"]["tasks"])
    with tempfile.TemporaryDirectory(prefix="bench_eval_jobs_") as tmp:
        work = Path(tmp)
        (work / "config.yaml").write_text(config_path.read_text())
        (work / "config.old.yaml").write_text((old_root / "config.yaml").read_text())
        prepare(load_config(config_path)["data"], work / "results" / "data")  # validated: defaults filled
        tok = build_char_tokenizer()
        tiny = {**config["model"]["tiny"], "max_position_embeddings": 128}
        build_tiny_llama(len(tok), tiny, tok).save_pretrained(
            work / "results/models/base", safe_serialization=True
        )
        tok.save_pretrained(work / "results/models/base")
        common = ["--run", run, "--results", "results", "--threads", "1"]
        load_before = os.getloadavg()
        print(f"{run} on {len(tasks)} tasks ({config_path.name}); load average {load_before[0]:.2f}")
        print("| task | before: evaluate + kl job (s) | after: one job (s) |\n|---|---|---|")
        before = after = 0.0
        for task in tasks:
            old_args = [*common, "--config", "config.old.yaml", "--task", task]
            old_eval = _timed_process(["evaluate", *old_args], old_root, work)
            old_kl = _timed_process(["kl", *old_args], old_root, work)
            new = _timed_process([*common, "--config", "config.yaml", "--task", task], REPO, work)
            before, after = before + old_eval + old_kl, after + new
            print(f"| {task} | {old_eval:.1f} + {old_kl:.1f} | {new:.1f} |", flush=True)
        load_after = os.getloadavg()
    ratio = after / before
    print(f"eval+KL wall time: before {before:.1f}s ({2 * len(tasks)} jobs), after {after:.1f}s "
          f"({len(tasks)} jobs); after/before={ratio:.2f} (target <= 0.5); "
          f"load average {load_before[0]:.2f} -> {load_after[0]:.2f} on {os.cpu_count()} CPUs")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
