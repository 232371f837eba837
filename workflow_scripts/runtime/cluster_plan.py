"""Planning a cluster run: for each shipped GPU config, the hardware it fits, its wall time on one 8-GPU
node and on N nodes, its GPU-hours, its disk and its network needs (docs/cluster.md's table is this
module's output: ``python -m workflow_scripts.runtime.cluster_plan --write docs/cluster.md``).

No GPU has run these configs at scale: every time below is an ESTIMATE, a range from a fast end to a slow
end of stated throughput assumptions (the named constants), not a measurement. Replace them with a
pilot's numbers (docs/cluster.md, "A pilot that stops after training").

| quantity            | how                                                                                 |
|---------------------|-------------------------------------------------------------------------------------|
| fits H100 / H200    | ``memory_plan.problems`` with gpu.memory_gb 80 / 141: no arm over the reported total |
|                     | and every colocated engine's floor within its share                                 |
| train job, per run  | rollouts: max_steps x prompts_per_step x num_generations completions of             |
|                     | max_completion_length x MEAN_LENGTH tokens (x DYNAMIC_SAMPLING_REDRAW with dynamic   |
|                     | sampling) + the held-out curves (``heldout_spec``), at ROLLOUT_TOKENS_PER_S per GPU  |
|                     | (a 7B model in bf16; scaled by ROLLOUT_REFERENCE_BYTES / (P x the arm's bytes):     |
|                     | decoding is memory-bound); the update: (8 with activation checkpointing, else 6) +  |
|                     | 2 (old log-probs, when a round feeds several optimizer steps) x P FLOPs a token of  |
|                     | prompt + completion at PEAK_TFLOPS[compute dtype] x UPDATE_MFU on every GPU of the  |
|                     | job; the KL log (kl_prompts x kl_samples                                            |
|                     | every kl_every steps) with the HF sampler at resources.evaluate.kl_tokens_per_s (in |
|                     | lockstep on every rank: not split); + TRAIN_STARTUP_MIN                             |
| evaluate job        | ``resources.evaluate_minutes`` (the job's time limit: its estimate x EVAL_MARGIN)    |
|                     | for the slow end, that / EVAL_MARGIN for the fast end; problem counts of the public |
|                     | sets in DATASET_PROBLEMS                                                            |
| base_model job      | ``resources.base_model_minutes`` likewise (a hub model); TINY_BASE_MIN for ``tiny``  |
| wall time           | phases one after another (base_model, train, evaluate); in a phase, jobs go longest |
|                     | first to the next free slot of (NODE_GPUS // job GPUs) x nodes: one slot = the sum  |
| GPU-hours           | each job's hours x its GPUs, summed (the same on any number of nodes)               |
| disk                | a checkpoint = P x param bytes x (weights + 2 AdamW moments; gradients not saved),  |
|                     | CHECKPOINTS_AT_SAVE of them while a save rotates (save_total_limit 1), for every    |
|                     | run training at once; + each run's final model (P x param bytes) + the base model   |
|                     | and its hub copy (P x model.dtype bytes each)                                       |
| network             | only the fetch rules (rules/fetch.smk) on the controller's node; every other job    |
|                     | runs with HF_HUB_OFFLINE=1                                                          |

Snakemake overlaps the phases where GPUs are free (a finished run's evaluation beside later runs' training),
so the wall time is an upper bound for the throughputs assumed. Torch-free.
"""

from __future__ import annotations

import argparse
import copy
import math
import string
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from workflow_scripts.runtime import hub_copies, memory_plan, paths, resources
from workflow_scripts.training.heldout_spec import heldout_spec, heldout_steps

REPO = Path(__file__).resolve().parents[2]
GPU_CONFIGS = ("config.gpu-smoke.yaml", "config.gpu-check.yaml", "config.one-node.yaml", "config.paper.yaml")
COMMAND = "python -m workflow_scripts.runtime.cluster_plan --write docs/cluster.md"
GPU_RULES = ("base_model", "train", "evaluate")  # the rules whose jobs hold GPUs in the GPU configs
NODE_GPUS = 8  # GPUs of one node (an 8 x H100 / H200 node)
HARDWARE = {"H100": 80, "H200": 141}  # nominal GB per GPU; memory_plan.reported_gib takes 0.99 of it
GB = 1e9

