"""Every rule of a valid experiment config, checked once before Snakemake plans a job (torch-free).

What it checks: the JSON schema (``schemas/config.schema.yaml``: unknown keys, types, enums, ranges;
defaults are filled in from it and only from it) plus each rule between keys that a schema cannot
express (``RULES`` below: batch divisibility, arm consistency, overlong buffer, names that collide with
run names, local files). All problems are reported at once, one line each, naming the file the user
gave and the dotted key, e.g. ``other.yaml: train.gradient_accumulation_steps: ...``; a YAML syntax
error names the file, line and column.

Which file: ``snakemake`` alone reads config.yaml; ``snakemake --configfile X`` reads X *instead*
(``workflow_config``): nothing of config.yaml leaks in unless X says so with ``extends``
(``config_files``).
``--config k=v`` overrides apply on top, typed as the schema wants them (``retype_overrides``: Snakemake
reads the values inside a --config list or mapping as strings, so ``seeds=[1,2]`` would otherwise arrive
as ``['1', '2']``).

"""

from __future__ import annotations

import copy
import hashlib
import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from workflow_scripts.runtime import eval_matmul, memory_plan, paths
from workflow_scripts.runtime.config_files import (
    ConfigError,
    _as_given,
    _node,
    merge,
    resolve_config,
)
from workflow_scripts.training import curriculum, heldout_spec

SCHEMA_PATH = Path(__file__).resolve().parents[1] / "schemas" / "config.schema.yaml"
DEFAULT_CONFIG = "config.yaml"
Problem = tuple[str, str]  # (dotted key, what is wrong)


# ------------------------------------------------------------------------------------ loading files


def load_config(path: str | os.PathLike, check_files: bool = True) -> dict:
    """Read (following ``extends``) and validate one config file (the command lines' ``--config``)."""
    config, layers = resolve_config(path, name=str)
    problems = config_problems(config, check_files)
    if problems:
        raise ConfigError(_format(problems, lambda key: _blame(key, layers)))
    return config


OVERRIDE_FORMS = (
    "--config values are YAML, e.g. --config 'seeds=[1,2,3]' 'train={max_steps: 24, learning_rate: 1.0e-5}'"
    " (a nested key takes a mapping: its other keys keep their values)"
)


def _typed(text: str) -> Any:
    """A --config leaf read as the YAML of a config file would read it (numbers, booleans, null)."""
    for parse in (int, float):
        try:
            return parse(text)
        except ValueError:
            pass
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def retype_overrides(config: dict, overrides: Mapping) -> dict:
    """``config`` (in place) with each string leaf that ``--config`` set typed, wherever the schema rejects
    the string. Snakemake parses a top-level --config value as a number where it can but every value
    inside a list or mapping as a string (YAML BaseLoader); a string the schema accepts stays a string."""
    validator = jsonschema.Draft7Validator(load_schema())  # no defaults filled: config stays as given
    for _ in range(1000):  # one pass per nesting level of error contexts at most; bounded
        changed = False
        for error in validator.iter_errors(config):
            for leaf in [error, *error.context]:
                path = list(leaf.absolute_path)
                set_by_user, given = _node(overrides, path)
                if not path or not set_by_user or not isinstance(given, str):
                    continue
                found, value = _node(config, path)
                typed = _typed(given)
                if found and value == given and not isinstance(typed, str):
                    _node(config, path[:-1])[1][path[-1]] = typed
                    changed = True
        if not changed:
            return config
    return config


