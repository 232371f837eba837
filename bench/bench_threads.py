"""Does a job keep its speed next to a CPU-bound neighbour? (thread control: runtime/threads.py)

A training-like job (forward + backward + AdamW steps of the tiny default Llama, batch 16 x 48 tokens)
runs in a fresh process set up as a Snakemake job is (``threads.limit_threads(1)``: one thread in every
pool, passive OpenMP waiting), alone and next to a neighbour process that keeps one core busy (a Python
busy loop), alternately. Target: with the neighbour <= 1.5 x alone. The time is that of the steps
(after imports and model construction). ``--spinning`` adds
the same pair with what a job gets without thread control (all cores, OpenMP's default active wait),
which is what made base_model 8x slower beside another job. Each time is the minimum of ``--repeats``.

The machine may be shared: the load average is printed, and the ratio is taken within one run.

Usage: .venv/bin/python bench/bench_threads.py [--steps 30] [--repeats 3] [--spinning]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

JOB = """
import sys, time
controlled = sys.argv[2] == "1"
if controlled:
    from workflow_scripts.runtime import threads
import torch
if controlled:
    threads.limit_threads(1)
from workflow_scripts.models.modeling import build_char_tokenizer, build_tiny_llama
tok = build_char_tokenizer()
model = build_tiny_llama(len(tok), {"hidden_size": 128, "num_layers": 4, "num_heads": 4,
                                    "intermediate_size": 512, "max_position_embeddings": 128, "seed": 0}, tok)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
ids = torch.randint(5, len(tok), (16, 48), generator=torch.Generator().manual_seed(0))
steps = int(sys.argv[1])
forever = steps <= 0
start = time.perf_counter()
done = 0
while forever or done < steps:
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad()
    done += 1
print(time.perf_counter() - start)
"""


def _env() -> dict:
    """No inherited thread settings: the controlled job sets its own, the other gets the defaults."""
    drop = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME", "TOKENIZERS_PARALLELISM")
    env = {k: v for k, v in os.environ.items() if not k.endswith("_THREADS") and k not in drop}
    return {**env, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}


def timed_job(steps: int, controlled: bool) -> float:
    out = subprocess.run([sys.executable, "-c", JOB, str(steps), "1" if controlled else "0"], cwd=REPO,
                         env=_env(), capture_output=True, text=True, check=True)  # fmt: skip
    return float(out.stdout.strip().splitlines()[-1])


NEIGHBOUR = "while True:\n    pass\n"  # keeps one core busy, from its first millisecond


def measure(steps: int, repeats: int, controlled: bool) -> tuple[float, float]:
    """(seconds alone, seconds next to a busy neighbour), each the minimum of ``repeats``, interleaved
    (alone, beside, alone, beside, ...) so both see the same background load."""
    alone, beside = [], []
    for _ in range(repeats):
        alone.append(timed_job(steps, controlled))
        neighbour = subprocess.Popen([sys.executable, "-c", NEIGHBOUR], env=_env())
        try:
            beside.append(timed_job(steps, controlled))
        finally:
            neighbour.kill()
            neighbour.wait()
    return min(alone), min(beside)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--spinning", action="store_true", help="also without thread control")
    args = parser.parse_args(argv)
    load = os.getloadavg()[0]
    print(f"training-like job: {args.steps} steps, best of {args.repeats}; load average {load:.2f} on "
          f"{os.cpu_count()} CPUs")  # fmt: skip
    variants = [("thread control (1 thread, passive wait)", True)]
    if args.spinning:
        variants.append(("no thread control (all cores, active wait)", False))
    for name, controlled in variants:
        alone, beside = measure(args.steps, args.repeats, controlled)
        ratio = beside / alone
        target = " (target <= 1.5)" if controlled else ""
        print(f"{name}: alone {alone:.2f}s, next to a CPU-bound neighbour {beside:.2f}s, "
              f"ratio={ratio:.2f}{target}", flush=True)  # fmt: skip
    print(f"load average after {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
