"""Isolated worker processes for verifier checks that can hang or blow up (math-verify / sympy).

A ``WorkerPool`` runs one handler, named ``"module:function"``, in long-lived child processes:
JSON requests go to a worker's stdin, JSON replies come back on a private copy of its stdout
(stray prints of libraries go to stderr, so they cannot corrupt the protocol). ``run`` bounds each
request by a timeout: a worker that does not answer in time is SIGKILLed and replaced, and the
request is scored ``timeout``; a handler that raises is scored ``error`` (the worker lives on); a
worker that dies mid-request is replaced and the request retried once, then scored ``error``.

Why processes: sympy can loop for minutes on adversarial LaTeX, and math-verify's own signal-based
timeouts only work on a main thread. Workers die with the process that started them
(PR_SET_PDEATHSIG: a killed training job leaves no sympy computation running); that signal follows
the *thread* that forked the worker, so workers are spawned from one long-lived thread. Each worker
has RLIMIT_AS of ``memory_mb`` (4 GiB by default).
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import json
import os
import select
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

STARTUP_S = 120.0
MAX_IDLE_WORKERS = 16
_ROOT = str(Path(__file__).resolve().parents[2])


class WorkerDied(RuntimeError):
    pass


def _load(spec: str):
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def worker_main(handler: str, warm_up: str | None, memory_mb: int) -> None:
    """Body of a worker process: JSON requests on stdin, one JSON reply per line on a private fd."""
    import logging
    import resource

    with contextlib.suppress(Exception):  # die with the parent even while stuck in a check
        import ctypes
        import signal

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    with contextlib.suppress(ValueError, OSError):
        limit = memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    logging.disable(logging.WARNING)
    reply = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    handle = _load(handler)
    if warm_up:
        _load(warm_up)()
    reply.write('{"ready": true}\n')
    reply.flush()
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            out = handle(json.loads(line))
        except Exception as exc:  # a check that raises is an error verdict, not a dead worker
            out = {"correct": False, "extracted": None, "status": "error", "error": repr(exc)[:500]}
        reply.write(json.dumps(out) + "\n")
        reply.flush()


_SPAWNER: tuple[int, ThreadPoolExecutor] | None = None
_SPAWNER_LOCK = threading.Lock()


def _spawner() -> ThreadPoolExecutor:
    """A single thread that lives as long as this process (one per process, also after a fork)."""
    global _SPAWNER
    with _SPAWNER_LOCK:
        if _SPAWNER is None or _SPAWNER[0] != os.getpid():
            _SPAWNER = (os.getpid(), ThreadPoolExecutor(max_workers=1, thread_name_prefix="verifier-spawn"))
        return _SPAWNER[1]


class Worker:
    """One child process running ``handler``; ``call`` sends a request and waits for its reply."""

    def __init__(self, handler: str, warm_up: str | None = None, memory_mb: int = 4096) -> None:
        boot = (
            f"import sys; sys.path.insert(0, {_ROOT!r}); "
            "from workflow_scripts.verify.workers import worker_main; "
            f"worker_main({handler!r}, {warm_up!r}, {int(memory_mb)})"
        )
        self.owner = os.getpid()
        started = _spawner().submit(
            subprocess.Popen,
            [sys.executable, "-c", boot],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            close_fds=True,
        )
        self.proc = started.result()
        self._buf = b""
        if not self._read_line(time.monotonic() + STARTUP_S):
            self.kill()
            raise WorkerDied(f"verifier worker {handler} did not start")

    def _read_line(self, deadline: float) -> bytes | None:
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], remaining)
            if not ready:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                raise WorkerDied(f"verifier worker exited (code {self.proc.poll()})")
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line

    def call(self, request: dict, timeout: float) -> dict | None:
        """The worker's reply, or None if it did not answer within ``timeout`` seconds."""
        try:
            self.proc.stdin.write((json.dumps(request) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            raise WorkerDied(f"verifier worker gone: {exc!r}") from exc
        line = self._read_line(time.monotonic() + timeout)
        return None if line is None else json.loads(line)

    def alive(self) -> bool:
        return self.proc.poll() is None and self.owner == os.getpid()

    def kill(self) -> None:
        if self.owner != os.getpid():
            return  # inherited through fork: the parent owns it
        with contextlib.suppress(OSError):
            self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        for stream in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                stream.close()


class WorkerPool:
    """Idle workers of one handler, reused across requests; ``run`` is the only entry point."""

    def __init__(self, handler: str, warm_up: str | None = None, memory_mb: int = 4096) -> None:
        self.handler, self.warm_up, self.memory_mb = handler, warm_up, memory_mb
        self._lock = threading.Lock()
        self._idle: list[Worker] = []
        atexit.register(self.close)

    def acquire(self) -> Worker:
        with self._lock:
            while self._idle:
                worker = self._idle.pop()
                if worker.alive():
                    return worker
                worker.kill()
        return Worker(self.handler, self.warm_up, self.memory_mb)

    def release(self, worker: Worker) -> None:
        with self._lock:
            if worker.alive() and len(self._idle) < MAX_IDLE_WORKERS:
                self._idle.append(worker)
                return
        worker.kill()

    def idle_pids(self) -> list[int]:
        with self._lock:
            return [w.proc.pid for w in self._idle]

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for worker in idle:
            worker.kill()

    def run(self, request: dict, timeout: float) -> dict:
        """The handler's reply to ``request``; a dict with status timeout / error if it has none."""
        for attempt in range(2):
            try:
                worker = self.acquire()
            except WorkerDied as exc:
                return {"correct": False, "extracted": None, "status": "error", "error": str(exc)}
            try:
                reply = worker.call(request, timeout)
            except WorkerDied as exc:
                worker.kill()
                if attempt == 0:
                    continue  # an idle worker may have been killed from outside: retry once
                return {"correct": False, "extracted": None, "status": "error", "error": str(exc)}
            except BaseException:
                worker.kill()
                raise
            if reply is None:
                worker.kill()
                return {"correct": False, "extracted": None, "status": "timeout"}
            self.release(worker)
            return reply
        raise AssertionError("unreachable")
