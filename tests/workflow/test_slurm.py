"""The workflow through `snakemake --profile profiles/slurm` on a real single-node SLURM started here.

The cluster: Debian's munged, slurmctld and slurmd (installed by .ci/slurm_setup.sh), started directly
(no systemd) in the foreground as children of this test, with a munge key, slurm.conf and gres.conf
generated in a temp dir (nothing under /etc is read or changed), on free ports. One node = this host,
with the two partitions profiles/slurm/partitions.yaml names (`cpu`, the default, and `gpu`) and two fake
GPUs (GRES backed by /dev/null and /dev/zero), so GPU jobs really get `--gpus=N` and a SLURM-set
CUDA_VISIBLE_DEVICES. The GPU counts, threads and memory come from the workflow config (`resources:`):
train asks for both GPUs (one node, --cpus-per-gpu, --mem), evaluate for one; the profile adds only
partitions, runtimes and one node per job. The node declares 128 GB and at least 4 CPUs
(SlurmdParameters=config_overrides), so that the two prepare jobs, and train beside the base model's
evaluation, run at once as on a real node instead of queueing for 2 cores (the jobs are mostly start-up);
they use a few hundred MB. The plugin's jobstep drops SLURM_CONF before its in-job `srun`, so an
`srun` wrapper first on PATH points it at the test config (a real cluster has /etc/slurm/slurm.conf); an
`sbatch` wrapper records each call's flags with the job id it got. Teardown (also after a failure)
cancels all jobs and stops the daemons by pid.

No accounting database: the plugin polls with squeue (--slurm-status-command squeue; MinJobAge=600 keeps
finished jobs visible to squeue) and guesses no account (--slurm-no-account). profiles/default (the
local-machine profile: cores 2, a 20 GB memory cap) is switched off with --workflow-profile none, as the
README says for cluster runs. Skipped, with the reason, where the daemons cannot run (not root, SLURM not
installed); under CI a daemon that does not come up is a failure, not a skip.

Waiting: the plugin pauses 5 s before every sbatch and backs its squeue polls off by 10 s each (2, 14,
36, 68, 110 s after a job starts), sized for a busy real cluster; on this idle one that was most of a run.
A sitecustomize on PYTHONPATH (SITE, test_slurm_site/ in a temp dir) turns both into a poll every
POLL_S s in the Snakemake process that imports the plugin; the jobs, their flags and states are SLURM's
as before. It fails the run if the plugin's code no longer has what it patches.

The run's profile is a copy of profiles/slurm whose gpu partition has a 1-minute limit: the train job's
estimate exceeds it, SLURM kills the first attempt at its limit, and the retries that runtime/retries.py
planned bring it back to resume from its checkpoint before the evaluation reads its model (one run checks
both the profile's plain path and its resubmission; test_a_train_job_longer_than_its_partitions_limit_...).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import (
    REPO,
    SNAKEMAKE,
    load_test_config,
    log_workflow_run,
    make_workflow_dir,
    run_snakemake,
)

pytestmark = pytest.mark.slow

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "squeue", "scontrol", "sinfo", "scancel", "srun")
# What the workflow config asks for (config `resources:`): train = one node with both fake GPUs.
RESOURCES = {
    "train": {"gpus": 2, "cpus": 2, "mem_mb": 3000},
    "evaluate": {"gpus": 1, "cpus": 1, "mem_mb": 2500},
}
GPU_RULES = {rule for rule, res in RESOURCES.items() if res["gpus"]}
# prepare_* -> base_model -> train fp32 seed 1 -> evaluate (pass@1 + KL) base and fp32-s1 on one task
TARGETS = (
    "results/models/base.json",
    "results/eval/fp32-s1/add_sub.json",
    "results/eval/fp32-s1/add_sub.kl.json",
)
SUBMITTED = re.compile(r"Job (\d+) has been submitted with SLURM jobid (\d+)")
SNAKEMAKE_TIMEOUT = 420
POLL_S = 2  # seconds between the plugin's squeue polls (SITE), the first one included
# sbatch first on PATH: the real one, then "<its output (the job id)>\t<its arguments>" appended to a log
SBATCH_WRAPPER = """#!/bin/sh
out=$({sbatch} "$@")
rc=$?
printf '%s\\t%s\\n' "$out" "$*" >> {log}
printf '%s\\n' "$out"
exit $rc
"""


# A sitecustomize for the processes of the SLURM runs (PYTHONPATH; the jobs inherit it): two hooks, each on
# only where its variable is set, that patch a module right after its first import.
SITE = '''\
"""Test hooks of tests/workflow/test_slurm.py (its docstring says why)."""
import glob
import os
import sys
import time

_POLL_S = float(os.environ.get("RLVR_TEST_SLURM_POLL_S") or 0)
_STALL_AT = int(os.environ.get("RLVR_TEST_STALL_AT") or 0)
_CHECKPOINTS = os.environ.get("RLVR_TEST_CHECKPOINTS", "")


class _AfterImport:
    """Runs ``patch(module)`` when module ``name`` has been imported."""

    def __init__(self, name, patch):
        self.name, self.patch = name, patch

    def find_spec(self, name, path=None, target=None):
        if name != self.name:
            return None
        import importlib.util

        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            self.patch(module)

        spec.loader.exec_module = exec_module
        return spec


class _NoPause:
    """The time module for the plugin, without its 5 s pause before each sbatch."""

    def __getattr__(self, name):
        return getattr(time, name)

    @staticmethod
    def sleep(seconds):
        pass


def _poll_often(plugin):
    """snakemake-executor-plugin-slurm: squeue every _POLL_S s (no back-off), no pause before sbatch."""
    executor = getattr(plugin, "Executor", None)
    if getattr(plugin, "time", None) is not time or not isinstance(
        getattr(executor, "next_seconds_between_status_checks", None), property
    ):
        raise RuntimeError("test_slurm.py SITE: the slurm plugin changed; update its _poll_often")
    executor.next_seconds_between_status_checks = property(lambda self: _POLL_S, lambda self, value: None)
    plugin.time = _NoPause()
    print(f"test_slurm.py SITE: squeue every {_POLL_S:g} s", file=sys.stderr)


def _stall(trainer_module):
    """Trainer.training_step waits for SLURM's kill once _STALL_AT steps (and their checkpoint) are done."""
    step = trainer_module.Trainer.training_step

    def training_step(self, *args, **kwargs):
        if self.state.global_step >= _STALL_AT:
            print(f"test_slurm.py SITE: stalled after step {self.state.global_step}", file=sys.stderr)
            time.sleep(3600)
        return step(self, *args, **kwargs)

    trainer_module.Trainer.training_step = training_step


