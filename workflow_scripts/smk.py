"""The bridge from a Snakemake ``script:`` job to a stage function: logging into the rule's log."""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator
from pathlib import Path


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
