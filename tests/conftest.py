"""Shared test fixtures: an isolated copy of the workflow driven by snakemake as a subprocess."""

from __future__ import annotations

import contextlib
import os

# numpy's OpenBLAS gets one thread in the test process (set before numpy loads). The statistics' matrices
# are a few tasks wide, where OpenBLAS's threads cost more than they give: tests/test_stats.py and
# tests/statistics took 118 s with its default (2 threads here), 73 s with one. Stage jobs size their own
# pools (workflow_scripts/runtime/threads.py), as a stats job does in a run.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # Two test workers share the machine, so no job may spin-wait on a core the other worker needs
    # (runtime/threads.py: a job whose threads cover every CPU keeps OpenMP's spinning wait).
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import snakemake_server
import yaml

REPO = Path(__file__).resolve().parents[1]


def bench_module(name: str):
    """A script of bench/ (not a package) imported as a module, for the tests of its functions."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, REPO / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TEST_CONFIG = REPO / "tests" / "config.test.yaml"
WORKFLOW_FILES = ("Snakefile", "rules", "workflow_scripts", "envs", "report", "profiles", "data")
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# One fork server (workflow_scripts/runtime/forkserver.py) for the whole session's workflow runs instead of
# one per run: the runs' workflow folders link the repository's package (make_workflow_dir(shared_code=True)),
# so their jobs compute one server key; sockets live in a private folder that the session made (the
# controller, before xdist starts its workers, who inherit it) and removes at its end, which stops every
# server in it; a server idles for up to 20 minutes instead of one. A run then neither waits for a server's
# imports nor runs its first jobs as fresh processes beside them (~9 CPU-s each on a 2-core AVX2 EPYC).
_SESSION_FORK_SERVERS: str | None = None
if not os.environ.get("PYTEST_XDIST_WORKER") and not os.environ.get("RLVR_FORK_SERVER_DIR"):
    import tempfile

    _SESSION_FORK_SERVERS = tempfile.mkdtemp(prefix="rlvr-test-forkservers-")  # 0700, this user's
    os.environ["RLVR_FORK_SERVER_DIR"] = _SESSION_FORK_SERVERS
os.environ.setdefault("RLVR_FORK_SERVER_IDLE_S", "1200")


def pytest_unconfigure(config) -> None:
    """The session's fork servers exit once their socket is gone (Server.serve checks every second)."""
    if _SESSION_FORK_SERVERS:
        shutil.rmtree(_SESSION_FORK_SERVERS, ignore_errors=True)


