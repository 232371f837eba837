"""Multi-process training: ``train.distributed`` + the job's GPUs -> the ``accelerate launch`` of a run.

The train stage calls ``launch_training`` when a run has more than one process; every process then runs
``python -m workflow_scripts.train --job <spec>`` (the same ``train.run`` arguments as the one-process
path, in a JSON file), and accelerate/torchrun give each its RANK/WORLD_SIZE. Torch-free, so the config
checks (``config.py``) and the resources (``resources.py``) can use ``resolve_processes`` too.

Which accelerate launcher (accelerate 1.15, ``accelerate/commands/launch.py``): ``--multi_gpu`` is the
torchrun launcher (``multi_gpu_launcher``) for GPUs AND for CPU processes: without CUDA each process
joins a gloo group (``PartialState``). ``--cpu`` is NOT used: it selects the simple launcher, which
starts one process unless an mpirun hostfile is configured. FSDP is not a launch flag here: it is
configured in the GRPOConfig (``grpo_config``: ``fsdp``/``fsdp_config`` + the arm's mixed-precision
policy), so the launch is the same for both strategies. The launcher, mixed precision (none: the arm's
autocast is the GRPOConfig's), machines and dynamo are explicit flags, so a user's ``accelerate config``
file cannot change them (its ``gpu_ids`` would still apply).
``--main_process_port 0``: accelerate picks a free port, so concurrent runs on one node never collide.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

TRAIN_MODULE = "workflow_scripts.train"


class LaunchError(RuntimeError):
    """A multi-process training run failed; the message names the log that holds every rank's output."""


def resolve_processes(distributed: Mapping | None, gpus: int) -> int:
    """Processes of one training run: ``processes``, or (null) one per GPU of the job, 1 without GPU."""
    processes = (distributed or {}).get("processes")
    if processes is None:
        return max(1, int(gpus))
    return int(processes)


def accelerate_command(
    processes: int,
    module_args: Sequence[str],
    threads_per_process: int = 1,
    port: int = 0,
    python: str = sys.executable,
) -> list[str]:
    """The ``accelerate launch`` command line (run with ``python``, so the children use this interpreter)."""
    if processes < 2:
        raise ValueError(f"accelerate_command: {processes} process(es); a one-process run is not launched")
    return [
        python,
        "-m",
        "accelerate.commands.launch",
        "--multi_gpu",
        "--num_processes",
        str(processes),
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",  # the arm's autocast is set by the GRPOConfig (bf16/fp16 always explicit), never here
        "--dynamo_backend",
        "no",
        "--num_cpu_threads_per_process",
        str(max(1, threads_per_process)),
        "--main_process_port",
        str(port),
        "-m",
        TRAIN_MODULE,
        *module_args,
    ]


def launch_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The children's environment: this one, with the package the parent imported first on PYTHONPATH
    (a workflow copy in another folder must not run the installed package's code) and no hub access."""
    env = dict(os.environ if base is None else base)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("HF_HUB_OFFLINE", "1")
    return env


def launch_training(
    job: Mapping,
    processes: int,
    threads: int,
    log_path: str | os.PathLike | None = None,
    port: int = 0,
) -> None:
    """Run ``train.run(**job)`` in ``processes`` processes; block until they end.

    ``job`` must be JSON (paths as strings). Output of every rank goes to ``log_path`` (appended) or,
    without one, to this process's stdout/stderr. A nonzero exit raises ``LaunchError`` with the exit
    status and the log's tail. The job file is removed afterwards.
    """
    fd, spec = tempfile.mkstemp(prefix="train-job-", suffix=".json")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump({k: str(v) if isinstance(v, Path) else v for k, v in job.items()}, fh)
        per_process = max(1, threads // processes)
        cmd = accelerate_command(processes, ["--job", spec, "--threads", str(per_process)], per_process, port)
        if log_path is None:
            code, tail = _run_launcher(cmd, None), ""
        else:
            Path(log_path).parent.mkdir(parents=True, exist_ok=True)
            with open(log_path, "a", encoding="utf-8") as log:
                log.write(f"launching {processes} training processes: {' '.join(cmd)}\n")
                log.flush()
                code = _run_launcher(cmd, log)
            tail = _tail(Path(log_path))
    finally:
        Path(spec).unlink(missing_ok=True)
    if code != 0:
        where = f"; every rank's output is in {log_path}" if log_path else ""
        raise LaunchError(
            f"accelerate launch of {processes} training processes exited with status {code}{where}"
            + (f"\n--- last lines ---\n{tail}" if tail else "")
        )


def _run_launcher(cmd: list[str], log) -> int:
    """Run the launcher to its end and return its exit status; it never outlives this process.

    torchrun starts the workers in sessions of their own, so a signal to this process group does not
    reach them: only the launcher (its elastic agent) stops them, on SIGTERM/SIGINT. Hence (1) the
    launcher gets SIGTERM when this process dies, even by SIGKILL (Linux PR_SET_PDEATHSIG), and (2) on
    an exception here (Ctrl-C) it is sent SIGTERM, not SIGKILL (``subprocess.run`` would SIGKILL it and
    orphan training workers that go on writing the run's outputs).
    """
    out = {} if log is None else {"stdout": log, "stderr": subprocess.STDOUT}
    proc = subprocess.Popen(cmd, env=launch_env(), preexec_fn=_terminate_with_parent, **out)
    try:
        return proc.wait()
    except BaseException:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        raise


def _terminate_with_parent() -> None:
    """In the launcher before exec: SIGTERM when the parent dies (Linux; elsewhere a no-op)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
