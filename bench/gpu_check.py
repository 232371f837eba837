"""Device check for a lent GPU (no network, no vLLM): the pieces ``bench/gpu_check.sh`` runs, and its summary.

| step       | what it runs                                                 | passes when                |
|------------|--------------------------------------------------------------|----------------------------|
| probe.     | a randomly initialised Qwen2 of the case's shapes in the     | torch's reserved peak of   |
| <case>.    | arm's param_dtype, its reference copy in model.dtype, AdamW; | one optimizer step (2      |
| <arm>      | deterministic algorithms, TF32 off, TRL's fused log-prob     | micro-batches) within 15%  |
|            | head (add_fused_lm_head), activation checkpointing as        | of memory_plan's terms     |
|            | configured, gradient accumulation 2: two micro-batches of b  | less context and engine;   |
|            | sequences of T tokens, loss on the last C tokens             | held tensors = the plan's  |
| fsdp       | FSDP2 (fully_shard per decoder layer + root) in ONE process  | params are DTensors and    |
|            | on the device (nccl; gloo on CPU), gradient accumulation 2,  | equal the unsharded step's |
|            | against the same step unsharded                              | (1e-5)                     |
| smoke      | bench/gpu_smoke.sh on config.gpu-check.yaml (HF sampler)     | its gpu_smoke.json passes  |

Cases: ``one-node`` (config.one-node.yaml's Qwen2.5-Math-1.5B shapes, T = its max_model_len 3072, its
micro-batch of 8), ``7b-cut`` (config.paper.yaml's Qwen2.5-Math-7B shapes cut to ``CUT_LAYERS`` decoder
layers, T = 4096, the paper's 2 completions a micro-batch and GPU); the CPU twin's ``tiny`` (a few seconds).
On CPU there is no allocator peak: a probe runs the same code and reports the plan with status
"skipped (no GPU)", never "pass". Each probe runs in its own process, so each peak is its own.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from workflow_scripts.runtime import memory_plan  # noqa: E402
from workflow_scripts.runtime.atomic import write_json, write_text  # noqa: E402

PASS, FAIL, NO_GPU = "pass", "fail", "skipped (no GPU)"
TOLERANCE = 0.15
ACCUMULATION = 2
PERSISTENT = ("weights", "gradients", "optimizer", "reference")  # the plan's terms a step holds throughout
CUT_LAYERS = 4
GiB = 1 << 30
TINY = {
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 256,
    "max_position_embeddings": 128,
    "model_type": "qwen2",
    "tie_word_embeddings": False,
}


def case_spec(case: str) -> dict:
    """{architecture, train, precisions, model_dtype, tokens, micro_batch} of a probe case, from the shipped
    configs (their memory plans are what the probe checks)."""
    from workflow_scripts.runtime.config import load_config
    from workflow_scripts.runtime.resources import train_processes

    if case == "tiny":
        config = load_config(REPO / "config.one-node.yaml", check_files=False)
        arch, tokens, completion, b = dict(TINY), 64, 32, 2
    else:
        name = {"one-node": "config.one-node.yaml", "7b-cut": "config.paper.yaml"}[case]
        config = load_config(REPO / name, check_files=False)
        arch = dict(config["model"]["architecture"])
        b = memory_plan.micro_batch(config["train"], train_processes(config))
        completion = config["train"]["max_completion_length"]
        tokens = 4096 if case == "7b-cut" else config["train"]["vllm"]["max_model_len"]
        if case == "7b-cut":
            arch["num_hidden_layers"] = CUT_LAYERS
    # One process (no FSDP, no engine), b sequences a micro-batch, ACCUMULATION micro-batches a step.
    train = {
        **config["train"],
        "use_vllm": False,
        "prompts_per_step": b * ACCUMULATION,
        "num_generations": 1,
        "gradient_accumulation_steps": ACCUMULATION,
        "max_completion_length": completion,
        "distributed": {"strategy": "ddp", "processes": 1},
    }
    return {
        "architecture": arch,
        "train": train,
        "precisions": config["precisions"],
        "model_dtype": config["model"]["dtype"],
        "tokens": tokens,
        "micro_batch": b,
    }


def planned_gib(spec: dict, arm: str) -> dict:
    """memory_plan's terms for the probe (GiB) and what torch's allocator can see of them: the total less
    the CUDA context, the engine and an own sampler copy (none of which the probe builds)."""
    dims = memory_plan.dims_from_hf_config(spec["architecture"])
    terms, b, tokens = memory_plan.train_terms(
        dims,
        spec["precisions"][arm],
        spec["train"],
        spec["model_dtype"],
        1,
        None,
        sequence_tokens=spec["tokens"],
    )
    seen = sum(v for k, v in terms.items() if k not in ("context", "vllm", "sampler_copy"))
    return {
        "terms_gib": {k: round(v / GiB, 3) for k, v in terms.items()},
        "terms_bytes": dict(terms),
        "compared_gib": round(seen / GiB, 3),
        "micro_batch": b,
        "tokens": tokens,
        "parameters": dims.parameters,
    }


def _qwen2(arch: dict, dtype, device):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(**{k: v for k, v in arch.items() if k != "model_type"}, use_cache=False)
    cfg._attn_implementation = "sdpa"
    with torch.device(device):  # initialised where it runs: a 1.5B model's init on the host takes ~20 s
        return Qwen2ForCausalLM(cfg).to(dtype=dtype)


def _micro_batches(vocab: int, b: int, tokens: int, completion: int, device, seed: int):
    import torch

    g = torch.Generator().manual_seed(seed)
    for _ in range(ACCUMULATION):
        ids = torch.randint(0, vocab, (b, tokens), generator=g)
        labels = ids.clone()
        labels[:, : tokens - completion] = -100  # the prompt: only the completion is scored
        yield ids.to(device), labels.to(device)


def _loss(model, ids, labels):
    out = model(input_ids=ids, labels=labels, fused_lm_head=True)
    mask = (labels[:, 1:] != -100).to(out.log_probs.dtype)
    return -(out.log_probs * mask).sum() / mask.sum() / ACCUMULATION


def probe(case: str, arm: str, device: str) -> dict:
    """One optimizer step of the arm's trainer at the case's shapes; the peak against the plan."""
    import torch
    from trl.trainer.utils import add_fused_lm_head

    spec = case_spec(case)
    mode, train = spec["precisions"][arm], spec["train"]
    plan = planned_gib(spec, arm)
    torch.use_deterministic_algorithms(True)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    start = time.time()
    model = _qwen2(spec["architecture"], getattr(torch, mode["param_dtype"]), device)
    reference = _qwen2(spec["architecture"], getattr(torch, spec["model_dtype"]), device).requires_grad_(
        False
    )
    if train.get("activation_checkpointing"):
        model.activation_checkpointing_enable()  # as transformers' Trainer does under TRL's config
    add_fused_lm_head(model, temperature=1.0)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    autocast = mode.get("autocast")
    losses = []
    for ids, labels in _micro_batches(
        spec["architecture"]["vocab_size"],
        spec["micro_batch"],
        spec["tokens"],
        train["max_completion_length"],
        device,
        0,
    ):
        with torch.autocast(device, dtype=getattr(torch, autocast)) if autocast else contextlib.nullcontext():
            loss = _loss(model, ids, labels)
        loss.backward()
        losses.append(loss.item())
    opt.step()
    held = _persistent_gib(model, opt, reference)
    opt.zero_grad(set_to_none=True)
    planned_held = sum(plan["terms_bytes"][k] for k in PERSISTENT) / GiB
    held_ok = abs(held - planned_held) <= 0.01 * held
    result: dict[str, Any] = {
        "case": case,
        "arm": arm,
        "device": device,
        "plan": plan,
        "losses": losses,
        "seconds": round(time.time() - start, 2),
        "persistent_gib": held,
        "planned_persistent_gib": planned_held,
    }
    finite = all(map(_finite, losses))
    held_reason = f"weights+gradients+AdamW+reference {held:.4g} GiB vs planned {planned_held:.4g}"
    if device != "cuda":
        result.update(
            status=NO_GPU if finite and held_ok else FAIL,
            reason=f"ran on {device}; {held_reason} ({'equal' if held_ok else 'DIFFERENT'}); losses "
            f"finite: {finite}; no allocator peak to compare",
        )
        return result
    peak = torch.cuda.max_memory_reserved() / GiB
    rel = abs(plan["compared_gib"] - peak) / peak
    result.update(
        peak_reserved_gib=round(peak, 3),
        peak_allocated_gib=round(torch.cuda.max_memory_allocated() / GiB, 3),
        relative_difference=round(rel, 3),
    )
    ok = finite and held_ok and rel <= TOLERANCE
    result.update(
        status=PASS if ok else FAIL,
        reason=f"plan {plan['compared_gib']:.2f} GiB vs reserved peak {peak:.2f} GiB: {rel:.1%} "
        f"({'within' if rel <= TOLERANCE else 'more than'} {TOLERANCE:.0%}); {held_reason}; losses finite: "
        f"{finite}",
    )
    return result


def _persistent_gib(model, opt, reference) -> float:
    """What the step holds beyond its transients: parameters, their gradients, AdamW's two states (its
    scalar step counters left out) and the reference copy."""
    tensors = [
        *model.parameters(),
        *(p.grad for p in model.parameters() if p.grad is not None),
        *(t for state in opt.state.values() for k, t in state.items() if k != "step"),
        *reference.parameters(),
    ]
    return sum(t.numel() * t.element_size() for t in tensors) / GiB


def _finite(x: float) -> bool:
    return x == x and abs(x) != float("inf")


def fsdp(device: str, case: str = "tiny") -> dict:
    """FSDP2 in one process (world size 1) against the same step unsharded: the sharded path runs on the
    device and changes nothing a single process should not change."""
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor
    from trl.trainer.utils import add_fused_lm_head

    spec = case_spec(case)
    arch = spec["architecture"]
    torch.use_deterministic_algorithms(True)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    dist.init_process_group("nccl" if device == "cuda" else "gloo", rank=0, world_size=1)
    start = time.time()
    try:
        params = []
        for sharded in (False, True):
            torch.manual_seed(0)
            model = _qwen2(arch, torch.float32, device)
            add_fused_lm_head(model, temperature=1.0)
            if sharded:
                for layer in model.model.layers:
                    fully_shard(layer)
                fully_shard(model)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
            for ids, labels in _micro_batches(arch["vocab_size"], 2, 64, 32, device, 1):
                _loss(model, ids, labels).backward()
            opt.step()
            params.append(
                {
                    n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().float().cpu()
                    for n, p in model.named_parameters()
                }
            )
            if sharded:
                dtensors = all(isinstance(p, DTensor) for p in model.parameters())
        worst = max((params[0][n] - params[1][n]).abs().max().item() for n in params[0])
    finally:
        dist.destroy_process_group()
    ok = dtensors and worst <= 1e-5
    return {
        "device": device,
        "status": PASS if ok else FAIL,
        "seconds": round(time.time() - start, 2),
        "max_abs_difference": worst,
        "dtensor_parameters": dtensors,
        "reason": f"FSDP2 world size 1 on {device}: parameters DTensors {dtensors}, "
        f"max |sharded - unsharded| after one step {worst:.2e} (<= 1e-5)",
    }


def summarize(workdir: Path, budget_s: float, elapsed_s: float) -> dict:
    """summary.json and summary.md from the steps' JSON files in ``workdir``."""
    steps: dict[str, dict] = {}
    for file in sorted(workdir.glob("probe.*.json")):  # probe.<case>.<arm>.json
        steps[file.stem] = json.loads(file.read_text())
    if (workdir / "fsdp.json").is_file():
        steps["fsdp"] = json.loads((workdir / "fsdp.json").read_text())
    for file in sorted(workdir.glob("*.err")):  # a step that died or never ran wrote why here instead
        if file.stem != "smoke":
            steps.setdefault(file.stem, {"status": FAIL, "reason": file.read_text()[-500:].strip()})
    steps.setdefault("fsdp", {"status": FAIL, "reason": "no result"})
    steps = dict(sorted(steps.items()))
    smoke = workdir / "smoke" / "gpu_smoke.json"
    skip = workdir / "smoke.skipped"
    if (workdir / "smoke.err").is_file():
        steps["smoke"] = {"status": FAIL, "reason": (workdir / "smoke.err").read_text()[-500:].strip()}
    elif skip.is_file():
        steps["smoke"] = {"status": "skipped", "reason": skip.read_text().strip()}
    elif smoke.is_file():
        record = json.loads(smoke.read_text())
        checks = record.get("checks", {})
        failed = sorted(k for k, c in checks.items() if c.get("status") == FAIL)
        steps["smoke"] = {
            "status": FAIL if failed else PASS,
            "failed_checks": failed,
            "reason": f"{len(checks)} checks, failed: {failed or 'none'}",
        }
    else:
        steps["smoke"] = {
            "status": FAIL,
            "reason": "bench/gpu_smoke.sh wrote no gpu_smoke.json (see smoke.log)",
        }
    summary = {
        "steps": steps,
        "elapsed_s": round(elapsed_s, 1),
        "budget_s": budget_s,
        "failed": sorted(k for k, v in steps.items() if v["status"] == FAIL),
    }
    lines = [
        f"# Device check ({elapsed_s:.0f} s of {budget_s:.0f})",
        "",
        "| step | status | reason |",
        "|---|---|---|",
    ]
    lines += [f"| {k} | {v['status']} | {v.get('reason', '')} |" for k, v in steps.items()]
    write_json(workdir / "summary.json", summary)
    write_text(workdir / "summary.md", "\n".join(lines) + "\n")
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("probe")
    p.add_argument("--case", choices=("one-node", "7b-cut", "tiny"), required=True)
    p.add_argument("--arm", required=True)
    p.add_argument("--out", required=True)
    f = sub.add_parser("fsdp")
    f.add_argument("--out", required=True)
    s = sub.add_parser("summary")
    s.add_argument("--workdir", required=True)
    s.add_argument("--budget-s", type=float, required=True)
    s.add_argument("--elapsed-s", type=float, required=True)
    args = parser.parse_args(argv)
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.command == "probe":
        result = probe(args.case, args.arm, device)
    elif args.command == "fsdp":
        result = fsdp(device)
    else:
        summary = summarize(Path(args.workdir), args.budget_s, args.elapsed_s)
        print((Path(args.workdir) / "summary.md").read_text())
        return 1 if summary["failed"] else 0
    write_json(args.out, result)
    print(f"{Path(args.out).stem}: {result['status']}: {result['reason']}")
    return 0 if result["status"] != FAIL else 1


if __name__ == "__main__":
    sys.exit(main())
