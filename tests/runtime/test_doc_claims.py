"""Every number in the guides is registered in docs/claims.yaml with a source that holds.

bench/doc_claims.py does the work; this runs it and pins its rule."""

import shutil

import pytest
from conftest import REPO, bench_module

doc_claims = bench_module("doc_claims")


def test_every_number_in_the_guides_has_a_source_that_holds():
    found, problems = doc_claims.audit(REPO)
    missing = [f"{n.file}:{n.line}: {n.text}" for n, claim in found if claim is None]
    assert found, "no numbers found: the scan is broken"
    assert not missing, "numbers with no entry in docs/claims.yaml:\n" + "\n".join(missing)
    assert not problems, "stale or failing claims:\n" + "\n".join(problems)


@pytest.mark.parametrize(
    "line, numbers",
    [
        ("6 arms x 8 seeds, 0.05 and 1/3", ["6", "8", "0.05", "1", "3"]),
        ("fp32 and bf16_sr at pass@1, H1-H3, k3, Qwen2.5-Math-7B", []),
        ("`snakemake --cores 2` and [a link](docs/x.md#step-2) <https://x.org/issues/18>", []),
        ("torch 2.13.0 on 2026-12-03, 1,319 prompts", ["1,319"]),
    ],
)
def test_only_the_narrow_rule_leaves_a_number_out(line, numbers):
    assert [n.text for n in doc_claims.numbers_in("x.md", line)] == numbers


def test_code_blocks_and_headings_hold_no_claims():
    text = "## Step 3 of 4\n\n```\nsnakemake --cores 64\n```\n\nA run of 12 jobs.\n"
    assert [(n.line, n.text) for n in doc_claims.numbers_in("x.md", text)] == [(7, "12")]


def test_a_number_without_an_entry_and_an_entry_whose_context_is_gone_are_both_reported(tmp_path):
    (tmp_path / "docs").mkdir()
    shutil.copy(REPO / "Makefile", tmp_path / "Makefile")
    (tmp_path / "README.md").write_text("Workers: two.\n\nThe default has 6 arms.\n")
    log = "# Research log\n\n## 2026-12-03: a run\n\n6 arms, 9 s.\n"
    (tmp_path / "docs" / "research-log.md").write_text(log)
    (tmp_path / "docs" / "claims.yaml").write_text(
        "claims:\n"
        "- {file: README.md, context: 'Workers: three', log: '2026-12-03: a run'}\n"
        "- {file: README.md, context: 'has 6 arms', log: 'no such entry'}\n"
    )
    found, problems = doc_claims.audit(tmp_path)
    assert [(n.text, claim is not None) for n, claim in found] == [("6", True)]
    assert any("'Workers: three'" in p and "0 times" in p for p in problems)
    assert any("no research-log entry 'no such entry'" in p for p in problems)


def test_a_log_claim_needs_every_number_of_its_block_in_the_log_entry(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("The run took 879 s on 6 arms.\n")
    (tmp_path / "docs" / "research-log.md").write_text("# Log\n\n## 2026-12-03: a run\n\n6 arms, 862 s.\n")
    (tmp_path / "docs" / "claims.yaml").write_text(
        "claims:\n- {file: README.md, context: 'The run took', log: '2026-12-03: a run'}\n"
    )
    _, problems = doc_claims.audit(tmp_path)
    assert problems == ["README.md: 'The run took': research-log entry '2026-12-03: a run' lacks 879"]
