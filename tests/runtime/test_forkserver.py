"""The fork server runs a job as a fresh process would (argv, cwd, environment, stdio, exit status, the
same floats), dies with its client, and serves only jobs whose code and environment it imported."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from workflow_scripts.runtime import forkserver

pytestmark = pytest.mark.slow  # every test starts job processes (or the module's server) that import torch
REPO = Path(__file__).resolve().parents[2]

# A job script: delegates first (as startup does for a stage's job), then reports where it ran and what
# it computed with the thread count it was asked for.
PROBE = """
import os, sys, time
sys.path.insert(0, {repo!r})
from workflow_scripts.runtime import forkserver
forkserver.delegate("evaluate")
where = "forked" if forkserver._IN_CHILD else "fresh"
mode = sys.argv[1]
if mode == "sleep":
    open(sys.argv[2], "w").write(str(os.getpid()))
    time.sleep(120)
if mode == "raise":
    raise RuntimeError("the job failed")
import hashlib, torch
torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))  # the rule's threads, as limit_threads does
torch.manual_seed(0)
a = torch.randn(256, 384)
b = torch.randn(384, 192).to(torch.bfloat16)
out = torch.cat([(a @ a.T).flatten(), (a.to(torch.bfloat16)[:, :384] @ b).float().flatten()])
print(where, os.getcwd(), os.environ.get("PROBE_VALUE"), sys.argv[2:], torch.get_num_threads(),
      hashlib.sha256(out.numpy().tobytes()).hexdigest())
print("to stderr", file=sys.stderr)
import logging
print("root logger", logging.getLogger().level, len(logging.getLogger().handlers), file=sys.stderr)
sys.exit(int(sys.argv[2]) if mode == "exit" else 0)
"""


class Probe:
    """Runs the probe script as a job would run (``probe(mode, *args, cwd=..., **env)``) with one socket
    folder: a short one, since pytest's tmp paths can be longer than a Unix socket's path may be."""

    def __init__(self, tmp: Path) -> None:
        self.tmp, self.script = tmp, tmp / "probe.py"
        self.first: subprocess.CompletedProcess | None = None  # the module fixture's first job
        self.script.write_text(PROBE.format(repo=str(REPO)))
        self.folder = Path(tempfile.mkdtemp(prefix="fs-")) / "s"
        self.env = {
            **os.environ,
            forkserver.DIR_ENV: str(self.folder),
            forkserver.IMPORTS_ENV: "torch",  # a server of seconds, not the stages' ~10 s
            # it serves the whole module: it must outlive a fresh job's start (~3 s, far more on a busy
            # machine) between two forked ones; the teardown stops it at once
            forkserver.IDLE_ENV: "120",
            "OMP_NUM_THREADS": "1",  # per job: not part of the key
            "OMP_WAIT_POLICY": "PASSIVE",  # a job that would spin runs fresh (tested below)
            "PROBE_VALUE": "v1",
        }
        self.env.pop(forkserver.ENABLE_ENV, None)
        self.env.pop("SLURM_JOB_ID", None)

    def __call__(self, *args: str, cwd: Path | None = None, **extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(self.script), *args], capture_output=True, text=True,
                              cwd=cwd or self.tmp, env={**self.env, **extra}, timeout=120)  # fmt: skip

    def close(self) -> None:
        """Stop the folder's servers now, not after their idle time, and remove the folder."""
        sockets = list(self.folder.glob("*.sock"))
        for sock in sockets:
            sock.unlink()
        if sockets:
            time.sleep(1.5)  # a server checks its socket every second
        shutil.rmtree(self.folder.parent, ignore_errors=True)


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    """One server for the module's tests (each server start imports torch once more): the first job of
    an empty folder runs fresh and starts it (``probe.first``, for the test of that); every later job of
    the same key is forked from it."""
    run = Probe(tmp_path_factory.mktemp("forkserver"))
    run.first = run("exit", "0")
    try:
        if run.first.returncode == 0:
            wait_for_server(run.folder)
        yield run
    finally:
        run.close()


