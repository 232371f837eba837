"""Config validation: every malformed config fails before any job runs, naming its file and key."""

from __future__ import annotations

import copy
import re
import subprocess
import sys

import pytest
import yaml
from conftest import REPO, load_test_config, make_workflow_dir, run_snakemake

from workflow_scripts.runtime import config as cfgmod
from workflow_scripts.runtime import config_files
from workflow_scripts.runtime.config import ConfigError, load_config, validate_config

QWEN25_7B = {"num_hidden_layers": 28, "hidden_size": 3584, "num_attention_heads": 28,
             "num_key_value_heads": 4, "intermediate_size": 18944, "vocab_size": 152064}  # fmt: skip


def _set(path: str, value):
    def mutate(cfg: dict) -> None:
        *parents, leaf = path.split(".")
        node = cfg
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value

    return mutate


def _delete(path: str):
    def mutate(cfg: dict) -> None:
        *parents, leaf = path.split(".")
        node = cfg
        for key in parents:
            node = node[key]
        del node[leaf]

    return mutate


def _rename_task(old: str, new: str):
    def mutate(cfg: dict) -> None:
        cfg["data"]["tasks"][new] = cfg["data"]["tasks"].pop(old)

    return mutate


# name -> (mutation, text the error must contain (the dotted key), the rule that owns it: "schema" or a
# key of config.RULES). Every rule of config.py has at least one row (test_every_rule_has_a_row).
MALFORMED = {
    "unknown top-level key": (_set("trian", {"max_steps": 3}), "trian: unknown key", "schema"),
    "unknown nested key": (_set("train.max_step", 3), "train.max_step: unknown key", "schema"),
    "seed not an int": (_set("seeds", [1, "two"]), "seeds.1", "schema"),
    "seed float": (_set("seeds", [1, 2.5]), "seeds.1", "schema"),
    "negative seed": (_set("seeds", [1, -2]), "seeds.1", "schema"),
    "data seed string": (_set("data.seed", "abc"), "data.seed", "schema"),
    "unknown param dtype": (
        _set("precisions.bf16.param_dtype", "bfloat8"),
        "precisions.bf16.param_dtype",
        "schema",
    ),
    "unknown autocast dtype": (
        _set("precisions.fp32.autocast", "half"),
        "precisions.fp32.autocast",
        "schema",
    ),
    "unknown task kind": (_set("data.tasks.mul.kind", "regex"), "data.tasks.mul.kind", "schema"),
    "unknown task source": (_set("data.tasks.mul.source", "mnist"), "data.tasks.mul.source", "schema"),
    "missing required precisions": (_delete("precisions"), "precisions: required key is missing", "schema"),
    "negative learning rate": (_set("train.learning_rate", -1.0), "train.learning_rate", "schema"),
    "learning rate above one": (_set("train.learning_rate", 1000), "train.learning_rate", "schema"),
    "temperature above ten": (_set("train.temperature", 100), "train.temperature", "schema"),
    "epsilon above one": (_set("train.epsilon", 5), "train.epsilon", "schema"),
    "epsilon_high above one": (_set("train.epsilon_high", 5), "train.epsilon_high", "schema"),
    "beta above ten": (_set("train.beta", 1000), "train.beta", "schema"),
    "dropout above one": (_set("precisions.bf16.dropout", 1.5), "precisions.bf16.dropout", "schema"),
    "duplicate seeds": (_set("seeds", [1, 1]), "seeds", "schema"),
    "eta not a number": (_set("sparsity", {"etas": ["small"]}), "sparsity.etas.0", "schema"),
    "bad precision name": (_set("precisions.1bad", {"param_dtype": "float32"}), "precisions.1bad", "schema"),
    "task name with a dash": (_rename_task("mul", "mul-s1"), "data.tasks.mul-s1", "schema"),
    "missing local dataset": (
        _set(
            "data.tasks.gsm", {"source": "gsm8k", "kind": "gsm8k", "role": "off_task", "path": "nope.jsonl"}
        ),
        "data.tasks.gsm.path",
        "data",
    ),
    "missing local training set": (
        _set("data.train", {"source": "gsm8k", "path": "nope.jsonl"}),
        "data.train.path",
        "data",
    ),
    "synthetic task without family": (_delete("data.tasks.mul.family"), "data.tasks.mul.family", "data"),
    "train_val task without a synthetic train set": (
        _set("data.train", {"source": "gsm8k"}),
        "data.tasks.add_sub.source",
        "data",
    ),
    "no on_task task": (_set("data.tasks.add_sub.role", "off_task"), "data.tasks: at least one", "data"),
    "bf16 masters with fp16 autocast": (
        _set("precisions.bf16", {"param_dtype": "bfloat16", "autocast": "float16"}),
        "precisions.bf16.autocast: autocast runs over float32 masters only",
        "precisions",
    ),
    "autocast to the master dtype": (
        _set("precisions.bf16", {"param_dtype": "bfloat16", "autocast": "bfloat16"}),
        "precisions.bf16.autocast",
        "precisions",
    ),
    "float32 autocast": (
        _set("precisions.fp32.autocast", "float32"),
        "precisions.fp32.autocast",
        "precisions",
    ),
    "completions not divisible by accumulation": (
        _set("train.gradient_accumulation_steps", 3),
        "train.gradient_accumulation_steps",
        "train",
    ),
    "steps_per_generation not a multiple of accumulation": (
        _set("train.gradient_accumulation_steps", 4),
        "train.steps_per_generation",
        "train",
    ),
    "overlong buffer as long as the completion": (
        _set("train.overlong_buffer", 8),
        "train.overlong_buffer",
        "train",
    ),
    "epsilon_high below epsilon": (_set("train.epsilon_high", 0.1), "train.epsilon_high", "train"),
    "processes not dividing a micro-batch": (
        _set("train.distributed.processes", 3),
        "train.distributed.processes",
        "distributed",
    ),
    "task named base": (_rename_task("mul", "base"), "data.tasks.base", "names"),
    "arm named base": (_set("precisions.base", {"param_dtype": "float32"}), "precisions.base", "names"),
    "missing local model folder": (_set("model.source", "./no/such/model"), "model.source", "model"),
    "importance-sampling correction without a bound": (
        _set("train.importance_sampling", {"correction": True, "clip_max": None}),
        "train.importance_sampling.clip_max",
        "train",
    ),
    "repeat of an arm that is not configured": (
        _set("repeats", [{"precision": "fp16", "seed": 1}]),
        "repeats.0.precision",
        "repeats",
    ),
    "repeat of a seed that is not configured": (
        _set("repeats", [{"precision": "bf16", "seed": 9}]),
        "repeats.0.seed",
        "repeats",
    ),
    "a train job that does not fit its GPU": (
        lambda c: (
            _set("resources.train.gpus", 1)(c),
            _set("gpu.memory_gb", 24)(c),
            _set("model.architecture", QWEN25_7B)(c),
        ),
        "resources.train.gpus: arm 'fp32' needs",
        "memory",
    ),
    "an fp32 LM head sampled by vLLM": (
        lambda c: (_set("precisions.bf16.lm_head_dtype", "float32")(c), _set("train.use_vllm", True)(c)),
        "precisions.bf16.lm_head_dtype: train.use_vllm sample with vLLM, which runs the whole model in one",
        "vllm",
    ),
    "sleep mode asked of the evaluation engine": (
        _set("eval.vllm.sleep_mode", True),
        "eval.vllm.sleep_mode: the evaluation engine runs alone and is shut down after sampling",
        "vllm",
    ),
    "bf16 arms sharing a base evaluation with different bf16_matmul": (
        _set("precisions.bf16_emul", {"param_dtype": "bfloat16", "bf16_matmul": "emulated"}),
        "precisions.bf16_emul.bf16_matmul",
        "eval_matmul",
    ),
    "curriculum steps that do not add up to max_steps": (
        _set("train.curriculum", [{"family": "add_sub_small", "steps": 2}]),
        "train.curriculum: the phases' steps add up to 2",
        "curriculum",
    ),
    "held-out curves of a task that is not configured": (
        _set("train.eval_tasks", ["add_sub", "gsm8k"]),
        "train.eval_tasks: not in data.tasks: gsm8k",
        "heldout",
    ),
}


