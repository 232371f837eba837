"""Sweep of the tiny default: which warm start and GRPO settings make RL improve the held-out on-task score.

The target is a research result (the valid miniature), so it is judged by held-out J at evaluation
settings (pass@1, T and top_p of config ``eval``), never by the training reward, and the whole table is
printed, failures included. Each row builds (or reuses) a base from ``model.tiny`` overrides (and ``data``
overrides: the warm-start mix, task sizes), trains one arm for each of its ``seeds`` (default [1]) with
``train`` overrides, measures held-out pass@1 every ``eval_every`` steps during training (0: never), and
reports dJ on every task against that base. A row with several seeds is evaluated by the workflow's own
evaluate stage (``evaluate.run``, with ``eval`` overrides): per task the mean dJ and its SE across seeds,
the across-seed variance of dJ against the mean eval-noise variance of a run (``noise_share`` = their
ratio: the part of the seed variance that is evaluation noise) and the same for KL (noise = its
SE^2). ``base_only: true`` rows build and score the base alone (the warm start's own search).

    .venv/bin/python bench/sweep_miniature.py bench/sweep_miniature.yaml --work /tmp/sweep [--only NAME]
    .venv/bin/python bench/sweep_miniature.py --results DIR/results   # a finished workflow run, same table

Rows are appended to ``<work>/results.jsonl`` as they finish (a rerun skips finished rows), and the
table is printed from it. Run it alone: CPU time is the budget.
"""

import argparse
import hashlib
import json
import logging
import os
import platform
import time
from pathlib import Path

import numpy as np
import torch
import yaml

from workflow_scripts import base_model, evaluate, prepare_data, train
from workflow_scripts.models.modeling import load_model, load_tokenizer
from workflow_scripts.runtime import paths
from workflow_scripts.runtime.config import validate_config
from workflow_scripts.stats import analysis_defaults
from workflow_scripts.tasks.rows import read_rows

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


def short_hash(obj) -> str:
    return hashlib.sha1(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:8]


def data_dir_of(config: dict, work: Path) -> Path:
    """The prepared data of this config's ``data`` section (one folder per distinct section)."""
    out = work / f"data-{short_hash(config['data'])}"
    if not (out / "train.jsonl").exists():
        prepare_data.run(config["data"], out)
    return out