# --- throughput assumptions: (fast end, slow end). Estimates, not measurements: no GPU has run these configs.
ROLLOUT_TOKENS_PER_S = (4000, 1500)  # vLLM rollout tokens a second per GPU for a 7B model in bf16 (colocated)
ROLLOUT_REFERENCE_BYTES = 7.6e9 * 2  # that model's weight bytes: decoding reads every weight once a step
PEAK_TFLOPS = {"bfloat16": 989, "float16": 989, "float32": 67}  # H100 SXM dense; fp32 = IEEE (TF32 off)
UPDATE_MFU = (0.4, 0.2)  # the loss forward + backward's share of that peak under FSDP/DDP
MEAN_LENGTH = resources.EVAL_MEAN_LENGTH  # mean completion / its token budget (the evaluate estimate's)
PROMPT_TOKENS = 200  # a math prompt with its template, tokens
# generations per kept group with dynamic sampling (zero-spread groups are drawn again)
DYNAMIC_SAMPLING_REDRAW = (1.0, 1.5)
TRAIN_STARTUP_MIN = (5, 15)  # imports, model loads, the engine's start (compile, CUDA graphs), per job
TINY_BASE_MIN = (2, 5)  # base_model for model.source tiny: build + warm start (minutes)
# save_total_limit 1 (training/grpo_config.py): a save writes the new checkpoint before it removes the old
CHECKPOINTS_AT_SAVE = 2
CHAR_VOCAB = len(set(string.printable) - set("\x0b\x0c\r")) + 4  # the char tokenizer: printable + 4 specials
# Problems of each public evaluation set (its split as tasks/real_datasets.py reads it); MMLU-STEM = the test
# split of MMLU_STEM_SUBJECTS.
DATASET_PROBLEMS = {"math500": 500, "aime24": 30, "aime25": 30, "amc23": 40, "gsm8k": 1319, "mmlu_stem": 3153,
                    "humaneval": 164}  # fmt: skip

Range = tuple[float, float]  # (fast end, slow end)


@dataclass(frozen=True)
class Job:
    """One GPU job of the plan: its rule, GPUs and hours (fast end, slow end)."""

    rule: str
    gpus: int
    hours: Range


def config_named(name: str) -> dict:
    """A shipped config, validated without its data files (they need not exist to plan)."""
    from workflow_scripts.runtime.config import load_config

    return load_config(REPO / name, check_files=False)


# ------------------------------------------------------------------------------------ the model's size


def tiny_architecture(model: Mapping) -> dict:
    """config.json keys of a ``tiny`` model (model.tiny; the char tokenizer's vocabulary or the BPE's cap)."""
    tiny, tok = model["tiny"], model["tiny"].get("tokenizer") or {}
    vocab = int(tok["vocab_size"]) if tok.get("kind") == "bpe" else CHAR_VOCAB
    return {"model_type": "llama", "num_hidden_layers": tiny["num_layers"],
            "hidden_size": tiny["hidden_size"], "num_attention_heads": tiny["num_heads"],
            "num_key_value_heads": tiny.get("num_kv_heads") or tiny["num_heads"],
            "intermediate_size": tiny["intermediate_size"], "vocab_size": vocab,
            "max_position_embeddings": tiny["max_position_embeddings"],
            "tie_word_embeddings": False}  # fmt: skip


def planned_config(config: Mapping) -> dict:
    """``config`` with ``model.architecture`` for a tiny model, so the memory plan knows its dimensions."""
    out = copy.deepcopy(dict(config))
    if out["model"]["source"] == "tiny" and not out["model"].get("architecture"):
        out["model"]["architecture"] = tiny_architecture(out["model"])
    return out


def parameters(config: Mapping) -> int:
    dims = memory_plan.model_dims(planned_config(config)["model"])
    if dims is None:
        raise ValueError("model: no dimensions (set model.architecture, a config.json's keys)")
    return dims.parameters


# ------------------------------------------------------------------------------------------- memory


def memory_fit(config: Mapping, nominal_gb: float) -> tuple[bool, dict[str, float]]:
    """Whether every arm's train job fits a GPU of ``nominal_gb`` (the memory plan refuses nothing), and
    each arm's planned GiB per GPU there."""
    sized = planned_config(config)
    sized["gpu"] = {**(sized.get("gpu") or {}), "memory_gb": nominal_gb}
    sized["gpu"].pop("reported_gib", None)
    plans = memory_plan.plans(sized) or {}
    return not list(memory_plan.problems(sized)), {arm: plan["total"] for arm, plan in plans.items()}


