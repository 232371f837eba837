"""The held-out curve split across ranks (training.heldout): with the colocated vLLM engine every engine
samples a contiguous share of each task's slice, seeded as the whole slice seeds it, and rank 0 gathers
the scored shares. Two gloo processes on CPU, a fake engine (vLLM is not needed): the lines rank 0
writes equal one process's, and each engine received only its share of the prompts.

Three processes in all: one process's lines (the reference), and one pair of ranks that measures twice,
one engine per rank and then one tensor-parallel group of both (a process's start-up is most of a run's
cost)."""

from __future__ import annotations

import itertools
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from workflow_scripts.training.heldout import engine_share, share_bounds

ROOT = Path(__file__).resolve().parents[2]

WORKER = r'''
import json, random, sys, types
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist

root, world, rank = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
tensor_parallel = [int(tp) for tp in sys.argv[4].split(",")]  # one measurement each, in root/tp{tp}/
if world > 1:
    dist.init_process_group("gloo", rank=rank, world_size=world)


class SamplingParams:
    def __init__(self, **kwargs):
        self.__dict__.update(kwargs)


sys.modules["vllm"] = types.SimpleNamespace(SamplingParams=SamplingParams)  # sample_llm's one import


class Tokenizer:
    eos_token_id = 0

    def __call__(self, texts, add_special_tokens=False):
        return {"input_ids": [[ord(c) for c in t] for t in texts]}

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids if i)


class FakeLLM:
    """Draws from the request's seed only (as vLLM's per-request seeds do): sample j of a request with
    seed s answers right when random.Random(s + j) says so; logs the requests it received."""

    def __init__(self):
        self.calls = []

    def generate(self, requests, params, use_tqdm=False):
        self.calls.append([p.seed for p in params])
        outputs = []
        for request, p in zip(requests, params, strict=True):
            answer = int("".join(chr(i) for i in request["prompt_token_ids"]).split()[-1])
            samples = []
            for j in range(p.n):
                text = f"it is {answer if random.Random(p.seed + j).random() < 0.6 else answer + 1}"
                ids = [ord(c) for c in text] + [0]
                samples.append(SimpleNamespace(token_ids=ids, finish_reason="stop", stop_reason=None))
            outputs.append(SimpleNamespace(outputs=samples))
        return outputs


from workflow_scripts.training.heldout import HeldOutCurves  # noqa: E402

tasks = {"arith": 5, "count": 4}
slices = {
    task: [{"id": f"{task}-{i}", "task": task, "kind": "integer", "prompt": f"q {i * 3 + 1}",
            "answer": str(i * 3 + 1), "meta": {}} for i in range(n)]
    for task, n in tasks.items()
}
spec = {"every": 3, "problems": 5, "samples": 4, "temperature": 1.0, "top_p": 1.0, "seed": 7,
        "batch_size": 8, "memory_budget_gb": None, "verify_timeout": 5.0, "code_timeout": 5.0,
        "tasks": {t: {"kind": "integer", "role": "on_task", "max_new_tokens": 8, "verifier": None}
                  for t in tasks}}
run = {"run": "fp32-s1", "precision": "fp32", "seed": 1, "repeat": 0, "stream": "fp32-s1"}
model = torch.nn.Linear(1, 1)
for tp in tensor_parallel:
    out = root / f"tp{tp}"
    out.mkdir(exist_ok=True)
    llm = FakeLLM()
    generation = SimpleNamespace(llm=llm, sync_weights=lambda: None, enable_sleep_mode=False,
                                 tensor_parallel_size=tp)
    curves = HeldOutCurves(out / "heldout.jsonl", spec, slices, run, 6, Tokenizer(), is_main=rank == 0)
    curves.trainer = SimpleNamespace(use_vllm=True, vllm_generation=generation,
                                     vllm_engine_args={"model_dtype": "float32"})
    for step in (0, 3, 6):
        curves.measure(model, step)
    (out / f"calls{rank}.json").write_text(json.dumps(llm.calls))
if world > 1:
    dist.destroy_process_group()
'''


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(out: Path, world: int, tensor_parallel: tuple[int, ...] = (1,)) -> dict[int, tuple[list, list]]:
    """tp -> (the lines rank 0 wrote, each rank's engine calls) of ``world`` ranks measuring once per
    tensor-parallel size, one after the other in the same processes."""
    out.mkdir(parents=True)
    script = out / "worker.py"
    script.write_text(WORKER)
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()),
           "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}  # fmt: skip
    command = [sys.executable, str(script), str(out), str(world)]
    pipe = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True}
    sizes = ",".join(map(str, tensor_parallel))
    procs = [
        subprocess.Popen([*command, str(rank), sizes], env=env, cwd=ROOT, **pipe) for rank in range(world)
    ]
    for proc in procs:
        output, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, output[-3000:]
    runs = {}
    for tp in tensor_parallel:
        lines = [json.loads(x) for x in (out / f"tp{tp}" / "heldout.jsonl").read_text().splitlines()]
        calls = [json.loads((out / f"tp{tp}" / f"calls{rank}.json").read_text()) for rank in range(world)]
        runs[tp] = lines, calls
    return runs


