"""The ``code`` kind's verdict: assembles the candidate and the test programs and decides.

Why two processes: a test appended to the candidate's own program runs in the candidate's
interpreter, so the candidate can read the harness (its file, its frames via ``gc``), patch the
builtins the test uses, write a fake pass marker to any fd or exit 0 before the test runs. Here the
candidate (stub + completion) runs in one sandbox and serves its entry point; the dataset's test
(with the stub's trusted helpers, e.g. HumanEval's ``poly``) runs in another sandbox, under another
uid, and calls the entry point through a proxy. Only plain data crosses: JSON lines over two pipes,
decoded on the test side into builtin values (None, bool, int, float, complex, str, bytes, list,
tuple, dict, set, frozenset) — no pickle, no objects with the candidate's ``__eq__``. The verdict is
the test process's own exit status and a random token it prints to its own stdout, which the
candidate cannot reach. The test process never executes candidate code. Each request carries a
fresh random nonce the reply must echo, so replies written ahead of time (to every fd) do not count.
In the test process the entry point's name is also bound to the proxy, for tests that call it by name.

Not plain data: an argument the test passes that is not plain data (a lambda, an instance) cannot be
sent, so the case is scored ``error`` (a dataset the verifier cannot check; not the candidate's
fault). A candidate that returns something that is not plain data (a generator, its own class) is
scored wrong, as is one that raises (its exception is re-raised in the test as the builtin exception
of the same name, else ``RuntimeError``, so tests that expect e.g. ``ValueError`` still work). Known
limitation: a test that checks the candidate mutated its argument in place sees no mutation.
"""

from __future__ import annotations

import re
import uuid

from workflow_scripts.verify import sandbox

STATUSES = ("ok", "timeout", "error")
MAX_MESSAGE = 8 * 1024 * 1024  # bytes of one JSON line either way
_STUB_FAILED = 3  # exit codes of the test program that mean "cannot check", not "wrong"
_UNSUPPORTED = 4

# Plain-data codec, shared (as source) by both programs: JSON scalars as themselves, everything else
# as a one-key object {tag: payload}. Decoding builds builtin values only.
_CODEC = r"""
import json as _rlvr_json


def _rlvr_enc(v, depth=0):
    if depth > 200:
        raise TypeError("nested too deeply")
    t = type(v)
    if v is None or t is bool or t is str:
        return v
    if t is int:
        return v if -(2**53) < v < 2**53 else {"i": hex(v)}
    if t is float:
        return v if v - v == 0 else {"x": repr(v)}
    if t is complex:
        return {"c": [_rlvr_enc(v.real), _rlvr_enc(v.imag)]}
    if t is bytes:
        return {"b": v.hex()}
    if t is dict:
        return {"d": [[_rlvr_enc(k, depth + 1), _rlvr_enc(x, depth + 1)] for k, x in v.items()]}
    tag = {list: "l", tuple: "t", set: "s", frozenset: "f"}.get(t)
    if tag is None:
        raise TypeError("not plain data: %s" % t.__name__)
    return {tag: [_rlvr_enc(x, depth + 1) for x in v]}


def _rlvr_dec(o, depth=0):
    if depth > 200:
        raise ValueError("nested too deeply")
    t = type(o)
    if o is None or t in (bool, str, int, float):
        return o
    if t is not dict or len(o) != 1:
        raise ValueError("malformed message")
    (tag, x), = o.items()
    if tag == "i" and type(x) is str:
        return int(x, 16)
    if tag == "x" and x in ("inf", "-inf", "nan"):
        return float(x)
    if tag == "b" and type(x) is str:
        return bytes.fromhex(x)
    if type(x) is not list:
        raise ValueError("malformed message")
    if tag == "c" and len(x) == 2:
        return complex(_rlvr_dec(x[0], depth + 1), _rlvr_dec(x[1], depth + 1))
    if tag == "d":
        return {_rlvr_dec(k, depth + 1): _rlvr_dec(v, depth + 1) for k, v in x}
    items = [_rlvr_dec(y, depth + 1) for y in x]
    kind = {"l": list, "t": tuple, "s": set, "f": frozenset}.get(tag)
    if kind is None:
        raise ValueError("malformed message")
    return kind(items)
"""

# Appended to the candidate's program: serve the entry point on fds 3 (requests) and 4 (replies).
# The candidate may tamper with all of this; whatever it sends is only ever data to the test.
_SERVE = r"""
def _rlvr_serve(fn):
    import os as _os
    requests, replies = _os.fdopen(3, "rb"), _os.fdopen(4, "wb")
    for line in requests:
        req = None
        try:
            req = _rlvr_json.loads(line)
            result = fn(*_rlvr_dec(req["a"]), **_rlvr_dec(req["k"]))
            try:
                msg = {"r": _rlvr_enc(result)}
            except (TypeError, RecursionError) as exc:
                msg = {"e": ["TypeError", "candidate returned %%s" %% exc]}
        except Exception as exc:
            msg = {"e": [type(exc).__name__, str(exc)[:2000]]}
        msg["n"] = req.get("n") if isinstance(req, dict) else None
        replies.write(_rlvr_json.dumps(msg).encode() + b"\n")
        replies.flush()


_rlvr_serve(globals()[%(entry)r])
"""

