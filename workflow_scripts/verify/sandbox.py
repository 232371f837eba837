"""Run untrusted, model-generated Python in a contained subprocess.

``run_sandboxed(code)`` runs ``code`` as ``__main__`` with ``python -I -S`` (isolated mode, no
site-packages: the standard library only) and returns a ``SandboxResult``; ``spawn_sandboxed``
starts it and returns a handle (``wait()``, ``kill()``). ``peers=`` runs more programs in the same
sandbox, each under its own uid with its own writable tmpfs, connected only by ``pipes=`` created
inside the sandbox (``code_verdict`` runs a candidate and its tests this way). Whatever the programs
do, the call returns within ``timeout`` (+ a few seconds of cleanup), no process they started
survives, and the host directory is deleted.

One module of ~700 lines on purpose: the threat model below, the containment modes and the code that
enforces them are reviewed together; split, a reader could check one mode's code against another's
promises.

Threat model. The program is written to be scored correct without being correct (RLVR policies
learn to exploit their checker) or, by accident or design, to harm the host. It may read every file
it can see, its own interpreter's memory (``gc``, frames), its environment and every fd it holds;
write anything to any of them; fork, daemonise, exhaust memory, disk, processes or fds; exit however
it likes; try the network. Defended here: the host (its files, processes, network, disk, memory)
and the separation between programs of one sandbox (a peer cannot signal, trace, or read the files
of another: different uids, private tmpfs) and, in the namespaces mode, the host's files (a program
sees only the system dirs, so it cannot look its answer up in the dataset or the results). Not
defended: kernel exploits; CPU/disk contention during the timeout window; in the weaker modes,
reading world-readable files. A verdict must never come from the program's own process: see
``code_verdict``.

What is enforced depends on what the machine allows; ``capabilities()`` says which mode is active.
A probe (one tiny sandboxed run, cached per process) picks the strongest mode that works here:

``namespaces`` (running as root with a working ``unshare``; the mode on the dev machine, measured)
  - the programs run under ``unshare --mount --net --pid --fork --kill-child --mount-proc``:
  - network: a fresh network namespace with only a (down) loopback; ``connect`` fails with
    ENETUNREACH, also to services on the host's 127.0.0.1. Enforced by the kernel.
  - processes: a fresh PID namespace whose init (the bootstrap) forks each program and exits with
    the main program's status; when it exits or is killed, the kernel kills every process left in
    the namespace, including ones that called ``setsid()``. ``/proc`` shows only the sandbox's.
  - privileges: each program drops to a fresh unprivileged uid/gid (random, ~1.5e9, no
    supplementary groups; all capabilities are lost). So RLIMIT_NPROC is enforced (root is exempt
    from it), which stops fork bombs at ``max_processes`` tasks; ordinary file permissions block
    writes to the repository and anything else not world-writable; no program can signal or
    ptrace another.
  - disk: each program gets its own mount namespace whose only writable place is a fresh tmpfs of
    ``disk_mb`` MiB (and 4096 inodes), owned by its uid, mounted at ``/tmp`` and bound over
    ``/var/tmp`` and ``/dev/shm``; it is the program's cwd and HOME. A disk fill ends in ENOSPC at
    ``disk_mb``; the tmpfs vanishes with the namespace (no mount is ever left on the host: all
    mounts are private to the sandbox's mount namespace).
  - files: each program is chrooted into an empty tmpfs into which only ``/usr``, ``/bin``, ``/lib*``,
    ``/dev``, ``/proc``, ``/etc/ld.so.cache``, ``/etc/localtime`` and the interpreter's prefix are
    bound: the repository, datasets, results, home dirs and the host's ``/tmp`` are not there.
  - as a final guarantee the parent kills any process still owned by a sandbox uid.

``uid`` (root, but no namespaces): the same uid drop and rlimits, no network, PID or mount
  namespace; ``socket`` is monkeypatched (bypassable via ``_socket``), stray processes are found by
  uid and killed, files the uids left in ``/tmp``, ``/var/tmp``, ``/dev/shm`` are removed. Total
  disk is NOT bounded (only per file).

``basic`` (not root, or nothing else works): rlimits only (RLIMIT_NPROC = the user's current task
  count + ``max_processes``; it counts all of the user's tasks), ``socket`` monkeypatched, own session
  killed as a group, processes carrying the run's token in their command line or environment
  killed, the whole tree non-dumpable (PR_SET_DUMPABLE 0: same uid, yet no ptrace of, or
  ``/proc/<pid>/fd`` access to, a peer or the bootstrap). Writes outside the temp dir are NOT
  prevented in this mode (only HOME/TMPDIR/cwd point into it), nor is total disk bounded, and peers
  share a uid (one can read the other's files and kill it).

Always (every mode): RLIMIT_CPU (timeout + 1 s), RLIMIT_AS (``memory_mb``), RLIMIT_FSIZE (16 MiB per
file), RLIMIT_CORE 0, RLIMIT_NOFILE 256; a wall-clock timeout after which the whole session is
SIGKILLed; stdout/stderr of the main program are read incrementally and truncated to
``max_output_bytes`` each (peers' output is discarded); the environment is reduced to PATH, HOME,
TMPDIR, LANG and the run's token; ``python -I`` ignores PYTHON* variables and the user site.
``RLVR_SANDBOX_MODE=basic|uid|namespaces`` forces a mode.
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
import threading
import time
import uuid
from dataclasses import dataclass, field

import psutil

SETUP_FAILED = 121  # exit code of the bootstrap when it cannot set the sandbox up
_SETUP_MARK = "rlvr-sandbox: setup failed"
_FILE_SIZE_LIMIT = 16 * 1024 * 1024
DISK_MB = 64  # size of the tmpfs that is the program's only writable place (namespaces mode)
_INODES = 4096
_TOKEN_VAR = "RLVR_SANDBOX_TOKEN"
_UNSHARE_SIGKILL = "unshare: sigprocmask unblock failed"
_SIGNAL_MARK = "rlvr-sandbox: program killed by signal"
_UID_RANGE = (1_500_000_000, 1_600_000_000)
_WORLD_WRITABLE = ("/tmp", "/var/tmp", "/dev/shm")  # the first is the programs' cwd and HOME
# What a program sees of the host in the namespaces mode (plus the interpreter's prefix): the system
# dirs the interpreter and its extension modules load from. Missing ones are skipped.
_SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/dev", "/proc",
                 "/etc/ld.so.cache", "/etc/localtime")  # fmt: skip
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


# The bootstrap (root in the namespaces mode): rlimits, pipes, the programs' root, network guard; then
# it forks each program (own mount namespace, tmpfs and chroot; its fds; uid drop; runpy) and waits for
# the first. Kept free of site-packages (python -S).
_BOOT = r"""
import json, os, resource, sys
cfg = json.loads(sys.argv[1])
progs = cfg["programs"]
try:
    for name, soft, hard in cfg["rlimits"]:
        resource.setrlimit(getattr(resource, name), (soft, hard))
    codes = []
    for p in progs:
        with open(os.path.join(p["dir"], "main.py"), "rb") as fh:  # before /tmp is covered
            codes.append(fh.read())
    ends = [[] for _ in progs]  # each program's pipe ends, in the order of cfg["pipes"]
    for writer, reader in cfg["pipes"]:
        r, w = os.pipe()
        ends[writer].append(w)
        ends[reader].append(r)
    if cfg["mounts"] or cfg["nodump"]:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
    if cfg["nodump"]:  # same uid as the host: no ptrace / /proc/<pid>/fd of this tree by a program
        libc.prctl(4, 0, 0, 0, 0)
    if cfg["mounts"]:
        def mount(src, tgt, fstype, flags, data=None):
            enc = lambda s: None if s is None else s.encode()
            if libc.mount(enc(src), enc(tgt), enc(fstype), flags, enc(data)) != 0:
                err = ctypes.get_errno()
                raise OSError(err, os.strerror(err), tgt)
        MS_NOSUID, MS_NODEV, MS_BIND, MS_REC, CLONE_NEWNS = 2, 4, 4096, 16384, 0x20000
        # The programs' root: an empty tmpfs with only the system dirs and the interpreter's prefix
        # bound in (symlinks recreated); the repository, datasets, home dirs, results are not there.
        root = cfg["root"]
        mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m")
        for path in cfg["system"]:
            target = root + path
            if os.path.islink(path):
                os.makedirs(os.path.dirname(target), exist_ok=True)
                os.symlink(os.readlink(path), target)
            elif os.path.isdir(path):
                os.makedirs(target, exist_ok=True)
                mount(path, target, None, MS_BIND | MS_REC)
            elif os.path.exists(path):
                os.makedirs(os.path.dirname(target), exist_ok=True)
                open(target, "w").close()
                mount(path, target, None, MS_BIND)
        for path in cfg["binds"]:
            os.makedirs(root + path, exist_ok=True)
    if cfg["patch_socket"]:
        import socket
        def _no_network(*args, **kwargs):
            raise PermissionError(1, "network access is disabled in the sandbox")
        socket.socket = socket.create_connection = socket.socketpair = _no_network
        socket.getaddrinfo = socket.create_server = socket.fromfd = _no_network
    # before the fork (each program inherits them loaded) and the uid drop / chroot
    import fcntl, pkgutil, runpy
