"""envs/*.yaml match pyproject.toml's pins and hold what their stages need (train.yaml: the GPU configs'
vllm too), and every rule declares conda:, log: and benchmark:."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ENV_FILES = sorted((REPO / "envs").glob("*.yaml"))
RULE_FILES = sorted((REPO / "rules").glob("*.smk"))
# Conda entries that are tooling, not project dependencies: checked separately or allowed unpinned.
TOOLING = {"pip"}
REQUIREMENT = re.compile(
    r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*(==?|>=|<=|~=|!=|<|>)?\s*([^;\s]*)"
)


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_requirement(entry: str) -> tuple[str, str | None, str | None]:
    """'torch==2.13.0' -> ('torch', '==', '2.13.0'); conda's 'python=3.11' -> ('python', '=', '3.11')."""
    match = REQUIREMENT.match(entry)
    assert match, f"cannot parse requirement {entry!r}"
    name, op, version = match.groups()
    return normalize(name), op, version or None


def pyproject_pins() -> dict[str, str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    entries = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        entries += extra
    pins = {}
    for entry in entries:
        name, op, version = parse_requirement(entry)
        assert op == "==" and version, f"pyproject.toml: {entry!r} is not pinned with =="
        pins[name] = version
    return pins


def env_entries(path: Path) -> list[tuple[str, str]]:
    """(kind, entry) for every dependency of a conda env file; kind is 'conda' or 'pip'."""
    spec = yaml.safe_load(path.read_text())
    entries = []
    for dep in spec.get("dependencies", []):
        if isinstance(dep, dict):
            assert set(dep) == {"pip"}, f"{path.name}: unknown dependency section {set(dep)}"
            entries += [("pip", str(e)) for e in dep["pip"]]
        else:
            entries.append(("conda", str(dep)))
    return entries


def test_there_are_env_files():
    assert {p.name for p in ENV_FILES} >= {"core.yaml", "train.yaml", "analysis.yaml"}


@pytest.mark.parametrize("env", ENV_FILES, ids=lambda p: p.name)
def test_env_pins_match_pyproject(env):
    pins = pyproject_pins()
    requires_python = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    problems = []
    for kind, entry in env_entries(env):
        if kind == "pip" and (entry.startswith("-") or "/" in entry or entry.startswith(".")):
            # e.g. `-e ..`: Snakemake copies the env file to .snakemake/conda/<hash>.yaml and conda runs
            # pip in that folder, so a relative path names .snakemake/, not the project
            problems.append(f"{entry!r} ({kind}): a pip option or local path")
            continue
        name, op, version = parse_requirement(entry)
        if kind == "conda" and name in TOOLING:
            continue
        if kind == "conda" and name == "python":
            minimum = requires_python.removeprefix(">=")
            if op not in ("=", "==") or not version:
                problems.append(f"{entry!r}: python is not pinned")
            elif tuple(map(int, version.split("."))) < tuple(map(int, minimum.split("."))):
                problems.append(f"{entry!r}: below requires-python {requires_python}")
            continue
        if op not in ("=", "==") or not version:
            problems.append(f"{entry!r} ({kind}): not pinned to one version")
        elif name not in pins:
            problems.append(f"{entry!r} ({kind}): not a pyproject.toml dependency")
        elif version != pins[name]:
            problems.append(f"{entry!r} ({kind}): pyproject.toml pins {name}=={pins[name]}")
    assert not problems, f"envs/{env.name}:\n  " + "\n  ".join(problems)


def test_pin_check_catches_drift_and_unpinned_entries(tmp_path, monkeypatch):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "dependencies:\n  - python=3.11\n  - pip\n  - pip:\n"
        "      - torch==2.0.0\n      - numpy\n      - -e ..\n"
    )
    with pytest.raises(AssertionError) as err:
        test_env_pins_match_pyproject(bad)
    assert "torch==2.0.0" in str(err.value) and "'numpy' (pip): not pinned" in str(err.value)
    assert "'-e ..' (pip): a pip option or local path" in str(err.value)