# The test program: the proxy, then the dataset's stub (trusted helpers) and test, then check().
_TEST = r"""
import builtins as _rlvr_builtins, os as _rlvr_os, sys as _rlvr_sys
_rlvr_req = _rlvr_os.fdopen(3, "wb")
_rlvr_rep = _rlvr_os.fdopen(4, "rb")


def _rlvr_call(*args, **kwargs):
    nonce = _rlvr_os.urandom(8).hex()  # a reply written before this request cannot carry it
    try:
        line = _rlvr_json.dumps({"n": nonce, "a": _rlvr_enc(list(args)), "k": _rlvr_enc(kwargs)}).encode()
    except (TypeError, ValueError, RecursionError) as exc:
        _rlvr_sys.stderr.write("rlvr: the test passes an argument that is not plain data: %%s\n" %% exc)
        _rlvr_sys.stderr.flush()
        _rlvr_os._exit(%(unsupported)d)
    try:
        _rlvr_req.write(line + b"\n")
        _rlvr_req.flush()
    except OSError:
        raise RuntimeError("the candidate process is gone") from None
    reply = _rlvr_rep.readline(%(limit)d + 1)
    if not reply.endswith(b"\n"):
        raise RuntimeError("the candidate process sent no (or an oversized) reply")
    msg = _rlvr_json.loads(reply)
    if type(msg) is not dict or len(msg) != 2 or msg.get("n") != nonce:
        raise RuntimeError("malformed or out-of-turn reply")
    if "r" in msg:
        return _rlvr_dec(msg["r"])
    name, text = msg["e"]
    cls = getattr(_rlvr_builtins, str(name), None)
    if not (isinstance(cls, type) and issubclass(cls, Exception)):
        cls = RuntimeError
    raise cls(str(text))


_rlvr_call.__name__ = %(entry)r
try:
    try:
        _rlvr_stub = compile(%(stub)r, "<stub>", "exec")
    except SyntaxError:  # a bare signature: give it a body
        _rlvr_stub = compile(%(stub)r.rstrip() + "\n    pass\n", "<stub>", "exec")
    exec(_rlvr_stub, globals())
except BaseException as exc:
    _rlvr_sys.stderr.write("rlvr: the stub does not run on its own: %%r\n" %% exc)
    _rlvr_sys.stderr.flush()
    _rlvr_os._exit(%(stub_failed)d)
globals()[%(entry)r] = _rlvr_call  # a test (or a stub helper) that calls the entry point by name
exec(compile(%(test)r, "<test>", "exec"), globals())
check(_rlvr_call)
_rlvr_sys.stdout.flush()
_rlvr_os.write(1, b"\n%(token)s\n")
"""


def assemble_candidate(code: str, stub: str, entry_point: str) -> str:
    """The candidate's program: stub + completion (a full definition replaces the stub's) + server."""
    if re.search(rf"^def\s+{re.escape(entry_point)}\s*\(", code, re.MULTILINE):
        program = stub.rstrip("\n") + "\n\n" + code
    else:
        program = stub + code
    return program + "\n\n" + _CODEC + _SERVE % {"entry": entry_point}


def assemble_test(stub: str, test: str, entry_point: str, token: str) -> str:
    """The test's program; it never contains candidate code."""
    return _CODEC + _TEST % {
        "entry": entry_point,
        "stub": stub,
        "test": test,
        "token": token,
        "limit": MAX_MESSAGE,
        "unsupported": _UNSUPPORTED,
        "stub_failed": _STUB_FAILED,
    }


def code_verdict(
    code: str,
    stub: str,
    test: str,
    entry_point: str,
    timeout: float,
    *,
    memory_mb: int = 512,
    disk_mb: int = sandbox.DISK_MB,
    info: dict | None = None,
) -> tuple[bool, str]:
    """(correct, status): does ``code`` (continuing ``stub``) pass ``test``'s ``check(entry_point)``?

    status is ``ok`` (checked), ``timeout`` (the test did not finish within ``timeout`` s) or
    ``error`` (the sandbox or the dataset's stub/test could not run; scored wrong). ``info``, if
    given, receives the test program's ``SandboxResult`` under "test" (for debugging and tests).
    """
    token = uuid.uuid4().hex
    test_program = assemble_test(stub, test, entry_point, token)
    cand_program = assemble_candidate(code, stub, entry_point)
    run = sandbox.spawn_sandboxed(
        test_program,
        timeout,
        memory_mb,
        disk_mb=disk_mb,
        peers=(cand_program,),
        pipes=((0, 1), (1, 0)),  # test -> candidate (requests), candidate -> test (replies)
    )
    res = run.wait()
    if info is not None:
        info["test"] = res
    if res.timed_out:
        return False, "timeout"
    if res.status == "error" or res.returncode in (_STUB_FAILED, _UNSUPPORTED):
        return False, "error"
    passed = res.returncode == 0 and f"\n{token}\n" in res.stdout
    return passed, "ok"
