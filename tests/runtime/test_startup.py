"""A job process imports with the garbage collector paused and collects again once its work starts."""

from __future__ import annotations

import gc
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

PROBE = """
import gc, sys
sys.path.insert(0, {repo!r})
{define}
from workflow_scripts.runtime import startup
paused = not gc.isenabled()
startup.imports_done()
print(paused, gc.isenabled(), gc.get_freeze_count() > 0)
"""


def _probe(tmp_path: Path, define: str) -> str:
    script = tmp_path / "probe.py"
    script.write_text(PROBE.format(repo=str(REPO), define=define))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_a_snakemake_script_job_imports_with_the_collector_paused_then_frozen_and_on(tmp_path):
    # Snakemake's preamble defines `snakemake` in __main__ before the stage module's first import.
    assert _probe(tmp_path, "snakemake = object()") == "True True True"


def test_a_plain_script_or_a_test_keeps_the_collector_as_it_was(tmp_path):
    assert _probe(tmp_path, "") == "False True False"
    from workflow_scripts.runtime import startup

    startup.imports_done()
    startup.before_exit()
    assert gc.isenabled()  # this pytest process


def test_a_stage_run_with_python_m_is_a_job_and_pauses_the_collector():
    # `python -m workflow_scripts.<stage>`: __main__.__spec__ names the package module.
    probe = (
        "import sys, types, gc; m = types.ModuleType('__main__'); "
        "m.__spec__ = types.SimpleNamespace(name='workflow_scripts.evaluate'); sys.modules['__main__'] = m; "
        "from workflow_scripts.runtime import startup; print(startup.is_job_process(), gc.isenabled())"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "True False"
