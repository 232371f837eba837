"""A warm interpreter for a workflow's jobs: torch, transformers and the stages imported once, each job
forked from it instead of importing them again (the torch stages; the others' one-thread jobs).

Why: a torch job's fixed cost is its imports, not its work. On a 2-core AVX2 AMD EPYC the default's 130
evaluate jobs spent 9.3 s each starting (1210 of 1922 job seconds) and start-up was 37% of all job seconds
(docs/performance.md, "Where the time goes"). Forking a process that has already imported costs ~0.1 s.

How a job runs through it (``delegate``, called by ``startup`` as a stage's ``script:`` job starts):

| step | who    | what                                                                              |
|------|--------|-----------------------------------------------------------------------------------|
| 1    | client | the job process Snakemake started (interpreter + preamble, ~0.5 s) computes the    |
|      |        | server key and connects to that server's socket                                   |
| 1'   | client | no server listening: starts one in the background and runs the job itself         |
| 2    | server | forks; the child takes the client's stdin/stdout/stderr (passed over the socket),  |
|      |        | argv, cwd, environment, umask and sys.path and runs the job's script as            |
|      |        | ``python script.py`` would (``runpy.run_path``: preamble, then the stage)          |
| 3    | server | reaps the child and sends its exit status; the client exits with it               |
| 4    | child  | if the client dies (Snakemake cancels the job), sees its socket close and exits   |

What stays as in a fresh process, and why:

- The same code: the key hashes the package's files (content) and folder, the interpreter, the
  modification times of the folders packages are installed in (an install changes them), the
  environment less the per-job variables (thread sizes, pytest's bookkeeping), CPU affinity and
  resource limits. Any difference starts another server.
- The same numerics: the server never runs a torch operation, so no thread pool exists before a fork;
  each child sizes its pools for its rule's threads (``threads.limit_threads``), as a fresh job does.
  OpenMP's wait policy is read once, when torch loads: the server waits passively, so a job that would
  spin (its threads cover every CPU: the warm start alone on the machine) runs as a fresh process.
  Outputs are byte-identical either way (tests/runtime/test_forkserver.py).
- Plain processes where a server cannot help or be trusted: ``RLVR_FORK_SERVER=off``; under SLURM
  (``SLURM_JOB_ID``: one job per allocation, and the allocation's end would kill the server); on a
  machine with a GPU driver (``GPU_DEVICE_FILES``; CUDA initialised before a fork is unusable in the
  child, and this was never tried on a GPU: ``RLVR_FORK_SERVER=on`` forces it); where the socket folder
  is not private to this user or the platform has no ``os.fork``/Unix sockets.

What a job's record loses: Snakemake's ``benchmark:`` measures the client (its max_rss and cpu_time are
the client's, not the forked child's); ``s`` (wall seconds) is exact. The job's ``STARTUP`` line counts
from the client's start (``threads.process_age_s``), so start-up figures stay comparable.

A server exits after ``RLVR_FORK_SERVER_IDLE_S`` seconds (default 60) with no job running.

Long on purpose: the client, the server and the forked child speak one small wire protocol (a length,
a JSON request and three descriptors; a start byte; a status), which is easier to check in one file.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import runpy
import select
import signal
import socket
import stat
import struct
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from pathlib import Path

ENABLE_ENV = "RLVR_FORK_SERVER"  # "off" / "0" / "false": every job is a fresh process; "on": also on GPUs
DIR_ENV = "RLVR_FORK_SERVER_DIR"  # where sockets live (default: a private folder in the temp dir)
IDLE_ENV = "RLVR_FORK_SERVER_IDLE_S"
IMPORTS_ENV = "RLVR_FORK_SERVER_IMPORTS"  # modules the server imports (default: the stages)
DEFAULT_IDLE_S = 60.0
# Stages whose jobs import torch: the server imports them all, so one server serves every such job.
STAGES = ("evaluate", "train", "sparsity", "overlap", "base_model")
# Stages without torch (pandas, scipy, statsmodels, matplotlib: 1-4 s of imports for ~1 s of work). Their
# arithmetic is numpy's BLAS, whose thread pool is sized once, when it loads: in the server that is one
# thread (a server with BLAS threads refuses to serve), so only their one-thread jobs (the default) fork.
# They use a listening server but never start one: prepare_data's jobs come first, and a server importing
# beside the warm start (which spins on every core) would slow it down.
ONE_THREAD_STAGES = ("prepare_data", "aggregate", "stats", "learning_curves", "figures", "report")
# Per-job or bookkeeping variables: not part of the key (the child gets the client's own values).
VOLATILE_ENV = frozenset({
    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS", "RAYON_NUM_THREADS", "TOKENIZERS_PARALLELISM",
    "PYTEST_CURRENT_TEST", "PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID",
    "OLDPWD", "PWD", "SHLVL", "_",
})  # fmt: skip
# A GPU driver's device files: CUDA (or ROCm) initialised by an import in the server could not be used in a
# forked child, and no GPU was at hand to prove the server safe there, so GPU machines run fresh jobs.
GPU_DEVICE_FILES = ("/dev/nvidiactl", "/dev/kfd")
LIMITS = ("RLIMIT_AS", "RLIMIT_NOFILE", "RLIMIT_NPROC", "RLIMIT_CPU", "RLIMIT_DATA", "RLIMIT_STACK")
STARTED, STATUS = b"S", struct.Struct("!i")
MAX_SOCKET_PATH = 104  # sun_path: 108 bytes on Linux, 104 on macOS, the terminating NUL included
HEADER = struct.Struct("!I")
ACK_TIMEOUT_S = 30.0

log = logging.getLogger("forkserver")
_IN_CHILD = False  # a forked job runs its script here: it must not delegate again


# --- the key: what must be equal for a forked job to be the job a fresh process would run -------------


def _package_dir() -> Path:
    import workflow_scripts

    return Path(workflow_scripts.__file__).resolve().parent


def code_hash(package_dir: Path) -> str:
    """Content hash of every file of the package (caches excluded): edited code starts a new server."""
    digest = hashlib.sha256()
    for path in sorted(package_dir.rglob("*")):
        if "__pycache__" in path.parts or not path.is_file():
            continue
        digest.update(str(path.relative_to(package_dir)).encode())
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def key_environment(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in sorted(env.items()) if k not in VOLATILE_ENV}


def server_key(
    env: dict[str, str] | None = None, package_dir: Path | None = None, code: str | None = None
) -> str:
    """The identity of a server that may run this process's job (see the module docstring)."""
    import resource

    env = dict(os.environ if env is None else env)
    package_dir = package_dir or _package_dir()
    install_stamps = []
    for folder in sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}):
        try:
            install_stamps.append((folder, os.stat(folder).st_mtime_ns))
        except OSError:
            install_stamps.append((folder, None))
    parts = {
        "executable": sys.executable,
        "version": sys.version,
        "package": str(package_dir),
        "code": code or code_hash(package_dir),
        "installed": install_stamps,
        "env": key_environment(env),
        "affinity": sorted(os.sched_getaffinity(0)),
        "limits": [resource.getrlimit(getattr(resource, name)) for name in LIMITS],
        "uid": os.getuid(),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:24]


