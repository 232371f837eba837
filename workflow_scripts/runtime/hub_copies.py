"""Hub copies: what a config reads from the Hugging Face hub, fetched once where the network is.

Compute nodes often have no network. So the hub datasets a config names without a ``path`` and a base
model given by hub id are copied by two LOCAL rules (rules/fetch.smk; on SLURM they run on the login node)
into ``results/hub/``, and every other job runs with ``HF_HUB_OFFLINE=1`` (rules/common.smk sets it for
the jobs, ``OFFLINE_ENV`` keeps the value the user started with for the fetch rules) and reads the copies:

| what                                  | copy (under results/hub/)       | read by                       |
|---------------------------------------|---------------------------------|-------------------------------|
| dataset ``name``: a task's, data.train | datasets/{name}.parquet: every | prepare_eval, prepare_train   |
| 's or a curriculum phase's ``source``, | record of every config of the  | (as the entry's ``path``)     |
| no ``path``, no packaged copy          | spec's split, ``_config`` added |                               |
| ``model.source``, a hub id             | models/{org}--{name}/: config,  | base_model (instead of the id)|
|                                       | safetensors, tokenizer files    |                               |

A dataset copy holds the records ``read_hub`` would have read, in its order, so a capped or de-duplicated
set is the same rows either way. Torch-free and hub-free at import: rules/common.smk imports it.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path

from workflow_scripts.runtime import paths
from workflow_scripts.runtime.atomic import atomic_dir, atomic_path

# The HF_HUB_OFFLINE the workflow started with (rules/common.smk), for the fetch rules alone.
OFFLINE_ENV = "RLVR_USER_HF_HUB_OFFLINE"
SYNTHETIC_SOURCES = ("train_val", "synthetic", "train", "tiny")  # never from the hub
# A model's files a load needs (weights as safetensors only: load_model passes use_safetensors=True).
MODEL_FILES = ("*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken", "*.py", "merges.txt")


def hub_dir(results: str | os.PathLike = paths.RESULTS) -> Path:
    return Path(results) / "hub"


def dataset_copy(name: str, results: str | os.PathLike = paths.RESULTS) -> Path:
    return hub_dir(results) / "datasets" / f"{name}.parquet"


def model_copy(source: str, results: str | os.PathLike = paths.RESULTS) -> Path:
    return hub_dir(results) / "models" / source.replace("/", "--")


def _entries(data: Mapping, phases: Iterable[Mapping] = ()) -> list[Mapping]:
    return [*data["tasks"].values(), data.get("train") or {}, *phases]


def hub_datasets(data: Mapping, phases: Iterable[Mapping] = ()) -> list[str]:
    """The real datasets of ``data`` (its tasks, data.train) and the curriculum ``phases`` that are read
    from the hub: no ``path`` and no copy shipped by an installed package (tasks.real_datasets)."""
    from workflow_scripts.tasks.real_datasets import DATASETS, bundled_copy

    names: dict[str, None] = {}
    for entry in _entries(data, phases):
        source = entry.get("source")
        if source in SYNTHETIC_SOURCES or source is None or entry.get("path"):
            continue
        if source not in DATASETS:
            raise ValueError(f"data: source {source!r} is not a known dataset; known: {sorted(DATASETS)}")
        if bundled_copy(DATASETS[source]) is None:
            names[source] = None
    return list(names)


def hub_model(model: Mapping) -> str | None:
    """``model.source`` when it is a hub id (not ``tiny``, not a local folder), else None."""
    source = str(model["source"])
    if source == "tiny" or Path(source).expanduser().exists():
        return None
    return source


def copies_by_source(files: Iterable[str | os.PathLike]) -> dict[str, str]:
    """{dataset name: its copy} of a job's fetched files (``dataset_copy`` paths)."""
    return {Path(f).stem: str(f) for f in files}