if _POLL_S:
    sys.meta_path.insert(0, _AfterImport("snakemake_executor_plugin_slurm", _poll_often))
if _STALL_AT and not glob.glob(os.path.join(_CHECKPOINTS, "checkpoint-*")):  # a first attempt only
    sys.meta_path.insert(0, _AfterImport("transformers.trainer", _stall))
'''


def _find(binary: str) -> str | None:
    return shutil.which(binary) or next(
        (str(p) for d in ("/usr/sbin", "/usr/bin") if (p := Path(d) / binary).exists()), None
    )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _slurm_conf(root: Path, host: str) -> str:
    cpus = max(4, os.cpu_count() or 4)  # 4 on a 2-core machine: jobs that are mostly start-up overlap
    return f"""\
ClusterName=rlvrtest
SlurmctldHost={host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge/munge.socket
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SchedulerType=sched/builtin
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
MinJobAge=600
KillWait=5
DefMemPerCPU=500
GresTypes=gpu
SlurmdParameters=config_overrides
NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory=128000 Gres=gpu:2 State=UNKNOWN
PartitionName=cpu Nodes={host} Default=YES MaxTime=INFINITE State=UP
PartitionName=gpu Nodes={host} MaxTime=INFINITE State=UP
"""


def _unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"SLURM test cluster unavailable under CI: {reason}")
    pytest.skip(f"SLURM test cluster unavailable: {reason}")


def _wait_for(check, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.5)
    return False


class Cluster:
    def __init__(self, root: Path, env: dict[str, str], host: str):
        self.root, self.env, self.host = root, env, host
        self.procs: list[subprocess.Popen] = []

    def cmd(self, *args: str, timeout: int = 30) -> subprocess.CompletedProcess:
        return subprocess.run(args, capture_output=True, text=True, env=self.env, timeout=timeout)

    def start(self, name: str, *args: str) -> None:
        log = open(self.root / "log" / f"{name}.out", "w")  # noqa: SIM115 (closed with the process)
        self.procs.append(
            subprocess.Popen(
                [_find(name), *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
            )
        )
        log.close()

    def logs(self) -> str:
        parts = []
        for path in sorted((self.root / "log").iterdir()):
            lines = [ln for ln in path.read_text(errors="replace").splitlines() if "pmix" not in ln]
            parts.append(f"--- {path.name}\n" + "\n".join(lines[-15:]))
        return "\n".join(parts)

    def node_state(self) -> str:
        try:
            return self.cmd("sinfo", "-h", "-n", self.host, "-o", "%t", timeout=10).stdout.strip()
        except subprocess.TimeoutExpired:
            return ""

    def jobs(self) -> dict[str, dict[str, str]]:
        """SLURM job id -> scontrol's fields (Partition, Comment, TresPerJob, JobState, ...)."""
        out = self.cmd("scontrol", "-o", "show", "job").stdout
        jobs = {}
        for line in out.splitlines():
            fields = dict(re.findall(r"(\w+(?:/\w+)?)=(\S*)", line))
            if "JobId" in fields:
                jobs[fields["JobId"]] = fields
        return jobs

    def stop(self) -> None:
        if any(p.poll() is None for p in self.procs):
            try:
                self.cmd("scancel", "--full", "--quiet", "--user", "root", timeout=10)
                _wait_for(lambda: not self.cmd("squeue", "-h", "-t", "R,CG", timeout=10).stdout.strip(), 20)
            except (subprocess.TimeoutExpired, OSError):
                pass
        for proc in reversed(self.procs):  # slurmd, slurmctld, munged
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)


@pytest.fixture(scope="module")
def slurm_cluster(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("SLURM test cluster needs root (munged/slurmd run as root here)")
    missing = [b for b in (*DAEMONS, *CLIENTS) if _find(b) is None]
    if missing:
        pytest.skip(
            f"SLURM not installed (missing {', '.join(missing)}): run `bash .ci/slurm_setup.sh` as root"
        )

    root = tmp_path_factory.mktemp("slurm")
    for sub in ("munge", "state", "spool", "log"):
        (root / sub).mkdir(mode=0o700)
    key = root / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    host = socket.gethostname()
    conf = root / "slurm.conf"
    conf.write_text(_slurm_conf(root, host))
    (root / "gres.conf").write_text(
        f"NodeName={host} Name=gpu File=/dev/null\nNodeName={host} Name=gpu File=/dev/zero\n"
    )
    # Inside a job the plugin's jobstep drops every SLURM_* variable, SLURM_CONF too, before its `srun`:
    # on a real cluster srun then reads /etc/slurm/slurm.conf. This test leaves /etc alone and puts an
    # srun first on PATH that points the real one at the test cluster's config, and an sbatch that
    # appends "<its output (the job id)>\t<its arguments>" to sbatch_calls.log.
    bin_dir = root / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(f'#!/bin/sh\nSLURM_CONF={conf} exec {_find("srun")} "$@"\n')
    (bin_dir / "sbatch").write_text(
        SBATCH_WRAPPER.format(sbatch=_find("sbatch"), log=root / "sbatch_calls.log")
    )
    for wrapper in ("srun", "sbatch"):
        (bin_dir / wrapper).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_"))}
    env["SLURM_CONF"] = str(conf)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    cluster = Cluster(root, env, host)
    try:
        socket_path = root / "munge" / "munge.socket"
        cluster.start(
            "munged", "--foreground", "--force", f"--key-file={key}", f"--socket={socket_path}",
            f"--pid-file={root}/munge/munged.pid", f"--log-file={root}/log/munged.log",
            f"--seed-file={root}/munge/munged.seed",
        )  # fmt: skip
        if not _wait_for(socket_path.exists, 15):
            _unavailable("munged did not start\n" + cluster.logs())
        cluster.start("slurmctld", "-D", "-i", "-f", str(conf))
        cluster.start("slurmd", "-D", "-f", str(conf), "-N", host)
        if not _wait_for(lambda: cluster.node_state() in ("idle", "mix", "alloc"), 40):
            _unavailable(f"node state {cluster.node_state()!r} after 40 s\n" + cluster.logs())
        yield cluster
    finally:
        cluster.stop()


def test_gpu_jobs_get_their_device_from_slurm(slurm_cluster):
    """A --gpus=1 job on the gpu partition sees SLURM's CUDA_VISIBLE_DEVICES, and gpu_slot leaves it."""
    probe = (
        "import os; from workflow_scripts.runtime.gpu_slots import gpu_slot\n"
        "with gpu_slot(1) as slots: print('slots', slots, 'visible', os.environ.get('CUDA_VISIBLE_DEVICES'))"
    )
    proc = slurm_cluster.cmd(
        "srun", "-p", "gpu", "--gpus=1", "--mem=500", "-t", "5", "-D", str(REPO), sys.executable, "-c", probe,
        timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"slots \[\] visible \d", proc.stdout), proc.stdout + proc.stderr


# The train job is longer than its partition: its estimate (resources.train.estimate_min 2) exceeds the
# gpu partition's max_runtime (1 minute, in a copy of the profile's partitions.yaml): runtime/retries.py
# caps every attempt at -t 1 and gives the rule the retries it needs; SLURM kills the first attempt at its
# limit (60-90 s after it starts: slurmctld checks limits every 30 s), Snakemake resubmits it, and it
# resumes from its checkpoint. SITE stalls the first attempt (a train job that started with no checkpoint) in
# Trainer.training_step once STALL_AT steps and their checkpoint are done, so it is killed however fast the
# machine is, and leaves the resumed attempt only RESUME_STEPS - STALL_AT steps: that one must finish inside
# its minute, start-up included (~15 s on an idle 2-core machine; one finishing after the limit but before
# slurmctld's check would be marked TIMEOUT with its outputs and checkpoints gone). The base model's
# evaluation runs beside the stalled attempt; the run's evaluation of fp32-s1 reads the resumed model.
RESUME_STEPS, STALL_AT = 6, 4  # checkpoints every 2 steps (a generation round): the resumed one does 2


def _run_config() -> dict:
    """The tiny test config with RESOURCES; training stays one process (the node's GPUs are fake)."""
    config = load_test_config()
    config["model"]["tiny"]["sft_steps"] = 2  # the jobs' placement and outputs are checked, not quality
    config["train"]["eval_tasks"] = ["add_sub"]  # train's held-out curve: one prepare_eval job, not three
    config["train"].update(
        max_steps=RESUME_STEPS, checkpoint_every=2, kl_every=RESUME_STEPS, eval_every=RESUME_STEPS
    )
    config["resources"] = {
        **RESOURCES,
        "train": {**RESOURCES["train"], "estimate_min": 2, "startup_min": 0.1},
    }
    config["train"]["distributed"] = {"processes": 1}
    return config


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """A folder with SITE as its sitecustomize.py, for the runs' PYTHONPATH."""
    folder = tmp_path_factory.mktemp("test_slurm_site")
    (folder / "sitecustomize.py").write_text(SITE)
    return folder


def _slurm_env(cluster: Cluster, site: Path, **extra: str) -> dict[str, str]:
    """The cluster's environment for a Snakemake run and its jobs, with SITE's squeue poll every POLL_S s."""
    return {
        **cluster.env, "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore",
        "RLVR_TEST_SLURM_POLL_S": str(POLL_S),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])),
        **extra,
    }  # fmt: skip


def _slurm_cmd(profile: Path | str, workdir: Path, *targets: str) -> list[str]:
    """snakemake through ``profile`` in ``workdir``, polling squeue (no accounting here), no account."""
    return [
        SNAKEMAKE, "--profile", str(profile), "--workflow-profile", "none",
        "--directory", str(workdir), "--snakefile", str(workdir / "Snakefile"),
        "--slurm-status-command", "squeue", "--slurm-init-seconds-before-status-checks", str(POLL_S),
        "--slurm-no-account", "--slurm-keep-successful-logs", *targets,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def slurm_run(slurm_cluster, site, tmp_path_factory):
    """prepare -> base_model -> train (killed at its partition's limit, resumed) -> evaluate through a copy
    of the profile whose gpu partition has a 1-minute limit (every job an sbatch)."""
    remote = make_workflow_dir(tmp_path_factory.mktemp("run") / "slurm", _run_config())
    profile = remote / "profile-short"
    shutil.copytree(REPO / "profiles" / "slurm", profile)
    (profile / "partitions.yaml").write_text("partitions:\n  cpu: {}\n  gpu: {max_gpu: 8, max_runtime: 1}\n")
    checkpoints = remote / "results/checkpoints/fp32/seed1"
    env = _slurm_env(
        slurm_cluster, site, RLVR_TEST_STALL_AT=str(STALL_AT), RLVR_TEST_CHECKPOINTS=str(checkpoints)
    )
    cmd = ["timeout", "-k", "10", str(SNAKEMAKE_TIMEOUT), *_slurm_cmd(profile, remote, *TARGETS)]
    log_workflow_run(cmd[5:], via="snakemake --profile (profiles/slurm, gpu partition limit 1 min)")
    started = time.monotonic()
    proc = subprocess.run(
        cmd, capture_output=True, text=True, env=env, cwd=remote, timeout=SNAKEMAKE_TIMEOUT + 30
    )
    slurm_seconds = time.monotonic() - started
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, (
        f"SLURM run failed after {slurm_seconds:.0f} s:\n{log[-6000:]}\n{slurm_cluster.logs()}"
    )
    print(f"SLURM run: {slurm_seconds:.0f} s")
    submitted = SUBMITTED.findall(log)  # (snakemake job id, SLURM job id), a resubmission a second pair
    jobs = {slurm_id: slurm_cluster.jobs()[slurm_id] for _, slurm_id in submitted}
    return {"log": log, "submitted": submitted, "jobs": jobs, "remote": remote, "checkpoints": checkpoints}


def _rule(job: dict[str, str]) -> str:
    return re.match(r"rule_(\w+?)(?:_wildcards_|$)", job["Comment"]).group(1)


def _asks_gpu(job: dict[str, str]) -> bool:
    return "gpu" in job.get("TresPerJob", "") or "gpu" in job.get("TresPerNode", "")


def test_workflow_runs_through_the_slurm_profile(slurm_run, slurm_cluster):
    log, submitted, jobs, remote = (slurm_run[k] for k in ("log", "submitted", "jobs", "remote"))
    assert "test_slurm.py SITE: squeue every" in log, log[-4000:]  # the waits below are SITE's
    # every job went through sbatch (train twice: the resubmission below), and SLURM ran it on the
    # partition its GPU request calls for
    n_jobs = int(re.search(r"^total\s+(\d+)", log, flags=re.M).group(1))  # snakemake's job stats
    rules = [_rule(jobs[slurm_id]) for _, slurm_id in submitted]
    assert len(submitted) == n_jobs + 1 >= 6 and rules.count("train") == 2, (rules, log[-4000:])
    rules_seen = set(rules)
    for job in jobs.values():
        rule = _rule(job)
        if rule != "train":  # its two attempts: test_a_train_job_longer_than_its_partitions_limit_...
            assert job["JobState"] == "COMPLETED", job
        if rule in GPU_RULES:
            assert job["Partition"] == "gpu" and _asks_gpu(job), (rule, job)
        else:
            assert job["Partition"] == "cpu" and not _asks_gpu(job), (rule, job)
    assert rules_seen >= {"prepare_train", "prepare_eval", "base_model", "train", "evaluate"}
    slurm_logs = list((remote / ".snakemake" / "slurm_logs").rglob("*.log"))
    assert {p.stem for p in slurm_logs} >= set(jobs)

    # every output of the plan is on the login node's disk and up to date in Snakemake's records: --summary
    # (a job's outputs, dates, params and code, as a local run would read them) finds no file to make
    summary = run_snakemake(remote, "--summary", *TARGETS, timeout=120)
    assert summary.returncode == 0, summary.stdout + summary.stderr
    rows = [line.split("\t") for line in summary.stdout.splitlines()[1:] if line.strip()]
    assert {row[2] for row in rows} == rules_seen and len(rows) >= n_jobs, summary.stdout
    for output, _date, rule, _log, status, plan in (row[:6] for row in rows):
        assert (status, plan) == ("ok", "no update") and (remote / output).exists(), (output, rule, status)
    # ... and nothing else: every file under results/ is an output of the plan or inside a directory() one
    # (the killed attempt's checkpoints included: train removes them when it finishes)
    declared = {Path(row[0]) for row in rows}
    for path in (remote / "results").rglob("*"):
        relative = path.relative_to(remote)
        if path.is_file():
            assert relative in declared or declared & set(relative.parents), relative
    assert not slurm_run["checkpoints"].exists()


def test_a_multi_gpu_train_job_asks_for_one_node_with_its_gpus_cpus_and_memory(slurm_run, slurm_cluster):
    """Config resources.train = 2 GPUs, 2 cpus, 3000 MB -> the plugin's sbatch flags and SLURM's job, for
    both attempts of the train job of the workflow run above (slurm_run, shared: no run of its own)."""
    calls = dict(
        line.split("\t", 1) for line in (slurm_cluster.root / "sbatch_calls.log").read_text().splitlines()
    )
    train = [(slurm_id, job) for slurm_id, job in slurm_run["jobs"].items() if _rule(job) == "train"]
    assert len(train) == 2, slurm_run["jobs"]
    want = RESOURCES["train"]
    per_gpu = -(-want["cpus"] // want["gpus"])
    for slurm_id, job in train:
        call = calls[slurm_id].split(" --wrap", 1)[0]  # the flags, without the job's own command line
        print(f"train job {slurm_id}: sbatch {call}")
        flags = call.split()
        for flag in (f"--gpus={want['gpus']}", f"--cpus-per-gpu={per_gpu}", "--nodes=1"):
            assert flag in flags, call
        assert flags[flags.index("--mem") + 1] == str(want["mem_mb"]), call
        assert not any(f.startswith("--cpus-per-task") for f in flags), call
        # what SLURM made of it: both GPUs, the CPUs per GPU and the memory, on one node
        assert re.fullmatch(rf"(gres[:/])?gpu:{want['gpus']}", job.get("TresPerJob", "")), job
        assert re.fullmatch(rf"(gres[:/])?gpu:{per_gpu}", job.get("CpusPerTres", "")), job
        assert job["NumNodes"] == "1" and job["NumCPUs"] == str(want["gpus"] * per_gpu), job
        assert job["MinMemoryNode"] == f"{want['mem_mb']}M", job
        assert job["Partition"] == "gpu", job


def test_a_train_job_longer_than_its_partitions_limit_is_resubmitted_and_finishes_by_resuming(slurm_run):
    log, remote = slurm_run["log"], slurm_run["remote"]
    # the plan printed at the start: 1 + ceil((2 - 1) / (1 - 0.1 - 2 x 2/6)) = 1 + ceil(4.29) = 6 attempts;
    # retries 5 + the profile's 2
    row = next(line for line in log.splitlines() if line.startswith("train ") and " min " in line)
    assert row.split()[-2:] == ["6", "7"], row
    # every attempt asked the partition's limit; the first was killed at it, the last completed
    train = [(slurm_id, job) for slurm_id, job in slurm_run["jobs"].items() if _rule(job) == "train"]
    assert len(train) == 2, log[-4000:]
    assert all(job["TimeLimit"] == "00:01:00" for _, job in train), train
    states = [job["JobState"] for _, job in sorted(train, key=lambda item: int(item[0]))]
    assert states == ["TIMEOUT", "COMPLETED"], states
    # ... and resumed from the checkpoint the killed one left
    run = json.loads((remote / "results/train/fp32/seed1/run.json").read_text())
    assert _find_key(run, "resumed") is True and _find_key(run, "resumed_from_step") == STALL_AT, run
    metrics = [json.loads(line) for line in (remote / "results/train/fp32/seed1/metrics.jsonl").open()]
    assert [m["step"] for m in metrics] == list(range(1, RESUME_STEPS + 1))


def _find_key(record, key):
    """The value of ``key`` anywhere in a nested run.json record (None if absent)."""
    if isinstance(record, dict):
        if key in record:
            return record[key]
        record = list(record.values())
    if isinstance(record, list):
        for item in record:
            found = _find_key(item, key)
            if found is not None:
                return found
    return None
