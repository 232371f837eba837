"""bench/suite_times.py: the per-tier table from a junit xml and the workflow invocation log."""

import pytest
from conftest import bench_module, log_workflow_run

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="0" failures="1" skipped="1" tests="5" time="42.5">
<testcase classname="tests.test_report" name="test_full_workflow" time="30.0"/>
<testcase classname="tests.test_report" name="test_render" time="0.5"/>
<testcase classname="tests.workflow.test_factorial" name="test_few_step[2]" time="8.0"><failure message="x"/>
</testcase>
<testcase classname="tests.runtime.test_config.TestLoad" name="test_yaml" time="1.0"/>
<testcase classname="tests.runtime.test_config" name="test_skipped" time="0.0"><skipped message="no"/>
</testcase>
</testsuite></testsuites>
"""
LOG = (
    "tests/test_report.py::test_full_workflow\tsnakemake\t--cores 2 --directory /w\n"
    "tests/test_report.py::test_full_workflow\tsnakemake\t--cores 2 --directory /w --report report.html\n"
    "tests/workflow/test_factorial.py::test_few_step[2]\tsnakemake\t--cores 2 --dry-run\n"
    "tests/workflow/test_factorial.py::test_few_step[2]\tgpu_smoke.sh\t--cores 2 --resources gpu=1\n"
    "tests/runtime/test_config.py::test_yaml\tsnakemake\t--touch --forceall\n"
)


@pytest.fixture(scope="module")
def suite_times():
    return bench_module("suite_times")


@pytest.fixture
def tier_files(tmp_path):
    (tmp_path / "main.xml").write_text(JUNIT)
    (tmp_path / "main.workflows.tsv").write_text(LOG)
    return tmp_path / "main.xml"


def test_the_table_has_wall_time_module_sums_the_slowest_tests_and_workflow_runs(suite_times, tier_files):
    tier = suite_times.from_junit(tier_files)
    assert tier.wall_s == 42.5 and tier.outcomes == {"passed": 3, "failure": 1, "skipped": 1}
    assert tier.durations["tests/runtime/test_config.py::test_yaml"] == 1.0  # a class: its module's
    text = suite_times.table(tier, slowest=2)
    assert "wall 42.5 s   tests 5 (passed 3, skipped 1, failure 1, error 0)   sum of test times 39.5" in text
    assert "snakemake invocations 5: run 2, dry-run 1, touch 1, report 1" in text
    assert "workflow runs (jobs executed) 2, by test:" in text
    assert "    1  tests/test_report.py::test_full_workflow" in text
    assert "    1  tests/workflow/test_factorial.py::test_few_step[2]" in text
    modules = [line.split()[:3] for line in text.split("module")[1].split("\n\n")[0].splitlines()[1:]]
    assert modules == [["tests/test_report.py", "2", "30.5"],
                       ["tests/workflow/test_factorial.py", "1", "8.0"],
                       ["tests/runtime/test_config.py", "2", "1.0"]]  # fmt: skip
    slowest = text.split("2 slowest tests  time_s\n")[1].splitlines()
    assert slowest == ["  30.0  tests/test_report.py::test_full_workflow",
                       "   8.0  tests/workflow/test_factorial.py::test_few_step[2]"]  # fmt: skip


def test_missing_inputs_are_a_clear_error_and_timing_never_fails(suite_times, tier_files, capsys):
    assert suite_times.main(["--from-junit", str(tier_files)]) == 0  # a 42 s tier or a 4200 s one: 0
    assert "== suite times: main" in capsys.readouterr().out
    (tier_files.parent / "main.workflows.tsv").unlink()
    with pytest.raises(SystemExit, match=r"no workflow log at .*main\.workflows\.tsv"):
        suite_times.main(["--from-junit", str(tier_files)])
    with pytest.raises(SystemExit, match=r"no junit xml at .*vllm\.xml"):
        suite_times.main(["--from-junit", str(tier_files.parent / "vllm.xml")])
    tier_files.write_text("<testsuites><testsuite")
    with pytest.raises(SystemExit, match="is not junit xml"):
        suite_times.read_junit(tier_files)


def test_the_test_helpers_log_one_line_per_invocation_only_when_asked(tmp_path, monkeypatch, suite_times):
    log = tmp_path / "runs.tsv"
    monkeypatch.delenv(suite_times.LOG_ENV, raising=False)
    log_workflow_run(["--cores", "2"])
    assert not log.exists()
    monkeypatch.setenv(suite_times.LOG_ENV, str(log))
    log_workflow_run(["--cores", "2", "--dry-run"], via="gpu_smoke.sh")
    log_workflow_run(["--cores", "2", "results/x.json"])
    rows = suite_times.read_invocations(log)
    assert [(via, suite_times.kind(args)) for _, via, args in rows] == [("gpu_smoke.sh", "dry-run"),
                                                                        ("snakemake", "run")]  # fmt: skip
    assert all(test.startswith("tests/bench/test_suite_times.py::") for test, _, _ in rows)
