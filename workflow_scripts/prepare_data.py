"""prepare_data stage: training prompts, held-out and off-task evaluation sets, the warm-start pool.

Outputs (under ``--out``): train.jsonl, eval/{task}.jsonl, sft.jsonl, curriculum/phase{k}.jsonl (one per
``train.curriculum`` phase: ``build_phase_set``), prepare.json (counts,
including how many training prompts were dropped as duplicates of a REAL evaluation prompt, and how many
bad dataset records were skipped under ``data.on_bad_row: skip``; the default ``error`` stops the
stage at the first bad record, naming file, line and field).
"""

from workflow_scripts.runtime import startup  # noqa: F401  first: no garbage collection during imports

# isort: split

import argparse
import logging
from pathlib import Path

from workflow_scripts.runtime import paths
from workflow_scripts.runtime.atomic import write_json
from workflow_scripts.runtime.config import load_config, section_hash
from workflow_scripts.runtime.hub_copies import copies_by_source, local_path
from workflow_scripts.runtime.smk import main_from
from workflow_scripts.tasks import synthetic
from workflow_scripts.tasks.real_datasets import load_dataset_rows
from workflow_scripts.tasks.rows import Row, read_rows, write_rows
from workflow_scripts.training.curriculum import data_phases

log = logging.getLogger("prepare_data")


SYNTHETIC_SOURCES = ("train_val", "synthetic")


def real_tasks(data_cfg: dict) -> list[str]:
    """Tasks from real (hub/local) datasets: the only eval sets training data can collide with.

    Synthetic eval sets are held out by construction (synthetic.on_side), so the training set and
    the warm-start pool depend on the real eval sets only, and adding a synthetic task reruns nothing
    upstream of its own evaluation.
    """
    return [name for name, task in data_cfg["tasks"].items() if task["source"] not in SYNTHETIC_SOURCES]


def build_eval_set(data_cfg: dict, name: str, skipped: dict[str, list[str]] | None = None,
                   copies: dict[str, str] | None = None) -> list[Row]:  # fmt: skip
    """One evaluation task's rows (bad records skipped -> ``skipped[name]``); ``copies``: {dataset: its hub
    copy} (runtime/hub_copies.py), read where the task has no ``path`` (the job is offline)."""
    train, task = data_cfg.get("train"), data_cfg["tasks"][name]
    skipped = {} if skipped is None else skipped
    source = task["source"]
    if source == "train_val":
        rows = synthetic.generate(train["family"], task.get("n", train["val_n"]), data_cfg["seed"], name)
    elif source == "synthetic":
        rows = synthetic.generate(task["family"], task.get("n", 200), data_cfg["seed"], name)
    else:
        rows = load_dataset_rows(
            source, name, local_path(task, copies), task.get("n"), _on_bad_row(data_cfg),
            skipped.setdefault(name, []),
        )  # fmt: skip
    for row in rows:
        row["kind"] = task["kind"]
    if not rows:
        raise ValueError(f"data.tasks.{name}: produced no rows")
    return rows


def build_eval_sets(data_cfg: dict, skipped: dict[str, list[str]] | None = None) -> dict[str, list[Row]]:
    """Every configured evaluation task's rows, in config order (bad records skipped -> ``skipped``)."""
    return {name: build_eval_set(data_cfg, name, skipped) for name in data_cfg["tasks"]}


def build_train_set(data_cfg: dict, skipped: dict[str, list[str]] | None = None,
                    copies: dict[str, str] | None = None) -> tuple[list[Row], dict]:  # fmt: skip
    """The training rows and how a real source's copy was reduced to them ({records, repeats_dropped,
    conflicting_answers, distinct}; null counts for a synthetic set, whose prompts are distinct by
    construction).

    A real source is de-duplicated within itself by normalized prompt BEFORE the cap ``data.train.n``:
    the hub copy of DAPO-Math-17k holds each of its 17,398 prompts ~100 times (1.79M rows), so the first
    n rows of it would hold ~n/100 distinct prompts. The first occurrence of a prompt is kept; copies
    whose answer differs from the kept one are counted (``conflicting_answers``)."""
    train = data_cfg["train"]
    skipped = {} if skipped is None else skipped
    stats: dict = dict.fromkeys(("records", "repeats_dropped", "conflicting_answers", "distinct"))
    if train["source"] == "synthetic":
        rows = synthetic.generate(train["family"], train["n"], data_cfg["seed"], "train", side="train")
    else:
        loaded = load_dataset_rows(
            train["source"], "train", local_path(train, copies), None, _on_bad_row(data_cfg),
            skipped.setdefault("train", []),
        )  # fmt: skip
        rows, stats = distinct_prompts(loaded)
        rows = rows[: train["n"]] if train["n"] else rows
    for row in rows:
        row["kind"] = train["kind"]
    return rows, stats