except BaseException as exc:
    sys.stderr.write("%s: %r\n" % (cfg["mark"], exc))
    sys.stderr.flush()
    os._exit(cfg["setup_failed"])


def child(i):
    p = progs[i]
    uid = p["uid"]
    if cfg["mounts"]:
        # Its own mount namespace whose only writable place is a fresh size-limited tmpfs owned by
        # its uid, at /tmp and bound over the other world-writable dirs; it dies with the program.
        if libc.unshare(CLONE_NEWNS) != 0:
            raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS)")
        first, *others = [root + path for path in cfg["binds"]]
        owner = uid if uid is not None else 0
        opts = "mode=0700,uid=%d,gid=%d,size=%dk,nr_inodes=%d" % (owner, owner, cfg["disk_kb"], cfg["inodes"])
        mount("tmpfs", first, "tmpfs", MS_NOSUID | MS_NODEV, opts)
        for target in others:
            mount(first, target, None, MS_BIND)
        with open(os.path.join(first, "main.py"), "wb") as fh:
            fh.write(codes[i])
        os.chown(os.path.join(first, "main.py"), owner, owner)
        os.chroot(root)  # no way out once the uid is dropped (chroot needs CAP_SYS_CHROOT)
        cwd = cfg["binds"][0]
    else:
        cwd = p["dir"]
    # its fds become 3, 4, ... (via high copies: sources may overlap targets); the others' are closed
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 200) for fd in ends[i]]
    for fds in ends:
        for fd in fds:
            os.close(fd)
    for k, fd in enumerate(high):
        os.dup2(fd, 3 + k)
        os.close(fd)
    if i:  # a peer's output goes nowhere: only the primary program speaks to the caller
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 1)
        os.dup2(null, 2)
        os.close(null)
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    os.chdir(cwd)


