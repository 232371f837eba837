"""bench/example_report.py: a finished run's report.md copied with one header line naming its source."""

import json

from conftest import bench_module


def test_the_copy_names_commit_and_machine_and_keeps_the_report(tmp_path):
    example_report = bench_module("example_report")
    analysis = tmp_path / "results" / "analysis"
    analysis.mkdir(parents=True)
    report = (
        "# rlvr-precision: analysis report\n\nterms: [glossary](../../../../repo/docs/glossary.md).\n\n"
        "## Figures\n\n- [overlap](figures/overlap.png): masks\n"
    )
    (analysis / "report.md").write_text(report)
    (tmp_path / "results" / "models").mkdir()
    numerics = {"cpu_model": "AMD EPYC", "cpu_capability": "AVX2", "cpu_bf16": False, "torch": "2.13.0+cpu"}
    (tmp_path / "results" / "models" / "base.json").write_text(json.dumps({"numerics": numerics}))
    out = tmp_path / "example.md"
    assert example_report.main([str(tmp_path), "--commit", "abc1234", "--out", str(out)]) == 0
    header, blank, *body = out.read_text().splitlines()
    assert header.startswith("> Example:") and "commit abc1234" in header and blank == ""
    assert "AMD EPYC (AVX2, no native bf16), torch 2.13.0+cpu" in header  # read from the run's base.json
    assert body[0] == "# rlvr-precision: analysis report"
    assert "- overlap (`results/analysis/figures/overlap.png` in the run): masks" in body
    assert "terms: [glossary](glossary.md)." in body  # the copy lives in docs/, beside the glossary
    text = example_report.example(tmp_path, machine="a named box")
    assert "a named box" in text.splitlines()[0]
