"""base_model stage: build (or load) the base policy pi_0 and record its on-task accuracy.

``model.source: tiny`` builds the char-level tokenizer and a small Llama locally and warm-starts it
with a short supervised fine-tune on the warm-start pool (sft.jsonl), so that on-task accuracy sits
between the floor and the ceiling: GRPO needs groups with reward spread to learn anything.
Any other source (a local folder or a hub id) is loaded with an explicit dtype and saved as is.
"""

from __future__ import annotations

import argparse
import logging
import math
import platform
import random
import sys
import time
from pathlib import Path

import torch

from workflow_scripts.atomic import atomic_dir, write_json
from workflow_scripts.config import load_config, section_hash
from workflow_scripts.generation import sample_completions
from workflow_scripts.modeling import build_char_tokenizer, build_tiny_llama, load_model, load_tokenizer
from workflow_scripts.rows import Row, read_rows
from workflow_scripts.verifiers import verify_batch

log = logging.getLogger("base_model")


def sft_batches(rows: list[Row], tokenizer, batch_size: int, steps: int, seed: int):
    """Yield (input_ids, attention_mask, labels) batches; loss only on the answer and end token.

    Each batch is drawn from one length bucket (the bucket picked with probability proportional to
    its size, so the mix is kept in expectation): short arithmetic rows are not padded to the
    length of the occasional word problem, which would multiply the cost of every step.
    """
    rng = random.Random(seed)
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    buckets: dict[int, list[tuple[list[int], list[int]]]] = {}
    for r in rows:
        p = tokenizer(r["prompt"], add_special_tokens=False)["input_ids"]
        a = tokenizer(r["answer"], add_special_tokens=False)["input_ids"] + [eos]
        buckets.setdefault((len(p) + len(a) + 3) // 4, []).append((p, a))
    keys = sorted(buckets)
    sizes = [len(buckets[k]) for k in keys]
    for _ in range(steps):
        bucket = buckets[rng.choices(keys, sizes)[0]]
        batch = [bucket[rng.randrange(len(bucket))] for _ in range(batch_size)]
        width = max(len(p) + len(a) for p, a in batch)
        ids = torch.full((batch_size, width), pad, dtype=torch.long)
        mask = torch.zeros((batch_size, width), dtype=torch.long)
        labels = torch.full((batch_size, width), -100, dtype=torch.long)
        for j, (p, a) in enumerate(batch):
            seq = p + a
            ids[j, width - len(seq) :] = torch.tensor(seq)
            mask[j, width - len(seq) :] = 1
            labels[j, width - len(a) :] = torch.tensor(a)
        yield ids, mask, labels


def warm_start(model, tokenizer, rows: list[Row], tiny: dict) -> list[float]:
    """Supervised fine-tune (AdamW, linear warm-up then cosine decay); returns the loss curve."""
    steps = tiny["sft_steps"]
    if steps == 0:
        return []
    opt = torch.optim.AdamW(model.parameters(), lr=tiny["sft_lr"], weight_decay=0.0)
    warmup = max(1, steps // 20)

    def schedule(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    model.train()
    losses = []
    batches = sft_batches(rows, tokenizer, tiny["sft_batch_size"], steps, tiny["seed"])
    for step, (ids, mask, labels) in enumerate(batches, 1):
        # positions count real tokens only, as generate() does for left-padded prompts
        position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
        loss = model(input_ids=ids, attention_mask=mask, position_ids=position_ids, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if step % 100 == 0 or step == steps:
            log.info("sft step %d/%d loss %.4f", step, steps, sum(losses[-100:]) / len(losses[-100:]))
    model.eval()
    return losses


def greedy_accuracy(model, tokenizer, rows: list[Row], max_new_tokens: int, batch_size: int = 256) -> float:
    """Fraction of ``rows`` answered correctly by greedy decoding, scored by the task's verifier."""
    completions = sample_completions(
        model, tokenizer, [r["prompt"] for r in rows], max_new_tokens=max_new_tokens, batch_size=batch_size
    )
    verdicts = verify_batch(
        rows[0]["kind"], [c.text for c in completions], [r["answer"] for r in rows], [r["meta"] for r in rows]
    )
    return sum(v.correct for v in verdicts) / len(rows)


def on_task_eval(config: dict, data_dir: Path) -> tuple[str, list[Row]]:
    name = next(n for n, t in config["data"]["tasks"].items() if t["role"] == "on_task")
    return name, read_rows(data_dir / "eval" / f"{name}.jsonl")


def build_base(config: dict, data_dir: Path, out_dir: Path, record: Path, threads: int = 2) -> dict:
    model_cfg = config["model"]
    tiny = model_cfg["tiny"]
    torch.set_num_threads(threads)
    start = time.time()
    losses: list[float] = []
    if model_cfg["source"] == "tiny":
        tokenizer = build_char_tokenizer()
        model = build_tiny_llama(len(tokenizer), tiny, tokenizer)
        losses = warm_start(model, tokenizer, read_rows(data_dir / "sft.jsonl"), tiny)
    else:
        tokenizer = load_tokenizer(model_cfg["source"], model_cfg["trust_remote_code"])
        model = load_model(model_cfg["source"], model_cfg["dtype"], model_cfg["trust_remote_code"])
    model = model.to(dtype=getattr(torch, model_cfg["dtype"]))
    task, rows = on_task_eval(config, data_dir)
    max_new = config["data"]["tasks"][task]["max_new_tokens"]
    accuracy = greedy_accuracy(model, tokenizer, rows, max_new)
    log.info("on-task (%s) greedy accuracy %.3f on %d prompts", task, accuracy, len(rows))
    with atomic_dir(out_dir) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
    provenance = {
        "source": model_cfg["source"],
        "dtype": model_cfg["dtype"],
        "parameters": sum(p.numel() for p in model.parameters()),
        "on_task": {"task": task, "greedy_accuracy": accuracy, "n": len(rows), "max_new_tokens": max_new},
        "sft": {
            "steps": len(losses),
            "final_loss": sum(losses[-50:]) / len(losses[-50:]) if losses else None,
        },
        "config_hash": section_hash(config["model"], config["data"]),
        "versions": {"torch": torch.__version__, "python": platform.python_version()},
        "wall_time_s": round(time.time() - start, 2),
    }
    write_json(record, provenance)
    return provenance


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", default="config.yaml")
    parser.add_argument("--data", default="results/data")
    parser.add_argument("--out", default="results/models/base")
    parser.add_argument("--record", default="results/models/base.json")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    config = load_config(args.config)
    build_base(config, Path(args.data), Path(args.out), Path(args.record), args.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
