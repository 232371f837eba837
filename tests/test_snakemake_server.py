"""tests/snakemake_server.py: an invocation forked from the warm server is what a fresh process makes."""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest
import snakemake_server
from conftest import SNAKEMAKE

PROBE = """
import json, os, time
with open("seen.json", "w") as fh:
    json.dump({"cwd": os.getcwd(), "x": os.environ.get("RLVR_PROBE")}, fh)
time.sleep(float(os.environ.get("RLVR_PROBE_SLEEP", "0")))

rule all:
    input: "a.txt"

rule a:
    output: "a.txt"
    shell: "touch {output}"
"""
# what differs between any two invocations: the times and the run's random id
VARYING = re.compile(r"^\s*(Date|Workflow ID):.*$|^\[\w{3} \w{3} [\d :]+\]$", re.M)


@pytest.mark.slow  # one fresh snakemake process, for the comparison
def test_a_served_dry_run_prints_what_a_fresh_process_prints_from_the_callers_directory_and_env(tmp_path):
    (tmp_path / "Snakefile").write_text(PROBE)
    cmd = [SNAKEMAKE, "-n", "--cores", "1"]
    env = {**os.environ, "RLVR_PROBE": "served"}
    served = snakemake_server.run(cmd, cwd=tmp_path, env=env, timeout=120)
    assert json.loads((tmp_path / "seen.json").read_text()) == {"cwd": str(tmp_path), "x": "served"}
    fresh = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert served.returncode == fresh.returncode == 0, served.stderr
    assert VARYING.sub("", served.stdout) == VARYING.sub("", fresh.stdout)
    assert "Job stats:" in served.stdout and VARYING.sub("", served.stderr) == VARYING.sub("", fresh.stderr)
    assert not (tmp_path / "a.txt").exists()
    bad = snakemake_server.run([*cmd, "--no-such-flag"], cwd=tmp_path, env=env, timeout=120)
    assert bad.returncode == 2 and "unrecognized arguments: --no-such-flag" in bad.stderr


def test_a_served_invocation_past_its_timeout_is_killed_and_the_server_serves_on(tmp_path):
    (tmp_path / "Snakefile").write_text(PROBE)
    env = {**os.environ, "RLVR_PROBE_SLEEP": "60"}
    with pytest.raises(subprocess.TimeoutExpired):
        snakemake_server.run([SNAKEMAKE, "-n", "--cores", "1"], cwd=tmp_path, env=env, timeout=1)
    env["RLVR_PROBE_SLEEP"] = "0"
    assert (
        snakemake_server.run([SNAKEMAKE, "-n", "--cores", "1"], cwd=tmp_path, env=env, timeout=60).returncode
        == 0
    )


def test_only_invocations_that_start_no_job_are_served():
    assert snakemake_server.runs_no_job(["--cores", "2", "--dry-run"])
    assert snakemake_server.runs_no_job(["-n", "--profile", "profiles/slurm"])
    assert snakemake_server.runs_no_job(["--touch", "--forceall"]) and snakemake_server.runs_no_job(
        ["--summary"]
    )
    assert not snakemake_server.runs_no_job(["--cores", "2", "results/train/fp32/seed1/run.json"])
