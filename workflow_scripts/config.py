"""Load, validate and query the experiment config (config.yaml).

Validation happens once, before Snakemake plans any job: the JSON schema in
``schemas/config.schema.yaml`` (unknown keys, types, enums; defaults filled in) plus the checks a
schema cannot express (local files exist, real-data tasks name a path or can reach a hub).
Every error names the file and the dotted key, e.g. ``config.yaml: data.tasks.gsm8k.kind``.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jsonschema
import yaml

SCHEMA_PATH = Path(__file__).with_name("schemas") / "config.schema.yaml"


class ConfigError(ValueError):
    """A config problem; the message names the config file and the offending key."""


def _with_defaults(validator_class):
    validate_properties = validator_class.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for name, sub in properties.items():
                if isinstance(sub, dict) and "default" in sub and name not in instance:
                    instance[name] = copy.deepcopy(sub["default"])
        yield from validate_properties(validator, properties, instance, schema)

    return jsonschema.validators.extend(validator_class, {"properties": set_defaults})


_Validator = _with_defaults(jsonschema.Draft7Validator)


def load_schema() -> dict:
    with open(SCHEMA_PATH, encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def _key_path(error: jsonschema.ValidationError) -> str:
    parts = [str(p) for p in error.absolute_path]
    if error.validator == "additionalProperties":
        extra = sorted(set(error.instance) - set(error.schema.get("properties", {})))
        return ".".join([*parts, extra[0]]) if extra else ".".join(parts) or "<top>"
    if error.validator == "required":
        missing = error.message.split("'")[1] if "'" in error.message else ""
        return ".".join([*parts, missing])
    if "propertyNames" in error.schema_path:
        return ".".join([*parts, str(error.instance)])
    return ".".join(parts) or "<top>"


def _describe(error: jsonschema.ValidationError) -> str:
    if error.validator == "additionalProperties":
        return "unknown key"
    if error.validator == "required":
        return "required key is missing"
    if "propertyNames" in error.schema_path:
        return f"invalid name ({error.message})"
    return error.message


def validate_config(config: dict, source: str = "config.yaml", check_files: bool = True) -> dict:
    """Validate ``config`` in place (filling defaults) and return it; raise ConfigError otherwise."""
    if not isinstance(config, dict):
        raise ConfigError(f"{source}: the config must be a mapping, got {type(config).__name__}")
    errors = sorted(_Validator(load_schema()).iter_errors(config), key=lambda e: list(e.absolute_path))
    if errors:
        lines = [f"{source}: {_key_path(e)}: {_describe(e)}" for e in errors]
        raise ConfigError("invalid config:\n  " + "\n  ".join(lines))
    _check_semantics(config, source, check_files)
    return config


def _check_semantics(config: dict, source: str, check_files: bool) -> None:
    data = config["data"]
    for name, task in data["tasks"].items():
        key = f"data.tasks.{name}"
        if task["source"] == "synthetic" and "family" not in task:
            raise ConfigError(f"{source}: {key}.family: required when source is 'synthetic'")
        if task["source"] == "train_val" and data["train"]["source"] != "synthetic":
            raise ConfigError(f"{source}: {key}.source: 'train_val' needs a synthetic training set")
        if check_files and task.get("path") and not Path(task["path"]).exists():
            raise ConfigError(f"{source}: {key}.path: local dataset file not found: {task['path']}")
    train_path = data["train"].get("path")
    if check_files and train_path and not Path(train_path).exists():
        raise ConfigError(f"{source}: data.train.path: local dataset file not found: {train_path}")
    roles = {t["role"] for t in data["tasks"].values()}
    if "on_task" not in roles:
        raise ConfigError(f"{source}: data.tasks: at least one task needs role 'on_task'")
    for name, mode in config["precisions"].items():
        if mode.get("autocast") and mode["autocast"] == mode["param_dtype"]:
            raise ConfigError(
                f"{source}: precisions.{name}.autocast: autocast to the master dtype is a no-op; use null"
            )
    model_source = config["model"]["source"]
    missing_local = _looks_local(model_source) and not Path(model_source).is_dir()
    if check_files and model_source != "tiny" and missing_local:
        raise ConfigError(f"{source}: model.source: local model folder not found: {model_source}")
    train = config.get("train", {})
    if train.get("epsilon_high", 0) < train.get("epsilon", 0):
        raise ConfigError(f"{source}: train.epsilon_high: must be >= train.epsilon (clip-higher)")


def _looks_local(source: str) -> bool:
    return source.startswith((".", "/", "~")) or os.path.exists(source)


def load_config(path: str | os.PathLike, check_files: bool = True) -> dict:
    path = Path(path)
    try:
        with open(path, encoding="utf-8") as fh:
            config = yaml.safe_load(fh)
    except FileNotFoundError as err:
        raise ConfigError(f"{path}: config file not found") from err
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from err
    return validate_config(config, source=str(path), check_files=check_files)


def section_hash(*parts: Any) -> str:
    """A short stable hash of config sections, for provenance records."""
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def run_names(config: Mapping) -> list[str]:
    """'base' plus one run name per (precision, seed), as used under results/eval/."""
    return ["base"] + [f"{p}-s{s}" for p in config["precisions"] for s in config["seeds"]]


def parse_run(run: str) -> tuple[str, int] | None:
    """Inverse of run naming: 'bf16-s3' -> ('bf16', 3); 'base' -> None."""
    if run == "base":
        return None
    precision, _, seed = run.rpartition("-s")
    return precision, int(seed)