def socket_dir() -> Path | None:
    """A folder only this user can enter (created 0700), or None if the existing one is not private."""
    default = Path(tempfile.gettempdir()) / f"rlvr-precision-forkserver-{os.getuid()}"
    path = Path(os.environ.get(DIR_ENV) or default)
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = path.lstat()
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        return None
    if len(os.fsencode(path / f"{'0' * 24}.{'9' * 10}.tmp")) >= MAX_SOCKET_PATH:
        return None  # a Unix socket's path must fit sun_path
    return path


def enabled(env: dict[str, str] | None = None, gpu_files: tuple[str, ...] = GPU_DEVICE_FILES) -> bool:
    """Off when switched off, under SLURM, or (unless switched ``on``) where a GPU driver is present."""
    env = os.environ if env is None else env
    switch = env.get(ENABLE_ENV, "").strip().lower()
    if switch in {"off", "0", "false", "no"} or env.get("SLURM_JOB_ID"):
        return False
    if switch != "on" and any(os.path.exists(path) for path in gpu_files):
        return False
    return hasattr(os, "fork") and hasattr(socket, "AF_UNIX") and hasattr(socket, "send_fds")


# --- the client: the job process Snakemake started -------------------------------------------------------


def delegate(stage: str) -> None:
    """Run this job in a warm child of the server and exit with its status; return to run it here instead.

    Returns (the caller then imports and runs as a fresh process) when the server is off, cannot serve
    this job (a spinning wait policy, another stage, a stage without torch on several threads), or is not
    listening yet (then a torch stage's job starts one)."""
    if stage not in STAGES + ONE_THREAD_STAGES or _IN_CHILD or not enabled():
        return
    if stage in ONE_THREAD_STAGES and os.environ.get("OMP_NUM_THREADS") != "1":
        return
    from workflow_scripts.runtime import threads  # torch-free; sets the passive wait as a fresh job would

    if threads.SPINS:
        return
    folder = socket_dir()
    if folder is None:
        return
    package = _package_dir()
    code = code_hash(package)  # read once: the key and a new server's check both use it
    key = server_key(package_dir=package, code=code)
    sock_path = folder / f"{key}.sock"
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(str(sock_path))
    except OSError:
        conn.close()
        if stage in STAGES:  # not the others: the workflow's first jobs would start it beside the warm start
            _start_server(folder, key, package, code)
        return
    status = _run_remote(conn)
    if status is None:
        return  # the server did not take the job: run it here
    sys.stdout.flush()
    sys.stderr.flush()
    if status < 0:  # the child was killed by a signal: die the same way
        with contextlib.suppress(OSError, ValueError):
            signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
        status = 128 - status
    os._exit(status)


