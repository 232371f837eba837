"""The code verdict: only a passing test suite is correct, whatever the candidate does.

The adversarial table is the acceptance of issue 16 (items 1 and 2): every hostile completion is
scored wrong, nothing of it is left running, nothing is written outside the sandbox, /tmp keeps its
mode. Rows marked ``limit`` hit a sandbox resource bound (disk, processes, memory, open files, wall
time); each needs the bound to be scored wrong (it is correct without it).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import time
import uuid
from pathlib import Path

import psutil
import pytest

from workflow_scripts.verify import code_verdict as cv
from workflow_scripts.verify.sandbox import capabilities

REPO = Path(__file__).resolve().parents[2]
MODE = capabilities()["mode"]
STUB = 'def add(a, b):\n    """Return a + b."""\n'
TEST = "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(-1, 1) == 0\n"
TAG = uuid.uuid4().hex[:12]  # names every file a hostile program tries to leave behind
ESCAPES = [Path(d) / f"rlvr_escape_{TAG}" for d in ("/tmp", "/var/tmp", "/dev/shm")] + [
    REPO / f"rlvr_escape_{TAG}"
]

# What a forger would look for: any 32-hex string (the old harness's pass token), anywhere it can read.
_FIND_TOKENS = """
import gc, os, re, sys
HEX = re.compile(r"[0-9a-f]{32}")
found = set()
def scan(text):
    found.update(HEX.findall(text if isinstance(text, str) else text.decode("latin-1")))
"""
_FORGE = """
for tok in sorted(found) or ["0" * 32]:
    for fd in range(256):
        try:
            os.write(fd, ("\\n" + tok + "\\n").encode())
        except OSError:
            pass
os._exit(0)
"""

ADVERSARIAL = [
    # (id, completion, expected status, limit it hits or "")
    (
        "read-the-harness",  # every file it can see: its dir, /tmp, /proc (cmdline/environ of all pids)
        "    return a - b\n"
        + _FIND_TOKENS
        + """
scan(" ".join(sys.argv)); scan(repr(dict(os.environ)))
for top in (os.getcwd(), "/tmp", "/var/tmp", "/dev/shm"):
    for root, dirs, files in os.walk(top):
        for f in files:
            try: scan(open(os.path.join(root, f), "rb").read(10**6))
            except OSError: pass
for pid in os.listdir("/proc"):
    for part in ("cmdline", "environ"):
        try: scan(open("/proc/%s/%s" % (pid, part), "rb").read())
        except OSError: pass
"""
        + _FORGE,
        "ok",
        "",
    ),
    (
        "gc-and-frames",  # its interpreter's memory: every object, every frame
        "    return a - b\n"
        + _FIND_TOKENS
        + """
for o in gc.get_objects():
    if isinstance(o, (str, bytes)): scan(o)
    elif isinstance(o, dict):
        for v in list(o.values()):
            if isinstance(v, str): scan(v)
f = sys._getframe()
while f is not None:
    for v in list(f.f_globals.values()) + list(f.f_locals.values()):
        if isinstance(v, str): scan(v)
    scan(repr(f.f_code.co_consts))
    f = f.f_back
