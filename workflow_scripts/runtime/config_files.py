"""Which files make a config: an experiment file's ``extends`` chain and ``replace`` keys, merged into one
unvalidated config (``runtime.config`` validates it), and the errors that name the file and key.

Experiment files (``extends``, ``replace``; ``config_layers``): a config may start with
``extends: config.yaml`` (a path relative to that config's own folder) and then hold only what differs
from the file it extends. The loader reads the extended file (which may extend another; a cycle or a
missing file is a ConfigError naming the file and ``extends``), then merges the experiment over it:
mappings merge key by key, recursively; a list or a scalar replaces the value it meets. So a mapping
such as ``precisions`` ADDS the experiment's arms to the extended file's arms; to swap a mapping for
the experiment's own, list its dotted key under ``replace`` (``replace: [precisions]``): the extended
value is dropped and the experiment's value stands alone. ``replace`` names only keys the same file
sets, and needs ``extends``. Neither key reaches the validated config (the schema has neither); a
problem is blamed on the last file of the chain that sets the key.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml


class ConfigError(ValueError):
    """A config problem; the message names the config file and the offending key."""


def read_yaml(path: str | os.PathLike) -> Any:
    """The parsed file; a syntax error becomes ``<file>:<line>:<col>: not valid YAML: <problem>``."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as err:
        raise ConfigError(f"{path}: config file not found") from err
    try:
        return yaml.safe_load(text)
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        raise ConfigError(f"{where}: not valid YAML: {err.problem or err.context}") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from None


EXTENDS, REPLACE = "extends", "replace"  # loader directives of an experiment file, not config keys
Layer = tuple[str, Any, list[str]]  # (file name, its content without the directives, its replace keys)


def config_layers(path: str | os.PathLike, name: Callable[[str], str] | None = None) -> list[Layer]:
    """The files that make up the config ``path``: the ``extends`` chain, the most basic file first.

    ``name`` writes a file's path for messages and blame (default: relative to the working dir). Each
    file's ``extends`` is relative to that file's folder. A missing extended file, a cycle, a bad
    ``extends`` or ``replace`` value is a ConfigError naming the file that says it and the key."""
    name = name or _as_given
    chain: list[Layer] = []
    seen: list[Path] = []
    here = Path(path)
    while True:
        shown = name(str(here))
        raw = read_yaml(here)
        if not isinstance(raw, dict):
            if not chain:  # the file given: validation reports its shape, as for any config
                return [(shown, raw, [])]
            raise ConfigError(f"{shown}: the config must be a mapping, got {type(raw).__name__}")
        raw = dict(raw)
        base, replace = raw.pop(EXTENDS, None), raw.pop(REPLACE, None)
        chain.append((shown, raw, _replace_keys(shown, raw, replace, base is not None)))
        seen.append(here.resolve())
        if base is None:
            return chain[::-1]
        if not isinstance(base, str) or not base.strip():
            raise ConfigError(f"{shown}: {EXTENDS}: must be the path of a config file, got {base!r}")
        target = here.parent / base
        if target.resolve() in seen:
            loop = " -> ".join([*(layer[0] for layer in chain), name(str(target))])
            raise ConfigError(f"{shown}: {EXTENDS}: {base} makes a cycle ({loop})")
        if not target.is_file():
            raise ConfigError(f"{shown}: {EXTENDS}: {base}: config file not found ({name(str(target))})")
        here = target


def _replace_keys(shown: str, raw: Mapping, replace: Any, extends: bool) -> list[str]:
    """The dotted keys of ``replace: [...]``, checked: a list of keys this file sets, with ``extends``."""
    if replace is None:
        return []
    if not extends:
        raise ConfigError(f"{shown}: {REPLACE}: only applies to a file with `{EXTENDS}:`")
    if not isinstance(replace, list) or not all(isinstance(k, str) for k in replace):
        raise ConfigError(f"{shown}: {REPLACE}: must be a list of dotted keys, got {replace!r}")
    for key in replace:
        if not _node(raw, key.split("."))[0]:
            raise ConfigError(f"{shown}: {REPLACE}: {key}: not set in this file (replace names keys it sets)")
    return list(replace)


def resolve_config(
    path: str | os.PathLike, name: Callable[[str], str] | None = None
) -> tuple[Any, list[tuple[str, Any]]]:
    """(the unvalidated config of ``path`` with its ``extends`` chain merged, the chain's (name, content)
    layers for blame). Each file merges over the one it extends (``merge``), after the extended values
    of its ``replace`` keys are dropped."""
    chain = config_layers(path, name)
    if len(chain) == 1:
        return copy.deepcopy(chain[0][1]), [(chain[0][0], chain[0][1])]
    config: dict = {}
    for _, layer, replace in chain:
        for key in replace:
            *parents, leaf = key.split(".")
            found, parent = _node(config, parents)
            if found and isinstance(parent, dict):
                parent.pop(leaf, None)
        merge(config, layer)
    return config, [(shown, layer) for shown, layer, _ in chain]


def merge(base: dict, update: Mapping) -> dict:
    """Snakemake's merge rule (nested mappings merge, everything else replaces), in place."""
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(base.get(key), dict):
            merge(base[key], value)
        else:
            base[key] = copy.deepcopy(value)
    return base


def _node(tree: Any, path: Sequence[Any]) -> tuple[bool, Any]:
    """(whether ``path`` exists in ``tree`` (mappings and lists), the value there)."""
    for part in path:
        in_mapping = isinstance(tree, Mapping) and part in tree
        if in_mapping or (isinstance(tree, list) and isinstance(part, int) and part < len(tree)):
            tree = tree[part]
        else:
            return False, None
    return True, tree


# The Snakemake ``snakemake_sources`` was written against: pyproject.toml's pin (a test keeps them equal).
SNAKEMAKE_PIN = "snakemake==9.27.1"


def snakemake_sources(workflow: Any) -> tuple[list[Any], dict]:
    """(the ``--configfile`` files in the order given, the ``--config`` pairs alone) of the running
    Snakemake invocation, for ``config.workflow_config`` (rules/common.smk).

    Snakemake has no public API for either: the Snakefile's ``config`` is already the merge of both, the
    files as written (``extends`` unread). They are read from ``workflow.config_settings``, the
    ``snakemake.settings.types.ConfigSettings`` that the command line (and the Python API) builds:
    ``configfiles`` (absolute Paths; Snakemake's own ``workflow.overwrite_configfiles`` returns the same
    list) and ``config`` (the pairs, before any file). The Workflow attribute is Snakemake's internal, so
    a Snakemake other than the pinned one may move it: that is a ConfigError here, naming the pin, and
    tests/runtime/test_snakemake_sources.py fails on an upgrade that moves it or changes its shape."""
    settings = getattr(workflow, "config_settings", None)
    files = getattr(settings, "configfiles", None)
    pairs = getattr(settings, "config", None)
    if isinstance(files, str | bytes) or not isinstance(files, Sequence) or not isinstance(pairs, Mapping):
        raise ConfigError(
            "cannot read the --configfile list and --config pairs from this Snakemake: rules/common.smk reads"
            f" workflow.config_settings.configfiles and .config, Snakemake internals of {SNAKEMAKE_PIN} (the"
            f" version pyproject.toml pins; got {type(settings).__name__} with configfiles"
            f" {type(files).__name__}, config {type(pairs).__name__}); install the pinned version"
        )
    return list(files), dict(pairs)


def _as_given(path: str | os.PathLike) -> str:
    """Snakemake makes --configfile paths absolute; show them relative to the working dir if inside it."""
    rel = os.path.relpath(path)
    return str(path) if rel.startswith("..") else rel