def local_path(entry: Mapping, copies: Mapping[str, str] | None) -> str | None:
    """Where a real dataset entry (a task, data.train, a phase) is read from: its ``path``, else the
    hub copy of its ``source`` (None: the hub itself, which needs the network)."""
    return entry.get("path") or (copies or {}).get(entry["source"])


def offline_jobs() -> None:
    """Every job of this workflow offline (HF_HUB_OFFLINE=1), the value the user started with kept in
    ``OFFLINE_ENV`` for the fetch jobs (``go_online_as_started``). rules/common.smk calls it at parse time,
    so a SLURM job, which re-reads the Snakefile, is offline too."""
    os.environ.setdefault(OFFLINE_ENV, os.environ.get("HF_HUB_OFFLINE", ""))
    os.environ["HF_HUB_OFFLINE"] = "1"


def go_online_as_started() -> None:
    """For a fetch job: HF_HUB_OFFLINE back to the value the workflow started with (unset: online).
    Must run before huggingface_hub or datasets is imported (both read it once, at import)."""
    os.environ["HF_HUB_OFFLINE"] = os.environ.get(OFFLINE_ENV) or "0"


def fetch_dataset(name: str, out: str | os.PathLike, repo: str | os.PathLike | None = None) -> int:
    """Copy dataset ``name``'s records (every config of its spec, its split) into the parquet ``out``;
    returns the record count. ``repo``: where to load from instead of the spec's hub id (a local folder
    laid out like the hub repository, as the tests use)."""
    import datasets

    from workflow_scripts.tasks.real_datasets import DATASETS

    spec = DATASETS[name]
    parts = []
    for config in spec.configs:
        try:
            ds = datasets.load_dataset(str(repo or spec.hub_id), config, split=spec.split)
        except Exception as err:  # offline, gated, renamed: which dataset, and the way around it
            raise RuntimeError(
                f"fetch {name}: could not load {repo or spec.hub_id} ({config or 'default'}, {spec.split}): "
                f"{err}. Run the fetch where the hub is reachable, or give the task a local `path`."
            ) from err
        parts.append(ds.add_column("_config", [config] * len(ds)) if config is not None else ds)
    table = datasets.concatenate_datasets(parts) if len(parts) > 1 else parts[0]
    if not len(table):
        raise RuntimeError(f"fetch {name}: {repo or spec.hub_id} ({spec.split}) has no records")
    with atomic_path(out, suffix=".parquet") as tmp:
        table.to_parquet(str(tmp))
    return len(table)


def fetch_model(source: str, out: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> list[str]:
    """Copy the hub model ``source`` (config, safetensors weights, tokenizer files) into the folder
    ``out``, whole or not at all; returns its files. The snapshot goes through the hub cache (``cache_dir``,
    default HF's), so a cache filled earlier (``huggingface-cli download``) serves it offline too; files
    are hard-linked from the cache where the file system allows, else copied."""
    from huggingface_hub import snapshot_download

    try:
        snapshot = Path(snapshot_download(source, allow_patterns=list(MODEL_FILES), cache_dir=cache_dir))
    except Exception as err:
        raise RuntimeError(
            f"fetch model {source}: {type(err).__name__}: {err}. Run the fetch where the hub is reachable, "
            "or set model.source to a local folder."
        ) from err
    files = sorted(str(f.relative_to(snapshot)) for f in snapshot.rglob("*") if f.is_file())
    missing = [want for want, ok in (("config.json", "config.json" in files),
                                     ("*.safetensors", any(f.endswith(".safetensors") for f in files)))
               if not ok]  # fmt: skip
    if missing:
        raise RuntimeError(f"fetch model {source}: snapshot {snapshot} lacks {missing} (files: {files[:20]})")
    with atomic_dir(out) as tmp:
        for name in files:
            real, target = (snapshot / name).resolve(), tmp / name  # cache snapshots are symlinks to blobs
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(real, target)
            except OSError:
                shutil.copy2(real, target)
    return files
