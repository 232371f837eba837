"""GPU slots on a local multi-GPU machine: each GPU job gets its own devices, also under concurrency.

`snakemake --cores 32 --resources gpu=4` caps how many GPUs the running jobs ask for in total, but
Snakemake does not say *which* devices a job gets: without this module every job would see all devices
and load onto device 0. Every job runs its stage inside ``gpu_slot(n)`` (``smk.main_from`` does it):

    with gpu_slot(snakemake.resources.get("gpu", 0)):
        module.from_snakemake(snakemake)

which takes ``n`` free slots (device indices), sets ``CUDA_VISIBLE_DEVICES`` to them for the job (and
the processes it starts, e.g. `accelerate launch`), and gives them back when the block ends.

| situation | what ``gpu_slot(n)`` does |
| --- | --- |
| n == 0 (a CPU job, the default configs) | nothing |
| inside a SLURM job (``SLURM_JOB_ID`` set) | nothing: SLURM already set ``CUDA_VISIBLE_DEVICES`` |
| the machine has no CUDA device | nothing (the job runs on CPU), with a warning |
| a local machine with devices | waits until n slots are free, holds them, sets ``CUDA_VISIBLE_DEVICES`` |

Slots are lock files ``<lock_dir>/slot{i}.lock`` (default ``results/.gpu_slots``, or
``$RLVR_GPU_LOCK_DIR``) held with ``fcntl.flock``: the kernel drops a lock when its holder exits in any
way, SIGKILL and OOM kill included, so a crashed job can never leak its slot and no stale-lock cleanup
is needed. The lock file records the holder's pid for people looking at a busy box. Jobs of one
workflow directory share one lock dir; point ``RLVR_GPU_LOCK_DIR`` at one folder (e.g. /tmp/gpu_slots)
to make several workflow directories on one machine share the devices.

The slot count: ``$RLVR_GPU_SLOTS`` if set (tests use it to fake devices), else the entries of an
existing ``CUDA_VISIBLE_DEVICES`` (slot i = its i-th entry), else ``torch.cuda.device_count()`` asked
in a child process, so that this process never initializes CUDA before ``CUDA_VISIBLE_DEVICES`` is set
(CUDA reads it once, at initialization).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

SLOTS_ENV = "RLVR_GPU_SLOTS"
LOCK_DIR_ENV = "RLVR_GPU_LOCK_DIR"
DEFAULT_LOCK_DIR = Path("results") / ".gpu_slots"
VISIBLE = "CUDA_VISIBLE_DEVICES"
POLL_SECONDS = 0.1


def in_slurm_job() -> bool:
    return bool(os.environ.get("SLURM_JOB_ID"))


def visible_devices() -> list[str] | None:
    """The entries of CUDA_VISIBLE_DEVICES (None when unset; [] when set empty, i.e. no device)."""
    value = os.environ.get(VISIBLE)
    if value is None:
        return None
    return [d.strip() for d in value.split(",") if d.strip()]


def _count_cuda_devices() -> int:
    """torch.cuda.device_count() in a child process: this process must not initialize CUDA yet."""
    code = "import torch; print(torch.cuda.device_count())"
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
        )
        return int(proc.stdout.strip().splitlines()[-1])
    except (subprocess.SubprocessError, OSError, ValueError, IndexError):
        return 0


def device_pool() -> list[str]:
    """The devices slots map to: slot i -> device_pool()[i] (a CUDA_VISIBLE_DEVICES entry)."""
    override = os.environ.get(SLOTS_ENV)
    if override is not None and override.strip():
        try:
            count = int(override)
        except ValueError:
            raise ValueError(f"{SLOTS_ENV}={override!r} is not a number of GPU slots") from None
        if count < 0:
            raise ValueError(f"{SLOTS_ENV}={override!r} must be >= 0")
        return [str(i) for i in range(count)]
    visible = visible_devices()
    if visible is not None:
        return visible
    return [str(i) for i in range(_count_cuda_devices())]


def _check_cuda_not_initialized() -> None:
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        raise RuntimeError(
            "CUDA is already initialized in this process: CUDA_VISIBLE_DEVICES set now would be ignored. "
            "Enter gpu_slot() before any CUDA call (model.to('cuda'), torch.cuda.* queries)."
        )


def _lock_dir(lock_dir: str | os.PathLike | None) -> Path:
    if lock_dir is not None:
        return Path(lock_dir)
    return Path(os.environ.get(LOCK_DIR_ENV) or DEFAULT_LOCK_DIR)


def _try_lock(path: Path) -> int | None:
    """An fd holding an exclusive flock on ``path``, or None when another process holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
        os.close(fd)
        if err.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
            return None
        raise
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def _release(fds: dict[int, int]) -> None:
    for fd in fds.values():
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
    fds.clear()


