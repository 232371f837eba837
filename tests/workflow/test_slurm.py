"""The workflow through `snakemake --profile profiles/slurm` on a real single-node SLURM started here.

The cluster: Debian's munged, slurmctld and slurmd (installed by .ci/slurm_setup.sh), started directly
(no systemd) in the foreground as children of this test, with a munge key, slurm.conf and gres.conf
generated in a temp dir (nothing under /etc is read or changed), on free ports. One node = this host,
with the two partitions profiles/slurm/partitions.yaml names (`cpu`, the default, and `gpu`) and two fake
GPUs (GRES backed by /dev/null and /dev/zero), so GPU jobs really get `--gpus=N` and a SLURM-set
CUDA_VISIBLE_DEVICES. The GPU counts, threads and memory come from the workflow config (`resources:`):
train asks for both GPUs (one node, --cpus-per-gpu, --mem), evaluate for one; the profile adds only
partitions, runtimes and one node per job. The node declares 128 GB (SlurmdParameters=config_overrides);
the jobs use a few hundred MB. The plugin's jobstep drops SLURM_CONF before its in-job `srun`, so an
`srun` wrapper first on PATH points it at the test config (a real cluster has /etc/slurm/slurm.conf); an
`sbatch` wrapper records each call's flags with the job id it got. Teardown (also after a failure)
cancels all jobs and stops the daemons by pid.

No accounting database: the plugin polls with squeue (--slurm-status-command squeue; MinJobAge=600 keeps
finished jobs visible to squeue) and guesses no account (--slurm-no-account). profiles/default (the
local-machine profile: cores 2, a 20 GB memory cap) is switched off with --workflow-profile none, as the
README says for cluster runs. Skipped, with the reason, where the daemons cannot run (not root, SLURM not
installed); under CI a daemon that does not come up is a failure, not a skip.

A third run (test_a_train_job_longer_than_its_partitions_limit_...) gives a profile copy a 1-minute gpu
partition: the train job's estimate exceeds it, SLURM kills the first attempt at its limit and the retries
that runtime/retries.py planned bring it back to resume from its checkpoint.
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
from conftest import REPO, SNAKEMAKE, load_test_config, log_workflow_run, make_workflow_dir

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
# sbatch first on PATH: the real one, then "<its output (the job id)>\t<its arguments>" appended to a log
SBATCH_WRAPPER = """#!/bin/sh
out=$({sbatch} "$@")
rc=$?
printf '%s\\t%s\\n' "$out" "$*" >> {log}
printf '%s\\n' "$out"
exit $rc
"""


def _find(binary: str) -> str | None:
    return shutil.which(binary) or next(
        (str(p) for d in ("/usr/sbin", "/usr/bin") if (p := Path(d) / binary).exists()), None
    )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _slurm_conf(root: Path, host: str) -> str:
    cpus = max(2, os.cpu_count() or 2)
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


def _result_files(workdir: Path) -> list[str]:
    return sorted(str(p.relative_to(workdir)) for p in (workdir / "results").rglob("*") if p.is_file())


def _run_config() -> dict:
    """The tiny test config with RESOURCES; training stays one process (the node's GPUs are fake)."""
    config = load_test_config()
    config["model"]["tiny"]["sft_steps"] = 10  # outputs, not model quality, are compared here
    config["resources"] = RESOURCES
    config["train"]["distributed"] = {"processes": 1}
    return config


@pytest.fixture(scope="module")
def slurm_run(slurm_cluster, tmp_path_factory):
    """prepare -> base_model -> train -> evaluate through the profile, and the same targets locally."""
    # its own runs: every job through SLURM, and a local reference on the same config (10 SFT steps)
    tmp_path = tmp_path_factory.mktemp("run")
    config = _run_config()
    local = make_workflow_dir(tmp_path / "local", config)
    remote = make_workflow_dir(tmp_path / "slurm", config)

    # the reference: the same targets with plain local execution (runs while SLURM works); no CUDA
    # device probe in its GPU jobs (RLVR_GPU_SLOTS=0: they run on CPU, as on the fake-GPU node)
    local_env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore", "RLVR_GPU_SLOTS": "0"}
    local_cmd = [
        SNAKEMAKE, "--cores", "2", "--directory", str(local), "--snakefile", str(local / "Snakefile"),
        *TARGETS,
    ]  # fmt: skip
    local_proc = subprocess.Popen(
        ["timeout", "-k", "10", str(SNAKEMAKE_TIMEOUT), *local_cmd],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=local_env, cwd=local,
    )  # fmt: skip

    env = {**slurm_cluster.env, "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}
    cmd = [
        "timeout", "-k", "10", str(SNAKEMAKE_TIMEOUT), SNAKEMAKE,
        "--profile", "profiles/slurm", "--workflow-profile", "none",
        "--directory", str(remote), "--snakefile", str(remote / "Snakefile"),
        "--slurm-status-command", "squeue", "--slurm-init-seconds-before-status-checks", "2",
        "--slurm-no-account", "--slurm-keep-successful-logs",
        *TARGETS,
    ]  # fmt: skip
    log_workflow_run(local_cmd[1:], via="snakemake (local reference)")
    log_workflow_run(cmd[5:], via="snakemake --profile profiles/slurm")
    started = time.monotonic()
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, env=env, cwd=remote, timeout=SNAKEMAKE_TIMEOUT + 30
        )
        slurm_seconds = time.monotonic() - started
        local_out, _ = local_proc.communicate(timeout=SNAKEMAKE_TIMEOUT + 30)
    finally:
        if local_proc.poll() is None:  # `timeout` passes SIGTERM on to snakemake
            local_proc.terminate()
            try:
                local_proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                local_proc.kill()
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"SLURM run failed:\n{log[-6000:]}\n{slurm_cluster.logs()}"
    assert local_proc.returncode == 0, f"local run failed:\n{local_out[-4000:]}"
    print(f"SLURM run: {slurm_seconds:.0f} s")
    submitted = dict(SUBMITTED.findall(log))  # snakemake job id -> SLURM job id
    jobs = {slurm_id: slurm_cluster.jobs()[slurm_id] for slurm_id in submitted.values()}
    return {"log": log, "submitted": submitted, "jobs": jobs, "remote": remote, "local": local}


def _rule(job: dict[str, str]) -> str:
    return re.match(r"rule_(\w+?)(?:_wildcards_|$)", job["Comment"]).group(1)


def _asks_gpu(job: dict[str, str]) -> bool:
    return "gpu" in job.get("TresPerJob", "") or "gpu" in job.get("TresPerNode", "")


def test_workflow_runs_through_the_slurm_profile(slurm_run, slurm_cluster):
    log, submitted, jobs, remote = (slurm_run[k] for k in ("log", "submitted", "jobs", "remote"))
    # every job went through sbatch, and SLURM ran it on the partition its GPU request calls for
    n_jobs = int(re.search(r"^total\s+(\d+)", log, flags=re.M).group(1))  # snakemake's job stats
    assert len(submitted) == n_jobs >= 5, log[-4000:]
    rules_seen = set()
    for job in jobs.values():
        rule = _rule(job)
        rules_seen.add(rule)
        assert job["JobState"] == "COMPLETED", job
        if rule in GPU_RULES:
            assert job["Partition"] == "gpu" and _asks_gpu(job), (rule, job)
        else:
            assert job["Partition"] == "cpu" and not _asks_gpu(job), (rule, job)
    assert rules_seen >= {"prepare_train", "prepare_eval", "base_model", "train", "evaluate"}
    slurm_logs = list((remote / ".snakemake" / "slurm_logs").rglob("*.log"))
    assert {p.stem for p in slurm_logs} >= set(submitted.values())

    # the same outputs as the local run
    assert _result_files(remote) == _result_files(slurm_run["local"])


def test_a_multi_gpu_train_job_asks_for_one_node_with_its_gpus_cpus_and_memory(slurm_run, slurm_cluster):
    """Config resources.train = 2 GPUs, 2 cpus, 3000 MB -> the plugin's sbatch flags and SLURM's job.

    Reads the train job of the workflow run above (slurm_run, shared), so it adds no run of its own.
    """
    calls = dict(
        line.split("\t", 1) for line in (slurm_cluster.root / "sbatch_calls.log").read_text().splitlines()
    )
    train = [(slurm_id, job) for slurm_id, job in slurm_run["jobs"].items() if _rule(job) == "train"]
    assert len(train) == 1, slurm_run["jobs"]
    slurm_id, job = train[0]
    call = calls[slurm_id].split(" --wrap", 1)[0]  # the flags, without the job's own command line
    print(f"train job {slurm_id}: sbatch {call}")
    flags = call.split()
    want = RESOURCES["train"]
    per_gpu = -(-want["cpus"] // want["gpus"])
    for flag in (f"--gpus={want['gpus']}", f"--cpus-per-gpu={per_gpu}", "--nodes=1"):
        assert flag in flags, call
    assert flags[flags.index("--mem") + 1] == str(want["mem_mb"]), call
    assert not any(f.startswith("--cpus-per-task") for f in flags), call
    # what SLURM made of it: both GPUs, the CPUs per GPU and the memory, on one node
    assert re.fullmatch(rf"(gres[:/])?gpu:{want['gpus']}", job.get("TresPerJob", "")), job
    assert re.fullmatch(rf"(gres[:/])?gpu:{per_gpu}", job.get("CpusPerTres", "")), job
    assert job["NumNodes"] == "1" and job["NumCPUs"] == str(want["gpus"] * per_gpu), job
    assert job["MinMemoryNode"] == f"{want['mem_mb']}M", job
    assert job["Partition"] == "gpu" and job["JobState"] == "COMPLETED", job


# --------------------------------------------------- a train job longer than its partition's time limit
# The job's estimate (resources.train.estimate_min 2) exceeds the gpu partition's max_runtime (1 minute, in a
# copy of the profile's partitions.yaml): runtime/retries.py caps every attempt at -t 1 and gives the rule
# the retries it needs; SLURM kills the first attempt at its limit (60-90 s after it starts: slurmctld checks
# limits every 30 s), Snakemake resubmits it, and it resumes from its checkpoint. The first attempt is made
# too long for any machine by a sitecustomize on PYTHONPATH (the jobs inherit it) that sleeps STEP_SLEEP s in
# each Trainer.training_step while the run has no checkpoint; the resumed attempt runs at full speed, far
# inside its minute (one finishing its work after the limit but before slurmctld's check would be marked
# TIMEOUT with its outputs and checkpoints gone). Upstream jobs come from the local reference run of
# slurm_run (copied); the SLURM run takes ~170 s on 2 cores, ~70 s of it waits for the plugin's status checks.
RESUME_STEPS, STEP_SLEEP = 12, 8.0
SLOW_STEPS = """\
import glob
import os
import sys

_SLEEP = float(os.environ.get("RLVR_TEST_STEP_SLEEP") or 0)
_CHECKPOINTS = os.environ.get("RLVR_TEST_CHECKPOINTS", "")


class _SlowTrainer:
    \"\"\"Wraps transformers' Trainer.training_step with a sleep when transformers.trainer is imported by a
    run that has no checkpoint to resume from.\"\"\"

    def find_spec(self, name, path=None, target=None):
        if name != "transformers.trainer":
            return None
        import importlib.util

        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if glob.glob(os.path.join(_CHECKPOINTS, "checkpoint-*")):
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            import time

            run(module)
            step = module.Trainer.training_step

            def slow_step(self, *args, **kwargs):
                time.sleep(_SLEEP)
                return step(self, *args, **kwargs)

            module.Trainer.training_step = slow_step

        spec.loader.exec_module = exec_module
        return spec


if _SLEEP:
    sys.meta_path.insert(0, _SlowTrainer())
"""


def test_a_train_job_longer_than_its_partitions_limit_is_resubmitted_and_finishes_by_resuming(
    slurm_cluster, slurm_run, tmp_path
):
    config = _run_config()
    config["train"].update(
        max_steps=RESUME_STEPS, checkpoint_every=2, kl_every=RESUME_STEPS, eval_every=RESUME_STEPS
    )
    config["resources"] = {
        **RESOURCES,
        "train": {**RESOURCES["train"], "estimate_min": 2, "startup_min": 0.25},
    }
    # the local reference run above has built everything upstream of train on the same data and model
    # config (dates and Snakemake's records kept): only train (its config changed) runs again
    workdir = tmp_path / "wf"
    shutil.copytree(slurm_run["local"], workdir, symlinks=True)
    make_workflow_dir(workdir, config)
    profile = workdir / "profile-short"
    shutil.copytree(REPO / "profiles" / "slurm", profile)
    (profile / "partitions.yaml").write_text("partitions:\n  cpu: {}\n  gpu: {max_gpu: 8, max_runtime: 1}\n")
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SLOW_STEPS)
    env = {
        **slurm_cluster.env, "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore",
        "RLVR_TEST_STEP_SLEEP": str(STEP_SLEEP),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])),
    }  # fmt: skip
    env["RLVR_TEST_CHECKPOINTS"] = str(workdir / "results/checkpoints/fp32/seed1")
    target = "results/train/fp32/seed1/run.json"
    # what train reads, built locally first (a SLURM job's status checks back off by 10 s each)
    upstream = [SNAKEMAKE, "--cores", "2", "--directory", str(workdir), "--omit-from", "train", target]
    log_workflow_run(upstream[1:], via="snakemake (upstream of train, local)")
    proc = subprocess.run(upstream, capture_output=True, text=True, env=env, cwd=workdir, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    cmd = [
        SNAKEMAKE, "--profile", str(profile), "--workflow-profile", "none",
        "--directory", str(workdir), "--snakefile", str(workdir / "Snakefile"),
        "--slurm-status-command", "squeue", "--slurm-init-seconds-before-status-checks", "2",
        "--slurm-no-account", "--slurm-keep-successful-logs", target,
    ]  # fmt: skip
    log_workflow_run(cmd[1:], via="snakemake --profile (partition limit 1 min)")
    started = time.monotonic()
    proc = subprocess.run(
        cmd, capture_output=True, text=True, env=env, cwd=workdir, timeout=SNAKEMAKE_TIMEOUT
    )
    seconds = time.monotonic() - started
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, (
        f"SLURM run failed after {seconds:.0f} s:\n{log[-6000:]}\n{slurm_cluster.logs()}"
    )
    print(f"resumed SLURM train run: {seconds:.0f} s")

    # the plan printed at the start: 1 + ceil((2 - 1) / (1 - 0.25 - 2 x 2/12)) = 4 attempts; retries 3 + 2
    row = next(line for line in log.splitlines() if line.startswith("train ") and " min " in line)
    assert row.split()[-2:] == ["4", "5"], row
    # every attempt asked the partition's limit; the first was killed at it, the last completed
    train = [
        (slurm_id, job) for slurm_id, job in slurm_cluster.jobs().items()
        if slurm_id in {sid for _, sid in SUBMITTED.findall(log)} and _rule(job) == "train"
    ]  # fmt: skip
    assert len(train) == 2, log[-4000:]
    assert all(job["TimeLimit"] == "00:01:00" for _, job in train), train
    states = [job["JobState"] for _, job in sorted(train, key=lambda item: int(item[0]))]
    assert states == ["TIMEOUT", "COMPLETED"], states
    # ... and resumed from the checkpoint the killed one left
    run = json.loads((workdir / target).read_text())
    assert _find_key(run, "resumed") is True and _find_key(run, "resumed_from_step") > 0, run
    metrics = [json.loads(line) for line in (workdir / "results/train/fp32/seed1/metrics.jsonl").open()]
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