pids = []
for i in range(len(progs)):
    pid = os.fork()
    if pid == 0:
        try:
            child(i)
        except BaseException as exc:
            sys.stderr.write("%s: %r\n" % (cfg["mark"], exc))
            sys.stderr.flush()
            os._exit(cfg["setup_failed"])
        del cfg, progs, codes, ends, pids, json, resource, fcntl, pkgutil, child
        sys.argv = ["main.py"]
        runpy.run_path("main.py", run_name="__main__")
        raise SystemExit(0)
    pids.append(pid)
for fds in ends:  # only the programs hold them: a pipe's reader sees EOF when its writer ends
    for fd in fds:
        os.close(fd)
# Wait for the primary program; exit with its status (in the PID namespace, this init's exit kills
# all that is left; otherwise the caller sweeps). Reap every other child meanwhile.
while True:
    try:
        pid, status = os.waitpid(-1, 0)
    except ChildProcessError:
        os._exit(cfg["setup_failed"])
    if pid == pids[0]:
        break
for pid in pids[1:]:
    try:
        os.kill(pid, 9)
    except OSError:
        pass
if os.WIFSIGNALED(status):
    sys.stderr.write("%s %d\n" % (cfg["signal_mark"], os.WTERMSIG(status)))
    sys.stderr.flush()
    os._exit(128 + os.WTERMSIG(status))