def wait_for_server(folder: Path, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if list(folder.glob("*.sock")):
            return
        time.sleep(0.2)
    logs = "".join(p.read_text() for p in folder.glob("*.log"))
    raise AssertionError(f"no server listened within {timeout} s: {logs}")


def test_the_first_job_runs_fresh_and_starts_a_server_the_next_is_forked_as_the_client(probe, tmp_path):
    first = probe.first
    assert first.returncode == 0 and first.stdout.startswith("fresh"), first.stderr
    wait_for_server(probe.folder)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    second = probe("exit", "7", cwd=elsewhere)
    # The child's exit status, cwd, argv and stdio are the client's.
    assert second.returncode == 7, second.stderr
    where, cwd, value, argv, threads, _ = second.stdout.split(maxsplit=5)
    assert (where, cwd, value, argv, threads) == ("forked", str(elsewhere), "v1", "['7']", "1")
    assert "to stderr" in second.stderr
    assert "root logger 30 0" in second.stderr  # logging as a fresh interpreter has it, not the server's


def test_a_forked_job_computes_the_floats_a_fresh_process_computes_at_its_own_thread_count(probe):
    for threads in ("1", "2"):
        if threads == "1":  # the server's first job: a fresh process at one thread (OMP_NUM_THREADS=1)
            fresh = probe.first
        else:
            fresh = probe("exit", "0", **{forkserver.ENABLE_ENV: "off", "OMP_NUM_THREADS": threads})
        forked = probe("exit", "0", OMP_NUM_THREADS=threads)
        assert fresh.stdout.startswith("fresh") and forked.stdout.startswith("forked"), forked.stderr
        # same thread count in torch's pool, same digest of fp32 and bf16 products
        assert fresh.stdout.split()[-2:] == forked.stdout.split()[-2:] == [threads, fresh.stdout.split()[-1]]


def test_an_exception_in_a_forked_job_prints_its_traceback_and_exits_1(probe):
    wait_for_server(probe.folder)  # the module's server still listens: the job is forked
    proc = probe("raise")
    assert proc.returncode == 1
    assert "RuntimeError: the job failed" in proc.stderr and "Traceback" in proc.stderr


def test_a_forked_job_ends_when_its_client_is_killed(probe, tmp_path):
    wait_for_server(probe.folder)
    pid_file = tmp_path / "child.pid"
    client = subprocess.Popen([sys.executable, str(probe.script), "sleep", str(pid_file)], env=probe.env,
                              cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + 60
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline and client.poll() is None
        time.sleep(0.1)
    child = int(pid_file.read_text())
    assert child != client.pid  # it runs in the server's child
    client.send_signal(signal.SIGKILL)  # what Snakemake does to a cancelled job
    client.wait()
    deadline = time.monotonic() + 10
    while Path(f"/proc/{child}").exists() and _state(child) != "Z":
        assert time.monotonic() < deadline, "the forked job outlived its client"
        time.sleep(0.1)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "gone"


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="a job spins only when its threads cover >1 CPU")
def test_a_job_that_would_spin_runs_fresh_and_starts_no_server(tmp_path):
    probe = Probe(tmp_path)  # a folder of its own: the module's server is not there
    try:
        cpus = str(len(os.sched_getaffinity(0)))
        env_policy = {k: v for k, v in probe.env.items() if k != "OMP_WAIT_POLICY"}
        env = {**env_policy, "OMP_NUM_THREADS": cpus}
        proc = subprocess.run([sys.executable, str(probe.script), "exit", "0"], capture_output=True,
                              text=True, env=env, timeout=120)  # fmt: skip
        assert proc.returncode == 0 and proc.stdout.startswith("fresh"), proc.stderr
        time.sleep(1.0)
        assert not list(probe.folder.glob("*.log"))  # no server was started for it
    finally:
        probe.close()


def test_the_key_changes_with_code_and_environment_but_not_with_a_jobs_threads(tmp_path):
    package = tmp_path / "workflow_scripts"
    shutil.copytree(REPO / "workflow_scripts", package, ignore=shutil.ignore_patterns("__pycache__"))
    env = {"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PATH": "/usr/bin"}
    key = forkserver.server_key(env, package)
    same = {**env, "OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2", "PYTEST_CURRENT_TEST": "x"}
    assert forkserver.server_key(same, package) == key
    assert forkserver.server_key({**env, "HF_HUB_OFFLINE": "0"}, package) != key
    assert forkserver.server_key({**env, "OMP_WAIT_POLICY": "ACTIVE"}, package) != key
    schema = package / "schemas" / "config.schema.yaml"
    schema.write_text(schema.read_text() + "\n")  # any file of the package, not only its .py
    assert forkserver.server_key(env, package) != key


def test_the_server_is_off_when_switched_off_under_slurm_or_beside_a_gpu_driver(tmp_path):
    none = (str(tmp_path / "no-such-device"),)
    assert forkserver.enabled({}, none)
    assert not forkserver.enabled({forkserver.ENABLE_ENV: "off"}, none)
    assert not forkserver.enabled({forkserver.ENABLE_ENV: "0"}, none)
    assert not forkserver.enabled({"SLURM_JOB_ID": "123"}, none)
    driver = tmp_path / "nvidiactl"
    driver.touch()
    assert not forkserver.enabled({}, (str(driver),))
    assert forkserver.enabled({forkserver.ENABLE_ENV: "on"}, (str(driver),))


def test_a_socket_folder_too_deep_for_a_unix_socket_is_not_used(tmp_path, monkeypatch):
    monkeypatch.setenv(forkserver.DIR_ENV, str(tmp_path / ("d" * 100)))
    assert forkserver.socket_dir() is None  # the job runs as a fresh process


def test_a_socket_folder_other_users_can_enter_is_not_used(tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    monkeypatch.setenv(forkserver.DIR_ENV, str(shared))
    assert forkserver.socket_dir() is None
    private = Path(tempfile.mkdtemp(prefix="fs-")) / "p"
    monkeypatch.setenv(forkserver.DIR_ENV, str(private))
    assert forkserver.socket_dir() == private
    assert private.stat().st_mode & 0o777 == 0o700
    shutil.rmtree(private.parent)