def _request() -> bytes:
    old = os.umask(0)
    os.umask(old)
    body = {
        "argv": sys.argv,
        "cwd": os.getcwd(),
        "env": dict(os.environ),
        "umask": old,
        "path": sys.path,
        "pid": os.getpid(),
    }
    return json.dumps(body).encode()


def _stdio_fds() -> list[int]:
    fds = []
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
            fds.append(fd)
        except OSError:  # closed: the child gets /dev/null there
            fds.append(os.open(os.devnull, os.O_RDWR))
    return fds


def _run_remote(conn: socket.socket) -> int | None:
    """Send the job; None if the server did not start it, else the child's exit status."""
    body = _request()
    try:
        conn.settimeout(ACK_TIMEOUT_S)
        socket.send_fds(conn, [HEADER.pack(len(body))], _stdio_fds())
        conn.sendall(body)
        if _recv_exact(conn, 1) != STARTED:
            return None
        conn.settimeout(None)
        raw = _recv_exact(conn, STATUS.size)
    except OSError:
        conn.close()
        return None
    if raw is None:
        sys.stderr.write("forkserver: the server went away while the job ran; its status is unknown\n")
        return 1
    return STATUS.unpack(raw)[0]


def _recv_exact(conn: socket.socket, n: int) -> bytes | None:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def _start_server(folder: Path, key: str, package: Path, code: str) -> None:
    """Start a server for ``key`` in the background (it exits at once if another one holds the key)."""
    logfile = folder / f"{key}.log"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(package.parent), *filter(None, [env.get("PYTHONPATH")])])
    cmd = [sys.executable, "-m", "workflow_scripts.runtime.forkserver", "--key", key, "--dir", str(folder),
           "--package", str(package), "--code", code]  # fmt: skip
    with open(logfile, "ab") as out:
        subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
            start_new_session=True, close_fds=True,
        )  # fmt: skip