def build_phase_set(data_cfg: dict, phase: dict, index: int, train_rows: list[Row],
                    skipped: dict[str, list[str]],
                    copies: dict[str, str] | None = None) -> list[Row]:  # fmt: skip
    """Curriculum phase ``index``'s prompts (``training.curriculum``): a synthetic family's train-side
    problems (held out from every eval set by construction), data.train's own rows (source ``train``),
    or a real source de-duplicated by prompt as data.train is; every row gets data.train's verifier kind."""
    name = f"curriculum{index}"
    if phase["source"] == "train":
        rows = [dict(row) for row in train_rows]
    elif phase["source"] == "synthetic":
        rows = synthetic.generate(phase["family"], phase["n"], data_cfg["seed"], name, side="train")
    else:
        loaded = load_dataset_rows(phase["source"], name, local_path(phase, copies), None,
                                   _on_bad_row(data_cfg), skipped.setdefault(name, []))  # fmt: skip
        rows = distinct_prompts(loaded)[0][: phase["n"]]
    for row in rows:
        row["kind"] = data_cfg["train"]["kind"]
    if not rows:
        raise ValueError(f"train.curriculum.{index}: produced no rows")
    return rows


def distinct_prompts(rows: list[Row]) -> tuple[list[Row], dict]:
    """``rows`` with each normalized prompt once (first occurrence, order kept) and the counts."""
    first: dict[str, Row] = {}
    conflicting = 0
    for row in rows:
        key = synthetic.normalize_prompt(row["prompt"])
        kept = first.setdefault(key, row)
        if kept is not row and str(kept["answer"]) != str(row["answer"]):
            conflicting += 1
    kept_rows = list(first.values())
    return kept_rows, {"records": len(rows), "repeats_dropped": len(rows) - len(kept_rows),
                       "conflicting_answers": conflicting, "distinct": len(kept_rows)}  # fmt: skip


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


def run(data: dict, out: str | Path, tasks: list[str] | None = None, train: bool = True,
        curriculum: list[dict] | None = None, copies: dict[str, str] | None = None) -> dict:  # fmt: skip
    """The stage: eval sets of ``tasks`` (None = every task) and, if ``train``, train/sft/prepare.json.

    The workflow runs it per task (``prepare_eval``: one task, ``train=False``) and once for the
    training side (``prepare_train``: ``tasks=[]``; the real eval sets it deduplicates against are
    read from ``out/eval/``, its inputs). The CLI runs everything. ``curriculum``: the phases'
    data specs (``curriculum.data_phases``), prepared with the training side. ``copies``: the hub
    datasets' local copies, {name: file} (rules/fetch.smk), read instead of the hub.
    """
    out = Path(out)
    skipped: dict[str, list[str]] = {}
    names = list(data["tasks"]) if tasks is None else tasks
    built = {name: build_eval_set(data, name, skipped, copies) for name in names}
    for name, rows in built.items():
        write_rows(out / "eval" / f"{name}.jsonl", rows)
        log.info("eval set %s: %d rows", name, len(rows))
    if not train:
        _warn_skipped(skipped)
        return {"eval": {name: len(rows) for name, rows in built.items()}}
    real = {}
    for name in real_tasks(data):
        if name in built:
            real[name] = built[name]
            continue
        real[name] = read_rows(out / "eval" / f"{name}.jsonl")
        if _on_bad_row(data) == "skip":  # its prepare_eval job skipped them: count them in prepare.json
            build_eval_set(data, name, skipped, copies)
    return prepare_train(data, out, real, {name: len(rows) for name, rows in built.items()}, skipped,
                         curriculum or [], copies)  # fmt: skip


