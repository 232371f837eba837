"""The cluster plan (workflow_scripts/runtime/cluster_plan.py): docs/cluster.md's table is the one the plan
computes now, and the arithmetic behind it (jobs on slots, nodes, GPU-hours, disk) holds by hand."""

import copy

import pytest
from conftest import REPO

from workflow_scripts.runtime import cluster_plan as cp
from workflow_scripts.runtime import resources

PAPER_PARAMETERS = 7_615_616_512  # Qwen2.5-Math-7B (tests/runtime/test_memory_plan.py)


@pytest.fixture(scope="module")
def paper():
    return cp.config_named("config.paper.yaml")


def test_docs_cluster_md_holds_the_table_the_plan_computes_now():
    page = (REPO / "docs" / "cluster.md").read_text(encoding="utf-8")
    assert cp.START in page, f"docs/cluster.md has no {cp.START}"
    assert cp.current_block(page) == cp.block(), f"docs/cluster.md is stale: run {cp.COMMAND}"


def test_replace_block_swaps_only_what_lies_between_the_markers():
    page = f"intro\n{cp.START}\nold\n{cp.END}\nafter\n"
    new = cp.replace_block(page, "new | 1")
    assert new == f"intro\n{cp.START}\nnew | 1\n{cp.END}\nafter\n"
    assert cp.current_block(new) == "new | 1"


def test_jobs_one_after_another_on_one_slot_take_their_sum():
    assert cp.wall([3.0, 1.0, 2.0], 1) == 6.0


def test_as_many_slots_as_jobs_take_the_longest_and_fewer_go_longest_first():
    assert cp.wall([3.0, 1.0, 2.0], 3) == 3.0
    assert cp.wall([3.0, 1.0, 2.0], 2) == 3.0  # 3 | 2 + 1
    # longest first, each to the slot that frees first: 5 | 4, then 3 -> 4 + 3, 3 -> 5 + 3, 3 -> 7 + 3
    assert cp.wall([3.0, 5.0, 3.0, 4.0, 3.0], 2) == 10.0


def test_slots_are_whole_jobs_per_node_times_nodes():
    assert cp.slots(8, nodes=1) == 1  # a paper train job takes the node
    assert cp.slots(8, nodes=10) == 10
    assert cp.slots(1, nodes=2) == 16
    assert cp.slots(3, nodes=1) == 2  # a job stays on one node: 2 x 3 of 8 GPUs
    with pytest.raises(ValueError, match="does not fit a node"):
        cp.slots(16, nodes=4)


def test_phases_run_one_after_another_and_n_nodes_run_n_node_sized_jobs_at_once():
    phases = {
        "base_model": [cp.Job("base_model", 1, (1.0, 2.0))],
        "train": [cp.Job("train", 8, (10.0, 20.0))] * 4,
        "evaluate": [cp.Job("evaluate", 1, (1.0, 1.5))] * 12,
    }
    assert cp.plan_wall(phases, nodes=1) == (1.0 + 40.0 + 2.0, 2.0 + 80.0 + 3.0)  # 12 evaluations on 8 GPUs
    assert cp.plan_wall(phases, nodes=4) == (1.0 + 10.0 + 1.0, 2.0 + 20.0 + 1.5)
    assert cp.nodes_for_all_trains(phases) == 4


def test_gpu_hours_are_each_jobs_hours_times_its_gpus_on_any_number_of_nodes():
    train, evaluate = cp.Job("train", 8, (10.0, 20.0)), cp.Job("evaluate", 1, (1.0, 3.0))
    phases = {"train": [train, train], "evaluate": [evaluate]}
    assert cp.gpu_hours(phases) == (2 * 10.0 * 8 + 1.0, 2 * 20.0 * 8 + 3.0)


def test_the_paper_config_on_one_node_runs_its_ten_train_jobs_one_after_another(paper):
    phases = cp.jobs(paper)
    trains = phases["train"]
    assert len(trains) == 10 and {job.gpus for job in trains} == {8}
    one_node = cp.plan_wall({"train": trains}, nodes=1)
    assert one_node == pytest.approx(
        (5 * sum(cp.train_hours(paper, a)[0] for a in paper["precisions"]),
         5 * sum(cp.train_hours(paper, a)[1] for a in paper["precisions"]))
    )  # fmt: skip
    ten_nodes = cp.plan_wall({"train": trains}, nodes=10)
    assert ten_nodes == pytest.approx(cp.train_hours(paper, "fp32"))  # the slower arm's run
    assert cp.gpu_hours({"train": trains}) == pytest.approx(tuple(8 * h for h in one_node))


