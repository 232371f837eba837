"""One rank of the colocated weight-sync rehearsal (``test_colocated_sync.py``), started by
``torch.distributed.run``: FSDP2 over gloo, a colocated vLLM CPU engine per rank built by TRL's own
``VLLMGeneration`` (``distributed_executor_backend="external_launcher"``), and per round an optimizer step,
TRL's DTensor gather (``VLLMGeneration._iter_named_params``: ``full_tensor()`` per parameter) and the
engine's load. Writes what it saw to ``<out>/rank<r>.json``.

    python -m torch.distributed.run --nproc_per_node 2 --master_addr 127.0.0.1 --master_port PORT \\
        tests/models/colocated_worker.py MODEL_DIR OUT_DIR ROUNDS
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path

import torch

ENGINE = {"gpu_memory_utilization": 0.9, "kv_cache_gb": 0.0625, "max_model_len": 64, "enforce_eager": True}
SEQUENCE = "12+7=19;3*4=12"  # the fixed sequence whose log-probs the engine and the trainer score
LR = 3e-3


def engine_logprobs(llm, ids: list[int]) -> torch.Tensor:
    """The engine's log-probability of each token of ``ids`` after the first (vLLM's prompt log-probs)."""
    from vllm import SamplingParams, TokensPrompt

    params = SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0, seed=0)
    out = llm.generate([TokensPrompt(prompt_token_ids=ids)], params, use_tqdm=False)[0]
    steps = zip(out.prompt_logprobs[1:], ids[1:], strict=True)
    return torch.tensor([step[tok].logprob for step, tok in steps], dtype=torch.float64)


def trainer_logprobs(model, ids: list[int]) -> torch.Tensor:
    """The same log-probabilities from the trainer's FSDP2 model (a collective: every rank runs it). It
    leaves the root's parameters gathered (no backward follows), as a KL measurement in training does."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :-1].double()
    return logits.log_softmax(-1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]