@pytest.fixture(scope="module")
def single(tmp_path_factory) -> tuple[list[dict], list[list]]:
    """One process's lines and engine calls: what the split runs must reproduce."""
    return _run(tmp_path_factory.mktemp("heldout") / "one", 1)[1]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> dict[int, tuple[list, list]]:
    """Two ranks, measured with an engine each (tp 1) and as one tensor-parallel group (tp 2)."""
    return _run(tmp_path_factory.mktemp("heldout") / "two", 2, tensor_parallel=(1, 2))


def _numbers(lines: list[dict]) -> list[dict]:
    return [{k: v for k, v in line.items() if k not in ("generate_s", "score_s")} for line in lines]


def test_shares_are_contiguous_cover_every_problem_once_and_may_be_empty():
    for n, parts in [(5, 2), (4, 2), (7, 3), (2, 4), (0, 3), (9, 1)]:
        bounds = [share_bounds(n, parts, i) for i in range(parts)]
        assert bounds[0][0] == 0 and bounds[-1][1] == n
        assert all(a[1] == b[0] for a, b in itertools.pairwise(bounds))
        assert max(b - a for a, b in bounds) - min(b - a for a, b in bounds) <= 1
    assert share_bounds(2, 4, 3) == (2, 2)


def test_ranks_of_a_tensor_parallel_group_share_one_engine_and_its_first_rank_scores():
    assert [engine_share(r, 8, 1) for r in (0, 5)] == [(8, 0, True), (8, 5, True)]
    assert [engine_share(r, 8, 2) for r in (0, 1, 2, 7)] == [(4, 0, True), (4, 0, False), (4, 1, True),
                                                             (4, 3, False)]  # fmt: skip
    with pytest.raises(ValueError, match="does not divide"):
        engine_share(0, 6, 4)


@pytest.mark.slow
def test_two_ranks_each_sample_their_share_and_rank_0_writes_one_process_numbers(single, two_ranks):
    single, (one,) = single
    split, (first, second) = two_ranks[1]
    assert _numbers(split) == _numbers(single)  # the same lines, in the same order
    assert [(x["step"], x["task"]) for x in split] == [(s, t) for s in (0, 3, 6) for t in ("arith", "count")]
    assert 0 < split[0]["pass_at_1"] < 1  # the draws decide the numbers: a wrong seed would show
    # per measured step and task: 5 problems -> 3 + 2, 4 -> 2 + 2; every seed of one process drawn once
    assert [len(c) for c in first] == [3, 2] * 3 and [len(c) for c in second] == [2, 2] * 3
    assert sorted(s for c in first + second for s in c) == sorted(s for c in one for s in c)


@pytest.mark.slow
def test_a_tensor_parallel_group_sends_its_engine_the_whole_slice_and_scores_it_once(single, two_ranks):
    single, _ = single
    split, (first, second) = two_ranks[2]
    assert _numbers(split) == _numbers(single)
    assert first == second and [len(c) for c in first] == [5, 4] * 3
