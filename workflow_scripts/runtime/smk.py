"""The one calling convention between a rule and its stage module: dispatch, rule logging, NAME=VALUE.

A rule's ``script:`` names the stage module itself (``script: "../workflow_scripts/train.py"``), so a
reader opening a rule finds the code in one step. Snakemake runs that file as ``__main__`` with its
preamble (which defines ``snakemake``) prepended; hence stage modules carry no
``from __future__ import annotations`` (it would no longer be the file's first statement). Every stage
module ends with the same footer::

    if __name__ == "__main__":
        main_from(globals())

``main_from`` calls the *imported* package module (not the ``__main__`` copy Snakemake executed, so
classes and module state exist once): ``from_snakemake(snakemake)`` inside the rule's log and GPU
slot when Snakemake runs the file, else ``main(sys.argv[1:])`` (``python -m workflow_scripts.<stage>``).
Both paths end in the module's typed ``run(...)``. Around them, ``startup`` keeps the garbage collector
from taxing the job's imports and exit.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

PACKAGE = "workflow_scripts"


@contextlib.contextmanager
def rule_logging(log_path: str | None) -> Iterator[None]:
    """Send logging, stdout and stderr (warnings, tracebacks, progress bars) to the rule's log."""
    if not log_path:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
        yield
        return
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a", buffering=1, encoding="utf-8") as fh:
        old_out, old_err = sys.stdout, sys.stderr
        sys.stdout = sys.stderr = fh
        logging.basicConfig(
            level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=fh, force=True
        )
        try:
            yield
        except BaseException:
            logging.getLogger("rule").exception("job failed")
            raise
        finally:
            sys.stdout, sys.stderr = old_out, old_err


def stage_module_name(namespace: Mapping[str, Any]) -> str:
    """The package name of the stage module whose source runs in ``namespace``."""
    spec = namespace.get("__spec__")
    if spec is not None and spec.name.startswith(PACKAGE + "."):
        return spec.name  # python -m workflow_scripts.<stage>
    # Snakemake resets __file__ to the real path of the script (the copy it runs is a temp file).
    return f"{PACKAGE}.{Path(namespace['__file__']).stem}"


def main_from(namespace: Mapping[str, Any], argv: Sequence[str] | None = None) -> None:
    """The footer of every stage module: run it as a Snakemake job or as a command line."""
    from workflow_scripts.runtime import startup

    module = importlib.import_module(stage_module_name(namespace))
    startup.imports_done()
    smk = namespace.get("snakemake")
    try:
        if smk is None:
            sys.exit(module.main(list(sys.argv[1:] if argv is None else argv)))
        from workflow_scripts.runtime import threads
        from workflow_scripts.runtime.gpu_slots import gpu_slot

        log = smk.log[0] if len(smk.log) else None
        with rule_logging(log), gpu_slot(smk.resources.get("gpu", 0)):
            threads.limit_threads(smk.threads)
            started_s = threads.process_age_s()
            try:
                module.from_snakemake(smk)
            finally:
                if not threads.STARTUP_LOGGED:  # a stage without models: its start-up is its imports
                    threads.log_startup(started_s)
                threads.log_usage()  # its own CPU and memory (benchmark: measures a forked job's client)
    finally:
        startup.before_exit()


def parse_pairs(items: Sequence[str] | None, what: str = "NAME=VALUE") -> dict[str, str]:
    """``["a=x", "b=y"]`` -> ``{"a": "x", "b": "y"}`` (the CLI form of a mapping; one copy for all CLIs)."""
    pairs: dict[str, str] = {}
    for item in items or ():
        name, sep, value = item.partition("=")
        if not sep or not name or not value:
            raise ValueError(f"expected {what}, got {item!r}")
        if name in pairs:
            raise ValueError(f"{name!r} given twice")
        pairs[name] = value
    return pairs