def full_state(model) -> dict[str, torch.Tensor]:
    """The trainer's unsharded weights through torch's own state-dict gather (not TRL's code path)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=False)
    return get_model_state_dict(model, options=options)


def trl_load_each(generation) -> dict[str, str | None]:
    """TRL's colocated sync (``VLLMGeneration.sync_weights``: each gathered tensor through the engine's
    ``model_runner.model.load_weights``), one tensor at a time, every tensor tried: name -> None when the
    engine loaded it, else the error. Every rank walks every tensor (the gathers are collectives)."""
    model = generation.llm.llm_engine.model_executor.driver_worker.model_runner.model
    result = {}
    for name, param in generation._iter_named_params():
        try:
            model.load_weights([(name, param)])
            result[name] = None
        except Exception as err:  # what the CPU build raises is the finding
            result[name] = f"{type(err).__name__}: {err}"
    generation.llm.reset_prefix_cache()
    return result


def main(model_dir: str, out_dir: str, rounds: int) -> dict:
    from accelerate import Accelerator
    from accelerate.utils import FullyShardedDataParallelPlugin
    from torch.distributed.tensor import DTensor
    from transformers import AutoModelForCausalLM
    from trl.generation.vllm_generation import VLLMGeneration

    from workflow_scripts.models.modeling import load_tokenizer
    from workflow_scripts.models.vllm_engine import prepare_process
    from workflow_scripts.training.grpo_trainer import attach_colocated_sync, vllm_engine_args
    from workflow_scripts.training.ranks import fsdp_on_cpu

    clock = {"start": time.perf_counter()}
    torch.set_num_threads(1)
    prepare_process()
    # the train stage's FSDP2 settings (grpo_config.fsdp_args): each decoder layer its own group
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="transformer_based_wrap",
                                            reshard_after_forward=True, state_dict_type="FULL_STATE_DICT",
                                            cpu_ram_efficient_loading=False)  # fmt: skip
    with fsdp_on_cpu():
        accelerator = Accelerator(cpu=True, fsdp_plugin=plugin)
    rank = accelerator.process_index
    record: dict = {"rank": rank, "world": accelerator.num_processes,
                    "distributed_type": accelerator.distributed_type.name,
                    "backend": torch.distributed.get_backend()}  # fmt: skip
    tokenizer = load_tokenizer(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    # what GRPOTrainer.__init__ does with use_vllm and vllm_mode="colocate", through the project's wrapper
    with vllm_engine_args("float32", run_seed=0, engine=ENGINE) as built:
        generation = VLLMGeneration(model=model, accelerator=accelerator, processing_class=tokenizer,
                                    mode="colocate", gpu_memory_utilization=ENGINE["gpu_memory_utilization"],
                                    max_model_length=ENGINE["max_model_len"], max_num_seqs=4)  # fmt: skip
    attach_colocated_sync(generation, built)  # the sync GRPOTrainer's rounds call, as the project's trainer
    llm = generation.llm
    fields = (
        "dtype",
        "seed",
        "model_dtype",
        "attention_backend",
        "matmul_precision",
        "kv_cache_dtype",
        "platform",
    )
    record["engine"] = {k: built.get(k) for k in fields}
    config = llm.llm_engine.vllm_config.parallel_config
    record["executor_backend"] = str(config.distributed_executor_backend)
    record["engine_world_size"] = config.world_size
    clock["engine"] = time.perf_counter()

    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    model, optimizer = accelerator.prepare(model, optimizer)
    params = dict(model.named_parameters())
    record["dtensor_params"] = sum(isinstance(p, DTensor) for p in params.values())
    record["params"] = len(params)
    record["sharded_on"] = sorted({str(p.device_mesh.mesh.tolist()) for p in params.values()
                                   if isinstance(p, DTensor)})  # fmt: skip

    ids = tokenizer(SEQUENCE, add_special_tokens=False)["input_ids"]
    # each rank trains on its own text: the step reduces gradients across ranks, as FSDP training does
    text = ["1+1=2;2+2=4;", "9-3=6;8-1=7;"][rank % 2] * 3
    batch = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])
    previous = engine_logprobs(llm, ids)  # the base weights, as loaded from disk
    record["rounds"] = []
    for step in range(rounds):
        model.train()
        loss = model(batch, labels=batch).loss
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        model.eval()

        gathered: dict[str, torch.Tensor] = {}
        iterate = generation._iter_named_params  # TRL's gather, recorded as the engine's load reads it

        def recording(iterate=iterate, gathered=gathered):
            for name, tensor in iterate():
                gathered[name] = tensor.detach().clone()
                yield name, tensor

        generation._iter_named_params = recording
        entry: dict = {"step": step, "loss": loss.item()}
        if step == 0:  # TRL's own load, every tensor tried, then what the engine computes with after it
            entry["trl_load_weights"] = trl_load_each(generation)
            entry["engine_vs_trainer_after_trl_load_max_abs"] = float(
                (engine_logprobs(llm, ids) - trainer_logprobs(model, ids)).abs().max()
            )
            gathered.clear()
        entry["gathered_before_sync"] = sorted(
            n for n, p in model.named_parameters() if not isinstance(p, DTensor)
        )
        generation.sync_weights()  # the trainer's round: TRL's gather, the CPU build's reload
        generation._iter_named_params = iterate
        full = full_state(model)
        entry["gathered_names"] = sorted(gathered)
        entry["state_names"] = sorted(full)
        entry["gathered_equal"] = {n: bool(torch.equal(gathered[n], full[n])) for n in gathered if n in full}
        # FSDP2 shards dim 0 as torch.chunk does: this rank's shard is its chunk of the gathered tensor
        world = accelerator.num_processes
        entry["local_shards_match"] = all(
            torch.equal(p.to_local(), gathered[n].chunk(world, 0)[rank])
            for n, p in params.items()
            if isinstance(p, DTensor) and p.shape[0] >= world
        )
        engine = engine_logprobs(llm, ids)
        trainer = trainer_logprobs(model, ids)
        entry["engine_vs_trainer_max_abs"] = float((engine - trainer).abs().max())
        entry["engine_vs_previous_max_abs"] = float((engine - previous).abs().max())
        entry["engine_logprob_sum"] = float(engine.sum())
        entry["trainer_logprob_sum"] = float(trainer.sum())
        previous = engine
        record["rounds"].append(entry)
        clock[f"round{step}"] = time.perf_counter()
    # the LM head: TRL's load_weights takes the tensor, but the CPU build's kernel reads its packed copy
    runner_model = llm.llm_engine.model_executor.driver_worker.model_runner.model
    zeros = torch.zeros_like(full["lm_head.weight"])  # the engine pads its head's rows; this is the model's
    runner_model.load_weights([("lm_head.weight", zeros)])
    record["lm_head_zeroed_by_load_weights"] = bool((runner_model.lm_head.weight[: len(zeros)] == 0).all())
    record["lm_head_load_changed_logprobs"] = not torch.equal(engine_logprobs(llm, ids), previous)
    accelerator.wait_for_everyone()
    record["seconds"] = {k: round(v - clock["start"], 2) for k, v in clock.items() if k != "start"}
    return record


if __name__ == "__main__":
    model_dir, out_dir, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
    import os

    rank = int(os.environ.get("RANK", "0"))
    path = Path(out_dir) / f"rank{rank}.json"
    try:
        result = main(model_dir, out_dir, rounds)
    except BaseException:
        path.write_text(json.dumps({"rank": rank, "error": traceback.format_exc()}))
        raise
    path.write_text(json.dumps(result, indent=1))
    torch.distributed.destroy_process_group()
