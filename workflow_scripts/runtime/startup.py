"""The fixed cost of a job process: Python's cyclic garbage collector during imports and at exit.

A job imports torch + transformers (hundreds of thousands of long-lived objects) before a few seconds of
work. While they import, the cyclic collector runs again and again over everything allocated so far, and
at interpreter exit it walks and tears all of it down once more. Measured on this 2-core machine for
``import workflow_scripts.evaluate`` (bench/bench_imports.py --gc):

| collector during imports / at exit         | import  | exit      |
|--------------------------------------------|---------|-----------|
| Python's default                           | 4.5-5.2 s | 1.1-1.3 s |
| off during imports, objects frozen at exit | 3.7-3.9 s | 0.2 s     |

So a stage module imports this module first (before torch): when the process is a job (a Snakemake
``script:`` run, whose preamble defines ``snakemake`` in ``__main__``, or ``python -m
workflow_scripts.<stage>``) the collector is switched off. ``smk.main_from`` calls ``imports_done()``
before the job's work (what was imported moves to the permanent generation, ``gc.freeze``, and the
collector runs again as usual, so a long training job collects its own cycles) and ``before_exit()``
after it. Imported by a test or by Snakemake's own process, this module changes nothing.

Its import is also where a stage's Snakemake job hands itself to the fork server
(``forkserver.delegate``): if a server that imported the same code is listening, the job runs in a
forked child of it and this process only waits for its exit status, so it never imports torch.
"""

from __future__ import annotations

import gc
import sys
from pathlib import Path

PACKAGE = "workflow_scripts."


def is_job_process() -> bool:
    """True when ``__main__`` is a stage run by Snakemake's ``script:`` or as ``python -m``."""
    main = sys.modules.get("__main__")
    if main is None:
        return False
    if "snakemake" in vars(main):
        return True
    spec = getattr(main, "__spec__", None)
    return spec is not None and spec.name.startswith(PACKAGE)


_PAUSED = is_job_process() and gc.isenabled()
if _PAUSED:
    gc.disable()


def imports_done() -> None:
    """Freeze what the imports built and turn the collector back on (no-op unless paused here)."""
    global _PAUSED
    if _PAUSED:
        gc.freeze()
        gc.enable()
        _PAUSED = False


def before_exit() -> None:
    """Freeze every object left so the interpreter's exit does not walk them all (jobs only)."""
    if is_job_process():
        gc.freeze()


def _delegate_if_a_job() -> None:
    """A Snakemake ``script:`` job of a stage runs in the fork server's warm child if one is up
    (``forkserver``); this process then exits with the child's status and never imports torch."""
    main = sys.modules.get("__main__")
    if main is None or "snakemake" not in vars(main) or "__file__" not in vars(main):
        return
    from workflow_scripts.runtime import forkserver

    forkserver.delegate(Path(vars(main)["__file__"]).stem)


_delegate_if_a_job()