def load_test_config() -> dict:
    with open(TEST_CONFIG, encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def link_package(wf: Path) -> Path:
    """``wf``'s workflow_scripts/ as a link to the repository's package (a copy there is removed), so its
    jobs share the session's fork server. Only for runs that never edit the package."""
    target = wf / "workflow_scripts"
    if not target.is_symlink():
        shutil.rmtree(target, ignore_errors=True)
        target.symlink_to(REPO / "workflow_scripts", target_is_directory=True)
    return wf


def make_workflow_dir(dest: Path, config: dict, shared_code: bool = False) -> Path:
    """A self-contained workflow directory (its own results/) with ``config`` as config.yaml.

    ``shared_code``: workflow_scripts/ is a link to the repository's package instead of a copy, so the
    runs of a session share one fork server (its key names the package's resolved folder). Only for
    runs that never edit the package: an edit through the link would change the repository."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in WORKFLOW_FILES:
        src, target = REPO / name, dest / name
        if shared_code and name == "workflow_scripts":
            link_package(dest)
            continue
        if target.is_symlink():
            target.unlink()  # a linked package becomes this folder's own copy, never a copy into the link
        if src.is_dir():
            shutil.copytree(src, target, dirs_exist_ok=True)
        elif src.exists():
            shutil.copy2(src, target)
    with open(dest / "config.yaml", "w", encoding="utf-8") as fh:
        yaml.safe_dump(config, fh, sort_keys=False)
    return dest


def log_workflow_run(args, via: str = "snakemake") -> None:
    """A line for bench/suite_times.py (test id, how snakemake was started, its arguments) in the file that
    RLVR_WORKFLOW_LOG names; nothing without it. Every snakemake invocation of a test calls this."""
    log = os.environ.get("RLVR_WORKFLOW_LOG")
    if log:
        test = os.environ.get("PYTEST_CURRENT_TEST", "?").rsplit(" (", 1)[0]
        with open(log, "a", encoding="utf-8") as fh:  # one short append per line: two workers may share it
            fh.write(f"{test}\t{via}\t{' '.join(map(str, args))}\n")


def run_snakemake(workdir: Path, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}
    cmd = [
        SNAKEMAKE,
        "--cores",
        "2",
        "--directory",
        str(workdir),
        "--snakefile",
        str(workdir / "Snakefile"),
        *args,
    ]
    log_workflow_run(cmd[1:])
    return snakemake_server.run(cmd, cwd=workdir, env=env, timeout=timeout)  # a dry run: forked, warm


@pytest.fixture
def test_config() -> dict:
    return load_test_config()


@pytest.fixture
def workflow_dir(tmp_path, test_config) -> Path:
    return make_workflow_dir(tmp_path / "wf", test_config)


def job_stats(log: str) -> dict[str, int]:
    """Rule -> job count, from the "Job stats:" table Snakemake prints when it plans or starts a run."""
    lines = log.splitlines()
    jobs: dict[str, int] = {}
    for line in lines[lines.index("Job stats:") + 3 :]:
        parts = line.split()
        if len(parts) != 2 or parts[0] == "total":
            break
        jobs[parts[0]] = int(parts[1])
    return jobs


def planned_jobs(workdir: Path, *targets: str) -> dict[str, int]:
    """Rule -> job count that a dry run would execute ({} when there is nothing to do)."""
    proc = run_snakemake(workdir, "--dry-run", *targets, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    if "Job stats:" not in proc.stdout.splitlines():
        assert "Nothing to be done" in proc.stdout + proc.stderr, proc.stdout
        return {}
    return job_stats(proc.stdout)


def rule_stages(workdir: Path) -> dict[str, str]:
    """Rule -> the stage module its `script:` names (rules/*.smk)."""
    stages = {}
    for smk in sorted((workdir / "rules").glob("*.smk")):
        for block in re.split(r"^rule ", smk.read_text(), flags=re.M)[1:]:
            name = block.split(":", 1)[0].strip()
            script = re.search(r'script:\s*\n\s*"\.\./workflow_scripts/(\w+)\.py"', block)
            if script:
                stages[name] = script.group(1)
    return stages


def placeholder_outputs(wf: Path) -> None:
    """An empty file (or folder, for directory() outputs) for every output the workflow would write."""
    proc = run_snakemake(wf, "--summary", timeout=120)
    assert proc.returncode == 0, proc.stderr
    for line in proc.stdout.splitlines()[1:]:
        path = wf / line.split("\t")[0]
        if "." in path.name:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch()
        else:
            path.mkdir(parents=True, exist_ok=True)  # model folders


def mark_done(wf: Path) -> None:
    """Record every output as up to date (params, code versions) without running a job."""
    proc = run_snakemake(wf, "--touch", "--forceall", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# ---------------------------------------------------------------------------- workflow runs shared by modules


@contextlib.contextmanager
def once_per_session(tmp_path_factory, name: str) -> Iterator[Path]:
    """``shared-<name>`` in pytest-xdist's workers' common temporary folder, under a file lock for the
    block: the first caller (any worker) builds it there, later callers wait and find it built."""
    import fcntl

    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    with open(root / f"shared-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        yield root / f"shared-{name}"


def shared_workflow(
    tmp_path_factory, name: str, config: dict, *targets: str, timeout: int = 900, shared_code: bool = False
) -> Path:
    """A workflow dir on ``config`` that snakemake runs to ``targets`` once per test session, across
    pytest-xdist's workers (``once_per_session``). Callers only read it: a test that edits its config or
    runs more jobs works in a copy (``copy_workflow``). ``targets`` empty: every output of the DAG as an
    empty placeholder (``placeholder_outputs``), no job run."""
    import json

    key = json.dumps([config, targets], sort_keys=True)
    with once_per_session(tmp_path_factory, name) as folder:
        if not (folder / "key.json").exists():
            wf = make_workflow_dir(folder / "wf", config, shared_code=shared_code)
            if targets:
                proc = run_snakemake(wf, *targets, timeout=timeout)
                outcome = "" if proc.returncode == 0 else proc.stdout[-3000:] + proc.stderr[-3000:]
            else:
                placeholder_outputs(wf)
                outcome = ""
            (folder / "failed.txt").write_text(outcome)
            (folder / "key.json").write_text(key)
    assert (folder / "key.json").read_text() == key, f"shared workflow {name!r} asked for with another config"
    failed = (folder / "failed.txt").read_text()
    assert not failed, f"shared workflow {name!r} failed:\n{failed}"
    return folder / "wf"


def copy_workflow(src: Path, dest: Path) -> Path:
    """A private copy of a workflow dir: outputs, their times and Snakemake's records (nothing reruns)."""
    shutil.copytree(src, dest, symlinks=True)
    return dest


def base_evaluated(tmp_path_factory) -> Path:
    """The test config's data, base model and the base model's evaluation on every task, run once per
    session (``shared_workflow``): tests/workflow/test_workflow_foundation.py, tests/test_evaluate.py, and
    the start of tests/workflow/test_factorial.py's and tests/training/test_distributed.py's runs."""
    config = load_test_config()
    tasks = list(config["data"]["tasks"])
    targets = ["results/models/base.json", *(f"results/data/eval/{task}.jsonl" for task in tasks)]
    targets += [f"results/eval/base/{task}{suffix}" for task in tasks for suffix in (".json", ".kl.json")]
    return shared_workflow(tmp_path_factory, "base-evaluated", config, *targets, shared_code=True)


def placeholder_workflow(tmp_path_factory, dest: Path) -> Path:
    """A copy of the test config's workflow dir with every output a placeholder (``placeholder_outputs``:
    one ``snakemake --summary`` per session, not one per test); nothing recorded as done yet."""
    return copy_workflow(shared_workflow(tmp_path_factory, "placeholders", load_test_config()), dest)


def set_key(config_path: Path, dotted: str, value) -> None:
    """Change one key of a workflow dir's config.yaml in place."""
    cfg = yaml.safe_load(config_path.read_text())
    node = cfg
    *parents, leaf = dotted.split(".")
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = value
    config_path.write_text(yaml.safe_dump(cfg, sort_keys=False))


# ---------------------------------------------------------------------------- train-stage fixtures


def _one_digit_rows(n: int | None = None):
    from workflow_scripts.tasks.rows import make_row

    rows = [
        make_row(f"d{a}{b}", "train", "integer", f"{a}+{b}=", a + b, {"family": "one_digit"})
        for a in range(10)
        for b in range(10)
    ]
    return rows if n is None else rows[:: max(1, len(rows) // n)][:n]


def build_tiny_base(root: Path, tiny: dict | None = None) -> dict:
    """The test config's data and base model under ``root`` (``tiny``: model.tiny keys to change)."""
    from workflow_scripts.base_model import build_base
    from workflow_scripts.prepare_data import prepare
    from workflow_scripts.runtime.config import validate_config
    from workflow_scripts.tasks.rows import write_rows

    config = validate_config(load_test_config(), source=str(TEST_CONFIG))
    config["model"]["tiny"]["sft_steps"] = 150
    config["model"]["tiny"].update(tiny or {})
    data_dir = root / "data"
    prepare(config["data"], data_dir)
    write_rows(data_dir / "sft.jsonl", _one_digit_rows())
    write_rows(data_dir / "train.jsonl", _one_digit_rows(24))
    base_dir = root / "models" / "base"
    build_base(config, data_dir, base_dir, root / "models" / "base.json", threads=1)
    return {"config": config, "data_dir": data_dir, "base_dir": base_dir, "root": root}


@pytest.fixture(scope="session")
def tiny_base(tmp_path_factory) -> dict:
    """A base model and data for training tests, built once per session (a few seconds).

    The test config's data (prepare_data) with the warm start and the training prompts replaced by
    one-digit sums: a 150-step warm start puts sampled accuracy near 20%, so GRPO groups have reward
    spread (real gradients, clipping) within a handful of steps. 24 training prompts: with the test
    config's 4 prompts x 2 micro-batches per generation round an epoch is 6 optimizer steps, so short
    runs cross epoch boundaries (resume must restore the data order there too).
    """
    return build_tiny_base(tmp_path_factory.mktemp("tiny_base"))


def bit_identical(a: dict, b: dict) -> bool:
    """Two state dicts with the same keys, dtypes and bytes (NaNs compare equal, -0.0 != 0.0)."""
    import torch

    return a.keys() == b.keys() and all(
        a[k].dtype == b[k].dtype and torch.equal(a[k].view(torch.uint8), b[k].view(torch.uint8)) for k in a
    )


# ---------------------------------------------------------------------------- the real vLLM engine

VLLM_TINY = {"hidden_size": 128, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "intermediate_size": 256}
"""model.tiny dimensions vLLM's CPU build can run: its CPU attention takes head sizes 32-512, so heads of
32 (the default's 16 fail: "Unsupported CPU attention configuration: head_dim=16"); the rest as tiny."""


# The modules that took longest in the suite table (`make test`'s last step, bench/suite_times.py; a run of
# 2026-12-07 alone on a 2-core AMD EPYC: test_slurm 204 s, test_report 174, test_distributed 129,
# test_stats 126, test_gpu_smoke 81, test_factorial 80), longest first. Update it when the top changes.
LONGEST_MODULES = (
    "tests/workflow/test_slurm.py",
    "tests/test_report.py",
    "tests/training/test_distributed.py",
    "tests/test_stats.py",
    "tests/workflow/test_gpu_smoke.py",
    "tests/workflow/test_factorial.py",
)


def slow_modules_first(items: list) -> None:
    """Order the modules longest first: ``LONGEST_MODULES``, then by how many of their tests are marked
    ``slow`` (stable otherwise).

    `make test` hands pytest-xdist whole modules (``--dist loadfile``, with ``--no-loadscope-reorder`` so
    this order is kept): a module of long workflow runs started last ends the run alone while the other
    worker idles (a fresh-clone run: 881.6 s of tests on 2 workers took 480.5 s, not ~441). Starting the
    long modules first lets the short ones fill the gaps."""

    def module(item) -> str:
        return item.nodeid.split("::")[0]

    slow: dict[str, int] = {}  # module -> its slow tests, in collection order
    for item in items:
        slow[module(item)] = slow.get(module(item), 0) + ("slow" in item.keywords)
    order = {name: i for i, name in enumerate(slow)}
    rank = {name: i for i, name in enumerate(LONGEST_MODULES)}

    def key(item) -> tuple:
        name = module(item)
        return (rank.get(name, len(rank)), -slow[name], order[name])

    items.sort(key=key)


def pytest_collection_modifyitems(config, items):
    """Slow modules first (``slow_modules_first``); tests marked ``vllm`` run against the real engine
    (vLLM's CPU build in .venv-vllm, `make test`). Without vllm installed they are skipped, unless
    RLVR_REQUIRE_VLLM=1 (the Makefile's vLLM run sets it): there a missing engine fails the run instead of
    passing it quietly."""
    import importlib.util

    slow_modules_first(items)
    # the Makefile's vLLM tier collects only the files whose text marks tests vllm (VLLM_TESTS)
    marked = {item.path for item in items if item.get_closest_marker("vllm")}
    hidden = sorted(str(path) for path in marked if "mark.vllm" not in path.read_text())
    if hidden:
        raise pytest.UsageError(f"tests marked vllm in files the Makefile's VLLM_TESTS grep misses: {hidden}")
    if importlib.util.find_spec("vllm") is not None:
        return
    if os.environ.get("RLVR_REQUIRE_VLLM") == "1" and any("vllm" in item.keywords for item in items):
        raise pytest.UsageError("RLVR_REQUIRE_VLLM=1 but vllm cannot be imported in this environment")
    skip = pytest.mark.skip(reason="needs vLLM (its CPU build: make test builds .venv-vllm)")
    for item in items:
        if "vllm" in item.keywords:
            item.add_marker(skip)
