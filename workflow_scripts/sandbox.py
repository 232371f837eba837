"""Run untrusted, model-generated Python in a contained subprocess.

``run_sandboxed(code)`` writes ``code`` to ``main.py`` in a fresh temporary directory, runs it with
``python -I -S`` (isolated mode, no site-packages: the standard library only) and returns a
``SandboxResult``. Whatever the program does, the directory is deleted afterwards and no process it
started survives the call.

What is enforced depends on what the machine allows; ``capabilities()`` says which mode is active.
A probe (one tiny sandboxed run, cached per process) picks the strongest mode that works here:

``namespaces`` (running as root with a working ``unshare``; the mode on the dev machine, measured)
  - the program runs under ``unshare --mount --net --pid --fork --kill-child --mount-proc``:
  - network: a fresh network namespace with only a (down) loopback; ``connect`` fails with
    ENETUNREACH, also to services on the host's 127.0.0.1. Enforced by the kernel.
  - processes: a fresh PID namespace whose init (the bootstrap) runs the program as its child and
    exits with the program's status; when it exits or is killed, the kernel kills every process
    left in the namespace, including ones that called ``setsid()``. ``/proc`` shows only the
    sandbox's own processes.
  - privileges: before running the program the bootstrap drops to a fresh unprivileged uid/gid
    (random, ~1.5e9, no supplementary groups; all capabilities are lost). So RLIMIT_NPROC is
    enforced (root is exempt from it), which stops fork bombs at ``max_processes`` tasks; and
    ordinary file permissions block writes to the repository and anything else not world-writable.
  - filesystem: inside the mount namespace the temp dir is bind-mounted over ``/tmp``, ``/var/tmp``
    and ``/dev/shm``, so a write to ``/tmp/x`` lands in the temp dir and is deleted with it. An
    unreadable ancestor of the interpreter's prefix (``/root`` for a pyenv Python) is covered by an
    empty tmpfs with only the interpreter bind-mounted back, so the unprivileged uid can import the
    stdlib while the rest of ``/root`` is hidden. The rest of the filesystem stays readable.
  - as a final guarantee the parent kills any process still owned by the sandbox uid.

``uid`` (root, but no namespaces): the same uid drop and rlimits, no network or PID namespace;
  ``socket`` is monkeypatched (bypassable via ``_socket``), stray processes are found by uid and
  killed, files the uid left in ``/tmp``, ``/var/tmp``, ``/dev/shm`` are removed.

``basic`` (not root, or nothing else works): rlimits only (RLIMIT_NPROC = the user's current task
  count + ``max_processes``; it counts all of the user's tasks), ``socket`` monkeypatched, own session
  killed as a group, processes carrying the run's token in their environment killed. Writes outside
  the temp dir are NOT prevented in this mode (only HOME/TMPDIR/cwd point into it).

Always (every mode): RLIMIT_CPU (timeout + 1 s), RLIMIT_AS (``memory_mb``), RLIMIT_FSIZE (16 MiB per
file), RLIMIT_CORE 0, RLIMIT_NOFILE 256; a wall-clock timeout after which the whole session is
SIGKILLed; stdout/stderr are read incrementally and truncated to ``max_output_bytes`` each; the
environment is reduced to PATH, HOME, TMPDIR, LANG and the run's token; ``python -I`` ignores PYTHON*
variables and the user site. Not addressed: reading world-readable files, CPU/disk contention during
the timeout window, kernel exploits. ``RLVR_SANDBOX_MODE=basic|uid|namespaces`` forces a mode.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import random
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field

import psutil

SETUP_FAILED = 121  # exit code of the bootstrap when it cannot set the sandbox up
_SETUP_MARK = "rlvr-sandbox: setup failed"
_FILE_SIZE_LIMIT = 16 * 1024 * 1024
_TOKEN_VAR = "RLVR_SANDBOX_TOKEN"
_UNSHARE_SIGKILL = "unshare: sigprocmask unblock failed"
_SIGNAL_MARK = "rlvr-sandbox: program killed by signal"
_UID_RANGE = (1_500_000_000, 1_600_000_000)
_WORLD_WRITABLE = ("/tmp", "/var/tmp", "/dev/shm")
MODES = ("namespaces", "uid", "basic")


@dataclass(frozen=True)
class SandboxResult:
    returncode: int | None  # negative: killed by that signal (Popen convention)
    stdout: str
    stderr: str
    timed_out: bool
    status: str  # "ok" (exit 0) | "failed" (exit != 0) | "timeout" | "killed" (signal) | "error" (setup)
    truncated: bool = False  # stdout or stderr exceeded max_output_bytes
    info: dict = field(default_factory=dict, compare=False)  # mode, uid, token, workdir, wall_s


# The bootstrap runs first in the child (as root in the namespaces mode): rlimits, mounts, uid drop,
# network guard, then the program via runpy. Kept free of site-packages (python -S).
_BOOT = r"""
import json, os, resource, sys
cfg = json.loads(sys.argv[1])
try:
    for name, soft, hard in cfg["rlimits"]:
        resource.setrlimit(getattr(resource, name), (soft, hard))
    if cfg["mounts"]:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        def mount(src, tgt, fstype, flags, data=None):
            enc = lambda s: None if s is None else s.encode()
            if libc.mount(enc(src), enc(tgt), enc(fstype), flags, enc(data)) != 0:
                err = ctypes.get_errno()
                raise OSError(err, os.strerror(err), tgt)
        MS_NOSUID, MS_NODEV, MS_BIND, MS_REC = 2, 4, 4096, 16384
        prefix, hide = cfg["prefix"], cfg["hide"]
        # by fd: the host path of the work dir may itself lie under `hide` or under /tmp
        work = "/proc/self/fd/%d" % os.open(cfg["work"], os.O_PATH | os.O_DIRECTORY)
        if hide:
            fd = os.open(prefix, os.O_PATH | os.O_DIRECTORY)
            mount("tmpfs", hide, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=64k")
            os.makedirs(prefix, exist_ok=True)
            mount("/proc/self/fd/%d" % fd, prefix, None, MS_BIND | MS_REC)
            os.close(fd)
        for target in cfg["binds"]:
            mount(work, target, None, MS_BIND)
        os.close(int(work.rsplit("/", 1)[1]))
    if cfg["patch_socket"]:
        import socket
        def _no_network(*args, **kwargs):
            raise PermissionError(1, "network access is disabled in the sandbox")
        socket.socket = socket.create_connection = socket.socketpair = _no_network
        socket.getaddrinfo = socket.create_server = socket.fromfd = _no_network
    import runpy  # before the uid drop: the interpreter's prefix may be unreadable afterwards
    if cfg["uid"] is not None:
        os.setgroups([])
        os.setresgid(cfg["uid"], cfg["uid"], cfg["uid"])
        os.setresuid(cfg["uid"], cfg["uid"], cfg["uid"])
    os.chdir(cfg["cwd"])
except BaseException as exc:
    sys.stderr.write("%s: %r\n" % (cfg["mark"], exc))
    sys.stderr.flush()
    os._exit(cfg["setup_failed"])
if os.getpid() == 1:
    # PID-namespace init ignores signals it has no handler for (even SIGKILL sent from inside), so
    # the program must not be init: fork it, reap everything, exit with its status.
    child = os.fork()
    if child:
        while True:
            pid, status = os.waitpid(-1, 0)
            if pid == child:
                break
        if os.WIFSIGNALED(status):
            sys.stderr.write("%s %d\n" % (cfg["signal_mark"], os.WTERMSIG(status)))
            sys.stderr.flush()
            os._exit(128 + os.WTERMSIG(status))
        os._exit(os.waitstatus_to_exitcode(status))
del cfg, json, resource
sys.argv = ["main.py"]
runpy.run_path("main.py", run_name="__main__")
"""


@dataclass(frozen=True)
class _Mode:
    name: str
    namespaces: bool
    drop_uid: bool


_MODE_TABLE = {
    "namespaces": _Mode("namespaces", True, True),
    "uid": _Mode("uid", False, True),
    "basic": _Mode("basic", False, False),
}


def run_sandboxed(
    code: str,
    timeout: float = 10.0,
    memory_mb: int = 512,
    max_processes: int = 32,
    max_output_bytes: int = 64_000,
) -> SandboxResult:
    """Run ``code`` as ``__main__`` in the sandbox; see the module docstring for what is enforced."""
    return _run(code, _active_mode(), timeout, memory_mb, max_processes, max_output_bytes)


@functools.cache
def capabilities() -> dict:
    """The active mode and what it enforces on this machine (probed once per process)."""
    mode = _active_mode()
    return {
        "mode": mode.name,
        "network": "network namespace" if mode.namespaces else "socket monkeypatch (bypassable)",
        "processes": "pid namespace + process group" if mode.namespaces else "process group + sweep",
        "fork_limit": "RLIMIT_NPROC (unprivileged uid)"
        if mode.drop_uid
        else ("RLIMIT_NPROC (relative)" if os.geteuid() != 0 else "none (root is exempt)"),
        "writes_outside": "blocked by permissions; /tmp,/var/tmp,/dev/shm redirected"
        if mode.namespaces
        else ("blocked by permissions; world-writable dirs swept" if mode.drop_uid else "NOT blocked"),
        "python": sys.executable,
    }


@functools.cache
def _active_mode() -> _Mode:
    forced = os.environ.get("RLVR_SANDBOX_MODE")
    if forced:
        if forced not in _MODE_TABLE:
            raise ValueError(f"RLVR_SANDBOX_MODE={forced!r}; expected one of {MODES}")
        return _MODE_TABLE[forced]
    candidates = ["namespaces", "uid"] if os.geteuid() == 0 else []
    probe = "import decimal, hashlib, json, math, os\nprint(os.getuid())\n"
    for name in candidates:
        mode = _MODE_TABLE[name]
        if name == "namespaces" and not shutil.which("unshare"):
            continue
        res = _run(probe, mode, 10.0, 512, 32, 4096)
        if res.status == "ok" and res.stdout.strip() not in ("", "0"):
            return mode
    return _MODE_TABLE["basic"]


def _rlimits(timeout: float, memory_mb: int, nproc: int) -> list[tuple[str, int, int]]:
    cpu = max(1, math.ceil(timeout)) + 1
    mem = int(memory_mb) * 1024 * 1024
    return [
        ("RLIMIT_CPU", cpu, cpu + 1),
        ("RLIMIT_AS", mem, mem),
        ("RLIMIT_FSIZE", _FILE_SIZE_LIMIT, _FILE_SIZE_LIMIT),
        ("RLIMIT_CORE", 0, 0),
        ("RLIMIT_NOFILE", 256, 256),
        ("RLIMIT_NPROC", nproc, nproc),
    ]


def _user_task_count(uid: int) -> int:
    n = 0
    for proc in psutil.process_iter(["uids", "num_threads"]):
        with contextlib.suppress(psutil.Error, TypeError):
            if proc.info["uids"] is not None and proc.info["uids"].real == uid:
                n += proc.info["num_threads"] or 1
    return n


def _hidden_ancestor(prefix: str) -> str | None:
    """The shallowest ancestor of ``prefix`` that others cannot traverse (e.g. /root), if any."""
    parts = prefix.strip("/").split("/")
    for i in range(1, len(parts)):
        path = "/" + "/".join(parts[:i])
        with contextlib.suppress(OSError):
            if not os.stat(path).st_mode & 0o001:
                return path
    return None


def _run(
    code: str, mode: _Mode, timeout: float, memory_mb: int, max_processes: int, max_output_bytes: int
) -> SandboxResult:
    t0 = time.monotonic()
    token = uuid.uuid4().hex
    uid = random.randrange(*_UID_RANGE) if mode.drop_uid else None
    if uid is not None:
        nproc = max_processes
    else:
        nproc = _user_task_count(os.getuid()) + max_processes if os.geteuid() != 0 else max_processes
    work = tempfile.mkdtemp(prefix="rlvr-sbx-")
    info = {"mode": mode.name, "uid": uid, "token": token, "workdir": work}
    proc = None
    try:
        with open(os.path.join(work, "main.py"), "w", encoding="utf-8") as fh:
            fh.write(code)
        if uid is not None:
            os.chown(work, uid, uid)
            os.chown(os.path.join(work, "main.py"), uid, uid)
        inner_dir = "/tmp" if mode.namespaces else work
        prefix = os.path.realpath(sys.base_prefix)
        cfg = {
            "rlimits": _rlimits(timeout, memory_mb, nproc),
            "mounts": mode.namespaces,
            "prefix": prefix,
            "hide": _hidden_ancestor(prefix) if mode.namespaces and mode.drop_uid else None,
            "binds": [d for d in _WORLD_WRITABLE if os.path.isdir(d)] if mode.namespaces else [],
            "work": work,
            "uid": uid,
            "patch_socket": not mode.namespaces,
            "cwd": inner_dir,
            "mark": _SETUP_MARK,
            "setup_failed": SETUP_FAILED,
            "signal_mark": _SIGNAL_MARK,
        }
        argv = [sys.executable, "-I", "-S", "-c", _BOOT, json.dumps(cfg)]
        if mode.namespaces:
            argv = [
                "unshare", "--mount", "--propagation", "private", "--net", "--pid", "--fork",
                "--kill-child", "--mount-proc", "--", *argv,
            ]  # fmt: skip
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": inner_dir,
            "TMPDIR": inner_dir,
            "LANG": "C.UTF-8",
            _TOKEN_VAR: token,
        }
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=work,
            env=env,
            start_new_session=True,
            close_fds=True,
        )
        out, err, truncated, timed_out = _collect(
            proc, t0 + timeout, max_output_bytes, mode.namespaces, uid, token
        )  # kills and sweeps everything of the run before it returns
        rc = proc.returncode
        proc = None
    except OSError as exc:
        return SandboxResult(None, "", f"sandbox could not start: {exc!r}", False, "error", info=info)
    finally:
        if proc is not None:
            _kill_all(proc, mode.namespaces, uid, token)
        if uid is not None and not mode.namespaces:
            _remove_owned_files(uid, keep=work)
        _rmtree(work)
    stderr = err.decode("utf-8", "replace")
    if mode.namespaces and _UNSHARE_SIGKILL in stderr:
        # util-linux unshare cannot re-raise SIGKILL on itself: it reports this and exits 1 instead.
        stderr = "".join(line for line in stderr.splitlines(True) if _UNSHARE_SIGKILL not in line)
        rc = -signal.SIGKILL
    if mode.namespaces and _SIGNAL_MARK in stderr:
        kept = []
        for line in stderr.splitlines(True):
            if line.startswith(_SIGNAL_MARK):
                rc = -int(line[len(_SIGNAL_MARK) :].strip())
            else:
                kept.append(line)
        stderr = "".join(kept)
    stdout = out.decode("utf-8", "replace")
    if timed_out or rc == -signal.SIGXCPU:
        status = "timeout"
        timed_out = True
    elif rc == SETUP_FAILED and _SETUP_MARK in stderr:
        status = "error"
    elif rc == 0:
        status = "ok"
    elif rc is not None and rc < 0:
        status = "killed"
    else:
        status = "failed"
    info["wall_s"] = round(time.monotonic() - t0, 4)
    return SandboxResult(rc, stdout, stderr, timed_out, status, truncated, info)


def _collect(proc, deadline: float, limit: int, namespaces: bool, uid: int | None, token: str):
    """Read both pipes until EOF, keeping at most ``limit`` bytes each; kill on the deadline."""
    out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
    bufs = {out_fd: bytearray(), err_fd: bytearray()}
    truncated = timed_out = killed = False
    grace_end = None
    sel = selectors.DefaultSelector()
    for fd in bufs:
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
    try:
        while sel.get_map():
            now = time.monotonic()
            if not killed and now >= deadline:
                timed_out = True
            if not killed and (timed_out or proc.poll() is not None):
                # Main program finished (or ran out of time): nothing of it may outlive it.
                _kill_all(proc, namespaces, uid, token)
                killed = True
                grace_end = now + 2.0
            if grace_end is not None and now >= grace_end:
                break  # a writer we could not kill keeps a pipe open; give up on the rest
            wait = (grace_end if killed else deadline) - now
            for key, _ in sel.select(timeout=max(0.0, min(wait, 0.05))):
                try:
                    data = os.read(key.fd, 65536)
                except BlockingIOError:
                    continue
                if not data:
                    sel.unregister(key.fd)
                    continue
                buf = bufs[key.fd]
                room = limit - len(buf)
                if room > 0:
                    buf += data[:room]
                if len(data) > room:
                    truncated = True
    finally:
        sel.close()
        proc.stdout.close()
        proc.stderr.close()
    proc.wait()
    return bytes(bufs[out_fd]), bytes(bufs[err_fd]), truncated, timed_out


def _kill_all(proc: subprocess.Popen, namespaces: bool, uid: int | None, token: str) -> None:
    """SIGKILL the sandbox's session, then sweep anything that escaped it (by uid or env token)."""
    if namespaces and proc.poll() is None:
        # Namespaces mode: kill the namespace's init first so that `unshare` (still alive) reaps it at
        # once; the kernel then kills everything else in the PID namespace. Killing `unshare` first
        # would orphan the init to the machine's init, which may reap it only seconds later.
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(proc.pid).children():
                with contextlib.suppress(psutil.Error):
                    child.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=2)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)
    deadline = time.monotonic() + 5.0
    while True:
        strays = _strays(uid, token)
        if not strays or time.monotonic() > deadline:
            break
        for p in strays:
            with contextlib.suppress(psutil.Error):
                p.kill()
        psutil.wait_procs(strays, timeout=0.5)


