"""Sampling under FSDP: two gloo processes decode a sharded tiny model whose ranks compute differently
(rank 1 favours the end token, an extreme of how a non-deterministic bf16 arm's ranks may differ).

Without ``lockstep`` the ranks draw different tokens and run different numbers of forwards: under FSDP,
whose forwards all-gather, one rank would wait forever for the other. With it every rank decodes rank
0's tokens and runs the same forwards; the KL measurement (the KL log's, every rank) ends on both.

One pair of spawned processes runs both cases, apart (an unsharded model) and then in lockstep (a sharded
one): each process's start-up (torch, transformers) is most of a case's cost.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from workflow_scripts.models.generation import agreed_memory_budget_gb, lockstep, sample_completions
from workflow_scripts.models.modeling import build_char_tokenizer, build_tiny_llama

TINY = {"hidden_size": 32, "num_layers": 2, "num_heads": 2, "intermediate_size": 64,
        "max_position_embeddings": 64, "seed": 0, "initializer_range": 0.3}  # fmt: skip
PROMPTS = ["1+2=", "33+44=", "5-1="]
MAX_NEW = 12


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _model(sharded: bool):
    tokenizer = build_char_tokenizer()
    model = build_tiny_llama(len(tokenizer), TINY, tokenizer).eval()
    calls = {"forwards": 0}

    def count_and_perturb(module, args, output):  # rank 1 computes differently: it ends its rows at once
        calls["forwards"] += 1
        if dist.get_rank() == 1:
            output.logits[..., tokenizer.eos_token_id] += 30.0
        return output

    model.register_forward_hook(count_and_perturb)
    if sharded:
        from workflow_scripts.training.ranks import shard_reference

        shard_reference(model)  # the KL log's FSDP2 sharding: each forward all-gathers
    return model, tokenizer, calls


def _sample(sharded: bool, together: bool, budget: float) -> dict:
    """One case on this rank: its tokens, forwards and (sharded: in lockstep) the KL measurement."""
    model, tokenizer, calls = _model(sharded)
    with lockstep() if together else torch.no_grad():
        completions = sample_completions(model, tokenizer, PROMPTS, n_samples=4, temperature=1.0,
                                         max_new_tokens=MAX_NEW, seed=3, memory_budget_gb=budget)  # fmt: skip
    kl = None
    if sharded:
        from workflow_scripts.measures.kl import estimate_kl

        reference, _, _ = _model(sharded=True)
        with lockstep():
            kl = estimate_kl(model, reference, tokenizer, PROMPTS, n_samples=2, max_new_tokens=MAX_NEW,
                             seed=5, memory_budget_gb=budget).rb_mean  # fmt: skip
    return {"tokens": [list(c.token_ids) for c in completions], "forwards": calls["forwards"],
            "budget": budget, "kl": kl}  # fmt: skip


def _worker(rank: int, port: int, out: str) -> None:
    """Both cases in one process group: apart first (no collective while sampling, so the rank that
    ends its rows at once goes on and waits in the next case's first collective), then together."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    try:
        result = {}
        for case, sharded, together in (("apart", False, False), ("together", True, True)):
            budget = agreed_memory_budget_gb(torch.device("cpu"))
            result[case] = _sample(sharded, together, budget)
        Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def cases(tmp_path_factory) -> list[dict]:
    """Each rank's results of both cases, from one spawn of two processes."""
    out = tmp_path_factory.mktemp("lockstep")
    port = _free_port()
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_worker, args=(r, port, str(out))) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(240)
    hung = [p for p in procs if p.is_alive()]
    for p in hung:
        p.kill()
    assert not hung, "a rank did not finish"
    assert [p.exitcode for p in procs] == [0, 0]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.slow
def test_ranks_that_compute_differently_draw_different_tokens_and_forwards_on_their_own(cases):
    ranks = [r["apart"] for r in cases]
    assert ranks[1]["tokens"] == [[]] * 12 and ranks[0]["tokens"] != ranks[1]["tokens"]
    assert ranks[0]["forwards"] > ranks[1]["forwards"]  # under FSDP: rank 0 would wait forever


@pytest.mark.slow
def test_in_lockstep_a_sharded_model_decodes_rank_0s_tokens_on_every_rank_and_kl_ends(cases):
    ranks = [r["together"] for r in cases]
    assert ranks[0]["tokens"] == ranks[1]["tokens"]
    assert ranks[0]["forwards"] == ranks[1]["forwards"] > MAX_NEW
    assert ranks[0]["budget"] == ranks[1]["budget"] > 0  # one memory bound: the same batches
    # the same weights as policy and reference: KL 0 up to rounding (the point is that it ends)
    assert all(r["kl"] is not None and abs(r["kl"]) < 1e-9 for r in ranks)
