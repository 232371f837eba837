"""The shipped base model (config ``model.shipped``): its recipe, manifest and checks; no torch here.

A warm start trained on a CPU ends in other weights on another CPU kind (a Xeon built a base with word
pass@1 0.384 where an EPYC's had 0.288, issue 60), and every conclusion of a run is conditional on its
base. So the default starts from a base built once and shipped in data/base: save_pretrained's files
(safetensors, tokenizer, config) and manifest.json with each file's sha256, the recipe (the model and
data keys it was built from) and its hash, and the build's record (device, torch, warm-start steps).
The base_model stage checks both (``check_shipped``) and loads it; ``make base`` rebuilds and re-ships
it (``ship``). The rules import this module to list the shipped files as inputs, so it stays light.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from workflow_scripts.runtime.atomic import atomic_path, write_text
from workflow_scripts.runtime.config import section_hash

MANIFEST = "manifest.json"
SYNTHETIC_SOURCES = ("synthetic", "train_val")
# What a shipped folder holds (save_pretrained's files); anything else in it is not the model.
SHIPPED_SUFFIXES = (".safetensors", ".json", ".jinja")
REPO_ROOT = Path(__file__).resolve().parents[2]


def recipe(model: dict, data: dict) -> dict:
    """The config keys a built base depends on: the model section but ``shipped``, and the data section
    but the synthetic off-task tasks (the warm-start pool and the on-task probe come from the rest)."""
    on_task = next(n for n, t in data["tasks"].items() if t["role"] == "on_task")
    tasks = {
        n: t for n, t in data["tasks"].items() if n == on_task or t.get("source") not in SYNTHETIC_SOURCES
    }
    return {"model": {k: v for k, v in model.items() if k != "shipped"}, "data": {**data, "tasks": tasks}}


def recipe_hash(recipe_: dict) -> str:
    return section_hash(recipe_)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def shipped_dir(shipped: str | Path, root: str | Path = REPO_ROOT) -> Path:
    """``model.shipped`` as a folder: relative paths are the workflow's (the repo root), not the cwd's."""
    path = Path(shipped).expanduser()
    return path if path.is_absolute() else Path(root) / path


def shipped_inputs(shipped: str | Path, root: str | Path = REPO_ROOT) -> list[str]:
    """The base_model job's inputs for a shipped base: its manifest and model files, relative to the
    working directory where they lie below it, so a finished run folder that is moved or copied keeps its
    records (Snakemake compares the set of input paths; an absolute path would rerun everything)."""
    folder = shipped_dir(shipped, root)
    files = [folder / MANIFEST] + [folder / name for name in shipped_files(folder)]
    cwd = Path.cwd().resolve()
    out = []
    for file in files:
        try:
            out.append(str(file.resolve().relative_to(cwd)))
        except ValueError:  # outside the working directory: as given
            out.append(str(file))
    return out


def shipped_files(folder: Path) -> list[str]:
    """The model files of a shipped folder (its manifest's ``files``), sorted."""
    manifest = read_manifest(folder)
    return sorted(manifest["files"])


def read_manifest(folder: Path) -> dict:
    path = folder / MANIFEST
    if not path.is_file():
        raise ValueError(f"model.shipped: {path} not found (a shipped base needs its manifest; `make base`)")
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not JSON ({err})") from err
    for key in ("files", "recipe", "recipe_hash"):
        if key not in manifest:
            raise ValueError(f"{path}: field {key!r} missing")
    return manifest


def check_shipped(folder: Path, expected_recipe: dict) -> dict:
    """The manifest of ``folder`` after checking that every listed file has its sha256 and that the base
    was built from ``expected_recipe`` (this config's); a ValueError naming the file or field otherwise."""
    manifest = read_manifest(folder)
    for name, digest in manifest["files"].items():
        path = folder / name
        if not path.is_file():
            raise ValueError(f"{folder / MANIFEST}: files.{name}: {path} is missing")
        if (got := sha256_file(path)) != digest:
            raise ValueError(
                f"{folder / MANIFEST}: files.{name}: sha256 {got} of {path}, manifest says {digest}"
            )
    if recipe_hash(manifest["recipe"]) != manifest["recipe_hash"]:
        raise ValueError(f"{folder / MANIFEST}: recipe_hash does not match its recipe (an edited manifest)")
    differ, new = recipe_diff(manifest["recipe"], expected_recipe)
    if differ:
        raise ValueError(
            f"{folder / MANIFEST}: recipe: the shipped base was built from another recipe than this config's "
            f"(differs in {', '.join(differ)}); rebuild it with `make base`, or set model.shipped: null to "
            "build the base here"
        )
    manifest["unchecked_keys"] = new
    return manifest


def recipe_diff(shipped: dict, config: dict, prefix: str = "") -> tuple[list[str], list[str]]:
    """(dotted keys the shipped recipe holds whose value differs in ``config`` or that ``config`` lacks,
    dotted keys only ``config`` has). Keys added to the schema after the base was built are reported,
    not refused: their defaults are what the base was built without (a test checks the shipped
    default's recipe is complete, tests/test_shipped_base.py)."""
    differ: list[str] = []
    new = [f"{prefix}{k}" for k in config if k not in shipped]
    for key, value in shipped.items():
        if isinstance(value, dict) and isinstance(config.get(key), dict):
            d, n = recipe_diff(value, config[key], f"{prefix}{key}.")
            differ += d
            new += n
        elif key not in config or config[key] != value:
            differ.append(f"{prefix}{key}")
    return differ, new


def ship(out_dir: Path, record: Path, dest: Path, recipe_: dict) -> dict:
    """Copy the built base in ``out_dir`` to ``dest`` with manifest.json: every file's sha256, the recipe
    and its hash, and where and how it was built (from base.json ``record``)."""
    built = json.loads(Path(record).read_text())
    files = sorted(
        p.name for p in Path(out_dir).iterdir() if p.is_file() and p.name.endswith(SHIPPED_SUFFIXES)
    )
    dest.mkdir(parents=True, exist_ok=True)
    for stale in dest.iterdir():
        if stale.is_file() and stale.name not in files and stale.name != MANIFEST:
            stale.unlink()
    for name in files:
        with atomic_path(dest / name) as tmp:
            shutil.copyfile(Path(out_dir) / name, tmp)
    manifest = {
        "files": {name: sha256_file(dest / name) for name in files},
        "recipe_hash": recipe_hash(recipe_),
        "recipe": recipe_,
        "built": {
            k: built.get(k) for k in ("device", "parameters", "on_task", "sft", "versions", "numerics")
        },
    }
    write_text(dest / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest
