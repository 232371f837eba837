"""Atomic writes: a result is either absent or complete, never truncated.

Every stage writes through these helpers (temp file in the same directory, fsync, rename), so a
killed job can never leave a half-written file that Snakemake or a later stage mistakes for output.
(The directory is not fsynced: a rename lost in a power cut leaves the old state, never a torn file.)
Reading them back, with the path in every error: ``rows``.

``ResultStore``: finished results kept OUTSIDE a job's declared outputs (Snakemake deletes those before
a retry), under a key of what decides them (``inputs_key``), and copied into place atomically; the
evaluate job's per-task resume (``evaluate.run_tasks``), as train's checkpoints are its resume.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

_UMASK = os.umask(0)
os.umask(_UMASK)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, suffix: str = "") -> Iterator[Path]:
    """Yield a temp path next to ``path``; rename it onto ``path`` only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix or ".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    os.chmod(tmp_path, 0o666 & ~_UMASK)  # mkstemp makes 0600; results should be readable like any file
    try:
        yield tmp_path
        _fsync(tmp_path)
        os.replace(tmp_path, path)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)


def write_json(path: str | os.PathLike, obj: Any) -> None:
    write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=_json_default) + "\n")


def write_jsonl(path: str | os.PathLike, rows: Iterable[dict]) -> int:
    n = 0
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, sort_keys=True, default=_json_default) + "\n")
            n += 1
    return n


def write_parquet(path: str | os.PathLike, frame) -> None:
    """Write a pandas DataFrame to parquet atomically."""
    with atomic_path(path, suffix=".parquet") as tmp:
        frame.to_parquet(tmp, index=False)


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temp directory that replaces ``path`` as a whole when the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    os.chmod(tmp, 0o777 & ~_UMASK)
    try:
        yield tmp
        if path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


HASHED_BYTES = 64 * 2**20  # files up to this size are keyed by content, larger ones by (size, mtime)


def file_signature(path: str | os.PathLike) -> list:
    """What a key sees of a file or a folder's files: name and sha256 of the content up to HASHED_BYTES,
    beyond it (model weights) name, size and mtime (a retry of the same inputs leaves them untouched; a
    rewritten file changes them)."""
    path = Path(path)
    if path.is_dir():
        files = [f for f in sorted(path.rglob("*")) if f.is_file()]
        return [[*file_signature(f), str(f.relative_to(path))] for f in files]
    if not path.is_file():
        return [path.name, None]
    stat = path.stat()
    if stat.st_size > HASHED_BYTES:
        return [path.name, stat.st_size, stat.st_mtime_ns]
    return [path.name, hashlib.sha256(path.read_bytes()).hexdigest()]


def inputs_key(settings: Any, files: Iterable[str | os.PathLike | None]) -> str:
    """A hash of ``settings`` (JSON-able), the signatures of ``files`` (None: no file) and the versions of
    the numeric stack (torch, transformers, vllm: an upgrade changes the numbers)."""
    from importlib.metadata import PackageNotFoundError, version

    versions = {}
    for name in ("torch", "transformers", "vllm"):
        with contextlib.suppress(PackageNotFoundError):
            versions[name] = version(name)
    signatures = [None if f is None else file_signature(f) for f in files]
    blob = json.dumps([settings, signatures, versions], sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:24]


class ResultStore:
    """Finished results by (name, key) under ``root``: ``save`` copies a result's files into
    ``root/<name>-<key>/`` as a whole (``atomic_dir``: the folder exists only complete, replacing any
    older key's folder of that name), ``restore`` copies them onto the job's outputs one by one
    (``atomic_path``) and says whether it could; ``clear`` removes a job's entries once it is done (only
    its own: the per-task jobs of one run share a root)."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)

    def _entry(self, name: str, key: str) -> Path:
        return self.root / f"{name}-{key}"

    def save(self, name: str, key: str, files: dict[str, str | os.PathLike]) -> None:
        for stale in self.root.glob(f"{name}-*"):
            if stale.is_dir() and stale.name != f"{name}-{key}":
                shutil.rmtree(stale, ignore_errors=True)
        with atomic_dir(self._entry(name, key)) as tmp:
            for label, source in files.items():
                shutil.copyfile(source, tmp / label)
                _fsync(tmp / label)

    def restore(self, name: str, key: str, files: dict[str, str | os.PathLike]) -> bool:
        entry = self._entry(name, key)
        if not all((entry / label).is_file() for label in files):
            return False
        for label, target in files.items():
            with atomic_path(target, suffix=Path(target).suffix) as tmp:
                shutil.copyfile(entry / label, tmp)
        return True

    def clear(self, names: Iterable[str]) -> None:
        for name in names:
            for entry in self.root.glob(f"{name}-*"):
                shutil.rmtree(entry, ignore_errors=True)


def _fsync(path: Path) -> None:
    """Flush a file's data to disk before it is renamed into place; best effort."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "item"):  # numpy / torch scalars
        return obj.item()
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")