def _malformed(name: str) -> dict:
    mutate, _, _ = MALFORMED[name]
    cfg = load_test_config()
    mutate(cfg)
    return cfg


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_config_names_its_file_and_key(name):
    _, expected, _ = MALFORMED[name]
    with pytest.raises(ConfigError) as err:
        validate_config(_malformed(name), source="my.yaml")
    assert f"my.yaml: {expected}" in str(err.value)


def test_every_rule_has_a_row_and_each_row_is_caught_by_its_rule():
    assert set(cfgmod.RULES) <= {rule for _, _, rule in MALFORMED.values()}
    for name, (_, expected, rule) in MALFORMED.items():
        cfg = _malformed(name)
        schema = cfgmod.schema_problems(cfg)
        if rule == "schema":
            assert any(expected.startswith(key) or key in expected for key, _ in schema), name
            continue
        assert schema == [], name
        found = [f"{key}: {what}" for key, what in cfgmod.RULES[rule](cfg, True)]
        assert any(line.startswith(expected) or expected in line for line in found), (name, found)


def test_all_problems_are_reported_at_once():
    cfg = load_test_config()
    cfg["train"]["gradient_accumulation_steps"] = 3
    cfg["precisions"]["bf16"]["autocast"] = "float16"
    cfg["data"]["tasks"]["base"] = cfg["data"]["tasks"].pop("mul")
    with pytest.raises(ConfigError) as err:
        validate_config(cfg, source="x.yaml")
    lines = str(err.value).splitlines()[1:]
    assert len(lines) == 4  # divisibility, steps_per_generation, autocast, task name
    assert all(line.strip().startswith("x.yaml: ") for line in lines)


