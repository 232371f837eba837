"""GPU slots under concurrent jobs, with fake devices (RLVR_GPU_SLOTS): no two jobs share a device."""

from __future__ import annotations

import itertools
import multiprocessing as mp
import os
import signal
import time
from collections import defaultdict

import pytest

from workflow_scripts.runtime.gpu_slots import acquire_gpu, gpu_slot

HOLD_SECONDS = 0.15


@pytest.fixture(autouse=True)
def clean_env(monkeypatch, tmp_path):
    for var in ("SLURM_JOB_ID", "CUDA_VISIBLE_DEVICES", "RLVR_GPU_SLOTS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("RLVR_GPU_LOCK_DIR", str(tmp_path / "locks"))


def _job(n_gpus: int, n_slots: int, start_barrier, out) -> None:
    """One GPU job: take n_gpus slots, record what it held and when, hold them briefly."""
    os.environ["RLVR_GPU_SLOTS"] = str(n_slots)
    start_barrier.wait()
    with gpu_slot(n_gpus) as slots:
        start = time.monotonic()
        visible = os.environ["CUDA_VISIBLE_DEVICES"]
        time.sleep(HOLD_SECONDS)
        end = time.monotonic()
    out.put((os.getpid(), slots, visible, start, end, os.environ.get("CUDA_VISIBLE_DEVICES")))


def _run_jobs(gpus_per_job: list[int], n_slots: int) -> list[tuple]:
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(len(gpus_per_job))
    out = ctx.Queue()
    procs = [ctx.Process(target=_job, args=(n, n_slots, barrier, out)) for n in gpus_per_job]
    for p in procs:
        p.start()
    records = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    return records


def _assert_no_shared_slot(records: list[tuple]) -> None:
    by_slot = defaultdict(list)
    for _pid, slots, _visible, start, end, _after in records:
        for slot in slots:
            by_slot[slot].append((start, end))
    for slot, spans in by_slot.items():
        spans.sort()
        for (_s1, e1), (s2, _e2) in itertools.pairwise(spans):
            assert s2 >= e1, f"slot {slot} held by two jobs at once: {spans}"


def test_eight_jobs_on_four_slots_never_share_a_slot():
    records = _run_jobs([1] * 8, n_slots=4)
    _assert_no_shared_slot(records)
    for _pid, slots, visible, _start, _end, after in records:
        assert len(slots) == 1 and visible == str(slots[0])
        assert after is None  # restored after the block
    # the slots were really used in parallel (4 at a time), not one job after the other
    starts = sorted(r[3] for r in records)
    ends = sorted(r[4] for r in records)
    assert sum(s < ends[0] for s in starts) >= 2
    assert len({r[1][0] for r in records}) >= 2


def test_multi_gpu_jobs_get_disjoint_device_sets():
    records = _run_jobs([2, 1, 2, 1, 1, 2], n_slots=4)
    _assert_no_shared_slot(records)
    for _pid, slots, visible, *_ in records:
        assert visible == ",".join(str(s) for s in slots)
        assert len(set(slots)) == len(slots)


def _hold_forever(n_slots: int, ready) -> None:
    os.environ["RLVR_GPU_SLOTS"] = str(n_slots)
    with gpu_slot(1):
        ready.set()
        time.sleep(600)


def test_a_killed_holder_does_not_leak_its_slot(monkeypatch):
    monkeypatch.setenv("RLVR_GPU_SLOTS", "1")
    ctx = mp.get_context("fork")
    ready = ctx.Event()
    holder = ctx.Process(target=_hold_forever, args=(1, ready))
    holder.start()
    try:
        assert ready.wait(30)
        with pytest.raises(TimeoutError), acquire_gpu(1, timeout=0.3):
            pass
        os.kill(holder.pid, signal.SIGKILL)
        holder.join(10)
        with acquire_gpu(1, timeout=10) as slots:
            assert slots == [0] and os.environ["CUDA_VISIBLE_DEVICES"] == "0"
    finally:
        if holder.is_alive():
            holder.kill()
            holder.join(10)


def test_crash_inside_the_block_releases_the_slot(monkeypatch):
    monkeypatch.setenv("RLVR_GPU_SLOTS", "1")
    with pytest.raises(RuntimeError), gpu_slot(1):
        raise RuntimeError("job failed")
    assert "CUDA_VISIBLE_DEVICES" not in os.environ
    with acquire_gpu(1, timeout=1) as slots:
        assert slots == [0]


def test_cpu_jobs_and_slurm_jobs_are_left_alone(monkeypatch):
    monkeypatch.setenv("RLVR_GPU_SLOTS", "4")
    with gpu_slot(0) as slots:
        assert slots == [] and "CUDA_VISIBLE_DEVICES" not in os.environ
    with gpu_slot(None) as slots:
        assert slots == []
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    with gpu_slot(2) as slots:
        assert slots == [] and os.environ["CUDA_VISIBLE_DEVICES"] == "3"


def _visible_in_other_job(out) -> None:
    os.environ["CUDA_VISIBLE_DEVICES"] = "2,3"  # what the job inherits from the snakemake process
    with gpu_slot(1) as slots:
        out.put((slots, os.environ["CUDA_VISIBLE_DEVICES"]))


def test_slots_map_onto_an_existing_cuda_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    with gpu_slot(1) as first:
        assert first == [0] and os.environ["CUDA_VISIBLE_DEVICES"] == "2"
        other = ctx.Process(target=_visible_in_other_job, args=(out,))
        other.start()
        assert out.get(timeout=30) == ([1], "3")
        other.join(10)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "2,3"


def test_no_device_runs_on_cpu_and_too_many_is_an_error(monkeypatch):
    monkeypatch.setenv("RLVR_GPU_SLOTS", "0")
    with pytest.warns(UserWarning, match="no CUDA device"), gpu_slot(1) as slots:
        assert slots == []
    monkeypatch.setenv("RLVR_GPU_SLOTS", "2")
    with pytest.raises(ValueError, match="asks for 3 GPU slots"), gpu_slot(3):
        pass