# --------------------------------------------------------------------------------------------- time


def task_problems(config: Mapping) -> dict[str, int]:
    """Problems of each evaluation task: a public set's size (DATASET_PROBLEMS), a synthetic task's n
    (train_val: data.train.val_n)."""
    data, out = config["data"], {}
    for name, task in data["tasks"].items():
        source = task["source"]
        if task.get("n"):
            out[name] = int(task["n"])
        elif source == "train_val":
            out[name] = int(data["train"]["val_n"])
        else:
            out[name] = DATASET_PROBLEMS[source]
    return out


def rollout_tokens_per_s(config: Mapping, arm: str) -> Range:
    """Rollout tokens a second per GPU for this model in the arm's sampling dtype (fast, slow)."""
    mode = config["precisions"][arm]
    weight_bytes = parameters(config) * memory_plan.BYTES[memory_plan.sampler_dtype(mode)]
    return tuple(rate * ROLLOUT_REFERENCE_BYTES / weight_bytes for rate in ROLLOUT_TOKENS_PER_S)


def train_completions(train: Mapping) -> int:
    """Completions one run trains on: optimizer steps x prompts_per_step x num_generations."""
    return int(train["max_steps"]) * int(train["prompts_per_step"]) * int(train["num_generations"])


def heldout_tokens(config: Mapping) -> float:
    """Tokens the held-out curves sample over one run (every measured step, every task's slice)."""
    spec, problems = heldout_spec(config), task_problems(config)
    points = len(heldout_steps(spec["every"], int(config["train"]["max_steps"])))
    per_point = sum(
        min(spec["problems"], problems[name]) * spec["samples"] * task["max_new_tokens"] * MEAN_LENGTH
        for name, task in spec["tasks"].items()
    )
    return points * per_point


def kl_log_tokens(train: Mapping) -> float:
    """Tokens the training-time KL log samples over one run (every kl_every steps and the last)."""
    steps = int(train["max_steps"])
    points = len({steps, *range(int(train["kl_every"]), steps + 1, int(train["kl_every"]))})
    return points * train["kl_prompts"] * train["kl_samples"] * train["max_completion_length"] * MEAN_LENGTH


TRAIN_PARTS = ("rollouts", "held-out curves", "update", "KL log", "start-up")


def train_parts(config: Mapping, arm: str, gpus: int | None = None) -> dict[str, Range]:
    """One training run of ``arm`` on its job's GPUs by part, hours (fast end, slow end): the module
    table's model."""
    train, mode = config["train"], config["precisions"][arm]
    gpus = gpus or max(1, resources.rule_resources(config, "train")["gpus"])
    completions = train_completions(train)
    generated = completions * train["max_completion_length"] * MEAN_LENGTH
    redraw = DYNAMIC_SAMPLING_REDRAW if train.get("dynamic_sampling") else (1.0, 1.0)
    hf_rate = config["resources"]["evaluate"]["kl_tokens_per_s"]
    vllm_rate = rollout_tokens_per_s(config, arm)
    rate = [vllm_rate[end] * gpus if train["use_vllm"] else hf_rate for end in (0, 1)]
    compute = mode.get("autocast") or mode["param_dtype"]
    # forward + backward (+ the recomputed forward with checkpointing) + the old log-probs' forward, which
    # TRL computes only when a round feeds several optimizer steps (else they are the current ones)
    old_logprobs = train["steps_per_generation"] > train["gradient_accumulation_steps"] or train.get(
        "num_iterations", 1) > 1  # fmt: skip
    flops_a_token = (8 if train["activation_checkpointing"] else 6) + (2 if old_logprobs else 0)
    tokens = completions * (PROMPT_TOKENS + train["max_completion_length"] * MEAN_LENGTH)
    update = flops_a_token * parameters(config) * tokens / (PEAK_TFLOPS[compute] * 1e12 * gpus)
    parts = {
        "rollouts": [generated * redraw[end] / rate[end] for end in (0, 1)],
        "held-out curves": [heldout_tokens(config) / rate[end] for end in (0, 1)],
        "update": [update / UPDATE_MFU[end] for end in (0, 1)],
        "KL log": [kl_log_tokens(train) / hf_rate] * 2,
        "start-up": [TRAIN_STARTUP_MIN[end] * 60 for end in (0, 1)],
    }
    return {part: (seconds[0] / 3600, seconds[1] / 3600) for part, seconds in parts.items()}