def test_valid_configs_fill_defaults_from_the_schema():
    cfg = load_config(REPO / "config.yaml")
    assert cfg["train"]["loss_type"] == "dapo"
    assert cfg["eval"]["backend"] == "hf"
    assert cfg["model"]["trust_remote_code"] is False
    small = validate_config(load_test_config())
    assert small["sparsity"]["etas"] == cfgmod.schema_defaults("sparsity", "etas") == [1e-3, 1e-4, 1e-5]
    assert small["data"]["tasks"]["mul"]["path"] is None


def test_every_shipped_config_is_valid():
    for path in sorted(REPO.glob("config*.yaml")):
        load_config(path, check_files=False)


def test_gpu_configs_evaluate_one_job_per_run():
    """The shipped configs whose jobs hold GPUs keep `eval.jobs: per_run` (one vLLM engine start and one load
    of policy and base for all of a run's tasks); the CPU default stays per_task."""
    configs = {path.name: load_config(path, check_files=False) for path in sorted(REPO.glob("config*.yaml"))}
    gpu = sorted(
        name for name, cfg in configs.items() if any(r.get("gpus") for r in cfg["resources"].values())
    )
    assert gpu == [
        "config.gpu-check.yaml",
        "config.gpu-smoke.yaml",
        "config.one-node.yaml",
        "config.paper.yaml",
    ]
    assert {name: configs[name]["eval"]["jobs"] for name in gpu} == dict.fromkeys(gpu, "per_run")
    assert configs["config.yaml"]["eval"]["jobs"] == "per_task"


def test_third_precision_arm_is_config_only():
    cfg = load_test_config()
    cfg["precisions"]["bf16_autocast"] = {"param_dtype": "float32", "autocast": "bfloat16"}
    validate_config(cfg)


def test_yaml_syntax_error_names_file_and_line(tmp_path):
    bad = tmp_path / "c.yaml"
    bad.write_text("data:\n  seed: 1\n  train: [unclosed\nseeds: [1]\n")
    with pytest.raises(ConfigError, match=r"c\.yaml:4:\d+: not valid YAML"):
        load_config(bad)
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "missing.yaml")


