"""The code sandbox: hostile programs are scored wrong and leave nothing behind.

What is enforced depends on the mode the sandbox probes on this machine (``capabilities()``); a test
that needs a containment layer the OS does not provide here is skipped with the reason.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from pathlib import Path

import psutil
import pytest

from workflow_scripts import sandbox
from workflow_scripts.sandbox import capabilities, run_sandboxed

REPO = Path(__file__).resolve().parents[1]
MODE = capabilities()["mode"]
needs_uid_drop = pytest.mark.skipif(
    MODE == "basic", reason="basic mode (not root / no unshare): the sandbox runs as this user"
)
needs_namespaces = pytest.mark.skipif(
    MODE != "namespaces", reason=f"sandbox mode is {MODE!r}, not namespaces"
)


def _processes_with_token(token: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter():
        try:
            if p.status() != psutil.STATUS_ZOMBIE and p.environ().get("RLVR_SANDBOX_TOKEN") == token:
                found.append(p)
        except (psutil.Error, OSError):
            continue
    return found


def assert_nothing_left(res: sandbox.SandboxResult) -> None:
    """No process of the run survives, its directory is gone, and its uid owns no live process."""
    assert not _processes_with_token(res.info["token"])
    assert not os.path.exists(res.info["workdir"])
    if res.info["uid"] is not None:
        live = [
            p
            for p in psutil.process_iter(["uids", "status"])
            if p.info["uids"] and p.info["uids"].real == res.info["uid"] and p.info["status"] != "zombie"
        ]
        assert not live


def test_mode_is_probed():
    caps = capabilities()
    assert caps["mode"] in sandbox.MODES
    if caps["mode"] != "namespaces":  # visible in the test report: containment is weaker here
        pytest.skip(f"the namespaces mode is not available on this machine; active: {caps}")


def test_passing_program():
    res = run_sandboxed("import math\nprint(math.factorial(5))\n", timeout=10)
    assert (res.returncode, res.status, res.timed_out, res.stdout) == (0, "ok", False, "120\n")
    assert_nothing_left(res)


def test_failing_program():
    res = run_sandboxed("def f():\n    return 1\nassert f() == 2\n", timeout=10)
    assert res.returncode == 1 and res.status == "failed" and not res.timed_out
    assert "AssertionError" in res.stderr
    assert_nothing_left(res)


def test_exit_code_and_signal():
    assert run_sandboxed("import sys\nsys.exit(3)\n").returncode == 3
    res = run_sandboxed("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    assert (res.returncode, res.status) == (-9, "killed")


def test_infinite_loop_times_out():
    t0 = time.monotonic()
    res = run_sandboxed("while True:\n    pass\n", timeout=1.0)
    assert res.timed_out and res.status == "timeout"
    assert time.monotonic() - t0 < 6
    assert_nothing_left(res)


def test_sleeping_child_killed_when_main_exits():
    code = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"  # tries to leave the session that the parent kills
        "    time.sleep(60)\n"
        "print('parent done')\n"
    )
    res = run_sandboxed(code, timeout=10)
    assert res.status == "ok" and res.stdout == "parent done\n"
    assert_nothing_left(res)


def test_sleeping_child_killed_in_basic_mode():
    """The fallback mode (no namespaces, no uid change) also reaps a setsid() escaper, by env token."""
    code = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\nprint('done')\n"
    res = sandbox._run(code, sandbox._MODE_TABLE["basic"], 10.0, 512, 32, 64_000)
    assert res.status == "ok" and res.info["mode"] == "basic"
    assert_nothing_left(res)


def test_fork_bomb_is_contained():
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    before = len(psutil.pids())
    t0 = time.monotonic()
    res = run_sandboxed(code, timeout=1.5)
    assert res.status in ("timeout", "failed", "killed")
    assert time.monotonic() - t0 < 10
    assert_nothing_left(res)
    assert len(psutil.pids()) < before + 20  # nothing of the bomb is left on the machine


@needs_uid_drop
def test_process_count_is_capped():
    code = (
        "import os, time\n"
        "n = 0\n"
        "for _ in range(200):\n"
        "    try:\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(30)\n"
        "            os._exit(0)\n"
        "        n += 1\n"
        "    except OSError:\n"
        "        break\n"
        "print(n)\n"
    )
    res = run_sandboxed(code, timeout=5, max_processes=16)
    assert res.status == "ok", res
    assert 0 < int(res.stdout) < 16
    assert_nothing_left(res)


def test_huge_allocation_fails_fast():
    res = run_sandboxed("x = bytearray(8 * 1024**3)\n", timeout=10, memory_mb=256)
    assert res.status == "failed" and "MemoryError" in res.stderr
    res = run_sandboxed("xs = []\nwhile True:\n    xs.append(bytearray(10**7))\n", timeout=10, memory_mb=256)
    assert res.status == "failed" and "MemoryError" in res.stderr
    assert_nothing_left(res)


def test_big_file_write_is_capped():
    res = run_sandboxed("open('big', 'wb').write(b'x' * (64 * 1024 * 1024))\n", timeout=10)
    assert res.status in ("failed", "killed")
    assert_nothing_left(res)


@needs_uid_drop
def test_writes_outside_the_sandbox_leave_nothing():
    tag = uuid.uuid4().hex
    targets = [f"/tmp/xyz_escape_{tag}", f"/var/tmp/xyz_escape_{tag}", str(REPO / f"xyz_escape_{tag}")]
    code = (
        "import os\n"
        f"targets = {targets!r}\n"
        "for t in targets:\n"
        "    try:\n"
        "        with open(t, 'w') as fh:\n"
        "            fh.write('escaped')\n"
        "        print('wrote', t)\n"
        "    except OSError as e:\n"
        "        print('blocked', t, e.errno)\n"
        "open(os.path.expanduser('~/home_file'), 'w').write('x')\n"
        "open('cwd_file', 'w').write('x')\n"
    )
    try:
        res = run_sandboxed(code, timeout=10)
        assert res.status == "ok", res
        assert f"blocked {targets[2]}" in res.stdout  # the repository is not writable
        for target in targets:
            assert not os.path.exists(target), target
        assert_nothing_left(res)
    finally:
        for target in targets:
            if os.path.exists(target):
                os.unlink(target)


def test_network_is_blocked():
    """A program cannot reach a server listening on this machine's loopback."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    port = server.getsockname()[1]
    accepted = []
    stop = threading.Event()

    def accept():
        while not stop.is_set() and not accepted:
            try:
                conn, _ = server.accept()
                accepted.append(conn)
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    code = (
        "import socket\n"
        "try:\n"
        f"    socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
        "    print('CONNECTED')\n"
        "except OSError as e:\n"
        "    print('refused', type(e).__name__)\n"
    )
    try:
        res = run_sandboxed(code, timeout=10)
        assert res.status == "ok", res
        assert "CONNECTED" not in res.stdout and "refused" in res.stdout
        time.sleep(0.3)
        assert not accepted
    finally:
        stop.set()
        thread.join(timeout=10)
        server.close()
        for conn in accepted:
            conn.close()


