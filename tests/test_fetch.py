"""fetch stage (rules/fetch.smk): the only jobs that reach the hub are the local fetch jobs."""

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import snakemake_server
import yaml
from conftest import REPO, SNAKEMAKE

from workflow_scripts import fetch
from workflow_scripts.runtime import hub_copies
from workflow_scripts.tasks.real_datasets import DATASETS, load_dataset_rows


def test_a_fetch_dataset_job_writes_the_copy_its_rule_names(tmp_path, monkeypatch):
    """from_snakemake as the rule calls it: the dataset of the wildcard into the output (the "hub" a local
    folder laid out like opencompass/AIME2025's repository)."""
    import dataclasses

    repo = tmp_path / "repo"
    repo.mkdir()
    configs = "".join(
        f"- config_name: AIME2025-{p}\n  data_files:\n  - split: test\n    path: aime2025-{p}.jsonl\n"
        for p in ("I", "II")
    )
    (repo / "README.md").write_text(f"---\nconfigs:\n{configs}---\n", encoding="utf-8")
    for part in ("I", "II"):
        (repo / f"aime2025-{part}.jsonl").write_text(
            json.dumps({"question": f"{part}?", "answer": "7"}) + "\n"
        )
    monkeypatch.setitem(DATASETS, "aime25", dataclasses.replace(DATASETS["aime25"], hub_id=str(repo)))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # restored after the test: the job sets it as the run started
    monkeypatch.setenv(hub_copies.OFFLINE_ENV, "1")
    out = tmp_path / "results" / "hub" / "datasets" / "aime25.parquet"
    smk = SimpleNamespace(rule="fetch_dataset", wildcards=SimpleNamespace(dataset="aime25"),
                          output=SimpleNamespace(dataset=str(out)))  # fmt: skip
    fetch.from_snakemake(smk)
    rows = load_dataset_rows("aime25", "aime25", str(out))
    assert [r["meta"]["part"] for r in rows] == ["AIME2025-I", "AIME2025-II"]


# What the workflow's parse sets up, read through Snakemake's API in a child process (the parse sets
# HF_HUB_OFFLINE in its process, as a job's snakemake process does): local rules, each rule's script,
# the environment every job inherits.
PARSE = """
import json, os, sys
from pathlib import Path
from snakemake.api import SnakemakeApi
from snakemake.settings.types import ConfigSettings, OutputSettings, ResourceSettings, StorageSettings
with SnakemakeApi(OutputSettings()) as api:
    wf = api.workflow(resource_settings=ResourceSettings(), storage_settings=StorageSettings(),
                      config_settings=ConfigSettings(configfiles=[Path(sys.argv[1])]),
                      snakefile=Path("Snakefile"), workdir=Path(sys.argv[2]))._workflow
    print("PARSED " + json.dumps({"local": sorted(wf._localrules),
                                  "scripts": {r.name: r.script for r in wf.rules if r.script},
                                  "offline": os.environ.get("HF_HUB_OFFLINE"),
                                  "user": os.environ.get(sys.argv[3])}))
"""


def _dry_run_jobs(text: str) -> list[tuple[str, list[str]]]:
    """(rule, input files) of every job a dry run lists."""
    jobs = []
    for block in text.split("\nrule ")[1:]:
        lines = block.splitlines()
        inputs = next(
            (ln.split(":", 1)[1].split(", ") for ln in lines[1:] if ln.startswith("    input:")), []
        )
        jobs.append((lines[0].rstrip(":"), [f.strip() for f in inputs]))
    return jobs


def test_the_one_node_slurm_plan_needs_the_network_only_in_local_fetch_jobs(tmp_path):
    """The acceptance check: `snakemake -n --profile profiles/slurm --configfile config.one-node.yaml`
    plans the hub datasets and the hub model as fetch jobs of LOCAL rules (the login node), every other
    job reads their copies, and the parse sets HF_HUB_OFFLINE=1 for every job (~8 s: two parses)."""
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", hub_copies.OFFLINE_ENV)}
    dry = snakemake_server.run(
        [SNAKEMAKE, "-n", "--profile", "profiles/slurm", "--configfile", "config.one-node.yaml",
         "--directory", str(tmp_path), "--snakefile", "Snakefile"], cwd=REPO, env=env, timeout=300,
    )  # fmt: skip
    assert dry.returncode == 0, dry.stdout[-3000:] + dry.stderr[-3000:]
    jobs = _dry_run_jobs(dry.stdout)
    parse = subprocess.run([sys.executable, "-c", PARSE, "config.one-node.yaml", str(tmp_path / "p"),
                            hub_copies.OFFLINE_ENV], capture_output=True, text=True, timeout=300, cwd=REPO,
                           env=env)  # fmt: skip
    assert parse.returncode == 0, parse.stderr[-3000:]
    plan = json.loads(next(ln for ln in parse.stdout.splitlines() if ln.startswith("PARSED "))[7:])
    assert plan["local"] == ["fetch_dataset", "fetch_model"]
    assert plan["offline"] == "1" and plan["user"] == ""  # jobs offline; the fetch jobs as started (online)
    assert {plan["scripts"][r] for r in plan["local"]} == {"../workflow_scripts/fetch.py"}
    assert "../workflow_scripts/fetch.py" not in {
        s for r, s in plan["scripts"].items() if r not in plan["local"]
    }
    assert (
        sum(rule == "fetch_dataset" for rule, _ in jobs) == 5
    )  # math500, amc23, gsm8k, mmlu_stem, dapo_math
    assert sum(rule == "fetch_model" for rule, _ in jobs) == 1
    config = yaml.safe_load((REPO / "config.one-node.yaml").read_text())
    copies = {t: str(hub_copies.dataset_copy(spec["source"])) for t, spec in config["data"]["tasks"].items()}
    by_rule = {}
    for rule, inputs in jobs:
        by_rule.setdefault(rule, []).append(inputs)
    assert sorted(i[0] for i in by_rule["prepare_eval"]) == sorted(copies.values())
    assert str(hub_copies.dataset_copy("dapo_math")) in by_rule["prepare_train"][0]
    assert str(hub_copies.model_copy(config["model"]["source"])) in by_rule["base_model"][0]
    compute = {rule for rule, _ in jobs} - set(plan["local"])
    assert {"prepare_eval", "prepare_train", "base_model", "train", "evaluate"} <= compute