def _strays(uid: int | None, token: str) -> list[psutil.Process]:
    me = os.getpid()
    found = []
    for p in psutil.process_iter(["uids"]):
        if p.pid == me:
            continue
        try:
            uids = p.info["uids"]
            if uids is None or p.status() == psutil.STATUS_ZOMBIE:
                continue  # a zombie is already dead and holds nothing; its new parent reaps it
            if uid is not None:
                mine = uids.real == uid
            else:
                mine = uids.real == os.getuid() and p.environ().get(_TOKEN_VAR) == token
        except (psutil.Error, OSError):
            continue
        if mine:
            found.append(p)
    return found


def _remove_owned_files(uid: int, keep: str) -> None:
    """Delete what the sandbox uid left at the top of the world-writable dirs (uid mode)."""
    for base in _WORLD_WRITABLE:
        with contextlib.suppress(OSError):
            for entry in os.scandir(base):
                with contextlib.suppress(OSError):
                    if entry.path != keep and entry.stat(follow_symlinks=False).st_uid == uid:
                        if entry.is_dir(follow_symlinks=False):
                            shutil.rmtree(entry.path, ignore_errors=True)
                        else:
                            os.unlink(entry.path)


def _rmtree(path: str) -> None:
    root = os.path.realpath(path)

    def make_writable_and_retry(func, failed_path, _exc_info):
        # The program may have chmod-ed its own files or directories to 000 (matters when not root).
        # Only ever touch paths strictly inside the sandbox directory.
        failed = os.path.realpath(failed_path)
        if not failed.startswith(root + os.sep):
            raise _exc_info[1]
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(failed), 0o700)
            os.chmod(failed, 0o700)
        func(failed_path)

    for _ in range(3):
        try:
            shutil.rmtree(path, onerror=make_writable_and_retry)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.05)
    shutil.rmtree(path, ignore_errors=True)
