"""Each job's vLLM compile cache is its own (``vllm_engine.job_cache_root``): eight jobs on a node would
otherwise compile identical graphs into one ``~/.cache/vllm``. No engine here (tests/models/
test_vllm_engine.py checks that a real engine writes into the job's directory)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import REPO

from workflow_scripts.models import vllm_engine

JOB = """
import json, os, sys
from workflow_scripts.models.vllm_engine import job_cache_root, prepare_process
prepare_process()
first = os.environ["VLLM_CACHE_ROOT"]
again = job_cache_root()  # a second engine of the same job
names = ("TRITON_F32_DEFAULT", "VLLM_FLOAT32_MATMUL_PRECISION", "VLLM_BATCH_INVARIANT",
         "VLLM_ENABLE_V1_MULTIPROCESSING")
print(json.dumps({"root": first, "again": again, "exists": os.path.isdir(first),
                  "env": {k: os.environ[k] for k in names}}))
"""


def run_job(env: dict) -> dict:
    proc = subprocess.run([sys.executable, "-c", JOB], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_two_jobs_on_a_node_get_their_own_vllm_cache_removed_when_they_end(tmp_path):
    shared = tmp_path / "shared-cache"  # what a profile exporting VLLM_CACHE_ROOT would give every job
    env = {**os.environ, "VLLM_CACHE_ROOT": str(shared), "TRITON_F32_DEFAULT": "tf32",
           "VLLM_BATCH_INVARIANT": "1", "VLLM_FLOAT32_MATMUL_PRECISION": "high"}  # fmt: skip
    one, two = run_job(env), run_job(env)
    assert one["root"] != two["root"]
    for job in (one, two):
        assert job["exists"] and job["again"] == job["root"]  # one directory per job, kept across engines
        assert Path(job["root"]).parent == shared  # under the root the user chose, never that root itself
        assert not Path(job["root"]).exists()  # removed when the job's process ended
        # what was inherited is overridden: IEEE fp32 products, no batch invariance, in-process engines
        assert job["env"] == {"TRITON_F32_DEFAULT": "ieee", "VLLM_FLOAT32_MATMUL_PRECISION": "highest",
                              "VLLM_BATCH_INVARIANT": "0", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}  # fmt: skip
    bare = {k: v for k, v in os.environ.items() if k != "VLLM_CACHE_ROOT"} | {"TMPDIR": str(tmp_path)}
    assert Path(run_job(bare)["root"]).parent == tmp_path  # no root given: the job's temp dir


def test_a_job_may_name_its_cache_directory(tmp_path, monkeypatch):
    monkeypatch.setattr(vllm_engine, "_job_cache", None)
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "inherited"))
    chosen = vllm_engine.job_cache_root(tmp_path / "run" / "vllm-cache")
    assert chosen == str((tmp_path / "run" / "vllm-cache").resolve()) == os.environ["VLLM_CACHE_ROOT"]
    assert Path(chosen).is_dir() and vllm_engine.job_cache_root() == chosen


def test_jobs_share_only_what_vllm_learned_about_a_model_class(tmp_path, monkeypatch):
    """Two jobs' caches link modelinfos/ to one folder of this user's (an entry one job writes, the next
    reads; removing a job's cache leaves it); a folder others could write is not shared."""
    caches = []
    for _ in range(2):  # two jobs' processes: each inherits the node's root
        monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path))
        monkeypatch.setattr(vllm_engine, "_job_cache", None)
        caches.append(Path(vllm_engine.job_cache_root()))
    assert caches[0] != caches[1]
    shared = tmp_path / f"rlvr-vllm-modelinfos-{os.getuid()}"
    entry = "vllm-model_executor-models-llama-LlamaForCausalLM.json"
    (caches[0] / "modelinfos" / entry).write_text("{}")
    assert (caches[1] / "modelinfos" / entry).read_text() == "{}"
    assert (shared.stat().st_mode & 0o777) == 0o700
    vllm_engine.shutil.rmtree(caches[0])
    assert (shared / entry).is_file() and not caches[0].exists()
    # only the modelinfos folder is shared: the compile caches stay the job's own
    assert [p.name for p in caches[1].iterdir()] == ["modelinfos"]

    shared.chmod(0o777)  # writable by others: not trusted
    other = tmp_path / "job3"
    other.mkdir()
    assert vllm_engine.share_modelinfos(other, tmp_path) is None and not (other / "modelinfos").exists()
