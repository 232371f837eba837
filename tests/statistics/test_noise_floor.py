"""The numerical noise floor: repeats of an (arm, seed) are planned, kept out of the seed variance and
summarised apart (``noise_floor``); on CPU two real repeats are bit-identical, so the floor is exactly 0."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from conftest import bit_identical, make_workflow_dir, planned_jobs
from safetensors.torch import load_file

from workflow_scripts import aggregate, report, stats
from workflow_scripts.evaluate import run as evaluate
from workflow_scripts.runtime import eval_matmul, paths
from workflow_scripts.statistics.noise_floor import noise_floor, without_repeats
from workflow_scripts.train import train_run


def _table(values: dict[str, dict[str, float]]) -> pd.DataFrame:
    """run -> task -> dJ, as aggregate's metrics table (roles: add_sub on-task, mul off-task)."""
    rows = []
    for run, by_task in values.items():
        parsed = paths.parse_run(run)
        identity = {"run": run, "precision": parsed.precision, "seed": parsed.seed, "repeat": parsed.repeat}
        for task, dj in by_task.items():
            role = "on_task" if task == "add_sub" else "off_task"
            rows.append({**identity, "task": task, "role": role, "dJ": dj})
    return pd.DataFrame(rows)


def test_the_floor_is_the_variance_between_repeats_pooled_over_an_arms_pairs():
    table = _table({
        "base": {"add_sub": 0.0},
        "bf16-s1": {"add_sub": 0.10, "mul": 0.0}, "bf16-s1-r2": {"add_sub": 0.12, "mul": 0.0},
        "bf16-s1-r3": {"add_sub": 0.14, "mul": 0.0},
        "bf16-s2": {"add_sub": 0.30, "mul": 0.1}, "bf16-s2-r2": {"add_sub": 0.30, "mul": 0.2},
        "fp32-s1": {"add_sub": 0.5, "mul": 0.5},
    })  # fmt: skip
    floor = noise_floor(table)
    s1 = floor["pairs"]["bf16-s1"]
    assert s1["runs"] == ["bf16-s1", "bf16-s1-r2", "bf16-s1-r3"] and s1["n"] == 3 and not s1["identical"]
    assert s1["dJ"]["add_sub"] == {"var": pytest.approx(0.0004), "max_abs_diff": pytest.approx(0.04)}
    assert s1["dJ"]["mul"] == {"var": 0.0, "max_abs_diff": 0.0}
    arm = floor["arms"]["bf16"]["dJ"]
    assert arm["by_task"]["add_sub"] == {"var": pytest.approx((2 * 0.0004 + 0) / 3), "df": 3}
    assert arm["by_task"]["mul"] == {"var": pytest.approx(0.005 / 3), "df": 3}  # (0 * 2 + 0.005 * 1) / 3
    assert arm["by_role"]["on_task"]["df"] == 3
    assert "fp32" not in floor["arms"] and set(floor["pairs"]) == {"bf16-s1", "bf16-s2"}
    seeds_only = without_repeats(table)
    assert sorted(seeds_only["run"].unique()) == ["base", "bf16-s1", "bf16-s2", "fp32-s1"]


def test_a_table_without_repeats_has_no_floor():
    table = _table({"bf16-s1": {"add_sub": 0.1}, "bf16-s2": {"add_sub": 0.2}})
    assert noise_floor(table)["status"] == "none"
    assert noise_floor(table.drop(columns="repeat"))["status"] == "none"  # results from before repeats
    assert len(without_repeats(table.drop(columns="repeat"))) == 2


@pytest.mark.slow
def test_repeats_plan_their_own_training_and_evaluation_but_no_sparsity(tmp_path, test_config):
    test_config["repeats"] = [{"precision": "bf16", "seed": 1, "copies": 2}]
    wf = make_workflow_dir(tmp_path / "wf", test_config)
    jobs = planned_jobs(wf)
    tasks, runs = len(test_config["data"]["tasks"]), 2 + 2 * 2 + 2  # bases, arms x seeds, repeats
    assert jobs["train"] == 4 and jobs["train_repeat"] == 2 and jobs["sparsity"] == 4
    assert jobs["evaluate"] == runs * tasks and jobs["aggregate"] == 1
    alone = planned_jobs(wf, str(paths.eval_summary("bf16-s1-r3", "mul")))
    assert alone["train_repeat"] == 1 and "train" not in alone  # it does not wait for the run it repeats
    assert alone["evaluate"] == 2  # itself and its reference base (base-bfloat16)
    overlap = planned_jobs(wf, str(paths.overlap_table("bf16")))  # the configured seeds only
    assert overlap["overlap"] == 1 and overlap["train"] == 2 and "train_repeat" not in overlap