def build_base(config: dict, work: Path, name: str, data_dir: Path) -> dict:
    """The base of this row's ``model`` and ``data`` sections (reused when already built); its report."""
    key = f"{name}-{short_hash([config['model'], config['data']])}"
    folder, report = work / "bases" / key, work / "bases" / f"{key}.report.json"
    if report.exists():
        return json.loads(report.read_text())
    started = time.time()
    record = base_model.run(
        config["model"], config["data"], data_dir, folder, work / "bases" / f"{key}.json",
        threads=torch.get_num_threads(),
    )  # fmt: skip
    wall = round(time.time() - started, 1)
    model = load_model(folder, "float32").eval()
    result = {
        "folder": str(folder),
        "record": record["on_task"],
        "sft": {k: record["sft"].get(k) for k in ("steps", "final_loss", "probe_trace")},
        "wall_s": wall,
        "pass1": pass1_by_task(model, load_tokenizer(folder), config, data_dir),
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


def evaluate_run(config: dict, data_dir: Path, base_dir: Path, model_dir: Path, run: str, out: Path) -> dict:
    """``run`` on every task through the evaluate stage: {task: {summary, kl}} (reused when present)."""
    results = {}
    for task, task_cfg in config["data"]["tasks"].items():
        summary_path, kl_path = out / run / f"{task}.json", out / run / f"{task}.kl.json"
        if not kl_path.exists():
            ref = paths.reference_spec(config, run)
            own = ref["reference_run"] == run
            paired = None if own else out / ref["reference_run"] / f"{task}.samples.parquet"
            evaluate.run(
                model=model_dir, base=base_dir, data=data_dir / "eval" / f"{task}.jsonl",
                samples_out=out / run / f"{task}.samples.parquet", summary_out=summary_path, kl_out=kl_path,
                eval_cfg=config["eval"], task_cfg=task_cfg, run=run, task=task, base_samples=paired,
                threads=torch.get_num_threads(), **ref,
            )  # fmt: skip
        summary, kl = json.loads(summary_path.read_text()), json.loads(kl_path.read_text())
        results[task] = {"summary": summary, "kl": kl}
    return results


def kl_estimator(config: dict) -> str:
    """The KL estimator the analysis reads (``analysis.kl_estimator``, else the schema's default)."""
    return {**analysis_defaults(), **(config.get("analysis") or {})}["kl_estimator"]


def seed_statistics(per_seed: list[dict], config: dict) -> dict:
    """Per task: mean dJ, its SE across seeds, across-seed variance vs mean eval-noise variance, and
    the same for the analysis's KL estimator (its noise: the Monte-Carlo variance given the fixed
    prompts, ``<est>_mc_var``, as the analysis holds out; the squared prompt-level SE where a record
    predates it)."""
    est = kl_estimator(config)
    out = {}
    for task, task_cfg in config["data"]["tasks"].items():
        dj = np.array([r[task]["summary"]["dJ"] for r in per_seed])
        noise = np.array([r[task]["summary"]["eval_noise_var"] for r in per_seed])
        kl = np.array([r[task]["kl"][f"{est}_mean"] for r in per_seed])
        kl_noise = np.array([mc if (mc := r[task]["kl"].get(f"{est}_mc_var")) is not None
                             else (r[task]["kl"][f"{est}_se"] or 0.0) ** 2 for r in per_seed])  # fmt: skip
        var = float(dj.var(ddof=1)) if len(dj) > 1 else None
        kvar = float(kl.var(ddof=1)) if len(kl) > 1 else None
        out[task] = {
            "role": task_cfg["role"],
            "dJ_mean": float(dj.mean()),
            "dJ_se": float(dj.std(ddof=1) / np.sqrt(len(dj))) if len(dj) > 1 else None,
            "dJ_seed_var": var,
            "dJ_noise_var": float(noise.mean()),
            "dJ_noise_share": float(noise.mean() / var) if var else None,
            "kl_mean": float(kl.mean()),
            "kl_seed_var": kvar,
            "kl_noise_var": float(kl_noise.mean()),
            "kl_noise_share": float(kl_noise.mean() / kvar) if kvar else None,
        }
    return out


def run_row(row: dict, defaults: dict, work: Path) -> dict:
    config = validate_config(
        merged(
            defaults,
            {
                "model": {"tiny": row.get("base", {})},
                "train": row.get("train", {}),
                "data": row.get("data", {}),
                "eval": row.get("eval", {}),
            },
        )
    )
    data_dir = data_dir_of(config, work)
    base_name = row["base_name"]
    base = build_base(config, work, base_name, data_dir)
    result = {
        "name": row["name"],
        "cpu": cpu_name(),
        "load_before": round(os.getloadavg()[0], 2),
        "base_name": base_name,
        "base": row.get("base", {}),
        "data": row.get("data", {}),
        "train": row.get("train", {}),
        "eval": row.get("eval", {}),
        "base_record": base["record"],
        "base_sft": base.get("sft"),
        "base_wall_s": base.get("wall_s"),
        "base_pass1": base["pass1"],
    }
    if row.get("base_only"):
        return result
    precision, seeds = row.get("precision", "fp32"), [int(s) for s in row.get("seeds", [row.get("seed", 1)])]
    base_dir = Path(base["folder"]) if "folder" in base else work / "bases" / base_name
    tokenizer = load_tokenizer(base_dir)
    evals = work / "eval" / row["name"]
    curves, finals, per_seed, records = {}, {}, [], []
    started = time.time()
    if len(seeds) > 1:
        base_runs = {paths.reference_spec(config, paths.run_name(precision, 1))["reference_run"]}
        for run in sorted(base_runs):
            evaluate_run(config, data_dir, base_dir, base_dir, run, evals)
    for seed in seeds:
        curve: list = []
        run_dir = work / "runs" / row["name"] / f"seed{seed}"
        record = train.run(
            config["train"], precision, config["precisions"][precision], config["model"], seed, data_dir,
            base_dir, run_dir, work / "ckpt" / row["name"] / f"seed{seed}", threads=torch.get_num_threads(),
            callbacks=[held_out_callback(tokenizer, config, data_dir, row.get("eval_every", 25), curve)],
        )  # fmt: skip
        records.append(record)
        curves[seed] = curve
        if len(seeds) > 1:
            per_seed.append(evaluate_run(config, data_dir, base_dir, run_dir / "model",
                                         paths.run_name(precision, seed), evals))  # fmt: skip
        else:
            model = load_model(run_dir / "model", "float32").eval()
            finals[seed] = pass1_by_task(model, tokenizer, config, data_dir)
    result.update(
        precision=precision,
        seeds=seeds,
        wall_s=round(time.time() - started),
        curve=curves,
        reward_first10=float(np.mean([r["rewards"]["reward_first10"] for r in records])),
        reward_last10=float(np.mean([r["rewards"]["reward_last10"] for r in records])),
    )
    if per_seed:
        result["stats"] = seed_statistics(per_seed, config)
        result["dJ"] = {t: round(v["dJ_mean"], 4) for t, v in result["stats"].items()}
        result["base_pass1"] = {
            t: per_seed[0][t]["summary"]["base_pass_at_1"] for t in config["data"]["tasks"]
        }  # the evaluate stage's own base numbers at this row's eval sizes
    else:
        final = finals[seeds[0]]
        result["final_pass1"] = final
        result["dJ"] = {t: round(final[t] - base["pass1"][t], 4) for t in final}
    return result


def cpu_name() -> str:
    """The CPU model name (rows say where they ran: floats differ between CPUs)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def table(results: list[dict]) -> str:
    """The search table (one line per row, failures included) and, for multi-seed rows, a per-task table."""
    lines = [
        "| row | base | warm start (steps, s) | greedy | pass@1 T1 | pass@8 T1 | train | on-task J0 | "
        "dJ on-task | off-task J0 / dJ (each) | curve | reward first/last 10% |",
        "|" + "---|" * 12,
    ]
    for r in results:
        rec, on = r["base_record"], r["base_record"]["task"]
        dj = r.get("dJ", {})
        off = ", ".join(
            f"{t} {r['base_pass1'][t]:.3f}" + (f" / {dj[t]:+.3f}" if t in dj else "")
            for t in r["base_pass1"] if t != on
        )  # fmt: skip
        sft = r.get("base_sft") or {}
        warm = f"{sft.get('steps', '?')}, {r.get('base_wall_s', '?')}"
        over = {k: r[k] for k in ("base", "data") if r.get(k)}
        lines.append(
            f"| {r['name']} | {r['base_name']} {json.dumps(over)} | {warm} | {rec['greedy_accuracy']:.3f} | "
            f"{rec['pass1_T1']:.3f} | {rec['pass8_T1']:.3f} | {json.dumps(r.get('train', {}))} "
            f"{json.dumps(r.get('eval', {})) if r.get('eval') else ''} {r.get('precision', '')} "
            f"x{len(r.get('seeds', [1])) if 'dJ' in r else 0} | {r['base_pass1'][on]:.3f} | "
            + (f"{dj[on]:+.3f}" if on in dj else "-")
            + f" | {off} | {r.get('curve', '')} | "
            + (f"{r['reward_first10']:.3f}/{r['reward_last10']:.3f}" if "reward_first10" in r else "-")
            + " |"
        )
    multi = [r for r in results if r.get("stats")]
    if multi:
        lines += [
            "",
            "| row | task | role | dJ mean ± SE | seed var dJ | noise var dJ | noise share dJ | KL | "
            "seed var KL | noise var KL | noise share KL |",
            "|" + "---|" * 11,
        ]
        for r in multi:
            for t, v in r["stats"].items():
                lines.append(f"| {r['name']} | {t} | {v['role']} | {_stat_cells(v)} |")
    return "\n".join(lines)


def _stat_cells(v: dict) -> str:
    """A task's seed statistics as table cells: dJ mean ± SE, seed and noise variance, share; KL too."""
    kshare = v["kl_noise_share"]
    return (
        f"{v['dJ_mean']:+.4f} ± {v['dJ_se']:.4f} | {v['dJ_seed_var']:.2e} | {v['dJ_noise_var']:.2e} | "
        f"{v['dJ_noise_share']:.2f} | {v['kl_mean']:.3f} | {v['kl_seed_var']:.2e} | "
        f"{v['kl_noise_var']:.2e} | " + (f"{kshare:.2f}" if kshare is not None else "-")
    )


def workflow_results(results: Path) -> str:
    """The same per-task statistics for every arm of a finished workflow run (``results/`` of a
    ``snakemake`` run, e.g. ``bench/bench_default.py --keep DIR``), read from its eval files."""
    config = validate_config(yaml.safe_load((results.parent / "config.yaml").read_text()))
    lines = [
        "| arm | task | role | base J | dJ mean ± SE | seed var dJ | noise var dJ | noise share dJ | "
        f"KL {kl_estimator(config)} | seed var KL | noise var KL | noise share KL |",
        "|" + "---|" * 12,
    ]
    for precision in config["precisions"]:
        per_seed = []
        for seed in config["seeds"]:
            run = results / "eval" / paths.run_name(precision, seed)
            per_seed.append(
                {
                    task: {
                        "summary": json.loads((run / f"{task}.json").read_text()),
                        "kl": json.loads((run / f"{task}.kl.json").read_text()),
                    }
                    for task in config["data"]["tasks"]
                }
            )
        for task, v in seed_statistics(per_seed, config).items():
            base_j = per_seed[0][task]["summary"]["base_pass_at_1"]
            lines.append(f"| {precision} | {task} | {v['role']} | {base_j:.3f} | {_stat_cells(v)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "spec", nargs="?", help="YAML: {config: path, rows: [{name, base_name, base, train, ...}]}"
    )
    parser.add_argument(
        "--results", type=Path, help="instead: the per-task table of a finished run's results/"
    )
    parser.add_argument("--work", default="/tmp/rlvr-sweep")
    parser.add_argument("--only", action="append", help="run only these rows (repeatable)")
    parser.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "1")))
    args = parser.parse_args(argv)
    if args.results:
        print(workflow_results(args.results))
        return 0
    if not args.spec:
        parser.error("give a sweep spec or --results")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", force=True)
    torch.set_num_threads(args.threads)
    spec = yaml.safe_load(Path(args.spec).read_text())
    defaults = yaml.safe_load(Path(spec.get("config", "config.yaml")).read_text())
    work = Path(args.work)
    (work / "bases").mkdir(parents=True, exist_ok=True)
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
        print(table([result]), flush=True)
    results = [json.loads(line) for line in done_file.read_text().splitlines()] if done_file.exists() else []
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