def train_hours(config: Mapping, arm: str, gpus: int | None = None) -> Range:
    """One training run of ``arm``, hours (fast end, slow end): the sum of ``train_parts``."""
    parts = train_parts(config, arm, gpus).values()
    return sum(r[0] for r in parts), sum(r[1] for r in parts)


def evaluate_hours(config: Mapping) -> list[Range]:
    """Each evaluate job of one run, hours (fast end, slow end): ``resources.evaluate_minutes`` (a time
    limit, the estimate x EVAL_MARGIN) is the slow end, that / EVAL_MARGIN the fast end; eval.jobs per_run:
    one job for every task, per_task: one a task."""
    problems = task_problems(config)
    groups = [problems] if config["eval"].get("jobs") == "per_run" else [{t: n} for t, n in problems.items()]
    out = []
    for group in groups:
        limit = resources.evaluate_minutes(config, group) / 60
        out.append((limit / resources.EVAL_MARGIN, limit))
    return out


def base_model_hours(config: Mapping) -> Range:
    """The base_model job, hours: ``resources.base_model_minutes`` for a loaded model (slow end; / EVAL_MARGIN
    the fast end), TINY_BASE_MIN for tiny."""
    if config["model"]["source"] == "tiny":
        return TINY_BASE_MIN[0] / 60, TINY_BASE_MIN[1] / 60
    on_task = next(name for name, t in config["data"]["tasks"].items() if t["role"] == "on_task")
    limit = resources.base_model_minutes(config, task_problems(config)[on_task]) / 60
    return limit / resources.EVAL_MARGIN, limit


def jobs(config: Mapping) -> dict[str, list[Job]]:
    """The plan's GPU jobs by phase, in the order the phases run: base_model, train, evaluate."""
    res = {rule: max(1, resources.rule_resources(config, rule)["gpus"]) for rule in GPU_RULES}
    trains = [
        Job("train", res["train"], train_hours(config, arm))
        for arm in config["precisions"]
        for _ in paths.arm_seeds(config, arm)
    ]
    trains += [Job("train", res["train"], train_hours(config, arm)) for arm, _, _ in paths.repeats(config)]
    evaluates = [
        Job("evaluate", res["evaluate"], hours)
        for _ in paths.run_names(config)
        for hours in evaluate_hours(config)
    ]
    return {"base_model": [Job("base_model", res["base_model"], base_model_hours(config))], "train": trains,
            "evaluate": evaluates}  # fmt: skip


