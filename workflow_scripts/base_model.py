"""base_model stage: build (or load) the base policy pi_0 and record its on-task headroom for RL.

``model.source: tiny`` builds the tokenizer of ``model.tiny.tokenizer`` (char-level, or a BPE learnt from
the warm-start pool with digits kept single, models/modeling.py) and a Llama of the ``model.tiny``
dimensions locally and warm-starts it with a short supervised fine-tune on the warm-start pool
(sft.jsonl), on the GPU when there is one (the GPU smoke check builds a 0.36B model this way). Any
other source (a local folder or a hub id) is loaded with an explicit dtype and saved as is.

Why near-miss labels. RLVR mostly sharpens what the base already samples: its gain is bounded by what
the policy samples at the training temperature (pass@k at T 1) minus what it already gets at
evaluation settings (pass@1). A clean warm start of this tiny model either knows an answer (and
sampling at T 0.7 / top_p 0.8 finds it) or does not (and RL rarely samples it): measured, no held-out
gain at all. ``model.tiny.near_miss`` makes a fraction ``rate`` of the warm-start labels a near miss of
the right answer, the gain RLVR gets at scale from a base that sometimes misses the expected format:

| kind        | label for answer ``59`` | what RL must learn                                   |
|-------------|-------------------------|------------------------------------------------------|
| no_stop     | ``599`` then end        | stop after the answer (one decision; survives top_p)  |
| off_by_one  | ``58`` or ``60``        | sharpen the last digit (pruned by top_p at eval)      |

So the right answer is often sampled but, at a rate above 0.5, not yet the mode. Families that share
the near miss in other surface forms (``near_miss.families``) can take up RL's on-task lesson by
transfer, which is what makes off-task evaluations move.

Why a stopping rule (``model.tiny.stop``). Floats differ between CPUs, and so does the accuracy a fixed
number of warm-start steps reaches; stopping at a target greedy accuracy on a held-out train-side probe
gives every machine the same headroom, and ends the warm start as soon as it is there. With ``stop.floors``
the off-task families must also be off the floor at the stop (sampled pass@1 on their own held-out
probes, checked only once the on-task target holds): when the on-task target comes early, the
families RL should move by transfer have learnt less, and a family on the floor cannot show a change.
base.json records greedy accuracy, pass@1 and pass@8 at T 1 on the on-task set (the headroom); every
task's pass@1 at evaluation settings is in eval/base/{task}.json, one owner for those numbers.

Why a shipped base (``model.shipped``). The stopping rule gives every CPU the same headroom, not the
same model: a warm start of ~800 steps on one CPU kind ends in other weights than on another (a Xeon
built a base with word pass@1 0.384 where an EPYC's had 0.288), and every conclusion of a run is
conditional on its base. The default therefore starts from a base built once and shipped (data/base:
safetensors, tokenizer, config and manifest.json with each file's sha256 and the recipe, the model and
data keys it was built from). The stage checks the files and that the config's recipe is the shipped
one (runtime/shipped_base.py), then loads it; ``make base`` rebuilds it (``--ship``).
"""

from workflow_scripts.runtime import startup  # noqa: F401  first: no garbage collection during imports

# isort: split

import argparse
import json
import logging
import math
import platform
import random
import re
import shutil
import time
from pathlib import Path

import torch

from workflow_scripts.models.generation import sample_completions
from workflow_scripts.models.modeling import (
    build_tiny_llama,
    build_tiny_tokenizer,
    load_model,
    load_tokenizer,
)
from workflow_scripts.runtime import paths
from workflow_scripts.runtime.atomic import atomic_dir, inputs_key, write_json
from workflow_scripts.runtime.config import load_config, section_hash
from workflow_scripts.runtime.numerics import numerics_provenance
from workflow_scripts.runtime.seeds import derive_seed
from workflow_scripts.runtime.shipped_base import check_shipped, recipe, ship, shipped_dir
from workflow_scripts.runtime.smk import main_from
from workflow_scripts.runtime.threads import log_startup, process_age_s
from workflow_scripts.tasks.rows import Row, read_rows
from workflow_scripts.verify.verifiers import verify_batch