def from_snakemake(smk) -> None:
    """prepare_eval: one task's eval set; prepare_train: the training side (rules/prepare_data.smk)."""
    copies = copies_by_source(smk.input.hub)  # hub datasets, fetched by the local rule fetch_dataset
    if smk.rule == "prepare_eval":
        out = Path(smk.output.eval).parent.parent
        run(dict(smk.params.data), out, tasks=[smk.wildcards.task], train=False, copies=copies)
    else:
        run(dict(smk.params.data), Path(smk.output.train).parent, tasks=[],
            curriculum=list(smk.params.curriculum), copies=copies)  # fmt: skip


def _on_bad_row(data_cfg: dict) -> str:
    return data_cfg["on_bad_row"]  # schema default: "error"


def prepare(data_cfg: dict, out: Path, curriculum: list[dict] | None = None) -> dict:
    """Every data set of ``data_cfg`` (and the curriculum's phases) into ``out`` (what the workflow's
    prepare rules do together)."""
    return run(data_cfg, out, curriculum=curriculum)


def prepare_train(
    data_cfg: dict,
    out: Path,
    real_eval_sets: dict[str, list[Row]],
    eval_counts: dict[str, int],
    skipped: dict[str, list[str]],
    curriculum: list[dict] = (),
    copies: dict[str, str] | None = None,
) -> dict:
    """train.jsonl (deduplicated against the REAL eval sets), the curriculum's phases (the same),
    sft.jsonl and prepare.json."""
    train, within = build_train_set(data_cfg, skipped, copies)
    n_before = len(train)
    dropped = dict.fromkeys(real_eval_sets, 0)
    if data_cfg["dedup"]:
        train, dropped = deduplicate(train, real_eval_sets)
    if not train:
        raise ValueError("data.train: no training rows left after deduplication")
    eval_prompts = [row["prompt"] for rows in real_eval_sets.values() for row in rows]
    sft_mix = data_cfg.get("sft_mix") or {data_cfg["train"]["family"]: 1.0}
    sft = synthetic.sample_mix(sft_mix, data_cfg["sft_n"], data_cfg["seed"], exclude=eval_prompts)
    write_rows(out / "sft.jsonl", sft)
    write_rows(out / "train.jsonl", train)
    phase_rows = []
    for index, phase in enumerate(curriculum):
        rows = build_phase_set(data_cfg, phase, index, train, skipped, copies)
        if data_cfg["dedup"]:
            rows = deduplicate(rows, real_eval_sets)[0]
        if not rows:
            raise ValueError(f"train.curriculum.{index}: no rows left after deduplication")
        write_rows(paths.curriculum_file(out, index), rows)
        phase_rows.append(len(rows))
    summary = {
        "config_hash": section_hash(data_cfg),
        "train": {
            "rows": len(train),
            "before_dedup": n_before,
            "source": within,
            "dropped_total": sum(dropped.values()),
            "dropped_by_eval_task": dropped,
        },
        "curriculum": phase_rows,
        "eval": eval_counts,
        "sft": {"rows": len(sft), "mix": sft_mix},
        "bad_rows": {
            "policy": _on_bad_row(data_cfg),
            "skipped": sum(len(m) for m in skipped.values()),
            "by_task": {task: len(m) for task, m in skipped.items() if m},
            "first": [m for ms in skipped.values() for m in ms][:20],  # file:line: field ...
        },
    }
    write_json(out / "prepare.json", summary)
    log.info("train rows %d (dropped %d duplicates of eval prompts; the source's copy: %s)", len(train),
             sum(dropped.values()), within)  # fmt: skip
    _warn_skipped(skipped)
    return summary


def _warn_skipped(skipped: dict[str, list[str]]) -> None:
    first = [m for ms in skipped.values() for m in ms]
    if first:
        log.warning("skipped %d bad dataset records (data.on_bad_row: skip): %s", len(first), first[:3])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", default="config.yaml")
    parser.add_argument("--out", default=str(paths.data_dir()))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    config = load_config(args.config)
    run(config["data"], args.out, curriculum=data_phases(config["train"]))
    return 0


if __name__ == "__main__":
    main_from(globals())
