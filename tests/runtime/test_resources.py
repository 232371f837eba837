"""Every job's GPUs, threads and memory come from config `resources:`; no rule or profile holds a count."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
import yaml
from conftest import REPO, load_test_config, make_workflow_dir, run_snakemake

from workflow_scripts.runtime import resources
from workflow_scripts.runtime.config import ConfigError, load_config, load_schema, validate_config


def _config(res: dict | None = None, **train) -> dict:
    config = load_test_config()
    if res is not None:
        config["resources"] = res
    config["train"].update(train)
    return validate_config(config)


def workflow_rules() -> dict[str, str]:
    """Rule name -> the text of its block, from rules/*.smk."""
    blocks = {}
    for path in sorted((REPO / "rules").glob("*.smk")):
        for match in re.finditer(r"^rule (\w+):\n((?:[ \t]+.*\n|\n)*)", path.read_text(), flags=re.M):
            blocks[match.group(1)] = match.group(2)
    return blocks


def test_defaults_come_from_the_schema():
    config = _config()
    props = load_schema()["properties"]["resources"]["properties"]
    for rule in ("train", "evaluate", "base_model", "default"):
        specs = props[rule]["properties"]
        want = {key: spec["default"] for key, spec in specs.items() if key in resources.KEYS}
        assert resources.rule_resources(config, rule if rule != "default" else "aggregate") == want
    assert props["train"]["properties"]["runtime_min"]["default"] is None  # the profile's runtime
    assert resources.rule_resources(config, "base_model")["cpus"] == 2
    assert resources.rule_resources(config, "train")["mem_mb"] == 4000


def test_a_partial_entry_keeps_its_rules_defaults_for_the_other_keys():
    config = _config({"train": {"gpus": 2}, "sparsity": {"mem_mb": 9000}, "default": {"cpus": 3}})
    assert resources.rule_resources(config, "train") == {"gpus": 2, "cpus": 1, "mem_mb": 4000}
    # a rule the schema gives no defaults of its own falls back to resources.default, key by key
    assert resources.rule_resources(config, "sparsity") == {"gpus": 0, "cpus": 3, "mem_mb": 9000}
    assert resources.rule_resources(config, "aggregate") == {"gpus": 0, "cpus": 3, "mem_mb": 2000}


@pytest.mark.parametrize(
    ("res", "key"),
    [
        ({"trian": {"gpus": 1}}, "resources.trian: unknown key"),
        ({"train": {"gpu": 1}}, "resources.train.gpu: unknown key"),
        ({"train": {"gpus": -1}}, "resources.train.gpus"),
        ({"train": {"gpus": 1.5}}, "resources.train.gpus"),
        ({"evaluate": {"cpus": 0}}, "resources.evaluate.cpus"),
        ({"sparsity": {"mem_mb": "4G"}}, "resources.sparsity.mem_mb"),
        ({"default": {"mem_mb": 0}}, "resources.default.mem_mb"),
    ],
)
def test_malformed_resources_name_the_file_and_key(res, key):
    config = load_test_config()
    config["resources"] = res
    with pytest.raises(ConfigError, match=re.escape(f"my.yaml: {key}")):
        validate_config(config, source="my.yaml")


def test_train_threads_cover_every_training_process():
    config = _config({"train": {"gpus": 0, "cpus": 1}})
    assert resources.job_threads(config, "train") == 1
    config["train"]["distributed"] = {"processes": 2, "strategy": "ddp"}  # CPU (gloo) multi-process
    assert resources.job_threads(config, "train") == 2
    assert resources.job_threads(config, "evaluate") == 1  # only training runs several processes
    config["train"]["distributed"]["processes"] = None  # one per GPU
    config["resources"]["train"].update(gpus=4)
    assert resources.job_threads(config, "train") == 4
    config["resources"]["train"].update(cpus=16)
    assert resources.job_threads(config, "train") == 16


def test_a_gpu_job_asks_for_cpus_per_gpu_rounded_up_and_a_cpu_job_does_not():
    config = _config({"train": {"gpus": 2, "cpus": 3, "mem_mb": 5000}})
    assert resources.snakemake_resources(config, "train") == {"gpu": 2, "mem_mb": 5000, "cpus_per_gpu": 2}
    assert resources.snakemake_resources(config, "evaluate") == {"gpu": 0, "mem_mb": 4000}


def test_the_schema_lists_exactly_the_workflows_rules():
    listed = set(load_schema()["properties"]["resources"]["properties"]) - {"default"}
    assert listed == set(workflow_rules()) - {"all"}


def test_every_rule_takes_threads_and_resources_from_the_config():
    for rule, block in workflow_rules().items():
        if rule == "all":
            continue
        assert f'threads: job_threads("{rule}")' in block, rule
        assert f'**job_resources("{rule}")' in block, rule


def test_no_gpu_count_memory_or_partition_is_a_constant_in_rules_or_the_profile():
    constant = re.compile(
        r"\bgpus?\s*[=:]\s*\d|_GPUS\b|slurm_partition|threads:\s*\d|mem_mb\s*[=:]|cpus_per_\w+\s*="
    )
    for path in sorted((REPO / "rules").glob("*.smk")):
        code = "\n".join(line.split("#")[0] for line in path.read_text().splitlines())
        assert not constant.search(code), (path.name, constant.search(code).group(0))
    profile = yaml.safe_load((REPO / "profiles" / "slurm" / "config.yaml").read_text())
    assert profile["default-resources"]["nodes"] == 1
    for entry in [profile["default-resources"], *profile.get("set-resources", {}).values()]:
        assert not {"gpu", "mem_mb", "slurm_partition", "cpus_per_gpu", "cpus_per_task"} & set(entry), entry
    partitions = yaml.safe_load((REPO / "profiles" / "slurm" / profile["slurm-partition-config"]).read_text())
    assert partitions["partitions"]["cpu"].get("max_gpu", 0) == 0 < partitions["partitions"]["gpu"]["max_gpu"]


def _planned(out: str) -> dict[str, tuple[int, dict[str, str]]]:
    """Rule -> (threads, resources) of its jobs in a dry run's listing (the last job of each rule)."""
    jobs = {}
    for block in re.split(r"^rule ", out, flags=re.M)[1:]:
        rule = block.split(":", 1)[0]
        threads = re.search(r"^\s+threads: (\d+)", block, flags=re.M)  # listed only when > 1
        line = re.search(r"^\s+resources: (.*)$", block, flags=re.M).group(1)
        jobs[rule] = (
            int(threads.group(1)) if threads else 1,
            dict(i.split("=", 1) for i in line.split(", ")),
        )
    return jobs


@pytest.mark.slow
def test_a_configfile_with_two_train_gpus_plans_a_two_gpu_train_job(tmp_path):
    wf = make_workflow_dir(tmp_path / "wf", load_test_config())
    config = load_test_config()
    config["resources"] = {"train": {"gpus": 2, "cpus": 3, "mem_mb": 5000}, "evaluate": {"gpus": 1}}
    (wf / "gpu.yaml").write_text(yaml.safe_dump(config))
    proc = run_snakemake(wf, "--dry-run", "--cores", "8", "--configfile", "gpu.yaml")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    jobs = _planned(proc.stdout)
    threads, train = jobs["train"]
    assert threads == 3
    assert (train["gpu"], train["cpus_per_gpu"], train["mem_mb"]) == ("2", "2", "5000")
    assert jobs["evaluate"][1]["gpu"] == "1" and jobs["evaluate"][1]["mem_mb"] == "4000"
    assert jobs["base_model"][0] == 2 and jobs["base_model"][1]["gpu"] == "0"
    assert jobs["prepare_eval"][1]["gpu"] == "0" and "cpus_per_gpu" not in jobs["prepare_eval"][1]


def test_a_runtime_in_the_config_grows_with_the_attempt_and_none_leaves_the_profiles():
    config = validate_config(load_test_config())
    assert "runtime" not in resources.snakemake_resources(config, "train")
    config["resources"]["train"]["runtime_min"] = 2880
    runtime = resources.snakemake_resources(config, "train")["runtime"]
    assert [runtime(None, attempt) for attempt in (1, 2, 3)] == [2880, 5760, 8640]
    paper = load_config(REPO / "config.paper.yaml", check_files=False)
    attempts = 1 + yaml.safe_load((REPO / "profiles" / "slurm" / "config.yaml").read_text())["retries"]
    total_h = sum(paper["resources"]["train"]["runtime_min"] * k for k in range(1, attempts + 1)) / 60
    assert total_h >= 150  # docs/gpu-and-slurm.md's upper estimate for one fp32 run of config.paper.yaml


def test_a_gpu_evaluate_jobs_runtime_is_estimated_from_its_completions_unless_the_config_sets_one(tmp_path):
    config = validate_config(load_test_config())
    assert "runtime" not in resources.snakemake_resources(config, "evaluate")  # CPU: the profile's
    config["resources"]["evaluate"].update(gpus=1, tokens_per_s=100, kl_tokens_per_s=10)
    config["eval"].update(n_samples=4, kl_prompts=3, kl_samples=2)
    task = next(iter(config["data"]["tasks"]))
    config["data"]["tasks"][task]["max_new_tokens"] = 60
    # by hand: sampling 50 x 4 x 60 x 0.5 = 6000 tokens / 100 = 60 s; KL 3 x 2 x 30 = 180 / 10 = 18 s
    # (10 + 78 / 60) x 1.5 = 16.95 -> 17 min
    assert resources.evaluate_minutes(config, {task: 50}) == 17
    data = tmp_path / f"{task}.jsonl"
    data.write_text("{}\n" * 50)
    runtime = resources.snakemake_resources(config, "evaluate")["runtime"]
    job = SimpleNamespace(data=str(data))
    assert [runtime(None, job, attempt) for attempt in (1, 2)] == [17, 34]
    assert runtime(None, SimpleNamespace(data=[str(data)]), 1) == 17  # per_run: a list of files
    missing = SimpleNamespace(data=[str(tmp_path / "absent.jsonl")])
    assert runtime(None, missing, 2) == 2 * resources.EVAL_UNKNOWN_MIN  # a dry run before prepare_eval
    config["resources"]["evaluate"]["runtime_min"] = 240  # the config's own limit wins
    assert resources.snakemake_resources(config, "evaluate")["runtime"](None, 1) == 240
