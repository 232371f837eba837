"""Thread control of a job: exactly the rule's ``threads`` in every pool, and idle threads that sleep.

Two CPU-bound jobs on two cores slow each other down badly when each spawns a thread per core or when
their idle threads spin: libgomp's default wait policy busy-waits for a while after every parallel
region, stealing the neighbour's core (base_model measured 128 s alone, 1018 s beside another job).

| pool                        | set by                                      | when it must be set        |
|-----------------------------|---------------------------------------------|----------------------------|
| OpenMP wait (libgomp, iomp) | OMP_WAIT_POLICY=PASSIVE, GOMP_SPINCOUNT=0,  | before torch is imported   |
|                             | KMP_BLOCKTIME=0                             | (libgomp reads env at load)|
| OpenMP / BLAS sizes         | OMP/MKL/OPENBLAS/GOTO/VECLIB/NUMEXPR_NUM_THREADS | before torch is imported |
| torch intra-op              | torch.set_num_threads                       | any time                   |
| torch inter-op              | torch.set_num_interop_threads               | before the first inter-op  |
|                             |                                             | task (else it is kept)     |
| tokenizers (Rayon)          | RAYON_NUM_THREADS, TOKENIZERS_PARALLELISM   | before the first batch     |

Importing this module sets the passive-wait variables (unless already set, or unless the job's threads
cover every CPU of the process: ``SPINS``, the wait then stays OpenMP's spinning default), so a stage
module imports it before torch: its first import line is ``from workflow_scripts.runtime import threads``.
Snakemake already exports the ``*_NUM_THREADS`` sizes for ``script:`` jobs; ``limit_threads(n)`` (called
by ``smk.main_from`` for every job, and by CLIs) sets all of the table again for ``n`` and is idempotent.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time

PASSIVE_ENV = {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "0", "KMP_BLOCKTIME": "0"}
SIZE_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS",
            "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS", "RAYON_NUM_THREADS")  # fmt: skip

log = logging.getLogger("threads")


def _owns_the_machine() -> bool:
    """True when the job's threads (Snakemake exports them as OMP_NUM_THREADS before the process starts)
    cover every CPU this process may use: no neighbour from the same workflow can then share a core, so
    OpenMP's spinning wait costs no one and saves the wake-up after every parallel region (the warm
    start, which runs alone on 2 cores: 191 vs 237 ms a step, measured)."""
    try:
        threads = int(os.environ.get("OMP_NUM_THREADS", ""))
    except ValueError:
        return False
    return threads > 1 and threads >= len(os.sched_getaffinity(0))


# The wait policy of this process, fixed at import (libgomp reads it when torch loads it).
SPINS = _owns_the_machine() and "OMP_WAIT_POLICY" not in os.environ
if not SPINS:
    for _key, _value in PASSIVE_ENV.items():
        os.environ.setdefault(_key, _value)


def limit_threads(n: int | None) -> dict:
    """Use exactly ``n`` threads in this process (see the module table); returns what was set.

    torch's pools are sized only if torch is already imported (every torch stage imports it at module
    level, before its entry runs): a stage without torch (aggregate, stats, figures) must not pay ~2 s to
    import it here. A torch imported later still reads the ``*_NUM_THREADS`` set here for its intra-op
    pool."""
    n = max(1, int(n or 1))
    for key in SIZE_ENV:
        os.environ[key] = str(n)
    os.environ.update(PASSIVE_ENV)  # for child processes (workers run beside this one): always passive
    os.environ["TOKENIZERS_PARALLELISM"] = "true" if n > 1 else "false"
    state: dict = {"threads": n, "torch": False, "omp_wait": "active" if SPINS else "passive"}
    torch = sys.modules.get("torch")
    if torch is None:
        return state
    torch.set_num_threads(n)
    # Raises once set, or once inter-op work ran: the pool then keeps its size (warned below).
    with contextlib.suppress(RuntimeError):
        torch.set_num_interop_threads(n)
    state.update(torch=True, intra_op=torch.get_num_threads(), inter_op=torch.get_num_interop_threads())
    if state["inter_op"] != n:
        log.warning("torch inter-op pool already has %d threads (asked %d)", state["inter_op"], n)
    return state


# The process whose start a job's start-up counts from: this one, or the client of a fork-server child.
PROCESS_ORIGIN_PID: int | None = None


def process_age_s() -> float:
    """Seconds since this job's process started (interpreter start-up, imports, everything so far).

    A job forked by the fork server (``forkserver``) counts from its client's start, the process
    Snakemake started, so its start-up compares with a fresh job's."""
    pid = PROCESS_ORIGIN_PID or os.getpid()
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            start_ticks = int(fh.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime", encoding="ascii") as fh:
            uptime = float(fh.read().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):  # not Linux: psutil knows
        import psutil

        return max(0.0, time.time() - psutil.Process().create_time())


USAGE_TAG = "USAGE"


def log_usage() -> None:
    """One log line ``USAGE {"cpu_s": .., "max_rss_mb": .., "forked": ..}`` at a job's end: this process's
    CPU seconds (user + system, its reaped children included) and peak resident memory.

    Snakemake's ``benchmark:`` measures the process it started; for a job the fork server ran
    (``forkserver``) that is the waiting client, so this line is where such a job's own CPU time and
    memory are recorded. A forked child's counters start at the fork; its peak memory includes the pages
    it shares with the server (torch and every stage it imported), as a fresh job's includes its own
    imports."""
    import json
    import resource

    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime
    peak_kb = max(own.ru_maxrss, kids.ru_maxrss) / (1024 if sys.platform == "darwin" else 1)  # bytes there
    record = {
        "cpu_s": round(cpu, 3),
        "max_rss_mb": round(peak_kb / 1024, 1),
        "forked": PROCESS_ORIGIN_PID is not None,
    }
    log.info("%s %s", USAGE_TAG, json.dumps(record))


STARTUP_TAG = "STARTUP"
STARTUP_LOGGED = False  # a stage that loads models logs its own line; smk.main_from logs the others'


def log_startup(import_s: float, load_s: float = 0.0) -> None:
    """One log line ``STARTUP {"import_s": .., "load_s": .., "forked": ..}`` that bench/bench_default.py
    sums over jobs.

    ``import_s``: ``process_age_s()`` when the stage's ``run`` starts (interpreter, Snakemake's
    preamble, imports); ``load_s``: seconds spent loading models/tokenizers before the work starts;
    ``forked``: the job ran in a child of the fork server (``forkserver``), not as a fresh process."""
    import json

    global STARTUP_LOGGED
    forked = PROCESS_ORIGIN_PID is not None
    record = {"import_s": round(import_s, 3), "load_s": round(load_s, 3), "forked": forked}
    log.info("%s %s", STARTUP_TAG, json.dumps(record))
    STARTUP_LOGGED = True
