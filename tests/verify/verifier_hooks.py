"""Worker handlers for tests/verify/test_verifier_workers.py: checks that hang, raise or kill their worker.

They live here, not in the package, so production workers have no test hooks.
"""

from __future__ import annotations

import os
import time


def handle(request: dict) -> dict:
    op = request["op"]
    if op == "sleep":
        time.sleep(float(request["seconds"]))
        return {"correct": True, "extracted": None, "status": "ok"}
    if op == "raise":
        raise RuntimeError("requested failure")
    if op == "exit":
        os._exit(3)
    if op == "echo":
        return {"correct": True, "extracted": str(os.getpid()), "status": "ok"}
    raise ValueError(f"unknown op {op!r}")
