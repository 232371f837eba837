"""The package's architecture, kept by a test: no import cycles (lazy imports inside functions count)."""

import ast
import re
from pathlib import Path

from workflow_scripts.runtime import codehash

PACKAGE_DIR = Path(codehash.PACKAGE_DIR)


def module_name(file: Path) -> str:
    parts = file.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Package module -> the package modules it imports (top-level and lazy imports alike), as codehash
    reads them; ``from pkg import name`` counts only when ``pkg.name`` is a module."""
    files = {module_name(f): f for f in PACKAGE_DIR.rglob("*.py")}
    graph = {}
    for name, file in files.items():
        tree = ast.parse(file.read_text(encoding="utf-8"))
        graph[name] = {m for m in codehash._imported(tree, name) if m in files and m != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every elementary cycle's members, found as strongly connected components (Tarjan)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_package_has_no_import_cycles():
    graph = import_graph()
    assert len(graph) > 40  # the walk saw the package
    assert cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


STAGES = ("fetch", "prepare_data", "base_model", "train", "evaluate", "sparsity", "overlap", "aggregate",
          "stats", "learning_curves", "figures", "report", "snapshot_metrics")  # fmt: skip
REPO = PACKAGE_DIR.parent
MAX_LINES = 500


def subpackages() -> list[Path]:
    return sorted(p.parent for p in PACKAGE_DIR.glob("*/__init__.py"))


def test_no_module_imports_a_stage_module():
    """A stage's code is its own (rules name a stage module; what two stages share lives in a subpackage):
    no stage module and no package module imports one, lazily or not."""
    graph = import_graph()
    stages = {f"workflow_scripts.{stage}" for stage in STAGES}
    importers = {name: sorted(deps & stages) for name, deps in graph.items() if deps & stages}
    assert importers == {}


def test_the_top_level_holds_only_the_stages():
    assert sorted(p.stem for p in PACKAGE_DIR.glob("*.py") if p.stem != "__init__") == sorted(STAGES)


def test_every_subpackage_says_what_it_owns_and_imports_nothing():
    assert len(subpackages()) >= 8
    for pkg in subpackages():
        tree = ast.parse((pkg / "__init__.py").read_text())
        assert ast.get_docstring(tree), pkg
        assert not [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)], pkg


def test_no_package_shadows_a_stage_or_a_dependency():
    """No subpackage is named like a stage or like a top-level module of an installed distribution
    (``train/``, ``datasets/``); the package imports absolutely, so the stdlib's ``statistics`` is never
    shadowed by ``workflow_scripts.statistics``."""
    from importlib.metadata import packages_distributions

    installed = set(packages_distributions())
    assert {"torch", "datasets", "trl"} <= installed  # the lookup sees the dependencies
    for pkg in subpackages():
        assert pkg.name not in STAGES and pkg.name not in installed, pkg
    for file in PACKAGE_DIR.rglob("*.py"):
        assert not re.search(r"^\s*from \.", file.read_text(), flags=re.M), f"relative import in {file}"


def test_long_modules_say_why():
    for file in PACKAGE_DIR.rglob("*.py"):
        text = file.read_text()
        if text.count("\n") > MAX_LINES:
            doc = ast.get_docstring(ast.parse(text)) or ""
            assert "on purpose" in doc, (
                f"{file.relative_to(REPO)}: {text.count(chr(10))} lines, no reason given"
            )


def test_the_layout_table_matches_the_tree():
    readme = (REPO / "docs" / "development.md").read_text()  # its "Layout" table
    for pkg in subpackages():
        row = next(
            (ln for ln in readme.splitlines() if ln.startswith(f"| `workflow_scripts/{pkg.name}/` |")), None
        )
        assert row, f"docs/development.md layout table has no row for workflow_scripts/{pkg.name}/"
        listed = set(re.findall(r"`(\w+)`", row.split("|")[2]))
        modules = {p.stem for p in pkg.glob("*.py")} - {"__init__"}
        assert modules <= listed, (
            f"{pkg.name}: not in the docs/development.md row: {sorted(modules - listed)}"
        )


def test_tests_mirror_the_package():
    tests = REPO / "tests"
    for stage in STAGES:
        assert (tests / f"test_{stage}.py").exists(), stage
    allowed = {pkg.name for pkg in subpackages()} | {"workflow", "bench"}
    for file in tests.rglob("test_*.py"):
        folder = file.parent.relative_to(tests).parts
        assert folder == () or (len(folder) == 1 and folder[0] in allowed), file
