"""prepare_data stage: training prompts, held-out and off-task evaluation sets, the warm-start pool.

Outputs (under ``--out``): train.jsonl, eval/{task}.jsonl, sft.jsonl, prepare.json (counts,
including how many training prompts were dropped as duplicates of an evaluation prompt).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from workflow_scripts import synthetic
from workflow_scripts.atomic import write_json
from workflow_scripts.config import load_config, section_hash
from workflow_scripts.real_datasets import load_dataset_rows
from workflow_scripts.rows import Row, write_rows

log = logging.getLogger("prepare_data")


def build_eval_sets(data_cfg: dict) -> dict[str, list[Row]]:
    """Every configured evaluation task's rows, in config order."""
    train = data_cfg["train"]
    sets: dict[str, list[Row]] = {}
    for name, task in data_cfg["tasks"].items():
        source = task["source"]
        if source == "train_val":
            rows = synthetic.generate(train["family"], task.get("n", train["val_n"]), data_cfg["seed"], name)
        elif source == "synthetic":
            rows = synthetic.generate(task["family"], task.get("n", 200), data_cfg["seed"], name)
        else:
            rows = load_dataset_rows(source, name, task.get("path"), task.get("n"))
        for row in rows:
            row["kind"] = task["kind"]
        if not rows:
            raise ValueError(f"data.tasks.{name}: produced no rows")
        sets[name] = rows
    return sets


def build_train_set(data_cfg: dict) -> list[Row]:
    train = data_cfg["train"]
    if train["source"] == "synthetic":
        rows = synthetic.generate(train["family"], train["n"], data_cfg["seed"], "train")
    else:
        rows = load_dataset_rows(train["source"], "train", train.get("path"), train["n"])
    for row in rows:
        row["kind"] = train["kind"]
    return rows


def deduplicate(train: list[Row], eval_sets: dict[str, list[Row]]) -> tuple[list[Row], dict[str, int]]:
    """Drop training rows whose normalized prompt occurs in any eval set; count drops per eval task."""
    owner: dict[str, str] = {}
    for task, rows in eval_sets.items():
        for row in rows:
            owner.setdefault(synthetic.normalize_prompt(row["prompt"]), task)
    kept, dropped = [], dict.fromkeys(eval_sets, 0)
    for row in train:
        task = owner.get(synthetic.normalize_prompt(row["prompt"]))
        if task is None:
            kept.append(row)
        else:
            dropped[task] += 1
    return kept, dropped


def prepare(data_cfg: dict, out: Path) -> dict:
    eval_sets = build_eval_sets(data_cfg)
    train = build_train_set(data_cfg)
    n_before = len(train)
    dropped = dict.fromkeys(eval_sets, 0)
    if data_cfg["dedup"]:
        train, dropped = deduplicate(train, eval_sets)
    if not train:
        raise ValueError("data.train: no training rows left after deduplication")
    eval_prompts = [row["prompt"] for rows in eval_sets.values() for row in rows]
    sft_mix = data_cfg.get("sft_mix") or {data_cfg["train"]["family"]: 1.0}
    sft = synthetic.sample_mix(sft_mix, data_cfg["sft_n"], data_cfg["seed"], exclude=eval_prompts)

    for task, rows in eval_sets.items():
        write_rows(out / "eval" / f"{task}.jsonl", rows)
    write_rows(out / "sft.jsonl", sft)
    write_rows(out / "train.jsonl", train)
    summary = {
        "config_hash": section_hash(data_cfg),
        "train": {
            "rows": len(train),
            "before_dedup": n_before,
            "dropped_total": sum(dropped.values()),
            "dropped_by_eval_task": dropped,
        },
        "eval": {task: len(rows) for task, rows in eval_sets.items()},
        "sft": {"rows": len(sft), "mix": sft_mix},
    }
    write_json(out / "prepare.json", summary)
    log.info("train rows %d (dropped %d duplicates of eval prompts)", len(train), sum(dropped.values()))
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", default="config.yaml")
    parser.add_argument("--out", default="results/data")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    config = load_config(args.config)
    prepare(config["data"], Path(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