def slots(job_gpus: int, nodes: int, node_gpus: int = NODE_GPUS) -> int:
    """Jobs of ``job_gpus`` GPUs that ``nodes`` nodes run at once (a job stays on one node)."""
    if job_gpus > node_gpus:
        raise ValueError(f"a job of {job_gpus} GPUs does not fit a node of {node_gpus}")
    return nodes * (node_gpus // job_gpus)


def wall(hours: Sequence[float], n_slots: int) -> float:
    """Wall time of independent jobs on ``n_slots`` slots, longest first to the next free slot (one slot:
    their sum; as many slots as jobs: the longest)."""
    free = [0.0] * max(1, n_slots)
    for h in sorted(hours, reverse=True):
        i = free.index(min(free))
        free[i] += h
    return max(free)


def plan_wall(phases: Mapping[str, Sequence[Job]], nodes: int, node_gpus: int = NODE_GPUS) -> Range:
    """Wall hours of the phases one after another on ``nodes`` nodes (fast end, slow end)."""
    out = [0.0, 0.0]
    for phase in phases.values():
        if not phase:
            continue
        n = slots(max(job.gpus for job in phase), nodes, node_gpus)
        for end in (0, 1):
            out[end] += wall([job.hours[end] for job in phase], n)
    return out[0], out[1]


def gpu_hours(phases: Mapping[str, Sequence[Job]]) -> Range:
    """Every job's hours x its GPUs, summed (fast end, slow end)."""
    everything = [job for phase in phases.values() for job in phase]
    return sum(j.hours[0] * j.gpus for j in everything), sum(j.hours[1] * j.gpus for j in everything)


def nodes_for_all_trains(phases: Mapping[str, Sequence[Job]], node_gpus: int = NODE_GPUS) -> int:
    """The nodes that run every train job at once (more nodes shorten nothing but evaluation)."""
    trains = phases["train"]
    return math.ceil(len(trains) / slots(trains[0].gpus, 1, node_gpus)) if trains else 1


# --------------------------------------------------------------------------------------------- disk


def checkpoint_gb(config: Mapping, arm: str) -> float:
    """One resumable checkpoint of ``arm``: weights + two AdamW moments in the masters' dtype (GB; the
    gradients are not saved; RNG and trainer state are kilobytes)."""
    return 3 * parameters(config) * memory_plan.BYTES[config["precisions"][arm]["param_dtype"]] / GB


def disk_gb(config: Mapping, nodes: int) -> dict[str, float]:
    """Disk (GB): ``checkpoint`` the largest arm's checkpoint; ``peak`` while training on ``nodes`` nodes
    (the runs training at once, each with CHECKPOINTS_AT_SAVE checkpoints, beside the finished models);
    ``end`` what stays (each run's model, the base and its hub copy)."""
    p = parameters(config)
    model_bytes = memory_plan.BYTES[config["model"]["dtype"]]
    base = p * model_bytes * (2 if hub_copies.hub_model(config["model"]) else 1) / GB
    runs = [arm for arm in config["precisions"] for _ in paths.arm_seeds(config, arm)]
    runs += [arm for arm, _, _ in paths.repeats(config)]
    finals = sum(p * memory_plan.BYTES[config["precisions"][a]["param_dtype"]] / GB for a in runs)
    at_once = min(len(runs), slots(max(1, resources.rule_resources(config, "train")["gpus"]), nodes))
    biggest = max(checkpoint_gb(config, arm) for arm in config["precisions"])
    return {"checkpoint": biggest, "peak": at_once * CHECKPOINTS_AT_SAVE * biggest + finals + base,
            "end": finals + base}  # fmt: skip


def network(config: Mapping) -> str:
    """What the fetch rules download (the only jobs that need the network)."""
    data = config["data"]
    datasets = hub_copies.hub_datasets(data)
    model = hub_copies.hub_model(config["model"])
    if not datasets and not model:
        return "none"
    what = [f"{len(datasets)} datasets"] if datasets else []
    if model:
        size = parameters(config) * memory_plan.BYTES[config["model"]["dtype"]] / GB
        what.append(f"the model (~{size:.0f} GB)")
    return "fetch rules only: " + " + ".join(what)


# -------------------------------------------------------------------------------------------- table


def hours_text(r: Range) -> str:
    """A range of hours as the tables write it: in minutes when both ends are under an hour, else in
    hours, one decimal under 10 and whole hours from 10."""
    if r[1] < 1:
        unit, (lo, hi) = "min", [str(max(1, round(h * 60))) for h in r]
    else:
        unit, (lo, hi) = "h", [f"{h:.1f}" if h < 10 else f"{round(h):,}" for h in r]
    return f"{lo} {unit}" if lo == hi else f"{lo}-{hi} {unit}"


HEADER = ("| config | model | train runs x GPUs | GiB per GPU (plan at 80 GB) | fits | one run's training | "
          "wall, one 8-GPU node | wall, N nodes | GPU-hours | disk | network |")  # fmt: skip


def row_text(name: str, config: Mapping | None = None) -> str:
    """One config's row of the table (HEADER's columns; the module table says how each is computed)."""
    config = config or config_named(name)
    phases = jobs(config)
    n, fits, memory = nodes_for_all_trains(phases), [], {}
    for hardware, gb in HARDWARE.items():
        ok, planned = memory_fit(config, gb)
        fits += [hardware] if ok else []
        memory = memory or planned
    model = f"{config['model']['source'].split('/')[-1]} ({parameters(config) / 1e9:.2f}B)"
    runs = "; ".join(f"{arm} {hours_text(train_hours(config, arm))}" for arm in config["precisions"])
    n_nodes = "same (1 node)" if n == 1 else f"{n} nodes: {hours_text(plan_wall(phases, n))}"
    disk = disk_gb(config, 1)
    cells = [f"`{name}`", model, f"{len(phases['train'])} x {phases['train'][0].gpus}",
             " / ".join(f"{arm} {gib}" for arm, gib in memory.items()), ", ".join(fits) or "neither", runs,
             hours_text(plan_wall(phases, 1)), n_nodes, hours_text(gpu_hours(phases)).replace(" h", ""),
             f"checkpoint {disk['checkpoint']:.0f} GB a run; peak {disk['peak']:.0f} GB on one node; "
             f"{disk['end']:.0f} GB kept", network(config)]  # fmt: skip
    return "| " + " | ".join(cells) + " |"


def pilot_config(config: Mapping, steps: int = 8, seeds: Sequence[int] = (1,)) -> dict:
    """``config`` as the pilot runs it: ``steps`` optimizer steps, one seed per arm, no repeats."""
    out = copy.deepcopy(dict(config))
    out["train"]["max_steps"] = steps
    out["seeds"] = list(seeds)
    out["repeats"] = []
    for mode in out["precisions"].values():
        mode.pop("seeds", None)
    return out


PILOT_STEPS = 8  # two rollouts of config.paper.yaml (4 optimizer steps each), four of config.one-node.yaml
PILOT_CONFIGS = ("config.one-node.yaml", "config.paper.yaml")
BREAKDOWN_CONFIGS = ("config.one-node.yaml", "config.paper.yaml")


def pilot_phases(config: Mapping, steps: int = PILOT_STEPS) -> dict[str, list[Job]]:
    """The pilot's jobs: ``steps`` steps, one seed per arm, up to and including training (``--until
    train``)."""
    phases = jobs(pilot_config(config, steps))
    return {"base_model": phases["base_model"], "train": phases["train"]}


def pilot_table(names: Sequence[str] = PILOT_CONFIGS, steps: int = PILOT_STEPS) -> list[str]:
    """The pilots' cost (``pilot_phases``), one line per config."""
    head = ("pilot of", "train runs x GPUs", "base_model job", "one run's training", "wall, one node",
            "GPU-hours")  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for name in names:
        config = config_named(name)
        phases = pilot_phases(config, steps)
        runs = "; ".join(f"{arm} {hours_text(train_hours(pilot_config(config, steps), arm))}"
                         for arm in config["precisions"])  # fmt: skip
        cells = [f"`{name}`, {steps} steps, seed 1", f"{len(phases['train'])} x {phases['train'][0].gpus}",
                 hours_text(phases["base_model"][0].hours), runs, hours_text(plan_wall(phases, 1)),
                 hours_text(gpu_hours(phases)).replace(" h", "")]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def breakdown_table(names: Sequence[str] = BREAKDOWN_CONFIGS) -> list[str]:
    """One run's training hours by part (``train_parts``), per config and arm."""
    head = ("one run of", *TRAIN_PARTS, "total")
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for name in names:
        config = config_named(name)
        for arm in config["precisions"]:
            parts = train_parts(config, arm)
            cells = [hours_text(parts[p]) for p in TRAIN_PARTS] + [hours_text(train_hours(config, arm))]
            lines.append(f"| `{name}` {arm} | " + " | ".join(cells) + " |")
    return lines


def block(names: Sequence[str] = GPU_CONFIGS) -> str:
    """The generated block of docs/cluster.md (without its markers): the configs' table, one run's training
    by part, the pilots."""
    lines = [HEADER, "|" + "---|" * (HEADER.count(" | ") + 1)]
    lines += [row_text(name) for name in names]
    return "\n".join([*lines, "", *breakdown_table(), "", *pilot_table()])


START = f"<!-- generated: {COMMAND} -->"
END = "<!-- end generated -->"


def replace_block(text: str, new: str) -> str:
    """``text`` with the block between START and the next END replaced by ``new``."""
    start = text.index(START) + len(START)
    end = text.index(END, start)
    return text[:start] + "\n" + new + "\n" + text[end:]


def current_block(text: str) -> str:
    start = text.index(START) + len(START)
    return text[start : text.index(END, start)].strip("\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--write", metavar="PAGE", help="replace PAGE's generated block (docs/cluster.md)")
    parser.add_argument("--check", metavar="PAGE", help="exit 1 when PAGE's block differs from a fresh one")
    args = parser.parse_args(argv)
    fresh = block()
    if args.write:
        page = Path(args.write)
        page.write_text(replace_block(page.read_text(encoding="utf-8"), fresh), encoding="utf-8")
    elif args.check:
        if current_block(Path(args.check).read_text(encoding="utf-8")) != fresh:
            print(f"{args.check}: the generated block is stale; run: {COMMAND}", file=sys.stderr)
            return 1
    else:
        print(fresh)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