# --- the server --------------------------------------------------------------------------------------------


# Native threads that survive a fork by design: jemalloc (pyarrow's allocator) stops its background
# thread around fork() and starts it again when needed.
FORK_SAFE_THREADS = frozenset({"jemalloc_bg_thd"})


def _unsafe_threads() -> list[str]:
    """Threads besides this one whose state a fork would lose (Python's, or native ones not known safe)."""
    if threading.active_count() != 1:
        return [t.name for t in threading.enumerate() if t is not threading.current_thread()]
    names = []
    with contextlib.suppress(OSError):
        for task in os.listdir("/proc/self/task"):
            if int(task) != threading.get_native_id():
                with open(f"/proc/self/task/{task}/comm", encoding="utf-8") as fh:
                    names.append(fh.read().strip())
    return [name for name in names if name not in FORK_SAFE_THREADS]


def _import_stages() -> None:
    """The preamble's imports and every stage served (``RLVR_FORK_SERVER_IMPORTS``: other modules, tests)."""
    import importlib

    import snakemake.iocontainers
    import snakemake.logging  # noqa: F401

    names = os.environ.get(IMPORTS_ENV)
    default = [f"workflow_scripts.{stage}" for stage in STAGES + ONE_THREAD_STAGES]
    modules = [m for m in names.split(",") if m] if names is not None else default
    for module in modules:
        importlib.import_module(module)


class Server:
    """Accept jobs on ``<dir>/<key>.sock``; fork one child per job; report each child's exit status."""

    def __init__(self, folder: Path, key: str, idle_s: float, package: Path, code: str) -> None:
        self.folder, self.key, self.idle_s = folder, key, idle_s
        self.package, self.code = package, code
        self.sock_path = folder / f"{key}.sock"
        self.children: dict[int, socket.socket] = {}

    def serve(self) -> int:
        lock = open(self.folder / f"{self.key}.lock", "w")  # noqa: SIM115  held for the server's life
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return 0  # another server holds this key
        t0 = time.monotonic()
        _import_stages()  # with the collector paused: run with -m, this is a job process to `startup`
        import gc

        gc.collect()
        gc.freeze()  # children neither walk nor copy what the imports built
        gc.enable()
        if unsafe := _unsafe_threads():  # a fork would lose those threads' state: serve nothing
            log.error("forkserver: threads %s after imports; not serving", unsafe)
            return 1
        # The client's key names its package and code: serve only if they are what was imported.
        if _package_dir() != self.package or code_hash(self.package) != self.code:
            log.error("forkserver: imported %s, not the client's code; not serving", _package_dir())
            return 1
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        tmp = self.folder / f"{self.key}.{os.getpid()}.tmp"
        listener.bind(str(tmp))
        os.chmod(tmp, 0o600)
        listener.listen(64)
        os.replace(tmp, self.sock_path)
        inode = os.stat(self.sock_path).st_ino
        took = time.monotonic() - t0
        log.warning("forkserver %s: serving after %.1f s of imports (pid %d)", self.key, took, os.getpid())
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        last_busy = time.monotonic()
        try:
            while True:
                ready, _, _ = select.select([listener, wake_r], [], [], 1.0)
                if wake_r in ready:
                    while True:
                        try:
                            if not os.read(wake_r, 512):
                                break
                        except BlockingIOError:
                            break
                if listener in ready:
                    conn, _ = listener.accept()
                    self._start_job(conn, listener, (wake_r, wake_w))
                self._reap()
                if self.children:
                    last_busy = time.monotonic()
                elif time.monotonic() - last_busy > self.idle_s:
                    break
                try:
                    if os.stat(self.sock_path).st_ino != inode:
                        break  # another server took the socket path
                except FileNotFoundError:
                    break
        finally:
            with contextlib.suppress(OSError):
                if os.stat(self.sock_path).st_ino == inode:
                    os.unlink(self.sock_path)
            listener.close()
        return 0

    def _start_job(self, conn: socket.socket, listener: socket.socket, wake: tuple[int, int]) -> None:
        fds: list[int] = []
        try:
            creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            _pid, uid, _gid = struct.unpack("3i", creds)
            if uid != os.getuid():
                raise OSError("a job from another user")
            conn.settimeout(5.0)
            head, fds, _flags, _addr = socket.recv_fds(conn, HEADER.size, 3)
            if len(head) != HEADER.size or len(fds) != 3:
                raise OSError("malformed request")
            body = _recv_exact(conn, HEADER.unpack(head)[0])
            if body is None:
                raise OSError("truncated request")
            request = json.loads(body)
            conn.settimeout(None)
        except (OSError, ValueError) as err:
            log.warning("forkserver: refused a request: %s", err)
            for fd in fds:
                os.close(fd)
            conn.close()
            return
        pid = os.fork()
        if pid == 0:
            # never returns; the child keeps no other job's socket open
            _child(conn, request, fds, closing=[listener, *self.children.values()], wake=wake)
        for fd in fds:
            os.close(fd)
        self.children[pid] = conn
        with contextlib.suppress(OSError):
            conn.sendall(STARTED)

    def _reap(self) -> None:
        while self.children:
            try:
                pid, wait_status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.children.pop(pid, None)
            if conn is not None:
                with contextlib.suppress(OSError):
                    conn.sendall(STATUS.pack(os.waitstatus_to_exitcode(wait_status)))
                conn.close()