def workflow_config(
    snakemake_config: Mapping,
    user_files: Sequence[str],
    default: str = DEFAULT_CONFIG,
    overrides: Mapping | None = None,
) -> tuple[dict, str]:
    """The validated config of a Snakemake invocation and the file its errors name.

    ``user_files``: the ``--configfile`` files; the Snakefile declares no ``configfile:``, so config.yaml
    is read here only when none was given. Each file is read through its ``extends`` chain
    (``resolve_config``), the files merge in order, then the ``--config`` pairs apply on top. The config
    is rebuilt here rather than taken from Snakemake, which merges the files as written (``extends``
    unread, ``replace`` keys merged instead of replaced). ``overrides``: the ``--config`` pairs alone
    (typed by ``retype_overrides``; a problem in one of them shows the forms that work); when None,
    ``snakemake_config`` stands for them if no file was given. A key is blamed on the last file (or
    --config) that sets it.
    """
    if overrides is None:
        overrides = {} if user_files else snakemake_config
    layers: list[tuple[str, Mapping]] = []
    config: dict = {}
    for file in user_files or [default]:
        resolved, chain = resolve_config(file)
        if not isinstance(resolved, dict):
            shown = _as_given(file)
            if resolved is not None or not user_files:
                raise ConfigError(f"{shown}: the config must be a mapping, got {type(resolved).__name__}")
            resolved, chain = {}, [(shown, {})]  # an empty --configfile sets nothing
        merge(config, resolved)
        layers += [(shown, layer if isinstance(layer, Mapping) else {}) for shown, layer in chain]
    merge(config, overrides)
    if overrides:
        layers.append(("--config", overrides))
        retype_overrides(config, overrides)
    problems = config_problems(config)
    if problems:
        message = _format(problems, lambda key: _blame(key, layers))
        if overrides and "--config: " in message:
            message += f"\n  ({OVERRIDE_FORMS})"
        raise ConfigError(message)
    return config, _as_given(user_files[-1]) if user_files else default


def _blame(key: str, layers: Sequence[tuple[str, Mapping]]) -> str:
    """The last layer (file or --config) that sets ``key`` or its nearest set parent."""
    best, best_depth = layers[-1][0] if layers else DEFAULT_CONFIG, -1
    for name, layer in layers:
        node: Any = layer
        depth = 0
        for part in key.split("."):
            if isinstance(node, Mapping) and part in node:
                node, depth = node[part], depth + 1
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node, depth = node[int(part)], depth + 1
            else:
                break
        if depth >= best_depth:
            best, best_depth = name, depth
    return best


# ---------------------------------------------------------------------------------------- the schema


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
    """The schema (every Snakemake start reads it): libyaml's safe loader where PyYAML has it, ~10x faster
    than the pure-Python one on this 680-line file, same tree."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with open(SCHEMA_PATH, encoding="utf-8") as fh:
        return yaml.load(fh, Loader=loader)


def schema_defaults(*keys: str) -> Any:
    """The schema default of a dotted key, e.g. ``schema_defaults("sparsity", "etas")`` (CLI defaults)."""
    node = load_schema()
    for key in keys:
        node = node["properties"][key]
    return copy.deepcopy(node["default"])


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


def schema_problems(config: dict) -> list[Problem]:
    """Schema violations (fills defaults into ``config`` as it goes)."""
    errors = sorted(_Validator(load_schema()).iter_errors(config), key=lambda e: list(e.absolute_path))
    return [(_key_path(e), _describe(e)) for e in errors]


# ---------------------------------------------------------------------------- rules between keys


def data_problems(config: Mapping, check_files: bool = True) -> Iterator[Problem]:
    data = config["data"]
    for name, task in data["tasks"].items():
        key = f"data.tasks.{name}"
        if task["source"] == "synthetic" and "family" not in task:
            yield f"{key}.family", "required when source is 'synthetic'"
        if task["source"] == "train_val" and data["train"]["source"] != "synthetic":
            yield f"{key}.source", "'train_val' needs a synthetic training set (data.train.source)"
        if check_files and task["path"] and not Path(task["path"]).exists():
            yield f"{key}.path", f"local dataset file not found: {task['path']}"
    train_path = data["train"]["path"]
    if check_files and train_path and not Path(train_path).exists():
        yield "data.train.path", f"local dataset file not found: {train_path}"
    if "on_task" not in {t["role"] for t in data["tasks"].values()}:
        yield "data.tasks", "at least one task needs role 'on_task'"


def precision_problems(name: str, mode: Mapping) -> Iterator[Problem]:
    """One arm's consistency: autocast lowers float32 masters to a narrower compute dtype, or is null;
    stochastic rounding writes into bfloat16 masters; the LM head is the masters' dtype or float32."""
    autocast, param = mode.get("autocast"), mode["param_dtype"]
    if mode.get("rounding", "nearest") == "stochastic" and param != "bfloat16":
        yield (
            f"precisions.{name}.rounding",
            f"stochastic rounding writes updates into bfloat16 masters (param_dtype is {param})",
        )
    head = mode.get("lm_head_dtype")
    if head not in (None, param, "float32"):
        yield (
            f"precisions.{name}.lm_head_dtype",
            f"the LM head is kept in param_dtype ({param}) or float32 (TRL's cast_lm_head_to_fp32), "
            f"not {head}",
        )
    key = f"precisions.{name}.autocast"
    if autocast is None:
        return
    if autocast == "float32":
        yield key, "autocast only lowers precision; float32 is not an autocast dtype (use null)"
    elif autocast == param:
        yield key, "autocast to the master dtype is a no-op; use null"
    elif param != "float32":
        yield key, f"autocast runs over float32 masters only (param_dtype is {param})"


