"""Snakemake invocations that run no job (dry runs, --summary, --touch, --lint, ...), forked from a warm
interpreter.

A dry run of the test workflow costs ~4.7 CPU-s on 2 cores, ~3.5 of them before the Snakefile is read:
importing snakemake (sqlalchemy, pandas through the SLURM plugin's efficiency report) and collecting its
plugin registries. The suite starts ~70 such invocations. One server per test process pays that once and
forks a child for every invocation: the child takes the caller's directory and environment, writes its
stdout and stderr to files and runs snakemake's own ``main()``, as the ``snakemake`` script does, in a
process group of its own (a timeout kills it with whatever it started). Every child starts from the same
state, the server's, which has never run a workflow. Invocations that run jobs keep their own process.

    python tests/snakemake_server.py     # the server: one JSON request per line on stdin, a reply per line
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

# the flags of an invocation that plans or records but starts no job (bench/suite_times.py's kinds)
NO_JOBS = {"-n", "--dry-run", "--dryrun", "--summary", "--detailed-summary", "--touch", "--lint",
           "--rulegraph", "--dag", "--filegraph", "--list-rules", "--report"}  # fmt: skip


def runs_no_job(args: list[str]) -> bool:
    return any(a in NO_JOBS for a in args)


# ------------------------------------------------------------------------------------------- the server


def _child(request: dict) -> None:
    """In the forked child: become the invocation, then exit with its code (never returns)."""
    code = 1
    try:
        os.setsid()
        for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        if os.environ.get("PYTHONWARNINGS") == "ignore":
            import warnings

            warnings.simplefilter("ignore")
        sys.argv = [request["argv0"], *request["args"]]
        from snakemake.cli import main
        from snakemake.workflow import Workflow

        # the run directory snakemake reads from the cwd when snakemake.workflow is imported
        Workflow._rundir = str(Path.cwd().absolute())
        main(request["args"])
        code = 0
    except SystemExit as exit_:
        if isinstance(exit_.code, str):
            print(exit_.code, file=sys.stderr)
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _wait(pid: int, timeout: float) -> int | None:
    """The child's exit code, or None when it outlived ``timeout`` (then it and its group are killed)."""
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return None
        time.sleep(0.02)


def serve() -> None:
    import snakemake.cli

    snakemake.cli.get_argument_parser()  # imports and collects every plugin registry (singletons)
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # nothing but replies on the protocol's pipe
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(request)
        replies.write(json.dumps({"returncode": _wait(pid, request["timeout"])}) + "\n")
        replies.flush()


# ------------------------------------------------------------------------------------------- the client


class _Server:
    """The server of this test process, started on first use and stopped at exit."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.lock = threading.Lock()

    def _start(self) -> subprocess.Popen:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = subprocess.Popen(
                [sys.executable, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                env={**os.environ, "PYTHONWARNINGS": "ignore"},
            )  # fmt: skip
            atexit.register(self.proc.kill)
        return self.proc

    def run(self, cmd: list[str], *, cwd, env: dict, timeout: float) -> subprocess.CompletedProcess:
        with self.lock, tempfile.TemporaryDirectory() as tmp:
            out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
            request = {
                "argv0": str(cmd[0]), "args": list(map(str, cmd[1:])), "cwd": str(cwd), "env": dict(env),
                "stdout": str(out), "stderr": str(err), "timeout": timeout,
            }  # fmt: skip
            proc = self._start()
            proc.stdin.write(json.dumps(request) + "\n")
            proc.stdin.flush()
            reply = proc.stdout.readline()
            if not reply:
                raise RuntimeError(f"the snakemake server died (exit code {proc.poll()})")
            code = json.loads(reply)["returncode"]
            stdout, stderr = out.read_text(errors="replace"), err.read_text(errors="replace")
        if code is None:
            raise subprocess.TimeoutExpired(cmd, timeout, stdout, stderr)
        return subprocess.CompletedProcess(cmd, code, stdout, stderr)


_SERVER = _Server()


def run(cmd: list[str], *, cwd, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, capture_output=True, text=True, ...)`` for a snakemake command line (cmd[0] the
    snakemake script): through the warm server when it runs no job, in a process of its own otherwise."""
    env = dict(os.environ if env is None else env)
    if runs_no_job(cmd[1:]) and os.environ.get("RLVR_SNAKEMAKE_SERVER") != "off":
        return _SERVER.run(cmd, cwd=cwd, env=env, timeout=timeout)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)


if __name__ == "__main__":
    serve()