def test_schema_documents_every_key():
    schema = cfgmod.load_schema()
    definitions = schema.get("definitions", {})
    undocumented = []

    def documented(node: dict) -> bool:
        ref = node.get("$ref", "")
        return "description" in node or "description" in definitions.get(ref.rpartition("/")[2], {})

    def walk(node: dict, path: str) -> None:
        for key, sub in node.get("properties", {}).items():
            if not documented(sub):
                undocumented.append(f"{path}{key}")
            walk(sub, f"{path}{key}.")
        extra = node.get("additionalProperties")
        if isinstance(extra, dict):
            walk(extra, f"{path}*.")

    walk(schema, "")
    for name, definition in definitions.items():
        walk(definition, f"definitions.{name}.")
    assert undocumented == []


def test_config_rules_import_no_torch():
    code = (
        "import sys, workflow_scripts.runtime.config, workflow_scripts.runtime.paths, "
        "workflow_scripts.models.dtypes, workflow_scripts.runtime.codehash; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# ------------------------------------------------------------------------ through snakemake -n

# The acceptance configs, each refused by `snakemake -n` before any job, naming file and key.
ACCEPTANCE = [
    "completions not divisible by accumulation",
    "bf16 masters with fp16 autocast",
    "overlong buffer as long as the completion",
    "negative seed",
    "task named base",
    "a train job that does not fit its GPU",
]


def _refused(proc: subprocess.CompletedProcess, wf) -> str:
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert not (wf / "results").exists() and not list((wf / ".snakemake").glob("log/*")), out
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", ACCEPTANCE)
def test_snakemake_refuses_malformed_config_before_any_job(tmp_path, name):
    _, expected, _ = MALFORMED[name]
    wf = make_workflow_dir(tmp_path / "wf", _malformed(name))
    out = _refused(run_snakemake(wf, "--dry-run", timeout=120), wf)
    assert f"config.yaml: {expected}" in out


@pytest.mark.slow
def test_snakemake_names_the_configfile_the_user_gave(tmp_path):
    wf = make_workflow_dir(tmp_path / "wf", load_test_config())  # a valid config.yaml beside it
    other = copy.deepcopy(load_test_config())
    other["train"]["gradient_accumulation_steps"] = 3
    (wf / "other.yaml").write_text(yaml.safe_dump(other))
    out = _refused(run_snakemake(wf, "--dry-run", "--configfile", "other.yaml", timeout=120), wf)
    assert "other.yaml: train.gradient_accumulation_steps" in out
    assert "config.yaml:" not in out


@pytest.mark.slow
def test_snakemake_names_file_and_line_of_a_yaml_syntax_error(tmp_path):
    wf = make_workflow_dir(tmp_path / "wf", load_test_config())
    text = (wf / "config.yaml").read_text().splitlines()
    text[2] = text[2] + " ]: ["  # line 3 broken
    (wf / "config.yaml").write_text("\n".join(text) + "\n")
    out = _refused(run_snakemake(wf, "--dry-run", timeout=120), wf)
    assert "config.yaml:3:" in out and "not valid YAML" in out


@pytest.mark.slow
def test_snakemake_refuses_a_configfile_with_a_yaml_syntax_error(tmp_path):
    """Snakemake parses --configfile itself, before the Snakefile: refused before any job, but its
    message names neither file nor line (a Snakemake limitation, see README "Config")."""
    wf = make_workflow_dir(tmp_path / "wf", load_test_config())
    (wf / "other.yaml").write_text("data: [unclosed\n")
    out = _refused(run_snakemake(wf, "--dry-run", "--configfile", "other.yaml", timeout=120), wf)
    assert "not valid JSON or YAML" in out


def test_workflow_config_reads_the_users_file_instead_of_the_default(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    other = load_test_config()
    (tmp_path / "other.yaml").write_text(yaml.safe_dump(other))
    # what Snakemake hands the Snakefile for `--configfile other.yaml`: that file's content
    config, source = cfgmod.workflow_config(copy.deepcopy(other), [str(tmp_path / "other.yaml")])
    assert source == "other.yaml" and set(config["data"]["tasks"]) == set(other["data"]["tasks"])
    # no config.yaml here at all: it is not read when a --configfile is given
    with pytest.raises(ConfigError, match=r"config\.yaml: config file not found"):
        cfgmod.workflow_config({}, [])


def test_a_config_override_is_blamed_on_the_command_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(load_test_config()))
    config, _ = cfgmod.workflow_config({"train": {"max_steps": 9}}, [])
    assert config["train"]["max_steps"] == 9 and config["train"]["num_generations"] == 4
    with pytest.raises(ConfigError) as err:
        cfgmod.workflow_config({"train": {"gradient_accumulation_steps": 3}}, [])
    assert "--config: train.gradient_accumulation_steps" in str(err.value)


def _typed_run(tmp_path, monkeypatch, *pairs: str, files: list[str] | None = None) -> dict:
    """workflow_config as the Snakefile calls it, with ``--config`` pairs parsed by Snakemake itself."""
    from snakemake.cli import parse_config

    monkeypatch.chdir(tmp_path)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(load_test_config()))
    overrides = parse_config(list(pairs))
    merged = cfgmod.merge(copy.deepcopy(load_test_config()), overrides) if files else copy.deepcopy(overrides)
    return cfgmod.workflow_config(merged, files or [], overrides=overrides)[0]