def train_problems(train: Mapping, world_size: int = 1) -> Iterator[Problem]:
    """The batch arithmetic TRL needs, the overlong buffer and the clip range."""
    ga, spg = train["gradient_accumulation_steps"], train["steps_per_generation"]
    completions = train["prompts_per_step"] * train["num_generations"]
    if completions % (ga * world_size):
        yield (
            "train.gradient_accumulation_steps",
            f"prompts_per_step * num_generations ({completions}) must be divisible by "
            f"gradient_accumulation_steps * world_size ({ga} * {world_size})",
        )
    if spg % ga:
        yield "train.steps_per_generation", f"must be a multiple of gradient_accumulation_steps ({ga})"
    buffer = train["overlong_buffer"]
    if buffer is not None and buffer >= train["max_completion_length"]:
        yield (
            "train.overlong_buffer",
            f"must be smaller than train.max_completion_length ({train['max_completion_length']})",
        )
    if train["epsilon_high"] < train["epsilon"]:
        yield "train.epsilon_high", f"must be >= train.epsilon ({train['epsilon']}) (clip-higher)"
    sampling = train.get("importance_sampling") or {}
    low, high = sampling.get("clip_min"), sampling.get("clip_max")
    if sampling.get("correction") and low is None and high is None:
        yield "train.importance_sampling.clip_max", "the correction needs a bound (clip_min or clip_max)"
    if low is not None and high is not None and low >= high:
        yield "train.importance_sampling.clip_min", f"must be below clip_max ({high})"