# ------------------------------------------------------------------------------------ real tiny runs


@pytest.mark.slow
def test_two_real_repeats_are_bit_identical_on_cpu_so_the_floor_is_exactly_zero(tiny_base, tmp_path):
    config = json.loads(json.dumps(tiny_base["config"]))
    config["train"].update(max_steps=4, kl_every=100, kl_prompts=2, kl_samples=1, learning_rate=1e-3,
                           checkpoint_every=100)  # fmt: skip
    config["eval"].update(n_samples=2, kl_prompts=4, kl_samples=1)
    config["repeats"] = [{"precision": "fp32", "seed": 1}, {"precision": "bf16", "seed": 1}]
    res = tmp_path / "results"
    trained = [(p, 1, k) for p in ("fp32", "bf16") for k in (1, 2)]
    for precision, seed, repeat in trained:
        out = paths.train_dir(precision, seed, res, repeat=repeat)
        ckpt = paths.checkpoint_dir(precision, seed, res, repeat=repeat)
        record = train_run(config, precision, seed, tiny_base["data_dir"], tiny_base["base_dir"], out, ckpt,
                           repeat=repeat)  # fmt: skip
        assert record["run"] == paths.run_name(precision, seed, repeat) and record["repeat"] == repeat
    for precision in ("fp32", "bf16"):
        first, again = (load_file(paths.model_dir(paths.run_name(precision, 1, k), res) / "model.safetensors")
                        for k in (1, 2))  # fmt: skip
        assert bit_identical(first, again), precision

    tasks = {"add_sub": "on_task", "mul": "off_task"}
    runs = ["base", "base-bfloat16", *(paths.run_name(p, s, k) for p, s, k in trained)]
    evals, kls = [], []
    for run in runs:
        spec = paths.reference_spec(config, run)
        model = tiny_base["base_dir"] if paths.parse_run(run).is_base else paths.model_dir(run, res)
        for task in tasks:
            reference = spec["reference_run"]
            files = {
                "samples_out": paths.eval_samples(run, task, res),
                "summary_out": paths.eval_summary(run, task, res),
                "kl_out": paths.kl_summary(run, task, res),
                "base_samples": None if reference == run else paths.eval_samples(reference, task, res),
            }
            data = tiny_base["data_dir"] / "eval" / f"{task}.jsonl"
            evaluate(model=model, base=tiny_base["base_dir"], data=data, eval_cfg=config["eval"], run=run,
                     task=task, task_cfg=config["data"]["tasks"][task],
                     bf16_matmul=eval_matmul.bf16_matmul(config, run), **spec, **files)  # fmt: skip
            evals.append(paths.eval_summary(run, task, res))
            kls.append(paths.kl_summary(run, task, res))
    seeds_of = {r: json.loads(paths.eval_summary(r, "mul", res).read_text())["seed"] for r in runs}
    assert seeds_of["bf16-s1-r2"] == seeds_of["bf16-s1"] != seeds_of["fp32-s1"]  # the repeated run's streams
    train = [(paths.train_dir(p, s, res, repeat=k) / "metrics.jsonl", paths.train_dir(p, s, res, repeat=k) /
              "run.json") for p, s, k in trained]  # fmt: skip
    metrics, *_ = aggregate.aggregate(evals, kls, train, [], tasks, ["fp32", "bf16"])
    result = stats.analyze(metrics, {"bootstrap": 20, "power_simulations": 2}, precisions=["fp32", "bf16"])
    assert result["n"]["seeds"] == {"fp32": 1, "bf16": 1}  # the repeats are not seeds
    floor = result["noise_floor"]
    assert floor["status"] == "ok" and set(floor["pairs"]) == {"fp32-s1", "bf16-s1"}
    for precision in ("fp32", "bf16"):
        assert floor["pairs"][f"{precision}-s1"]["identical"] is True
        for quantity in ("dJ", "kl"):
            block = floor["arms"][precision][quantity]
            assert {t: v["var"] for t, v in block["by_task"].items()} == {"add_sub": 0.0, "mul": 0.0}
            assert block["by_role"]["off_task"] == {"var": 0.0, "df": 1}
    text = report.render(result, metrics, {}, tmp_path / "report.md", ["fp32", "bf16"])
    floor_text = text.split("## Numerical noise floor (repeats)")[1]
    assert "| bf16-s1 | bf16-s1 (first run), bf16-s1-r2 (repeat 2) | yes | 0 |" in floor_text
    assert "| fp32 | off_task | 1 | 0 (df 1) |" in floor_text  # the floor is exactly 0