def test_config_overrides_typed_on_the_command_line_arrive_with_the_schemas_types(tmp_path, monkeypatch):
    from snakemake.cli import parse_config

    assert parse_config(["seeds=[1,2,3]"]) == {"seeds": ["1", "2", "3"]}  # why retyping is needed at all
    pairs = ("seeds=[1,2,3]", "train={max_steps: 7, learning_rate: 1.0e-5}", "analysis={alpha: 1e-2}",
             "precisions={fp32: {param_dtype: float32, autocast: null}}")  # fmt: skip
    config = _typed_run(tmp_path, monkeypatch, *pairs)
    assert config["seeds"] == [1, 2, 3]
    assert config["train"]["max_steps"] == 7 and config["train"]["learning_rate"] == 1e-5
    assert config["analysis"]["alpha"] == 0.01
    assert config["precisions"]["fp32"]["param_dtype"] == "float32"  # a string where the schema wants one
    assert config["precisions"]["fp32"]["autocast"] is None
    assert config["train"]["num_generations"] == load_test_config()["train"]["num_generations"]  # kept
    # the same over a --configfile: the file's values, the override's types
    other = _typed_run(tmp_path, monkeypatch, "seeds=[4,5]", files=[str(tmp_path / "config.yaml")])
    assert other["seeds"] == [4, 5]


def test_a_config_override_of_the_wrong_type_shows_the_forms_that_work(tmp_path, monkeypatch):
    with pytest.raises(ConfigError) as err:
        _typed_run(tmp_path, monkeypatch, "seeds=[1,two]")
    message = str(err.value)
    assert "--config: seeds.1: 'two' is not of type 'integer'" in message
    assert "--config 'seeds=[1,2,3]'" in message and "train={max_steps: 24" in message


# --------------------------------------------------------- experiment files: `extends` and `replace`

EXPERIMENTS = ("config.controls.yaml", "config.factorial.yaml")


def _write(path, data: dict):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _expected(mutate) -> dict:
    """The test config with ``mutate`` applied, validated: what a file extending it must load as."""
    config = load_test_config()
    mutate(config)
    return validate_config(config, check_files=False)


def test_extends_merges_the_experiment_over_the_file_it_names(tmp_path, monkeypatch):
    _write(tmp_path / "config.yaml", load_test_config())
    arm = {"param_dtype": "bfloat16", "autocast": None, "deterministic": True, "dropout": 0.0}
    exp = _write(tmp_path / "experiments" / "exp.yaml", {
        "extends": "../config.yaml",  # relative to the experiment's folder, not the working dir
        "seeds": [7],  # a list replaces
        "train": {"max_steps": 9},  # a mapping merges key by key
        "precisions": {"bf16_nodrop": arm},  # ... so an arm is added to the extended file's arms
    })  # fmt: skip
    monkeypatch.chdir(tmp_path / "experiments")
    config = load_config(exp, check_files=False)

    def mutate(cfg):
        cfg["seeds"] = [7]
        cfg["train"]["max_steps"] = 9
        cfg["precisions"]["bf16_nodrop"] = arm

    assert config == _expected(mutate)
    assert list(config["precisions"]) == ["fp32", "bf16", "bf16_nodrop"]
    assert "extends" not in config and "replace" not in config