os._exit(os.waitstatus_to_exitcode(status))
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
    *,
    disk_mb: int = DISK_MB,
    peers: tuple[str, ...] = (),
    pipes: tuple[tuple[int, int], ...] = (),
) -> SandboxResult:
    """Run ``code`` as ``__main__`` in the sandbox; see the module docstring for what is enforced."""
    return spawn_sandboxed(
        code, timeout, memory_mb, max_processes, max_output_bytes,
        disk_mb=disk_mb, peers=peers, pipes=pipes,
    ).wait()  # fmt: skip


def spawn_sandboxed(
    code: str,
    timeout: float = 10.0,
    memory_mb: int = 512,
    max_processes: int = 32,
    max_output_bytes: int = 64_000,
    *,
    disk_mb: int = DISK_MB,
    peers: tuple[str, ...] = (),
    pipes: tuple[tuple[int, int], ...] = (),
) -> Sandboxed:
    """Start ``code`` in the sandbox and return at once; ``.wait()`` gives the ``SandboxResult``.

    Each of ``peers`` (program texts) runs alongside in the same sandbox under its own uid, with its
    own tmpfs, its output discarded; peers are killed when the main program ends, and only its
    status is returned. ``pipes`` connects them: ``(writer, reader)`` indices (0 = the main program,
    1... = the peers), each a pipe created inside the sandbox, so only those two programs hold it
    (a reader sees EOF once its writer is gone). A program's ends are its fds 3, 4, ..., in the
    order of ``pipes``.
    """
    programs = (code, *peers)
    for ends in pipes:
        if len(ends) != 2 or not all(0 <= e < len(programs) for e in ends) or ends[0] == ends[1]:
            raise ValueError(f"pipe {ends!r}: need (writer, reader), two of 0..{len(programs) - 1}")
    return Sandboxed(
        programs, tuple(pipes), _active_mode(), timeout, memory_mb, max_processes, max_output_bytes, disk_mb
    )


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
        "writes_outside": "chroot to system dirs; a private tmpfs of disk_mb is the only writable place"
        if mode.namespaces
        else ("blocked by permissions; world-writable dirs swept" if mode.drop_uid else "NOT blocked"),
        "host_files": "hidden (chroot)" if mode.namespaces else "world-readable ones visible",
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


def _run(
    code: str, mode: _Mode, timeout: float, memory_mb: int, max_processes: int, max_output_bytes: int
) -> SandboxResult:
    return Sandboxed((code,), (), mode, timeout, memory_mb, max_processes, max_output_bytes, DISK_MB).wait()


