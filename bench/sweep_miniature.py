"""Sweep of the tiny default: which warm start and GRPO settings make RL improve the held-out on-task score.

The target is a research result (the valid miniature), so it is judged by held-out J at evaluation
settings (pass@1, T and top_p of config ``eval``), never by the training reward, and the whole table is
printed, failures included. Each row builds (or reuses) a base from ``model.tiny`` overrides, trains one
arm for one seed with ``train`` overrides, measures held-out pass@1 every ``eval_every`` steps during
training, and reports dJ on every task against that base.

    .venv/bin/python bench/sweep_miniature.py bench/sweep_miniature.yaml --work /tmp/sweep [--only NAME]

Rows are appended to ``<work>/results.jsonl`` as they finish (a rerun skips finished rows), and the
table is printed from it. Run it alone: CPU time is the budget.
"""

import argparse
import json
import logging
import os
import time
from pathlib import Path

import torch
import yaml

from workflow_scripts import base_model, prepare_data, train
from workflow_scripts.config import validate_config
from workflow_scripts.modeling import load_model, load_tokenizer
from workflow_scripts.rows import read_rows

log = logging.getLogger("sweep")


def merged(config: dict, overrides: dict) -> dict:
    """``config`` with the nested ``overrides`` applied (dicts merge, everything else replaces)."""
    out = dict(config)
    for key, value in overrides.items():
        out[key] = merged(out.get(key, {}), value) if isinstance(value, dict) else value
    return out


def pass1_by_task(model, tokenizer, config: dict, data_dir: Path, seed: int = 123) -> dict[str, float]:
    """Held-out pass@1 of every task at the config's evaluation settings."""
    ev = config["eval"]
    out = {}
    for name, task in config["data"]["tasks"].items():
        rows = read_rows(data_dir / "eval" / f"{name}.jsonl")
        ok = base_model.correct_matrix(
            model, tokenizer, rows, task, ev["n_samples"], ev["temperature"], seed=seed, top_p=ev["top_p"]
        )
        out[name] = sum(sum(c) / len(c) for c in ok) / len(rows)
    return out


def build_base(config: dict, work: Path, name: str) -> dict:
    """The base of this row's ``model`` section (reused when already built); its held-out report."""
    folder, report = work / "bases" / name, work / "bases" / f"{name}.report.json"
    if report.exists():
        return json.loads(report.read_text())
    record = base_model.run(
        config["model"],
        config["data"],
        work / "data",
        folder,
        work / "bases" / f"{name}.json",
        threads=torch.get_num_threads(),
    )
    model = load_model(folder, "float32").eval()
    result = {
        "record": record["on_task"],
        "pass1": pass1_by_task(model, load_tokenizer(folder), config, work / "data"),
    }
    report.write_text(json.dumps(result))
    return result


def held_out_callback(tokenizer, config: dict, data_dir: Path, every: int, curve: list):
    from transformers import TrainerCallback

    on_task = next(n for n, t in config["data"]["tasks"].items() if t["role"] == "on_task")
    only = {**config, "data": {**config["data"], "tasks": {on_task: config["data"]["tasks"][on_task]}}}

    class HeldOut(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            if every and state.global_step % every == 0:
                was = model.training
                with torch.random.fork_rng():
                    value = pass1_by_task(model, tokenizer, only, data_dir)[on_task]
                model.train(was)
                curve.append([state.global_step, round(value, 4)])
                log.info("held-out %s pass@1 at step %d: %.3f", on_task, state.global_step, value)

    return HeldOut()


def run_row(row: dict, defaults: dict, work: Path) -> dict:
    config = validate_config(
        merged(defaults, {"model": {"tiny": row.get("base", {})}, "train": row.get("train", {})})
    )
    base_name = row["base_name"]
    base = build_base(config, work, base_name)
    precision, seed = row.get("precision", "fp32"), int(row.get("seed", 1))
    curve: list = []
    base_dir = work / "bases" / base_name
    tokenizer = load_tokenizer(base_dir)
    started = time.time()
    record = train.run(
        config["train"],
        precision,
        config["precisions"][precision],
        config["model"],
        seed,
        work / "data",
        base_dir,
        work / "runs" / row["name"],
        work / "ckpt" / row["name"],
        threads=torch.get_num_threads(),
        callbacks=[held_out_callback(tokenizer, config, work / "data", row.get("eval_every", 25), curve)],
    )
    model = load_model(work / "runs" / row["name"] / "model", "float32").eval()
    final = pass1_by_task(model, tokenizer, config, work / "data")
    return {
        "name": row["name"],
        "base_name": base_name,
        "base": row.get("base", {}),
        "train": row.get("train", {}),
        "precision": precision,
        "seed": seed,
        "wall_s": round(time.time() - started),
        "base_record": base["record"],
        "base_pass1": base["pass1"],
        "final_pass1": final,
        "dJ": {t: round(final[t] - base["pass1"][t], 4) for t in final},
        "curve": curve,
        "reward_first10": record["rewards"]["reward_first10"],
        "reward_last10": record["rewards"]["reward_last10"],
    }


def table(results: list[dict]) -> str:
    lines = [
        "| row | base | greedy | pass@1 T1 | pass@8 T1 | train | on-task J0 | dJ on-task | "
        "dJ off-task (each) | curve | reward first/last 10% |",
        "|" + "---|" * 10,
    ]
    for r in results:
        rec, on = r["base_record"], r["base_record"]["task"]
        off = ", ".join(f"{t} {d:+.3f}" for t, d in r["dJ"].items() if t != on)
        lines.append(
            f"| {r['name']} | {r['base_name']} {json.dumps(r['base'])} | {rec['greedy_accuracy']:.3f} | "
            f"{rec['pass1_T1']:.3f} | {rec['pass8_T1']:.3f} | {json.dumps(r['train'])} | "
            f"{r['base_pass1'][on]:.3f} | {r['dJ'][on]:+.3f} | {off} | {r['curve']} | "
            f"{r['reward_first10']:.3f}/{r['reward_last10']:.3f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("spec", help="YAML: {config: path, rows: [{name, base_name, base, train, ...}]}")
    parser.add_argument("--work", default="/tmp/rlvr-sweep")
    parser.add_argument("--only", action="append", help="run only these rows (repeatable)")
    parser.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "1")))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", force=True)
    torch.set_num_threads(args.threads)
    spec = yaml.safe_load(Path(args.spec).read_text())
    defaults = yaml.safe_load(Path(spec.get("config", "config.yaml")).read_text())
    work = Path(args.work)
    (work / "bases").mkdir(parents=True, exist_ok=True)
    if not (work / "data" / "train.jsonl").exists():
        prepare_data.run(validate_config(defaults)["data"], work / "data")
    done_file = work / "results.jsonl"
    done = (
        {json.loads(line)["name"] for line in done_file.read_text().splitlines()}
        if done_file.exists()
        else set()
    )
    for row in spec["rows"]:
        if row["name"] in done or (args.only and row["name"] not in args.only):
            continue
        result = run_row(row, defaults, work)
        with open(done_file, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(result) + "\n")
    results = [json.loads(line) for line in done_file.read_text().splitlines()] if done_file.exists() else []
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