def test_extends_follows_a_chain(tmp_path):
    _write(tmp_path / "config.yaml", load_test_config())
    _write(tmp_path / "mid.yaml", {"extends": "config.yaml", "seeds": [3], "train": {"max_steps": 9}})
    top = _write(tmp_path / "top.yaml", {"extends": "mid.yaml", "train": {"max_steps": 5}})
    config = load_config(top, check_files=False)
    assert config["seeds"] == [3] and config["train"]["max_steps"] == 5
    assert [name for name, *_ in config_files.config_layers(top, name=str)] == [
        str(tmp_path / n) for n in ("config.yaml", "mid.yaml", "top.yaml")
    ]


def test_replace_swaps_a_mapping_for_the_experiments_own(tmp_path):
    _write(tmp_path / "config.yaml", load_test_config())
    only = {"param_dtype": "float32", "autocast": None, "deterministic": True, "dropout": 0.1}
    exp = _write(tmp_path / "exp.yaml", {
        "extends": "config.yaml", "replace": ["precisions", "data.tasks"],
        "precisions": {"fp32_drop": only},
        "data": {"tasks": {"add_sub": load_test_config()["data"]["tasks"]["add_sub"]}},
    })  # fmt: skip
    config = load_config(exp, check_files=False)
    assert list(config["precisions"]) == ["fp32_drop"]  # config.yaml's fp32 and bf16 are gone
    assert list(config["data"]["tasks"]) == ["add_sub"]
    assert config["data"]["seed"] == load_test_config()["data"]["seed"]  # the rest of data: merged


_EXT = {"extends": "config.yaml"}


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"exp.yaml": {"extends": "exp.yaml"}}, r"exp\.yaml: extends: exp\.yaml makes a cycle"),
        (
            {"a.yaml": {"extends": "b.yaml"}, "b.yaml": {"extends": "a.yaml"}},
            r"b\.yaml: extends: a\.yaml makes a cycle \(.*a\.yaml -> .*b\.yaml -> .*a\.yaml\)",
        ),
        ({"exp.yaml": {"extends": "nope.yaml"}}, r"exp\.yaml: extends: nope\.yaml: config file not found"),
        ({"exp.yaml": {"extends": 3}}, r"exp\.yaml: extends: must be the path of a config file"),
        ({"exp.yaml": {**_EXT, "replace": ["seeds"]}}, r"exp\.yaml: replace: seeds: not set"),
        ({"exp.yaml": {**_EXT, "replace": "seeds", "seeds": [1]}}, r"exp\.yaml: replace: must"),
        ({"exp.yaml": {"replace": ["seeds"], "seeds": [1]}}, r"exp\.yaml: replace: only applies .*extends"),
        ({"exp.yaml": {"extends": "list.yaml"}, "list.yaml": [1]}, r"list\.yaml: the config must be a map"),
    ],
    ids=["self", "cycle", "missing", "not a path", "replace unset", "replace not a list", "replace alone",
         "not a mapping"],
)  # fmt: skip
def test_a_bad_extends_or_replace_names_the_file_and_the_key(tmp_path, files, message):
    _write(tmp_path / "config.yaml", load_test_config())
    for name, data in files.items():
        (tmp_path / name).write_text(yaml.safe_dump(data))
    first = tmp_path / ("a.yaml" if "a.yaml" in files else "exp.yaml")
    with pytest.raises(ConfigError, match=message):
        load_config(first, check_files=False)