log = logging.getLogger("base_model")


NEAR_MISS_KINDS = ("no_stop", "off_by_one")
# A floor's probe is held out of the warm start: at most 1/4 of its family's distinct problems (mul has ~200
# train-side problems in all; a probe of 200 would leave the warm start none).
MIN_FLOOR_POOL_FACTOR = 4
# Prompts a loaded model's headroom scores between two saves (``headroom``'s resume): MATH-500 in 8 chunks.
HEADROOM_CHUNK = 64


def near_misses(answer: str, kinds: tuple[str, ...] | list[str]) -> list[str]:
    """The near-miss labels of ``answer`` of the given kinds (see the module table); may be empty."""
    a = answer.strip()
    out: list[str] = []
    if "off_by_one" in kinds:
        if re.fullmatch(r"-?\d+", a):
            out += [str(int(a) + 1), str(int(a) - 1)]
        elif len(a) == 1 and a.isalpha():  # a choice letter: the neighbouring letter
            out.append(chr(ord(a) + 1) if a < "D" else chr(ord(a) - 1))
    if "no_stop" in kinds and a:
        out.append(a + a[-1])
    return out


def sft_batches(
    rows: list[Row], tokenizer, batch_size: int, steps: int, seed: int, near_miss: dict | None = None
):
    """Yield (input_ids, attention_mask, labels) batches; loss only on the answer and end token.

    Each batch is drawn from one length bucket (the bucket picked with probability proportional to
    its size, so the mix is kept in expectation): short arithmetic rows are not padded to the
    length of the occasional word problem, which would multiply the cost of every step. With
    ``near_miss`` ({rate, kinds, families}) each drawn label of a listed family is replaced, with
    probability rate, by one of its near misses chosen uniformly (a fresh draw each time it is drawn).
    """
    rng = random.Random(seed)
    rate = float((near_miss or {}).get("rate", 0.0))
    kinds = tuple((near_miss or {}).get("kinds", ()))
    families = (near_miss or {}).get("families")  # None: every family
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    misses_of = [
        near_misses(r["answer"], kinds)
        if rate and (families is None or (r.get("meta") or {}).get("family") in families)
        else []
        for r in rows
    ]
    texts = (
        t for r, misses in zip(rows, misses_of, strict=True) for t in (r["prompt"], r["answer"], *misses)
    )
    token_ids = encode_distinct(tokenizer, texts)

    buckets: dict[int, list[tuple[list[int], list[int], list[list[int]]]]] = {}
    for r, misses in zip(rows, misses_of, strict=True):
        p = token_ids[r["prompt"]]
        a = token_ids[r["answer"]] + [eos]
        encoded_misses = [token_ids[m] + [eos] for m in misses]
        buckets.setdefault((len(p) + len(a) + 3) // 4, []).append((p, a, encoded_misses))
    keys = sorted(buckets)
    sizes = [len(buckets[k]) for k in keys]
    for _ in range(steps):
        bucket = buckets[rng.choices(keys, sizes)[0]]
        batch = []
        for _ in range(batch_size):
            p, a, misses = bucket[rng.randrange(len(bucket))]
            if misses and rng.random() < rate:
                a = misses[rng.randrange(len(misses))]
            batch.append((p, a))
        width = max(len(p) + len(a) for p, a in batch)
        ids, mask, labels = [], [], []  # left-padded rows as lists, one tensor each: 3x faster a batch
        for p, a in batch:
            n_pad = width - len(p) - len(a)
            ids.append([pad] * n_pad + p + a)
            mask.append([0] * n_pad + [1] * (len(p) + len(a)))
            labels.append([-100] * (n_pad + len(p)) + a)
        yield torch.tensor(ids), torch.tensor(mask), torch.tensor(labels)


def encode_distinct(tokenizer, texts) -> dict[str, list[int]]:
    """Token ids of every distinct text, in one batch call: the pool repeats its ~26k problems over 100k
    rows, and one tokenizer call per row took ~10 s of the warm start's ~110 (the ids are the same)."""
    distinct = list(dict.fromkeys(texts))
    encoded = tokenizer(distinct, add_special_tokens=False)["input_ids"] if distinct else []
    return dict(zip(distinct, encoded, strict=True))


def stop_probe(rows: list[Row], family: str, n: int) -> tuple[list[Row], list[Row]]:
    """(probe, rest): the first ``n`` distinct ``family`` prompts of the pool, and the pool without them.

    The probe is train-side (the pool is) and held out of the warm start itself, so the stopping rule
    measures generalization, not memorized rows; its labels are the clean answers (near misses are
    drawn per batch, never stored)."""
    chosen: dict[str, Row] = {}
    for r in rows:
        if len(chosen) == n:
            break
        if (r.get("meta") or {}).get("family") == family and r["prompt"] not in chosen:
            chosen[r["prompt"]] = r
    rest = [r for r in rows if r["prompt"] not in chosen]
    return list(chosen.values()), rest


def warm_start(
    model, tokenizer, rows: list[Row], tiny: dict, probe: list[Row] | None = None, task: dict | None = None,
    floor_probes: dict[str, list[Row]] | None = None,
) -> tuple[list[float], list[list]]:  # fmt: skip
    """Supervised fine-tune (AdamW, linear warm-up then cosine decay over ``sft_steps``).

    With ``tiny.stop`` ({greedy_accuracy, every, probe_n, floors, ...}) and a ``probe`` (rows of the
    on-task family, scored with the on-task ``task``'s verifier), greedy accuracy on the probe is
    checked every ``every`` steps and the warm start ends at the first check that reaches the target
    and, once it does, finds every family of ``floor_probes`` at or above its floor (``floors``):
    the same headroom on every CPU, whose floats differ, at a fraction of the fixed-length cost
    (``sft_steps`` is then the longest it may run, and the horizon of the cosine). Returns (loss
    curve, [[step, accuracy], ...]); a check that scored the floors has them as a third entry.
    """
    steps = tiny["sft_steps"]
    if steps == 0:
        return [], []
    stop = tiny.get("stop") if probe else None
    betas = tuple(tiny.get("sft_betas", (0.9, 0.999)))
    opt = torch.optim.AdamW(model.parameters(), lr=tiny["sft_lr"], betas=betas, weight_decay=0.0)
    warmup = max(1, steps // 20)

    def schedule(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    model.train()
    losses: list[float] = []
    trace: list[list] = []
    batches = sft_batches(rows, tokenizer, tiny["sft_batch_size"], steps, tiny["seed"], tiny.get("near_miss"))
    device = next(model.parameters()).device
    for step, (ids, mask, labels) in enumerate(batches, 1):
        ids, mask, labels = ids.to(device), mask.to(device), labels.to(device)
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
        if stop and step % stop["every"] == 0:
            with torch.random.fork_rng():
                ok = correct_matrix(model, tokenizer, probe, task, 1, 0.0)
            accuracy = sum(c[0] for c in ok) / len(ok)
            trace.append([step, round(accuracy, 4)])
            log.info("sft step %d: probe greedy accuracy %.3f (target %s)", step, accuracy,
                     stop["greedy_accuracy"])  # fmt: skip
            reached = accuracy >= stop["greedy_accuracy"]
            if reached and floor_probes:
                levels = floor_levels(model, tokenizer, floor_probes, stop, task)
                trace[-1].append(levels)
                log.info("sft step %d: off-task probe pass@1 %s (floors %s)", step, levels, stop["floors"])
                reached = all(levels[f] >= stop["floors"][f] for f in floor_probes)
            model.train()
            if reached:
                break
    model.eval()
    return losses, trace


def floor_levels(model, tokenizer, probes: dict[str, list[Row]], stop: dict, task: dict) -> dict[str, float]:
    """Sampled pass@1 of each family's probe (``floor_samples`` a problem at ``floor_temperature`` /
    ``floor_top_p``, the evaluation settings; the on-task ``task``'s answer budget and verifier)."""
    n = stop["floor_samples"]
    levels = {}
    for family, rows in probes.items():
        with torch.random.fork_rng():
            ok = correct_matrix(model, tokenizer, rows, task, n, stop["floor_temperature"], seed=2,
                                top_p=stop["floor_top_p"])  # fmt: skip
        levels[family] = round(sum(sum(c) / n for c in ok) / len(ok), 4)
    return levels


def correct_matrix(
    model, tokenizer, rows: list[Row], task: dict, n: int, temperature: float, seed: int = 0,
    top_p: float = 1.0,
) -> list[list[bool]]:  # fmt: skip
    """Verdicts of ``n`` samples per row (greedy when temperature is 0), scored by the task's verifier."""
    completions = sample_completions(
        model, tokenizer, [r["prompt"] for r in rows], n_samples=n, temperature=temperature, top_p=top_p,
        max_new_tokens=task["max_new_tokens"], seed=seed,
    )  # fmt: skip
    verdicts = verify_batch(
        rows[0]["kind"],
        [c.text for c in completions],
        [r["answer"] for r in rows for _ in range(n)],
        [r["meta"] for r in rows for _ in range(n)],
        settings=task.get("verifier"),
    )
    return [[v.correct for v in verdicts[i * n : (i + 1) * n]] for i in range(len(rows))]


def headroom(model, tokenizer, rows: list[Row], task: dict, k: int = 8, resume: Path | None = None) -> dict:
    """Greedy accuracy, pass@1 and pass@k at T 1 (the training temperature) on ``rows``.

    With ``resume`` (a folder; a loaded model, whose sampling at 7B and 3072 tokens takes hours) the
    prompts go in chunks of HEADROOM_CHUNK, each chunk's verdicts saved there as it ends (sampled chunk
    i seeded ``derive_seed(1, "headroom", i)``, so a resumed run draws what an unbroken one does), and a
    retry after a kill scores only the chunks not saved."""
    if resume is None:
        greedy = correct_matrix(model, tokenizer, rows, task, 1, 0.0)
        sampled = correct_matrix(model, tokenizer, rows, task, k, 1.0, seed=1)
        restored = None
    else:
        greedy, sampled, restored = [], [], 0
        for i, start in enumerate(range(0, len(rows), HEADROOM_CHUNK)):
            chunk = rows[start : start + HEADROOM_CHUNK]
            for part, n, temperature, out in (("greedy", 1, 0.0, greedy), ("sampled", k, 1.0, sampled)):
                saved = resume / f"{part}-{i:05d}.json"
                if saved.is_file():
                    out += json.loads(saved.read_text())
                    restored += 1
                    continue
                seed = derive_seed(1, "headroom", i) if n > 1 else 0
                verdicts = correct_matrix(model, tokenizer, chunk, task, n, temperature, seed=seed)
                write_json(saved, verdicts)
                out += verdicts
                log.info("headroom %s chunk %d: %d prompts scored (%s)", part, i, len(chunk), saved)
    room = {
        "greedy_accuracy": sum(c[0] for c in greedy) / len(rows),
        "pass1_T1": sum(sum(c) / k for c in sampled) / len(rows),
        f"pass{k}_T1": sum(any(c) for c in sampled) / len(rows),
        "n": len(rows),
    }
    if restored is not None:
        room["chunks_restored"] = restored  # chunk parts an earlier, killed attempt had scored
    return room


def headroom_resume_dir(record: Path, model: dict, task: dict, files: list[str | Path | None]) -> Path:
    """Where a loaded model's headroom chunks wait for a retry: beside the workflow's other resume
    folders (results/resume/), keyed by the model and task settings and the model's and task's files
    (``inputs_key``), so a changed input never reuses another input's chunks."""
    key = inputs_key([model, task, HEADROOM_CHUNK], files)
    return Path(record).parent.parent / "resume" / "base_model" / key


def on_task_eval(config: dict, data_dir: Path) -> tuple[str, list[Row]]:
    name = next(n for n, t in config["data"]["tasks"].items() if t["role"] == "on_task")
    return name, read_rows(data_dir / "eval" / f"{name}.jsonl")


def run(
    model: dict, data: dict, data_dir: str | Path, out_dir: str | Path, record: str | Path, threads: int = 2,
    load_from: str | None = None,
) -> dict:  # fmt: skip
    """The stage: the base model of config ``model:`` into ``out_dir``, its provenance into ``record``
    (a hub ``model.source`` read from ``load_from``, its copy, when given).

    Of ``data`` the on-task entry is scored (its greedy accuracy is recorded), in the workflow and
    the CLI alike, so the record's config_hash does not change when an off-task task is added; with
    ``model.shipped`` the rest of it is the recipe the shipped base is checked against.
    """
    log_startup(process_age_s())  # the tiny model is built, not loaded: its time is the stage's work
    on_task = next(n for n, t in data["tasks"].items() if t["role"] == "on_task")
    config = {"model": model, "data": {"tasks": {on_task: data["tasks"][on_task]}}}
    shipped = None
    if model.get("shipped"):
        folder = shipped_dir(model["shipped"])
        shipped = {
            "path": str(model["shipped"]),
            "folder": folder,
            "manifest": check_shipped(folder, recipe(model, data)),
        }
        if unchecked := shipped["manifest"]["unchecked_keys"]:
            log.warning("model.shipped: config keys newer than the shipped base's recipe: %s", unchecked)
    return build_base(config, Path(data_dir), Path(out_dir), Path(record), threads=threads, shipped=shipped,
                      load_from=load_from)  # fmt: skip


def from_snakemake(smk) -> None:
    run(
        dict(smk.params.model),
        dict(smk.params.data),
        Path(smk.input.sft).parent,
        smk.output.model,
        smk.output.record,
        threads=smk.threads,
        load_from=smk.input.get("hub_model"),  # rules/fetch.smk's copy of a hub model.source
    )


def build_base(
    config: dict, data_dir: Path, out_dir: Path, record: Path, threads: int = 2, shipped: dict | None = None,
    load_from: str | None = None,
) -> dict:  # fmt: skip
    """The base model into ``out_dir`` and its record; ``load_from``: where a hub id's copy is."""
    model_cfg = config["model"]
    tiny = model_cfg["tiny"]
    torch.set_num_threads(threads)
    start = time.time()
    losses: list[float] = []
    trace: list[list] = []
    device = "cuda" if torch.cuda.is_available() else "cpu"
    task, rows = on_task_eval(config, data_dir)
    task_cfg = config["data"]["tasks"][task]
    resume = None  # a loaded model's headroom chunks (headroom); built and shipped bases score at once
    built = model_cfg["source"] == "tiny" and shipped is None
    if shipped is not None:  # checked (check_shipped): the same bits on every machine
        tokenizer = load_tokenizer(shipped["folder"])
        model = load_model(shipped["folder"], model_cfg["dtype"])
    elif built:
        pool = read_rows(data_dir / "sft.jsonl")
        # prompts and answers apart, as sft_batches tokenizes them: no merge spans the two
        texts = (t for r in pool for t in (r["prompt"], r["answer"]))
        tokenizer = build_tiny_tokenizer(tiny.get("tokenizer"), texts)
        model = build_tiny_llama(len(tokenizer), tiny, tokenizer).to(device)
        probe, floor_probes = None, {}
        if tiny.get("stop"):
            family = (rows[0].get("meta") or {}).get("family")
            probe, pool = stop_probe(pool, family, tiny["stop"]["probe_n"])
            if not probe:
                raise ValueError(f"model.tiny.stop: the warm-start pool has no {family!r} rows to probe")
            for other in tiny["stop"].get("floors") or {}:
                distinct = len({r["prompt"] for r in pool if (r.get("meta") or {}).get("family") == other})
                if distinct < MIN_FLOOR_POOL_FACTOR * tiny["stop"]["probe_n"]:
                    raise ValueError(
                        f"model.tiny.stop.floors.{other}: the warm-start pool has {distinct} distinct "
                        f"{other} problems; a held-out probe of {tiny['stop']['probe_n']} would take more "
                        f"than 1/{MIN_FLOOR_POOL_FACTOR} of them out of the warm start (drop the floor or "
                        "lower probe_n)"
                    )
                floor_probes[other], pool = stop_probe(pool, other, tiny["stop"]["probe_n"])
        losses, trace = warm_start(model, tokenizer, pool, tiny, probe, task_cfg, floor_probes)
    else:  # a local folder, or a hub id's copy (load_from: rules/fetch.smk; the job is offline)
        source = load_from or model_cfg["source"]
        tokenizer = load_tokenizer(source, model_cfg["trust_remote_code"])
        model = load_model(source, model_cfg["dtype"], model_cfg["trust_remote_code"])
        files = [source if Path(source).exists() else None, data_dir / "eval" / f"{task}.jsonl"]
        resume = headroom_resume_dir(record, model_cfg, task_cfg, files)
    model = model.to(device=device, dtype=getattr(torch, model_cfg["dtype"]))
    room = headroom(model, tokenizer, rows, task_cfg, resume=resume)
    log.info("on-task (%s) headroom on %d prompts: %s", task, len(rows), room)
    with atomic_dir(out_dir) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
    provenance = {
        "source": model_cfg["source"],
        "dtype": model_cfg["dtype"],
        "parameters": sum(p.numel() for p in model.parameters()),
        "device": device,
        "on_task": {"task": task, **room, "max_new_tokens": task_cfg["max_new_tokens"]},
        "near_miss": tiny.get("near_miss") if model_cfg["source"] == "tiny" else None,
        # the shipped base it loaded (model.shipped; its manifest's sha256s and recipe), null when built here
        "shipped": None
        if shipped is None
        else {
            "path": shipped["path"],
            "recipe_hash": shipped["manifest"]["recipe_hash"],
            "files": shipped["manifest"]["files"],
            "built": shipped["manifest"]["built"],
            "unchecked_keys": shipped["manifest"]["unchecked_keys"],
        },
        # char or bpe (model.tiny.tokenizer.kind, the schema fills it) for a built model
        "tokenizer": {
            "kind": tiny["tokenizer"]["kind"] if model_cfg["source"] == "tiny" else "loaded",
            "vocab_size": len(tokenizer),
        },
        "sft": {
            "steps": len(losses),
            "final_loss": sum(losses[-50:]) / len(losses[-50:]) if losses else None,
            # the stopping rule (model.tiny.stop) and its probe checks: [[step, greedy accuracy], ...]
            "stop": tiny.get("stop") if model_cfg["source"] == "tiny" else None,
            "stopped_early": bool(losses) and len(losses) < tiny["sft_steps"],
            "probe_trace": trace,
        },
        "config_hash": section_hash(config["model"], config["data"]),
        "versions": {"torch": torch.__version__, "python": platform.python_version()},
        "numerics": numerics_provenance(),
        "wall_time_s": round(time.time() - start, 2),
    }
    if shipped is not None:  # the warm start ran where the base was built: its record, not an empty one
        provenance["sft"] = shipped["manifest"]["built"]["sft"]
    write_json(record, provenance)
    if resume is not None:  # done: a later run with the same inputs scores afresh
        shutil.rmtree(resume, ignore_errors=True)
    return provenance


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", default="config.yaml")
    parser.add_argument("--data", default=str(paths.data_dir()))
    parser.add_argument("--out", default=str(paths.base_model_dir()))
    parser.add_argument("--record", default=str(paths.base_record()))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--ship",
        metavar="DEST",
        help="do not build: copy the base already built in --out (its record --record) to DEST with a "
        "manifest (sha256s, the recipe of --config with model.shipped ignored): `make base`",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    config = load_config(args.config)
    if args.ship:
        built = json.loads(Path(args.record).read_text())
        if built.get("shipped") or built.get("source") != "tiny":
            raise SystemExit(f"{args.record}: not a base built from model.source tiny here; nothing to ship")
        manifest = ship(
            Path(args.out), Path(args.record), Path(args.ship), recipe(config["model"], config["data"])
        )
        log.info(
            "shipped %d files to %s (recipe %s)", len(manifest["files"]), args.ship, manifest["recipe_hash"]
        )
        return 0
    run(config["model"], config["data"], args.data, args.out, args.record, args.threads)
    return 0


if __name__ == "__main__":
    main_from(globals())