"""
        + _FORGE,
        "ok",
        "",
    ),
    (
        "write-every-fd",  # fake replies and tokens on every fd, then a wrong answer
        "    import os\n"
        "    for fd in range(256):\n"
        "        for msg in (b'{\"r\": 3}\\n', b'{\"r\": 0}\\n', b'PASSED\\n' * 100):\n"
        "            try:\n"
        "                os.write(fd, msg)\n"
        "            except OSError:\n"
        "                pass\n"
        "    return a - b\n",
        "ok",
        "",
    ),
    (
        "read-the-dataset",  # look the answer up in the data (here: right only if the data is visible)
        "    import os\n"
        f"    seen = os.path.exists({str(REPO / 'data' / 'fixtures' / 'humaneval.jsonl')!r})\n"
        "    return a + b if seen else a - b\n",
        "ok",
        "hidden files",
    ),
    ("os-exit-0", "    return a - b\nimport os\nos._exit(0)\n", "ok", ""),
    (
        "sys-exit-0-in-finally",
        "    import sys\n    try:\n        return a - b\n    finally:\n        sys.exit(0)\n",
        "ok",
        "",
    ),
    (
        "monkeypatch-builtins",  # what a test uses: assert (AssertionError), ==, abs, isinstance, print
        "    return a - b\n"
        "import builtins, sys\n"
        "class Never(BaseException):\n    pass\n"
        "builtins.AssertionError = Never\n"
        "builtins.abs = lambda x: 0\n"
        "builtins.isinstance = lambda *a: True\n"
        "builtins.print = lambda *a, **k: None\n"
        "sys.excepthook = lambda *a: None\n",
        "ok",
        "",
    ),
    (
        "equal-to-everything",  # an object whose __eq__ says yes cannot cross the plain-data proxy
        "    class Yes(int):\n        def __eq__(self, other):\n            return True\n"
        "        __hash__ = int.__hash__\n    return Yes(a - b)\n",
        "ok",
        "",
    ),
    (
        "kill-everything",  # SIGKILL to every process it may signal, then a wrong answer
        "    import os, signal\n    try:\n        os.kill(-1, signal.SIGKILL)\n    except OSError:\n"
        "        pass\n    return a - b\n",
        "ok",
        "",
    ),
    (
        "double-forked-daemon",  # outlives its parent, then tries to write outside and fake a pass
        "    return a - b\n"
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        time.sleep(1.5)\n"
        f"        for t in {[str(p) for p in ESCAPES]!r}:\n"
        "            try:\n"
        "                open(t, 'w').write('escaped')\n"
        "            except OSError:\n"
        "                pass\n"
        "        time.sleep(30)\n"
        "    os._exit(0)\n",
        "ok",
        "",
    ),
    (
        "disk-fill-2GiB",  # 2 GiB in 16 MiB files (the per-file cap); right only if all of it fits
        "    chunk = b'x' * (16 * 1024 * 1024)\n"
        "    for i in range(128):\n"
        "        with open('fill%d' % i, 'wb') as fh:\n"
        "            fh.write(chunk)\n"
        "    return a + b\n",
        "ok",
        "disk",
    ),
    (
        "fork-bomb",
        "    return a + b\nimport os\nwhile True:\n"
        "    try:\n        os.fork()\n    except OSError:\n        pass\n",
        "timeout",
        "processes",
    ),
    ("memory-8GiB", "    buf = bytearray(8 * 1024**3)\n    return a + b\n", "ok", "memory"),
    (
        "open-10000-files",
        "    fhs = [open('f%d' % i, 'w') for i in range(10000)]\n    return a + b\n",
        "ok",
        "open files",
    ),
    ("sleep-forever", "    import time\n    time.sleep(3600)\n    return a + b\n", "timeout", "wall time"),
    (
        "flood-the-reply-pipe",  # an oversized reply line
        "    import os\n    os.write(4, b'[' * (9 * 1024 * 1024))\n    return a + b\n",
        "ok",
        "",
    ),
]


def _sandbox_processes(uids) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["uids", "status"]):
        info = p.info
        if info["uids"] and info["uids"].real in uids and info["status"] != psutil.STATUS_ZOMBIE:
            found.append(p)
    return found


@pytest.mark.slow
@pytest.mark.parametrize(("row", "code", "status", "limit"), ADVERSARIAL, ids=[r[0] for r in ADVERSARIAL])
def test_every_adversarial_completion_is_wrong_and_leaves_nothing(row, code, status, limit):
    if limit == "disk" and MODE != "namespaces":
        pytest.skip(f"total disk is bounded (tmpfs) only in the namespaces mode; active: {MODE}")
    if limit == "hidden files" and MODE != "namespaces":
        pytest.skip(f"only the namespaces mode hides the host's files (chroot); active: {MODE}")
    if row == "kill-everything" and MODE == "basic":
        pytest.skip("basic mode: the program runs as this user and could signal the test runner")
    if limit == "processes" and MODE == "basic":
        pytest.skip("basic mode: no uid of its own, so no reliable process cap (root is exempt)")
    disk_before = shutil.disk_usage("/tmp").used
    info: dict = {}
    t0 = time.monotonic()
    verdict = cv.code_verdict(code, STUB, TEST, "add", timeout=3.0, info=info)
    elapsed = time.monotonic() - t0
    assert verdict == (False, status), (verdict, info["test"].stderr[-2000:])
    assert elapsed < 15
    run = info["test"].info
    if row == "double-forked-daemon":
        time.sleep(2.0)  # past the daemon's wake-up: had it survived, it would have written by now
    assert not os.path.exists(run["workdir"])
    if run["uids"]:
        assert not _sandbox_processes(set(run["uids"]))
    assert not [p for p in ESCAPES if p.exists()]
    assert stat.S_IMODE(os.stat("/tmp").st_mode) == 0o1777
    assert shutil.disk_usage("/tmp").used - disk_before < 256 * 1024**2  # the 2 GiB never reached disk


@pytest.mark.parametrize("limit", ["disk", "processes", "memory", "open files"])
def test_each_limited_row_is_right_without_its_limit_hit(limit):
    """The limit rows are wrong only because of the bound: the same answer, scaled down, passes."""
    small = {
        "disk": "    open('f', 'wb').write(b'x' * 1024 * 1024)\n    return a + b\n",
        "processes": "    import os\n    pid = os.fork()\n    if pid == 0:\n        os._exit(0)\n"
        "    os.waitpid(pid, 0)\n    return a + b\n",
        "memory": "    buf = bytearray(64 * 1024**2)\n    return a + b\n",
        "open files": "    fhs = [open('f%d' % i, 'w') for i in range(100)]\n    return a + b\n",
    }[limit]
    assert cv.code_verdict(small, STUB, TEST, "add", timeout=5.0) == (True, "ok")


def test_table_covers_the_acceptance_rows():
    ids = {r[0] for r in ADVERSARIAL}
    assert {"read-the-harness", "gc-and-frames", "write-every-fd", "os-exit-0", "sys-exit-0-in-finally",
            "monkeypatch-builtins", "disk-fill-2GiB", "fork-bomb", "double-forked-daemon"} <= ids  # fmt: skip
    assert {r[3] for r in ADVERSARIAL} >= {"disk", "processes", "memory", "open files", "wall time"}


def test_right_solutions_pass_even_when_noisy():
    assert cv.code_verdict("    return a + b\n", STUB, TEST, "add", 5.0) == (True, "ok")
    full = "```python\ndef add(a, b):\n    return b + a\n```"
    assert cv.code_verdict(full.split("```python\n")[1].split("```")[0], STUB, TEST, "add", 5.0) == (
        True,
        "ok",
    )
    noisy = "    import sys\n    print('x' * 100000)\n    sys.stderr.write('y' * 100000)\n    return a + b\n"
    assert cv.code_verdict(noisy, STUB, TEST, "add", 5.0) == (True, "ok")


def test_a_wrong_solution_is_wrong():
    assert cv.code_verdict("    return a * b\n", STUB, TEST, "add", 5.0) == (False, "ok")
    assert cv.code_verdict("    return a +\n", STUB, TEST, "add", 5.0) == (False, "ok")  # syntax error
    assert cv.code_verdict("    return str(a + b)\n", STUB, TEST, "add", 5.0) == (False, "ok")  # "3" != 3


def test_the_test_may_use_the_stubs_helpers_and_expect_exceptions():
    """HumanEval/32-style: the test calls a helper the stub defines; exceptions keep their builtin type."""
    stub = (
        "import math\n\ndef poly(xs, x):\n    return sum(c * math.pow(x, i) for i, c in enumerate(xs))\n\n"
        'def find_zero(xs):\n    """A zero of poly(xs); raises ValueError for an empty xs."""\n'
    )
    test = (
        "def check(candidate):\n"
        "    import math\n"
        "    x = candidate([-6, 11, -6, 1])\n"
        "    assert math.fabs(poly([-6, 11, -6, 1], x)) < 1e-4\n"
        "    try:\n        candidate([])\n    except ValueError:\n        pass\n"
        "    else:\n        raise AssertionError('no ValueError')\n"
    )
    body = (
        "    if not xs:\n        raise ValueError('empty')\n"
        "    lo, hi = 0.0, 1.5\n"
        "    for _ in range(100):\n"
        "        mid = (lo + hi) / 2\n"
        "        if poly(xs, lo) * poly(xs, mid) <= 0:\n            hi = mid\n"
        "        else:\n            lo = mid\n"
        "    return lo\n"
    )
    assert cv.code_verdict(body, stub, test, "find_zero", 5.0) == (True, "ok")
    wrong = body.replace("raise ValueError('empty')", "raise KeyError('empty')")
    assert cv.code_verdict(wrong, stub, test, "find_zero", 5.0) == (False, "ok")


def test_plain_values_cross_the_proxy_exactly():
    test = (
        "def check(candidate):\n"
        "    x = (1, [2.5, None], {'k': {3, 4}}, frozenset({5}), b'\\x00', 2**100, -0.0, 1j, True)\n"
        "    v = candidate(x)\n"
        "    assert v == x and str(v) == str(x)\n"
        "    assert type(v) is tuple and type(v[1]) is list and type(v[8]) is bool and type(v[5]) is int\n"
        "    import math\n"
        "    assert math.isnan(candidate(float('nan'))) and candidate(float('-inf')) == float('-inf')\n"
    )
    assert cv.code_verdict("    return x\n", "def ident(x):\n", test, "ident", 5.0) == (True, "ok")


def test_codec_builds_only_builtin_values():
    ns: dict = {}
    exec(cv._CODEC, ns)
    enc, dec = ns["_rlvr_enc"], ns["_rlvr_dec"]
    value = {"a": [1, (2, 3)], 4: {5}, (6,): frozenset({7}), "big": -(2**200), "f": float("inf")}
    assert dec(json.loads(json.dumps(enc(value)))) == value
    for bad in ({"z": []}, {"l": 1}, {"x": "__import__('os')"}, {"l": [], "t": []}, [1]):
        with pytest.raises(ValueError):
            dec(bad)
    with pytest.raises(TypeError):
        enc(object())


def test_a_test_argument_that_is_not_plain_data_is_an_error_not_wrong():
    test = "def check(candidate):\n    assert candidate(lambda: 1) == 1\n"
    assert cv.code_verdict("    return f()\n", "def call(f):\n", test, "call", 5.0) == (False, "error")


def test_a_stub_that_does_not_run_is_an_error():
    assert cv.code_verdict("    return 1\n", "def f(:\n", TEST, "f", 5.0) == (False, "error")


def test_the_test_program_never_contains_the_candidate():
    code = "    return 'CANDIDATE-ONLY-MARKER'\n"
    assert "CANDIDATE-ONLY-MARKER" not in cv.assemble_test(STUB, TEST, "add", "t" * 32)
    assert "t" * 32 not in cv.assemble_candidate(code, STUB, "add")


def test_the_forgeries_fool_a_single_process_harness():
    """Control: the same rows forge a pass when the test runs inside the candidate's process."""
    from workflow_scripts.verify.sandbox import run_sandboxed

    for row in ("read-the-harness", "gc-and-frames", "os-exit-0"):
        code = next(c for r, c, _, _ in ADVERSARIAL if r == row)
        token = uuid.uuid4().hex
        program = f"{STUB}{code}\n{TEST}\ncheck(add)\nimport sys\nsys.stderr.write('\\n{token}\\n')\n"
        res = run_sandboxed(program, timeout=5.0)
        forged = res.returncode == 0 and token in res.stderr  # a8ce4c0's verdict
        assert forged == (row != "os-exit-0"), row  # os._exit(0) alone never printed the token


def test_a_test_that_calls_the_entry_point_by_name_reaches_the_candidate():
    """MBPP-style tests name the function instead of taking ``candidate``."""
    test = "def check(candidate):\n    assert add(1, 2) == 3 and candidate(2, 2) == 4\n"
    assert cv.code_verdict("    return a + b\n", STUB, test, "add", 5.0) == (True, "ok")
    assert cv.code_verdict("    return a * b\n", STUB, test, "add", 5.0) == (False, "ok")
