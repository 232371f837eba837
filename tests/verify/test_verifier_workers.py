"""Verifier worker processes: a check that hangs, raises or kills its worker is a verdict, not a crash.

The hanging / failing handlers are tests/verifier_hooks.py, run by a pool of their own, so the
package's workers carry no test hooks.
"""

from __future__ import annotations

import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest

from workflow_scripts.verify import verifiers as V
from workflow_scripts.verify.workers import WorkerPool

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def hooks():
    pool = WorkerPool("tests.verify.verifier_hooks:handle", memory_mb=1024)
    yield pool
    pool.close()


def test_a_hanging_check_times_out_and_its_worker_is_replaced(hooks):
    t0 = time.monotonic()
    assert hooks.run({"op": "sleep", "seconds": 60}, timeout=0.5)["status"] == "timeout"
    assert time.monotonic() - t0 < 10
    assert hooks.run({"op": "echo"}, timeout=10)["status"] == "ok"


def test_hanging_checks_in_parallel_do_not_stall_the_others(hooks):
    requests = [
        {"op": "sleep", "seconds": 60},
        {"op": "echo"},
        {"op": "sleep", "seconds": 60},
        {"op": "echo"},
    ]
    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=3) as pool:
        replies = list(pool.map(lambda r: hooks.run(r, timeout=0.5), requests))
    assert time.monotonic() - t0 < 15
    assert [r["status"] for r in replies] == ["timeout", "ok", "timeout", "ok"]


def test_a_check_that_raises_is_an_error_and_the_worker_lives_on(hooks):
    pid = hooks.run({"op": "echo"}, timeout=10)["extracted"]
    reply = hooks.run({"op": "raise"}, timeout=10)
    assert reply["status"] == "error" and "requested failure" in reply["error"]
    assert hooks.run({"op": "echo"}, timeout=10)["extracted"] == pid


def test_a_worker_that_dies_mid_check_is_an_error(hooks):
    assert hooks.run({"op": "exit"}, timeout=10)["status"] == "error"  # died, retried, died again
    assert hooks.run({"op": "echo"}, timeout=10)["status"] == "ok"


def test_pathological_latex_times_out_and_the_batch_continues():
    before = V.status_counts[("math", "timeout")]
    t0 = time.monotonic()
    completions = ["\\boxed{9^{9^{9^{9}}}}", "\\boxed{7}", "\\boxed{8}"]
    verdicts = V.verify_batch("math", completions, ["7", "7", "7"], timeout=1.0)
    assert time.monotonic() - t0 < 20
    assert [v.status for v in verdicts] == ["timeout", "ok", "ok"]
    assert [v.correct for v in verdicts] == [False, True, False]
    assert V.status_counts[("math", "timeout")] == before + 1


def test_workers_survive_between_batches():
    """Workers started from a batch's thread pool stay usable after that pool's threads exit."""
    V.verify_batch("math", ["\\boxed{1}", "\\boxed{2}"], ["1", "2"], timeout=20, workers=2)
    pids = set(V.MATH_POOL.idle_pids())
    assert pids
    time.sleep(0.2)
    verdicts = V.verify_batch("math", ["\\boxed{1}", "\\boxed{3}"], ["1", "2"], timeout=20, workers=2)
    assert [(v.correct, v.status) for v in verdicts] == [(True, "ok"), (False, "ok")]
    assert pids & set(V.MATH_POOL.idle_pids())  # reused, not restarted


def test_a_hung_worker_dies_with_its_parent(tmp_path):
    """A worker stuck in a check must not outlive a killed training/eval process (PR_SET_PDEATHSIG)."""
    script = tmp_path / "parent.py"
    script.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "from workflow_scripts.verify.workers import WorkerPool\n"
        "pool = WorkerPool('tests.verify.verifier_hooks:handle', memory_mb=1024)\n"
        "w = pool.acquire()\n"
        "print(w.proc.pid, flush=True)\n"
        "w.call({'op': 'sleep', 'seconds': 600}, timeout=600)\n"
    )
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        worker = psutil.Process(int(parent.stdout.readline()))
        assert worker.is_running()
        parent.kill()
        parent.wait(timeout=10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if worker.status() == psutil.STATUS_ZOMBIE:
                    break
            except psutil.NoSuchProcess:
                break
            time.sleep(0.1)
        else:
            pytest.fail("the worker outlived its parent")
    finally:
        parent.kill()
        parent.stdout.close()


def test_the_package_has_no_test_hooks():
    for name in ("verifiers", "workers", "math_rule", "string_rules", "reward"):
        source = (ROOT / "workflow_scripts" / "verify" / f"{name}.py").read_text()
        assert '"sleep"' not in source and "os._exit" not in source, name
    assert not hasattr(V, "shutdown_workers")
