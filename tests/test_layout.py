"""The package's architecture, kept by a test: no import cycles (lazy imports inside functions count)."""

import ast
from pathlib import Path

from workflow_scripts import codehash

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