class Sandboxed:
    """One sandboxed program, started in ``__init__``; ``wait()`` collects it, ``kill()`` ends it early.

    Either way, when ``wait()`` returns nothing of the program is running and its directory is gone.
    Always call ``wait()``: it is what enforces the deadline and cleans up.
    """

    def __init__(
        self,
        programs: tuple[str, ...],
        pipes: tuple[tuple[int, int], ...],
        mode: _Mode,
        timeout: float,
        memory_mb: int,
        max_processes: int,
        max_output_bytes: int,
        disk_mb: int,
    ) -> None:
        self._t0 = time.monotonic()
        self._mode, self._limit = mode, max_output_bytes
        self._deadline = self._t0 + timeout
        self._token = token = uuid.uuid4().hex
        uids = random.sample(range(*_UID_RANGE), len(programs)) if mode.drop_uid else [None] * len(programs)
        self._uids = tuple(u for u in uids if u is not None)
        uid = uids[0]
        self._killed = threading.Event()
        self._result: SandboxResult | None = None
        if mode.drop_uid:
            nproc = max_processes
        else:
            nproc = _user_task_count(os.getuid()) + max_processes if os.geteuid() != 0 else max_processes
        self._work = work = tempfile.mkdtemp(prefix="rlvr-sbx-")
        self.info = {"mode": mode.name, "uid": uid, "uids": self._uids, "token": token, "workdir": work}
        self._proc = None
        self._error: str | None = None
        try:
            os.chmod(work, 0o711)  # each program's own dir below is private to its uid
            specs = []
            for i, (code, puid) in enumerate(zip(programs, uids, strict=True)):
                pdir = os.path.join(work, str(i))
                os.mkdir(pdir, 0o700)
                with open(os.path.join(pdir, "main.py"), "w", encoding="utf-8") as fh:
                    fh.write(code)
                if puid is not None and not mode.namespaces:
                    os.chown(pdir, puid, puid)
                    os.chown(os.path.join(pdir, "main.py"), puid, puid)
                specs.append({"dir": pdir, "uid": puid})
            inner_dir = "/tmp" if mode.namespaces else specs[0]["dir"]
            os.mkdir(os.path.join(work, "root"), 0o755)
            prefix = os.path.realpath(sys.base_prefix)
            cfg = {
                "token": token,  # in every process's command line: what the basic mode sweeps by
                "programs": specs,
                "pipes": [list(p) for p in pipes],
                "nodump": not mode.drop_uid,
                "rlimits": _rlimits(timeout, memory_mb, nproc),
                "mounts": mode.namespaces,
                "root": os.path.join(work, "root"),
                "system": [*_SYSTEM_PATHS, prefix],
                "binds": list(_WORLD_WRITABLE),
                "disk_kb": max(64, int(disk_mb * 1024)),
                "inodes": _INODES,
                "patch_socket": not mode.namespaces,
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
            self._proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=work,
                env=env,
                start_new_session=True,
                close_fds=True,
            )
        except OSError as exc:
            self._error = f"sandbox could not start: {exc!r}"
            self._cleanup()

    def kill(self) -> None:
        """End the program now (from any thread); a pending ``wait()`` then returns ``killed``."""
        self._killed.set()

    def wait(self) -> SandboxResult:
        if self._result is None:
            self._result = self._wait()
        return self._result

    def _cleanup(self) -> None:
        mode = self._mode
        if self._proc is not None:
            _kill_all(self._proc, mode.namespaces, self._uids, self._token)
        if self._uids and not mode.namespaces:
            _remove_owned_files(self._uids, keep=self._work)
        _rmtree(self._work)

    def _wait(self) -> SandboxResult:
        mode, info = self._mode, self.info
        if self._error is not None:
            return SandboxResult(None, "", self._error, False, "error", info=info)
        proc = self._proc
        try:
            out, err, truncated, timed_out = _collect(
                proc, self._deadline, self._limit, mode.namespaces, self._uids, self._token, self._killed
            )  # kills and sweeps everything of the run before it returns
            rc = proc.returncode
            self._proc = None
        finally:
            self._cleanup()
        stderr = err.decode("utf-8", "replace")
        # The marks below are trusted only as the last stderr line with the exit code that goes with
        # them: a program may print the same text (e.g. in an exception message) to fake a status.
        *head, last = stderr.splitlines(True) or [""]
        we_killed = timed_out or self._killed.is_set()
        if mode.namespaces and rc == 1 and we_killed and _UNSHARE_SIGKILL in last:
            # util-linux unshare cannot re-raise SIGKILL on itself: it reports this and exits 1 instead
            # (only we SIGKILL the namespace's init; a program's own exit 1 with this text is not it).
            stderr, rc = "".join(head), -signal.SIGKILL
        elif last.startswith(_SIGNAL_MARK) and rc is not None:
            sig = last[len(_SIGNAL_MARK) :].strip()
            if sig.isdigit() and 0 < int(sig) < 128 and rc == 128 + int(sig):
                stderr, rc = "".join(head), -int(sig)
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
        info["wall_s"] = round(time.monotonic() - self._t0, 4)
        return SandboxResult(rc, stdout, stderr, timed_out, status, truncated, info)


