"""The paper path's weight sync rehearsed on CPU: two gloo processes train one FSDP2-sharded model, each
with a colocated vLLM CPU engine that TRL's own ``VLLMGeneration`` builds (``external_launcher``, one
engine per rank as TRL's tensor_parallel_size 1), and every round runs the sync the trainer runs
(``grpo_trainer.attach_colocated_sync``): TRL's DTensor gather (``full_tensor()`` per parameter) into the
engine's load. What the CPU build cannot load through TRL's ``load_weights`` is shown here too
(docs/engine-precision.md, "What the CPU rehearsal exercises"). The ranks run
``tests/models/colocated_worker.py`` under ``torch.distributed.run``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import VLLM_TINY

from workflow_scripts.models.modeling import build_char_tokenizer, build_tiny_llama
from workflow_scripts.models.vllm_engine import claim_rendezvous_port
from workflow_scripts.training.launch import launch_env

pytestmark = pytest.mark.vllm

WORKER = Path(__file__).with_name("colocated_worker.py")
ROUNDS = 3
TIMEOUT_S = 240
LOGPROB_TOLERANCE = 1e-5  # fp32 engine vs fp32 trainer, measured: at most ~1e-6 (C++ vs torch kernels)
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def run_ranks(model_dir: Path, out: Path, monkeypatch) -> tuple[list[dict], str]:
    """Both ranks' records and the launcher's output; the whole process group is killed on a timeout."""
    monkeypatch.setenv("MASTER_PORT", "0")
    port = claim_rendezvous_port()  # a port the OS assigns (0 left to the ranks hung in an earlier try)
    env = launch_env() | {
        "OMP_NUM_THREADS": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
    rendezvous = ["--master_addr", "127.0.0.1", "--master_port", str(port)]
    cmd = [*launcher, *rendezvous, str(WORKER), str(model_dir), str(out), str(ROUNDS)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)  # fmt: skip
    try:
        log, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        log, _ = proc.communicate()
        pytest.fail(f"the two ranks did not finish in {TIMEOUT_S} s:\n{log[-4000:]}")
    files = [out / f"rank{r}.json" for r in range(2)]
    records = [json.loads(f.read_text()) for f in files if f.exists()]
    errors = [r["error"] for r in records if "error" in r]
    assert proc.returncode == 0 and len(records) == 2 and not errors, errors or log[-4000:]
    return records, log


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    tokenizer = build_char_tokenizer()
    tiny = {**VLLM_TINY, "max_position_embeddings": 64, "seed": 0, "initializer_range": 0.05}
    model_dir = tmp_path_factory.mktemp("colocated_model")
    build_tiny_llama(len(tokenizer), tiny, tokenizer).to(torch.float32).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    out = tmp_path_factory.mktemp("colocated_ranks")
    with pytest.MonkeyPatch.context() as monkeypatch:
        records, _ = run_ranks(model_dir, out, monkeypatch)
    return records


def test_two_gloo_ranks_shard_the_model_with_fsdp2_and_each_colocates_an_external_launcher_engine(ranks):
    for rank, record in enumerate(ranks):
        assert (record["rank"], record["world"], record["backend"]) == (rank, 2, "gloo")
        assert record["distributed_type"] == "FSDP"
        assert record["dtensor_params"] == record["params"] == 21 and record["sharded_on"] == ["[0, 1]"]
        assert record["executor_backend"] == "external_launcher" and record["engine_world_size"] == 1
        assert record["engine"] == {"dtype": "float32", "seed": rank, "model_dtype": "float32",
                                    "attention_backend": "CPU_ATTN", "matmul_precision": "ieee",
                                    "kv_cache_dtype": "float32", "platform": "cpu"}  # fmt: skip


def test_every_round_the_engine_gets_trls_gathered_tensors_and_they_equal_the_trainers(ranks):
    for record in ranks:
        assert len(record["rounds"]) == ROUNDS
        for entry in record["rounds"]:
            # TRL's FSDP2 gather yields every parameter under the names of the trainer's full state dict
            assert entry["gathered_names"] == entry["state_names"] and len(entry["gathered_names"]) == 21
            assert all(entry["gathered_equal"].values())  # bit-equal to torch's own full-state gather
            assert entry["local_shards_match"]  # and each rank's shard is its chunk of them
        # round 0 measured the trainer's log-probs before the sync: a forward with no backward left
        # accelerate's tail group (final norm, LM head; reshard_after_forward=False) gathered as plain
        # tensors, and the sync resharded them before TRL's gather (grpo_trainer.reshard_fsdp)
        assert record["rounds"][0]["gathered_before_sync"] == ["lm_head.weight", "model.norm.weight"]
        assert all(
            not entry["gathered_before_sync"] for entry in record["rounds"][1:]
        )  # a backward came first


def test_the_engines_log_probs_follow_the_trainers_weights_round_after_round(ranks):
    for record in ranks:
        for entry in record["rounds"]:
            assert entry["engine_vs_trainer_max_abs"] < LOGPROB_TOLERANCE, entry
            assert entry["engine_vs_previous_max_abs"] > 0.01, entry  # the step moved them, the engine too
    # the ranks trained on different texts, the step reduced their gradients: one model on both engines
    for one, two in zip(ranks[0]["rounds"], ranks[1]["rounds"], strict=True):
        assert one["loss"] != two["loss"] and one["engine_logprob_sum"] == two["engine_logprob_sum"]


def test_trls_own_load_cannot_update_the_cpu_builds_packed_linear_weights(ranks):
    """Why the CPU build reloads (``grpo_trainer.sync_weights_cpu``): TRL's per-tensor ``load_weights``
    fails on every projection (the CPU build replaced their weights by empty parameters when it packed
    them) and takes the LM head into a weight its kernel no longer reads; the embedding and norms load.
    After TRL's load alone the engine does not compute the trainer's log-probs."""
    for record in ranks:
        loads = record["rounds"][0]["trl_load_weights"]
        failed = {name for name, error in loads.items() if error is not None}
        assert failed == {name for name in loads if name.rsplit(".", 2)[-2] in LINEARS} and len(failed) == 14
        for name in failed:
            assert loads[name] in (
                "AttributeError: 'Parameter' object has no attribute 'weight_loader'",  # q, k, v, gate, up
                f"AssertionError: Attempted to load weight (torch.Size({list(_shape(name))})) into parameter "
                "(torch.Size([0]))",  # o_proj, down_proj
            ), loads[name]
        assert "lm_head.weight" not in failed and "model.embed_tokens.weight" not in failed
        assert record["rounds"][0]["engine_vs_trainer_after_trl_load_max_abs"] > 0.01
        assert record["lm_head_zeroed_by_load_weights"] and not record["lm_head_load_changed_logprobs"]


def _shape(name: str) -> tuple[int, int]:
    hidden, inner = VLLM_TINY["hidden_size"], VLLM_TINY["intermediate_size"]
    return (hidden, inner) if "down_proj" in name else (hidden, hidden)