def test_the_paper_evaluate_job_takes_resources_evaluate_minutes_about_950(paper):
    problems = {"math500": 500, "aime24": 30, "aime25": 30, "amc23": 40, "gsm8k": 1319, "mmlu_stem": 3153,
                "humaneval": 164}  # fmt: skip
    assert cp.task_problems(paper) == problems and sum(problems.values()) * 16 == 83_776
    minutes = resources.evaluate_minutes(paper, problems)
    assert 940 <= minutes <= 960
    assert cp.evaluate_hours(paper) == [(minutes / 60 / resources.EVAL_MARGIN, minutes / 60)]
    assert len(cp.jobs(paper)["evaluate"]) == 12  # base, base-float32 and 10 trained runs, one job each


def test_training_time_is_steps_times_prompts_times_generations_times_tokens_at_the_stated_rates(paper):
    parts = cp.train_parts(paper, "bf16")
    tokens = 300 * 64 * 16 * (cp.PROMPT_TOKENS + 3072 * cp.MEAN_LENGTH)
    update = 10 * PAPER_PARAMETERS * tokens / (989e12 * 8)  # checkpointing: 8 + 2 old log-probs
    assert parts["update"] == pytest.approx((update / 0.4 / 3600, update / 0.2 / 3600))
    generated = 300 * 64 * 16 * 3072 * cp.MEAN_LENGTH
    rate = [r * cp.ROLLOUT_REFERENCE_BYTES / (PAPER_PARAMETERS * 2) * 8 for r in cp.ROLLOUT_TOKENS_PER_S]
    assert parts["rollouts"] == pytest.approx((generated / rate[0] / 3600, 1.5 * generated / rate[1] / 3600))
    kl = 15 * 64 * 4 * 3072 * cp.MEAN_LENGTH / paper["resources"]["evaluate"]["kl_tokens_per_s"]
    assert parts["KL log"] == pytest.approx((kl / 3600, kl / 3600))  # steps 20, 40, ..., 300
    fp32 = cp.train_parts(paper, "fp32")
    assert fp32["update"][0] == pytest.approx(parts["update"][0] * 989 / 67)  # IEEE fp32 peak
    assert fp32["rollouts"][0] == pytest.approx(parts["rollouts"][0] * 2)  # twice the weight bytes to read
    longer = copy.deepcopy(paper)
    longer["train"]["max_steps"] = 600
    assert cp.train_parts(longer, "bf16")["update"][0] == pytest.approx(2 * parts["update"][0])


def test_a_checkpoint_holds_weights_and_two_adam_moments_about_90_gb_for_the_7b_fp32_arm(paper):
    assert cp.checkpoint_gb(paper, "fp32") == pytest.approx(3 * PAPER_PARAMETERS * 4 / 1e9)  # 91.4 GB
    assert cp.checkpoint_gb(paper, "bf16") == pytest.approx(3 * PAPER_PARAMETERS * 2 / 1e9)
    disk = cp.disk_gb(paper, nodes=1)
    finals = 5 * PAPER_PARAMETERS * (4 + 2) / 1e9
    base_and_hub_copy = 2 * PAPER_PARAMETERS * 2 / 1e9
    assert disk["end"] == pytest.approx(finals + base_and_hub_copy)
    fp32_checkpoint = 3 * PAPER_PARAMETERS * 4 / 1e9
    assert disk["peak"] == pytest.approx(disk["end"] + 2 * fp32_checkpoint)  # one run, two at a save
    assert cp.disk_gb(paper, nodes=10)["peak"] == pytest.approx(disk["end"] + 10 * 2 * fp32_checkpoint)


def test_the_shipped_gpu_configs_fit_h100_and_h200_as_the_memory_plan_says(paper):
    fits, memory = cp.memory_fit(paper, 80)
    assert fits and memory == {"fp32": 66.8, "bf16": 59.1}
    assert cp.memory_fit(paper, 141)[0]
    one_gpu = copy.deepcopy(paper)
    one_gpu["resources"]["train"]["gpus"] = 1  # no FSDP: refused on either card
    assert not cp.memory_fit(one_gpu, 80)[0] and not cp.memory_fit(one_gpu, 141)[0]


def test_the_smoke_models_size_comes_from_model_tiny():
    smoke = cp.config_named("config.gpu-smoke.yaml")
    assert round(cp.parameters(smoke) / 1e6) == 358  # Qwen2.5-0.5B without its 152k-token embedding
    assert cp.network(smoke) == "none"


def test_only_the_fetch_rules_need_the_network_and_they_fetch_the_hub_copies(paper):
    assert cp.network(paper) == "fetch rules only: 7 datasets + the model (~15 GB)"


def test_hours_read_as_minutes_under_an_hour_and_whole_hours_from_ten():
    assert cp.hours_text((0.1, 0.5)) == "6-30 min"
    assert cp.hours_text((0.5, 2.25)) == "0.5-2.2 h"
    assert cp.hours_text((12.4, 1234.6)) == "12-1,235 h"
    assert cp.hours_text((3.6, 3.61)) == "3.6 h"