@contextlib.contextmanager
def acquire_gpu(
    n_gpus: int,
    n_slots: int | None = None,
    lock_dir: str | os.PathLike | None = None,
    timeout: float | None = None,
) -> Iterator[list[int]]:
    """Hold ``n_gpus`` of ``n_slots`` slots for the block; yields the slot indices (sorted).

    Sets CUDA_VISIBLE_DEVICES to the held slots' devices inside the block and restores it after.
    All-or-nothing: a job holds either all of its slots or none while waiting, so two multi-GPU jobs
    can never deadlock on each other's partial sets. ``timeout`` (seconds, None = wait as long as it
    takes) raises TimeoutError. Yields [] and changes nothing in the cases of the module table.
    """
    n_gpus = int(n_gpus or 0)
    if n_gpus < 0:
        raise ValueError(f"n_gpus must be >= 0, got {n_gpus}")
    if n_gpus == 0:
        yield []
        return
    if in_slurm_job():
        if visible_devices() is None:
            warnings.warn(
                f"SLURM job {os.environ['SLURM_JOB_ID']} asked for {n_gpus} GPU(s) but SLURM set no "
                f"{VISIBLE}: is the GPU requested (profile: gpu / gres) and is GRES configured?",
                stacklevel=3,
            )
        yield []
        return
    if n_slots is None:
        pool = device_pool()
    else:
        visible = visible_devices()
        pool = visible[:n_slots] if visible and len(visible) >= n_slots else [str(i) for i in range(n_slots)]
    if not pool:
        warnings.warn(f"{n_gpus} GPU(s) requested but no CUDA device found: running on CPU", stacklevel=3)
        yield []
        return
    if n_gpus > len(pool):
        raise ValueError(f"a job asks for {n_gpus} GPU slots but this machine has {len(pool)}")
    _check_cuda_not_initialized()

    directory = _lock_dir(lock_dir)
    directory.mkdir(parents=True, exist_ok=True)
    held: dict[int, int] = {}
    deadline = None if timeout is None else time.monotonic() + timeout
    waited = False
    while True:
        for slot in range(len(pool)):
            fd = _try_lock(directory / f"slot{slot}.lock")
            if fd is not None:
                held[slot] = fd
                if len(held) == n_gpus:
                    break
        if len(held) == n_gpus:
            break
        _release(held)
        if deadline is not None and time.monotonic() >= deadline:
            raise TimeoutError(f"no {n_gpus} free GPU slot(s) of {len(pool)} in {directory} after {timeout}s")
        if not waited:
            print(f"gpu_slots: waiting for {n_gpus} of {len(pool)} slots ({directory})", file=sys.stderr)
            waited = True
        time.sleep(POLL_SECONDS)

    slots = sorted(held)
    previous = os.environ.get(VISIBLE)
    os.environ[VISIBLE] = ",".join(pool[s] for s in slots)
    try:
        yield slots
    finally:
        if previous is None:
            os.environ.pop(VISIBLE, None)
        else:
            os.environ[VISIBLE] = previous
        _release(held)


def gpu_slot(
    n_gpus: int | None, lock_dir: str | os.PathLike | None = None
) -> contextlib.AbstractContextManager[list[int]]:
    """What ``smk.main_from`` wraps every job in: ``with gpu_slot(snakemake.resources.get("gpu", 0)):``."""
    return acquire_gpu(int(n_gpus or 0), lock_dir=lock_dir)
