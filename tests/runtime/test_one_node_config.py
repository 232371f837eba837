"""config.one-node.yaml is config.paper.yaml with a smaller model, fewer tasks, seeds of its own and one GPU
a run: it `extends` the paper config and holds only what differs, and what it resolves to is pinned here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from workflow_scripts.runtime.config import load_config

REPO = Path(__file__).resolve().parents[2]
ABSENT = "<absent>"
# Every dotted key where the validated one-node config differs from the validated paper config, with the
# one-node value (ABSENT: the paper has the key, one-node not). A change to either file that moves the
# one-node experiment shows up here.
ONE_NODE_VS_PAPER = {
    "data.tasks.aime24": ABSENT,
    "data.tasks.aime25": ABSENT,
    "data.tasks.humaneval": ABSENT,
    "data.tasks.amc23.max_new_tokens": 2048,
    "data.tasks.math500.max_new_tokens": 2048,
    "eval.vllm.gpu_memory_utilization": 0.85,
    "eval.vllm.max_model_len": 3072,
    "model.source": "Qwen/Qwen2.5-Math-1.5B",
    "model.architecture.hidden_size": 1536,
    "model.architecture.intermediate_size": 8960,
    "model.architecture.num_attention_heads": 12,
    "model.architecture.num_key_value_heads": 2,
    "model.architecture.tie_word_embeddings": True,
    "model.architecture.vocab_size": 151936,
    "resources.train.cpus": 8,
    "resources.train.gpus": 1,
    "resources.train.mem_mb": 128000,
    "resources.train.runtime_min": 1800,
    "seeds": [1, 2, 3, 4, 5, 6, 7, 8],
    "train.checkpoint_every": 10,
    "train.distributed.processes": 1,
    "train.distributed.strategy": "ddp",
    "train.eval_every": 20,
    "train.kl_every": 10,
    "train.max_completion_length": 2048,
    "train.max_steps": 100,
    "train.num_generations": 8,
    "train.steps_per_generation": 128,
    "train.vllm.gpu_memory_utilization": 0.3,
    "train.vllm.max_model_len": 3072,
    "train.vllm.max_num_seqs": None,
    "train.vllm.sleep_mode": False,
}


def _differences(base: dict, other: dict, prefix: str = "") -> dict[str, Any]:
    """Dotted key -> ``other``'s value wherever ``other`` differs from ``base`` (nested mappings recursed)."""
    found: dict[str, Any] = {}
    for key in sorted(set(base) | set(other)):
        dotted = f"{prefix}{key}"
        if key not in other:
            found[dotted] = ABSENT
        elif key not in base:
            found[dotted] = other[key]
        elif isinstance(base[key], dict) and isinstance(other[key], dict):
            found |= _differences(base[key], other[key], dotted + ".")
        elif base[key] != other[key]:
            found[dotted] = other[key]
    return found


def test_the_one_node_config_resolves_to_the_paper_config_and_its_recorded_differences():
    paper = load_config(REPO / "config.paper.yaml", check_files=False)
    one_node = load_config(REPO / "config.one-node.yaml", check_files=False)
    assert _differences(paper, one_node) == ONE_NODE_VS_PAPER


def test_the_one_node_file_extends_the_paper_config_and_repeats_none_of_it():
    raw = yaml.safe_load((REPO / "config.one-node.yaml").read_text())
    assert raw.pop("extends") == "config.paper.yaml"
    replaced = set(raw.pop("replace", []))
    paper = yaml.safe_load((REPO / "config.paper.yaml").read_text())

    def repeated(mine: dict, theirs: dict, prefix: str = "") -> list[str]:
        same = []
        for key, value in mine.items():
            dotted = f"{prefix}{key}"
            if key not in theirs:
                continue
            if isinstance(value, dict) and isinstance(theirs[key], dict) and dotted not in replaced:
                same += repeated(value, theirs[key], dotted + ".")
            elif value == theirs[key]:
                same.append(dotted)
        return same

    assert repeated(raw, paper) == []