def test_a_problem_is_blamed_on_the_file_of_the_chain_that_sets_it(tmp_path):
    base = load_test_config()
    base["trian"] = {"max_steps": 3}
    _write(tmp_path / "config.yaml", base)
    exp = _write(tmp_path / "exp.yaml", {**_EXT, "train": {"gradient_accumulation_steps": 3}})
    with pytest.raises(ConfigError) as err:
        load_config(exp, check_files=False)
    assert f"{tmp_path / 'config.yaml'}: trian: unknown key" in str(err.value)
    del base["trian"]
    _write(tmp_path / "config.yaml", base)
    with pytest.raises(ConfigError) as err:
        load_config(exp, check_files=False)
    assert f"{exp}: train.gradient_accumulation_steps" in str(err.value)


def test_workflow_config_follows_extends_where_snakemake_only_parsed_the_file(tmp_path, monkeypatch):
    from snakemake.cli import parse_config

    monkeypatch.chdir(tmp_path)
    _write(tmp_path / "config.yaml", load_test_config())
    raw = {"extends": "config.yaml", "replace": ["precisions"], "seeds": [5],
           "precisions": {"fp32": load_test_config()["precisions"]["fp32"]}}  # fmt: skip
    exp = _write(tmp_path / "exp.yaml", raw)
    # what Snakemake hands the Snakefile for `--configfile exp.yaml`: the file as written (absolute path)
    config, source = cfgmod.workflow_config(copy.deepcopy(raw), [str(exp)], overrides={})
    assert source == "exp.yaml" and config == load_config(exp, check_files=False)
    assert list(config["precisions"]) == ["fp32"] and config["train"] == load_config("config.yaml")["train"]
    overrides = parse_config(["seeds=[8,9]", "train={max_steps: 4}"])
    parsed = cfgmod.merge(copy.deepcopy(raw), overrides)  # Snakemake's config: the file, then --config
    config, _ = cfgmod.workflow_config(parsed, [str(exp)], overrides=overrides)
    assert config["seeds"] == [8, 9] and config["train"]["max_steps"] == 4  # --config on top, typed
    assert list(config["precisions"]) == ["fp32"]


@pytest.mark.slow
def test_snakemake_plans_an_experiment_file_as_its_extended_config(tmp_path):
    wf = make_workflow_dir(tmp_path / "wf", load_test_config())
    _write(wf / "exp.yaml", {"extends": "config.yaml", "replace": ["precisions"], "seeds": [5],
                             "precisions": {"fp32": load_test_config()["precisions"]["fp32"]}})  # fmt: skip
    proc = run_snakemake(wf, "--dry-run", "--configfile", "exp.yaml", timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert set(re.findall(r"results/train/(\w+)/seed(\d+)/run\.json", proc.stdout)) == {("fp32", "5")}
    _write(wf / "bad.yaml", {"extends": "config.yaml", "train": {"gradient_accumulation_steps": 3}})
    out = _refused(run_snakemake(wf, "--dry-run", "--configfile", "bad.yaml", timeout=120), wf)
    assert "bad.yaml: train.gradient_accumulation_steps" in out  # the key bad.yaml sets, blamed on it
    assert "config.yaml: train.steps_per_generation" in out  # the one it clashes with, on its file


def _config_lines(path) -> int:
    """Lines that set something: neither blank nor a comment."""
    lines = [line.strip() for line in path.read_text().splitlines()]
    return sum(1 for line in lines if line and not line.startswith("#"))


def _same_as_default(raw, default, replaced: set[str], prefix: str = "") -> list[str]:
    """Dotted keys of ``raw`` whose value equals ``default``'s (a copy), recursing into merged mappings."""
    same = []
    for key, value in raw.items():
        dotted = f"{prefix}{key}"
        if key not in default:
            continue
        if isinstance(value, dict) and isinstance(default[key], dict) and dotted not in replaced:
            same += _same_as_default(value, default[key], replaced, dotted + ".")
        elif value == default[key]:
            same.append(dotted)
    return same


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_an_experiment_file_holds_only_what_differs_from_the_default(name):
    raw = yaml.safe_load((REPO / name).read_text())
    assert raw.pop("extends") == "config.yaml"
    replaced = set(raw.pop("replace", []))
    assert _config_lines(REPO / name) <= 40
    default = yaml.safe_load((REPO / "config.yaml").read_text())
    assert _same_as_default(raw, default, replaced) == []