def pyproject_sections() -> tuple[list[str], dict[str, list[str]]]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return list(project["dependencies"]), project.get("optional-dependencies", {})


def makefile_extras(name: str) -> list[str]:
    """The extras a Makefile variable (GPU_EXTRAS = what `make setup-gpu` installs) lists."""
    match = re.search(rf"^{name}\s*:?=\s*(\S+)\s*$", (REPO / "Makefile").read_text(), flags=re.M)
    assert match, f"Makefile: no {name}"
    return match.group(1).split(",")


@pytest.mark.parametrize("env", ENV_FILES, ids=lambda p: p.name)
def test_env_holds_the_core_pins_within_an_install_that_install_check_resolves(env):
    """Every env has all of pyproject's core dependencies (the stages import the project's code, which needs
    them) and nothing outside `make setup-gpu`'s set, which `make install-check` resolves; train.yaml (train,
    evaluate, base_model) also has the `gpu` extra, the vLLM the GPU configs use."""
    core, extras = pyproject_sections()
    pip = {entry for kind, entry in env_entries(env) if kind == "pip"}
    assert pip >= set(core), f"envs/{env.name} lacks {sorted(set(core) - pip)}"
    resolved = set(core).union(*(extras[extra] for extra in makefile_extras("GPU_EXTRAS")))
    assert pip <= resolved, f"envs/{env.name}: {sorted(pip - resolved)} outside make setup-gpu's install"
    if env.name == "train.yaml":
        assert pip >= set(extras["gpu"]), "envs/train.yaml lacks the gpu extra (vllm) the GPU configs need"


def test_gpu_install_has_the_gpu_extra():
    assert {"gpu", "slurm", "tracking"} <= set(makefile_extras("GPU_EXTRAS"))


def rule_blocks(path: Path) -> dict[str, str]:
    """rule/checkpoint name -> its text (up to the next unindented line) in a .smk file."""
    blocks: dict[str, str] = {}
    current = None
    for line in path.read_text().splitlines():
        header = re.match(r"^(?:rule|checkpoint)\s+(\w+)\s*:", line)
        if header:
            current = header.group(1)
            blocks[current] = ""
        elif line and not line[0].isspace() and not line.startswith("#"):
            current = None
        elif current is not None:
            blocks[current] += line + "\n"
    return blocks


def rule_problems(paths: list[Path]) -> tuple[int, list[str]]:
    problems = []
    n_rules = 0
    for path in paths:
        for rule, body in rule_blocks(path).items():
            n_rules += 1
            for directive in ("conda", "log", "benchmark"):
                if not re.search(rf"^\s+{directive}\s*:", body, flags=re.M):
                    problems.append(f"{path.name}: rule {rule} has no {directive}:")
            conda = re.search(r"^\s+conda\s*:\s*\n?\s*[\"']([^\"']+)[\"']", body, flags=re.M)
            if conda and not (path.parent / conda.group(1)).resolve().is_file():
                problems.append(f"{path.name}: rule {rule}: conda env {conda.group(1)} does not exist")
    return n_rules, problems


def test_every_rule_declares_conda_log_and_benchmark():
    n_rules, problems = rule_problems(RULE_FILES)
    assert n_rules >= 2
    assert not problems, "\n".join(problems)


def test_rule_check_catches_a_missing_directive(tmp_path):
    smk = tmp_path / "rules" / "x.smk"
    smk.parent.mkdir()
    smk.write_text(
        'rule a:\n    output:\n        "a"\n    log:\n        "logs/a.log"\n    conda:\n'
        '        "../envs/none.yaml"\n    shell:\n        "touch {output}"\n\n\n'
        'X = 1\n\n\nrule b:\n    benchmark:\n        "b.tsv"\n'
    )
    n_rules, problems = rule_problems([smk])
    assert n_rules == 2
    assert problems == [
        "x.smk: rule a has no benchmark:",
        "x.smk: rule a: conda env ../envs/none.yaml does not exist",
        "x.smk: rule b has no conda:",
        "x.smk: rule b has no log:",
    ]