def _collect(
    proc,
    deadline: float,
    limit: int,
    namespaces: bool,
    uids: tuple[int, ...],
    token: str,
    stop: threading.Event,
):
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
            if not killed and (timed_out or stop.is_set() or proc.poll() is not None):
                # Main program finished (or ran out of time): nothing of it may outlive it.
                _kill_all(proc, namespaces, uids, token)
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
    while not killed:  # both pipes closed early (the program closed fds 1 and 2) but it may still run
        try:
            proc.wait(timeout=0.05)
            break
        except subprocess.TimeoutExpired:
            timed_out = time.monotonic() >= deadline
            if timed_out or stop.is_set():
                _kill_all(proc, namespaces, uids, token)
                killed = True
    if not killed:  # the main program is done: nothing it started may outlive it
        _kill_all(proc, namespaces, uids, token)
    proc.wait()
    return bytes(bufs[out_fd]), bytes(bufs[err_fd]), truncated, timed_out


def _kill_all(proc: subprocess.Popen, namespaces: bool, uids: tuple[int, ...], token: str) -> None:
    """SIGKILL the sandbox's session, then sweep anything that escaped it (by uid or env token)."""
    if namespaces and proc.poll() is not None and proc.returncode >= 0:
        # `unshare` exited by itself, so it has reaped the PID namespace's init, and an init's exit
        # completes only after the kernel has killed and reaped every other process of its namespace:
        # nothing can be left (setsid, double forks, reparenting all stay inside). Skips a ~20 ms
        # /proc sweep. (A killed `unshare` may not have waited: then sweep as below.)
        return
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
        strays = _strays(uids, token)
        if not strays or time.monotonic() > deadline:
            break
        for p in strays:
            with contextlib.suppress(psutil.Error):
                p.kill()
        psutil.wait_procs(strays, timeout=0.5)


def _strays(sandbox_uids: tuple[int, ...], token: str) -> list[psutil.Process]:
    me = os.getpid()
    found = []
    for p in psutil.process_iter(["uids"]):
        if p.pid == me:
            continue
        try:
            uids = p.info["uids"]
            if uids is None or p.status() == psutil.STATUS_ZOMBIE:
                continue  # a zombie is already dead and holds nothing; its new parent reaps it
            if sandbox_uids:
                mine = uids.real in sandbox_uids
            elif uids.real != os.getuid():
                mine = False
            else:  # the token is in the environment and (cfg) in the command line of all its processes
                mine = token in " ".join(p.cmdline())
                if not mine:
                    with contextlib.suppress(psutil.AccessDenied):  # non-dumpable: environ is root's
                        mine = p.environ().get(_TOKEN_VAR) == token
        except (psutil.Error, OSError):
            continue
        if mine:
            found.append(p)
    return found


def _remove_owned_files(uids: tuple[int, ...], keep: str) -> None:
    """Delete what the sandbox uid left at the top of the world-writable dirs (uid mode)."""
    for base in _WORLD_WRITABLE:
        with contextlib.suppress(OSError):
            for entry in os.scandir(base):
                with contextlib.suppress(OSError):
                    if entry.path != keep and entry.stat(follow_symlinks=False).st_uid in uids:
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
