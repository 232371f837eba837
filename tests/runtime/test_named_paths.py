"""Every repository path that the docs, code, configs and build files name exists.

A moved test or module leaves its old path behind in a comment, a docstring or a page of docs/; this test
finds those. It scans the README, docs/, the package, the rules, the configs, the Makefile, CI, bench/ and
the profiles for strings shaped like a repository path (``tests/....py``, ``workflow_scripts/...``,
``rules/....smk``, ``docs/....md``, ``bench/...``, ``envs/...``, ``profiles/...``, ``config*.yaml``) and
asserts that each exists. Paths with placeholders (``{run}``, ``<stage>``, ``*``, ``...``) are patterns,
not paths, and are skipped; outputs (``results/``, ``logs/``, ``benchmarks/``) are not scanned for.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PREFIXES = ("tests", "workflow_scripts", "rules", "docs", "bench", "envs", "profiles", ".ci", "data/fixtures")
# a path starts where no path character precedes it (so `profiles/slurm/config.yaml` is one path, not two,
# and `results/data/x` is not `data/x`); `../` (a rule's script) is allowed and dropped
_START = r"(?<![\w./~-])(?:\.\./)?"
PATH = re.compile(_START + r"((?:" + "|".join(re.escape(p) for p in PREFIXES) + r")/[\w./{}<>*-]*[\w}>*])")
CONFIG = re.compile(_START + r"(config[\w.-]*\.yaml)\b")
PLACEHOLDER = re.compile(r"[{}<>*]|\.\.\.")
# a bare config name is found at the top or where the package and the tests keep theirs (schemas/, tests/)
CONFIG_HOMES = ("", "workflow_scripts/schemas", "tests")
WRITTEN = {"bench/bench_eval.py": {"config.old.yaml"}}  # names a script gives the files it writes


def scanned_files() -> list[Path]:
    files = [REPO / "README.md", REPO / "Snakefile", REPO / "Makefile", REPO / ".ci" / "run"]
    files += sorted((REPO / "docs").glob("*.md"))
    files += sorted((REPO / "workflow_scripts").rglob("*.py"))
    files += sorted((REPO / "workflow_scripts").rglob("*.yaml"))
    files += sorted((REPO / "rules").glob("*.smk"))
    files += sorted(REPO.glob("config*.yaml"))
    files += sorted(p for p in (REPO / "bench").iterdir() if p.is_file())
    files += sorted(p for p in (REPO / "profiles").rglob("*") if p.is_file())
    return [f for f in files if f.exists() and "__pycache__" not in f.parts]


def named_paths(text: str) -> set[str]:
    found = {m.group(1) for m in PATH.finditer(text)} | {m.group(1) for m in CONFIG.finditer(text)}
    return {p.rstrip(".") for p in found if not PLACEHOLDER.search(p)}


def test_the_scan_finds_paths_and_skips_patterns():
    text = ("see tests/training/test_bf16_matmul.py, `rules/<stage>.smk`, workflow_scripts/{stage}.py, "
            "script: '../workflow_scripts/train.py', profiles/slurm/config.yaml and config.paper.yaml; "
            "results/data/train.jsonl, tests/..., bench/bench_*.py")  # fmt: skip
    assert named_paths(text) == {"tests/training/test_bf16_matmul.py", "workflow_scripts/train.py",
                                 "profiles/slurm/config.yaml", "config.paper.yaml"}  # fmt: skip


def exists(path: str) -> bool:
    if "/" not in path:
        return any((REPO / home / path).exists() for home in CONFIG_HOMES)
    return (REPO / path).exists()


def test_every_named_repository_path_exists():
    missing = []
    for file in scanned_files():
        name = str(file.relative_to(REPO))
        for path in sorted(named_paths(file.read_text(errors="replace")) - WRITTEN.get(name, set())):
            if not exists(path):
                missing.append(f"{name}: {path}")
    assert not missing, "named paths that do not exist:\n" + "\n".join(missing)