@needs_namespaces
def test_network_blocked_below_the_socket_module():
    """In the namespaces mode the block is the kernel's: the raw _socket module cannot connect either."""
    code = (
        "import _socket\n"
        "s = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)\n"
        "s.settimeout(2)\n"
        "try:\n"
        "    s.connect(('1.1.1.1', 53))\n"
        "    print('CONNECTED')\n"
        "except OSError as e:\n"
        "    print('errno', e.errno)\n"
    )
    res = run_sandboxed(code, timeout=10)
    assert res.status == "ok" and "CONNECTED" not in res.stdout and "errno" in res.stdout


def test_output_is_truncated():
    res = run_sandboxed("import sys\nsys.stdout.write('x' * 1_000_000)\nsys.stderr.write('e' * 500_000)\n",
                        timeout=10, max_output_bytes=1000)  # fmt: skip
    assert res.status == "ok" and res.truncated
    assert res.stdout == "x" * 1000 and res.stderr == "e" * 1000


def test_endless_output_is_bounded_and_times_out():
    res = run_sandboxed("while True:\n    print('spam' * 1000)\n", timeout=1.0, max_output_bytes=5000)
    assert res.timed_out and res.truncated and len(res.stdout) == 5000
    assert_nothing_left(res)


def test_environment_is_stripped(monkeypatch):
    monkeypatch.setenv("RLVR_TEST_SECRET", "hunter2")
    res = run_sandboxed("import os\nprint(sorted(os.environ))\nprint(os.getcwd() == os.environ['HOME'])\n")
    assert res.status == "ok"
    keys = eval(res.stdout.splitlines()[0])
    assert set(keys) <= {"PATH", "HOME", "TMPDIR", "LANG", "RLVR_SANDBOX_TOKEN", "LC_CTYPE"}
    assert "hunter2" not in res.stdout
    assert res.stdout.splitlines()[1] == "True"


def test_site_packages_are_not_importable():
    res = run_sandboxed("import psutil\n")
    assert res.status == "failed" and "ModuleNotFoundError" in res.stderr


def test_concurrent_runs():
    results = [None] * 4

    def go(i):
        results[i] = run_sandboxed(f"print({i} * 2)\n", timeout=20)

    threads = [threading.Thread(target=go, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [r.stdout for r in results] == ["0\n", "2\n", "4\n", "6\n"]
    assert all(r.status == "ok" for r in results)