def _watch_client(conn: socket.socket) -> None:
    """The job ends with its client: a closed socket means Snakemake stopped the job."""
    try:
        while conn.recv(64):
            pass
    except OSError:
        pass
    os._exit(143)


def _child(conn: socket.socket, request: dict, fds: list[int], closing: list, wake: tuple[int, int]) -> None:
    """The forked job: become the client's process (stdio, cwd, env, argv), run its script, exit."""
    global _IN_CHILD
    _IN_CHILD = True
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for sock in closing:
            sock.close()
        for fd in wake:
            os.close(fd)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.umask(request["umask"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv[:] = request["argv"]
        sys.path[:] = request["path"]
        # logging as a fresh interpreter has it: the server's handler (its log file) is not the job's
        for handler in list(logging.root.handlers):
            logging.root.removeHandler(handler)
        logging.root.setLevel(logging.WARNING)
        from workflow_scripts.runtime import threads

        threads.PROCESS_ORIGIN_PID = int(request["pid"])  # start-up counts from the client's start
        threading.Thread(target=_watch_client, args=(conn,), daemon=True).start()
        code = _run_script(request["argv"][0])
    finally:
        import atexit

        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError):
                stream.flush()
        os._exit(code)


def _run_script(path: str) -> int:
    """``python path`` in this process: its exit code (a traceback on stderr and 1 for an exception)."""
    import traceback

    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as exc:
        if exc.code is None:
            return 0
        if isinstance(exc.code, int):
            return exc.code
        print(exc.code, file=sys.stderr)
        return 1
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--key", required=True)
    parser.add_argument("--dir", required=True, type=Path)
    parser.add_argument("--package", required=True, type=Path)
    parser.add_argument("--code", required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(message)s")
    idle_s = float(os.environ.get(IDLE_ENV, DEFAULT_IDLE_S))
    return Server(args.dir, args.key, idle_s, args.package, args.code).serve()


if __name__ == "__main__":
    # Serve from the package's module object, not this __main__ copy: a child's `_IN_CHILD` must be the
    # flag its job's `import workflow_scripts.runtime.forkserver` finds.
    from workflow_scripts.runtime import forkserver

    sys.exit(forkserver.main())