def distributed_problems(config: Mapping) -> Iterator[Problem]:
    """``train.distributed`` against the train job's GPUs and the batch (``launch``, ``grpo_config``)."""
    from workflow_scripts.runtime.resources import rule_resources, train_processes

    train = config["train"]
    distributed = train["distributed"]
    gpus = rule_resources(config, "train")["gpus"]
    processes = train_processes(config)
    key = "train.distributed"
    if gpus and processes > gpus:
        yield (
            f"{key}.processes",
            f"{processes} processes, but the train job has {gpus} GPUs (resources.train.gpus): "
            "one process per GPU at most",
        )
    completions = train["prompts_per_step"] * train["num_generations"]
    ga = train["gradient_accumulation_steps"]
    if completions % ga == 0 and (completions // ga) % processes:
        yield (
            f"{key}.processes",
            f"{processes} processes must divide the completions of one micro-batch: prompts_per_step * "
            f"num_generations / gradient_accumulation_steps = {completions} / {ga} = {completions // ga}",
        )
    if distributed["strategy"] == "fsdp" and processes < 2:
        yield f"{key}.strategy", "fsdp shards over processes and this run has 1; use ddp (or more GPUs)"


def vllm_problems(config: Mapping) -> Iterator[Problem]:
    """vLLM runs a whole model in one dtype: an arm whose LM head is kept in another dtype than its
    rollouts compute in cannot be sampled by it as trained (its head would be cast). Sleep mode is the
    colocated engine's: the evaluation engine is shut down after sampling."""
    if config["eval"]["vllm"].get("sleep_mode"):
        yield (
            "eval.vllm.sleep_mode",
            "the evaluation engine runs alone and is shut down after sampling; sleep mode is for the "
            "colocated rollout engine (train.vllm.sleep_mode)",
        )
    if config["eval"]["vllm"].get("tensor_parallel_size", 1) != 1:
        yield (
            "eval.vllm.tensor_parallel_size",
            "the evaluation engine runs on one GPU (resources.evaluate); tensor parallelism is for the "
            "colocated rollout engine (train.vllm.tensor_parallel_size)",
        )
    if config["train"]["use_vllm"]:
        yield from tensor_parallel_problems(config)
    for block in ("train.vllm", "eval.vllm"):
        engine = config[block.split(".")[0]]["vllm"]
        seqs, tokens = engine.get("max_num_seqs"), engine.get("max_num_batched_tokens")
        if seqs and tokens and tokens < seqs:
            yield f"{block}.max_num_batched_tokens", f"must be at least max_num_seqs ({seqs}) (vLLM's rule)"
    users = [key for key, on in (("train.use_vllm", config["train"]["use_vllm"]),
                                 ("eval.backend", config["eval"]["backend"] == "vllm")) if on]  # fmt: skip
    for name, mode in config["precisions"].items():
        head, compute = mode.get("lm_head_dtype"), mode.get("autocast") or mode["param_dtype"]
        if users and head not in (None, compute):
            yield (
                f"precisions.{name}.lm_head_dtype",
                f"{' and '.join(users)} sample with vLLM, which runs the whole model in one dtype "
                f"({compute} for this arm): its {head} LM head would be sampled in {compute}. Sample this "
                "arm with the HF path (train.use_vllm: false, eval.backend: hf) or drop lm_head_dtype",
            )


def tensor_parallel_problems(config: Mapping) -> Iterator[Problem]:
    """TRL splits the train job's processes into engine groups of train.vllm.tensor_parallel_size; vLLM
    splits the attention heads over a group (key-value heads too, or replicates them below one each)."""
    from workflow_scripts.runtime.memory_plan import model_dims
    from workflow_scripts.runtime.resources import train_processes

    tp = config["train"]["vllm"].get("tensor_parallel_size", 1)
    if tp == 1:
        return
    processes = train_processes(config)
    if processes % tp:
        yield (
            "train.vllm.tensor_parallel_size",
            f"{tp} must divide the train job's {processes} processes (TRL forms engine groups of it)",
        )
    dims = model_dims(config["model"])
    if dims and (dims.heads % tp or (dims.kv_heads % tp and tp % dims.kv_heads)):
        yield (
            "train.vllm.tensor_parallel_size",
            f"{tp} must divide the model's {dims.heads} attention heads, and its {dims.kv_heads} key-value "
            "heads must divide or be divided by it (vLLM's rule)",
        )


def name_problems(config: Mapping) -> Iterator[Problem]:
    """Task and arm names must not read as run names (results/eval/{run}/{task}, paths.parse_run)."""
    runs = set(paths.run_names(config)) | {paths.base_run(d) for d in ("float32", "bfloat16", "float16")}
    for task in config["data"]["tasks"]:
        if task in runs:
            yield f"data.tasks.{task}", f"task name {task!r} is also a run name; rename the task"
    for name in config["precisions"]:
        if name == paths.BASE or paths.parse_run(paths.run_name(name, 0)).precision != name:
            yield f"precisions.{name}", f"arm name {name!r} collides with the base run names; rename it"


def repeat_problems(config: Mapping) -> Iterator[Problem]:
    """Each ``repeats`` entry names a configured arm and seed, once (``paths.repeats``)."""
    seen = set()
    for i, entry in enumerate(config.get("repeats") or []):
        key, pair = f"repeats.{i}", (entry["precision"], entry["seed"])
        if entry["precision"] not in config["precisions"]:
            yield f"{key}.precision", f"{entry['precision']!r} is not an arm of precisions"
        arm = config["precisions"].get(entry["precision"]) or {}
        seeds = arm.get("seeds") or config["seeds"]
        if entry["seed"] not in seeds:
            yield f"{key}.seed", f"{entry['seed']} is not one of the arm's seeds {seeds}"
        if pair in seen:
            yield key, f"{pair[0]} seed {pair[1]} is listed twice; give one entry more copies"
        seen.add(pair)


def model_problems(config: Mapping, check_files: bool = True) -> Iterator[Problem]:
    source = config["model"]["source"]
    tiny = config["model"]["tiny"]
    if source == "tiny" and tiny["hidden_size"] % tiny["num_heads"]:
        yield "model.tiny.num_heads", f"must divide model.tiny.hidden_size ({tiny['hidden_size']})"
    if source == "tiny" and tiny["num_kv_heads"] and tiny["num_heads"] % tiny["num_kv_heads"]:
        yield "model.tiny.num_kv_heads", f"must divide model.tiny.num_heads ({tiny['num_heads']})"
    looks_local = source.startswith((".", "/", "~")) or os.path.exists(source)
    if check_files and source != "tiny" and looks_local and not Path(source).is_dir():
        yield "model.source", f"local model folder not found: {source}"


RULES: dict[str, Callable[..., Iterator[Problem]]] = {
    "data": lambda c, files: data_problems(c, files),
    "precisions": lambda c, _: (p for n, m in c["precisions"].items() for p in precision_problems(n, m)),
    "train": lambda c, _: train_problems(c["train"]),
    "distributed": lambda c, _: distributed_problems(c),
    "vllm": lambda c, _: vllm_problems(c),
    "names": lambda c, _: name_problems(c),
    "repeats": lambda c, _: repeat_problems(c),
    "model": lambda c, files: model_problems(c, files),
    "eval_matmul": lambda c, _: eval_matmul.problems(c),
    "memory": lambda c, _: memory_plan.problems(c),
    "curriculum": lambda c, _: curriculum.problems(c),
    "heldout": lambda c, _: heldout_spec.problems(c),
}


def config_problems(config: Any, check_files: bool = True) -> list[Problem]:
    """Every problem of ``config`` (defaults filled in place); schema first, rules only on a valid shape."""
    if not isinstance(config, dict):
        return [("<top>", f"the config must be a mapping, got {type(config).__name__}")]
    problems = schema_problems(config)
    if problems:
        return problems
    return [p for rule in RULES.values() for p in rule(config, check_files)]


def _format(problems: Sequence[Problem], source_of: Callable[[str], str]) -> str:
    lines = [f"{source_of(key)}: {key}: {what}" for key, what in problems]
    return "invalid config:\n  " + "\n  ".join(lines)


def validate_config(config: Any, source: str = DEFAULT_CONFIG, check_files: bool = True) -> dict:
    """Validate ``config`` in place (filling defaults) and return it; raise ConfigError otherwise."""
    problems = config_problems(config, check_files)
    if problems:
        raise ConfigError(_format(problems, lambda _: source))
    return config


def check_train(train: Mapping, world_size: int = 1) -> None:
    """Raise ConfigError on the train rules (for the train stage, which knows the real world size)."""
    problems = list(train_problems(train, world_size))
    if problems:
        raise ConfigError(_format(problems, lambda _: "config"))


def check_precision(name: str, mode: Mapping) -> None:
    problems = list(precision_problems(name, mode))
    if problems:
        raise ConfigError(_format(problems, lambda _: "config"))


def section_hash(*parts: Any) -> str:
    """A short stable hash of config sections, for provenance records."""
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]
