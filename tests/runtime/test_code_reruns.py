"""Code-aware reruns: editing package code reruns exactly the rules whose code imports it, and downstream.

Dry runs on a workflow whose outputs exist and are recorded as up to date (``snakemake --touch`` over
placeholder files): no job really runs, so the whole DAG costs seconds.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest
from conftest import (
    mark_done,
    placeholder_workflow,
    planned_jobs,
    rule_stages,
    run_snakemake,
)

from workflow_scripts.runtime.codehash import closure, code_version

pytestmark = pytest.mark.slow


def rule_edges(workdir: Path) -> set[tuple[str, str]]:
    """(upstream rule, downstream rule) pairs of `snakemake --rulegraph`."""
    proc = run_snakemake(workdir, "--rulegraph", timeout=120)
    assert proc.returncode == 0, proc.stderr
    labels = dict(re.findall(r'^\s*(\d+)\[label = "(\w+)"', proc.stdout, flags=re.M))
    return {(labels[a], labels[b]) for a, b in re.findall(r"^\s*(\d+) -> (\d+)", proc.stdout, flags=re.M)}


def expected_reruns(workdir: Path, module: str, edges: set[tuple[str, str]]) -> set[str]:
    """Rules whose stage reaches ``module`` in the import graph, and every rule downstream of them
    (``edges``: ``rule_edges`` of ``workdir``)."""
    root = workdir / "workflow_scripts"
    hit = {rule for rule, stage in rule_stages(workdir).items() if module in closure(stage, root)}
    grew = True
    while grew:
        more = {b for a, b in edges if a in hit} - hit
        hit |= more
        grew = bool(more)
    return hit


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A workflow dir whose every output exists and is recorded as done."""
    wf = placeholder_workflow(tmp_path_factory, tmp_path_factory.mktemp("reruns") / "wf")
    mark_done(wf)
    return wf


@pytest.fixture(scope="module")
def edges(finished) -> set[tuple[str, str]]:
    """The rule graph's edges: one `snakemake --rulegraph` for the module (no test changes the rules)."""
    return rule_edges(finished)


@pytest.fixture(scope="module")
def finished_plan(finished) -> tuple[dict[str, int], float]:
    """The dry run of the finished workflow (its planned jobs) and its wall seconds: two tests read it."""
    start = time.perf_counter()
    jobs = planned_jobs(finished)  # asserts snakemake's exit status 0
    return jobs, time.perf_counter() - start


class edited:
    """Append ``text`` to a file for the duration of the block; restore content and mtime after."""

    def __init__(self, path: Path, text: str) -> None:
        self.path, self.text = path, text

    def __enter__(self) -> None:
        self.original, self.stat = self.path.read_text(), self.path.stat()
        self.path.write_text(self.original + self.text)

    def __exit__(self, *exc) -> None:
        self.path.write_text(self.original)
        os.utime(self.path, ns=(self.stat.st_atime_ns, self.stat.st_mtime_ns))


def _verifier_module(wf: Path) -> Path:
    files = sorted((wf / "workflow_scripts" / "verify").glob("verifiers*.py"))
    assert files, "no verifier module"
    return files[0]


def test_touching_nothing_plans_nothing(finished_plan):
    assert finished_plan[0] == {}


def test_a_finished_dry_run_is_fast(finished_plan):
    wall = finished_plan[1]
    # the budget is 3 s on an idle machine; CI boxes are shared, so only a gross regression fails here
    assert wall < 15, f"snakemake -n on a finished workflow took {wall:.1f}s"


def test_editing_the_verifier_reruns_its_importers_and_downstream(finished, edges):
    path = _verifier_module(finished)
    module = f"workflow_scripts.verify.{path.stem}"
    expected = expected_reruns(finished, module, edges)
    assert {"train", "evaluate", "aggregate", "stats"} <= expected  # the import graph agrees
    with edited(path, "\n\ndef _edited_by_a_test():\n    return 1\n"):
        jobs = planned_jobs(finished)
    assert set(jobs) == expected


def test_a_cosmetic_edit_reruns_nothing(finished):
    path = _verifier_module(finished)
    with edited(path, "\n# a comment added by a test\n"):
        assert planned_jobs(finished) == {}


def test_editing_the_figure_module_reruns_only_figures_and_report(finished, edges):
    path = finished / "workflow_scripts" / "figures.py"
    expected = expected_reruns(finished, "workflow_scripts.figures", edges)
    assert expected <= {"figures", "report", "all"}
    with edited(path, "\n\ndef _edited_by_a_test():\n    return 1\n"):
        jobs = planned_jobs(finished)
    assert set(jobs) == expected | {"all"}
    assert {"figures", "report"} <= set(jobs)


def test_code_version_ignores_docstrings_and_follows_imports(tmp_path):
    pkg = tmp_path / "workflow_scripts"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text('"""A."""\nfrom workflow_scripts import b\n\ndef f():\n    return b.g()\n')
    (pkg / "b.py").write_text("def g():\n    from workflow_scripts.c import h\n    return h()\n")
    (pkg / "c.py").write_text("def h():\n    return 1\n")
    (pkg / "d.py").write_text("X = 1\n")
    before = code_version("a", pkg)
    assert set(closure("a", pkg)) == {"workflow_scripts", "workflow_scripts.a", "workflow_scripts.b",
                                      "workflow_scripts.c"}  # fmt: skip
    (pkg / "a.py").write_text('"""Another docstring."""\nfrom workflow_scripts import b  # hi\n\n\ndef f():\n'
                              "    return b.g()\n")  # fmt: skip
    os.utime(pkg / "a.py", ns=(1, 10**18))
    assert code_version("a", pkg) == before  # docstring, comment, blank lines
    (pkg / "d.py").write_text("X = 2\n")
    assert code_version("a", pkg) == before  # not imported
    (pkg / "c.py").write_text("def h():\n    return 2\n")
    os.utime(pkg / "c.py", ns=(1, 10**18 + 1))
    assert code_version("a", pkg) != before  # imported lazily, two hops away


def test_opting_out_of_code_reruns_is_documented():
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    assert "--rerun-triggers" in readme and "code_version" in readme
