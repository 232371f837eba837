"""Fast jobs: one evaluate job per (run, task) with unchanged numbers, per-arm references, thread control.

The merged job must reproduce the outputs of the separate ``evaluate`` and ``kl`` rules it replaced. Both
sides are computed here, in the same run on the same machine: the old rules' call sequence is kept
runnable in tests/separate_jobs.py. (Floats differ between CPUs, so hashes recorded on another machine
cannot be compared with; bit-identity is a same-machine claim.)
"""

import copy
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import separate_jobs
import torch
from test_evaluate import EVAL_CFG, PROMPTS, TINY  # the same tiny model, settings and prompts

REPO = Path(__file__).resolve().parents[2]
TASK = {"kind": "integer", "role": "on_task", "max_new_tokens": 4}
# run, policy folder, the folder the old kl rule used as reference (the bf16 arm: a bf16 copy of the base
# saved to disk, where the new job casts the base in memory), the new job's reference dtype, reference run
CASES = (("base", "base", "base", None, "base"), ("fp32-s1", "fp32", "base", "float32", "base"),
         ("bf16-s1", "bf16", "base_bf16", "bfloat16", "base-bfloat16"))  # fmt: skip


def build_fixture(root: Path) -> tuple[dict[str, Path], Path]:
    """A base, a perturbed 'trained' model (fp32 and bf16 copies), a bf16 copy of the base, 5 problems."""
    from workflow_scripts.models.modeling import build_char_tokenizer, build_tiny_llama
    from workflow_scripts.tasks.rows import make_row, write_rows

    tok = build_char_tokenizer()
    base = build_tiny_llama(len(tok), TINY, tok).eval()
    trained = copy.deepcopy(base)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    dirs = {}
    copies = (("base", base, torch.float32), ("base_bf16", base, torch.bfloat16),
              ("fp32", trained, torch.float32), ("bf16", trained, torch.bfloat16))  # fmt: skip
    for name, model, dtype in copies:
        copy.deepcopy(model).to(dtype).save_pretrained(root / name, safe_serialization=True)
        tok.save_pretrained(root / name)
        dirs[name] = root / name
    rows = [make_row(f"q{i}", "t", "integer", p, eval(p[:-1])) for i, p in enumerate(PROMPTS)]
    write_rows(root / "t.jsonl", rows)
    return dirs, root / "t.jsonl"


def canonical(samples: pd.DataFrame, summary: dict, kl: dict) -> list:
    """(hash of every output value but timings, paths and the keys the old rules did not write:
    reference_run, bf16_matmul (the product path, recorded since); pass@1; k1; k3)."""
    drop = {"timing", "model_dir", "reference_run", "bf16_matmul", "vllm"}
    keep = [samples.to_dict(orient="list"), {k: v for k, v in summary.items() if k not in drop},
            {k: v for k, v in kl.items() if k not in drop}]  # fmt: skip
    digest = hashlib.sha256(json.dumps(keep, sort_keys=True, default=repr).encode()).hexdigest()[:16]
    return [digest, summary["pass_at_1"], kl["k1_mean"], kl["k3_mean"]]


def merged_outputs(root: Path, dirs: dict[str, Path], data: Path) -> dict[str, list]:
    """Every case through the merged job (``evaluate.run``), bf16 products on the native path the old
    rules took (``auto`` is emulated on a CPU without bf16 kernels: another path, other floats)."""
    from workflow_scripts import evaluate

    found = {}
    for run, policy, _, reference_dtype, reference_run in CASES:
        out = root / "merged" / run
        files = out / "t.samples.parquet", out / "t.json", out / "t.kl.json"
        paired = None if reference_run == run else root / "merged" / "base" / "t.samples.parquet"
        evaluate.run(model=dirs[policy], base=dirs["base"], data=data, samples_out=files[0],
                     summary_out=files[1], kl_out=files[2], eval_cfg=EVAL_CFG, task_cfg=TASK, run=run,
                     task="t", reference_run=reference_run, reference_dtype=reference_dtype,
                     base_samples=paired, bf16_matmul="native")  # fmt: skip
        summary, kl = (json.loads(f.read_text()) for f in files[1:])
        found[run] = canonical(pd.read_parquet(files[0]), summary, kl)
    return found


def separate_outputs(root: Path, dirs: dict[str, Path], data: Path) -> dict[str, list]:
    """Every case through the two old rules, one after the other (tests/separate_jobs.py), their outputs
    written and read back as the rules did (parquet and JSON), so both sides are compared as files."""
    from workflow_scripts.runtime.atomic import write_json, write_parquet

    found, base_samples = {}, None
    for run, policy, old_reference, _, _ in CASES:
        samples, summary = separate_jobs.evaluate_job(dirs[policy], data, EVAL_CFG, TASK, run, "t",
                                                      base_samples)  # fmt: skip
        kl = separate_jobs.kl_job(dirs[policy], dirs[old_reference], data, EVAL_CFG, TASK, run, "t")
        out = root / "separate" / run
        write_parquet(out / "t.samples.parquet", samples)
        write_json(out / "t.json", summary)
        write_json(out / "t.kl.json", kl)
        samples = pd.read_parquet(out / "t.samples.parquet")
        base_samples = samples if run == "base" else base_samples
        found[run] = canonical(samples, *(json.loads((out / f).read_text()) for f in ("t.json", "t.kl.json")))
    return found


def test_merged_job_reproduces_the_separate_evaluate_and_kl_rules_exactly(tmp_path):
    torch.set_num_threads(1)
    dirs, data = build_fixture(tmp_path)
    merged, separate = merged_outputs(tmp_path, dirs, data), separate_outputs(tmp_path, dirs, data)
    assert merged == separate
    # the cases differ from each other: the comparison is not between empty or constant outputs
    assert len({v[0] for v in merged.values()}) == 3 and merged["fp32-s1"][3] > 0 and merged["bf16-s1"][3] > 0


def test_base_against_its_own_cast_is_exactly_zero_kl_and_a_cast_alone_is_not(tmp_path):
    from workflow_scripts.evaluate import run

    torch.set_num_threads(1)
    dirs, data = build_fixture(tmp_path)

    def kl_of(name: str, model: Path, **kw) -> dict:
        out = tmp_path / "out" / name
        run(model=model, base=dirs["base"], data=data, samples_out=out / "s.parquet",
            summary_out=out / "s.json", kl_out=out / "kl.json", eval_cfg=EVAL_CFG, task_cfg=TASK, run=name,
            task="t", **kw)  # fmt: skip
        return json.loads((out / "kl.json").read_text())

    cast = kl_of("base-bfloat16", dirs["base"], policy_dtype="bfloat16", reference_dtype="bfloat16")
    assert (cast["policy_dtype"], cast["reference_dtype"]) == ("bfloat16", "bfloat16")
    assert cast["k1_mean"] == cast["k3_mean"] == cast["rb_mean"] == 0.0
    assert set(cast["per_prompt_k3"]) == set(cast["per_prompt_rb"]) == {0.0}
    # A bf16 run that has not moved yet (the saved bf16 copy of the base) vs its arm's start: exactly 0 ...
    start = kl_of("bf16-s1", dirs["base_bf16"], reference_run="base-bfloat16", reference_dtype="bfloat16")
    assert start["k1_mean"] == 0.0 and start["k3_mean"] == 0.0
    # ... but against the float32 base (the pre-per-arm reference) the cast alone shows up as KL.
    old = kl_of("bf16-s2", dirs["base_bf16"], reference_run="base", reference_dtype="float32")
    assert old["reference_dtype"] == "float32" and old["k3_mean"] > 0


def test_loaded_weights_lie_aligned_so_a_copy_computes_the_same_floats(tmp_path):
    """Weights loaded from safetensors are views at the file's offsets; on an AVX512 CPU MKL rounds a
    one-row product of unaligned weights otherwise than of an aligned copy (the base run's KL to its
    own copy came out -8.6e-10, not 0, on an AMD EPYC). ``load_model`` re-homes them aligned."""
    from workflow_scripts.models.modeling import ALIGNMENT, load_model

    torch.set_num_threads(1)
    dirs, _ = build_fixture(tmp_path)
    model = load_model(dirs["base"], "float32").eval()
    assert {p.data_ptr() % ALIGNMENT for p in model.parameters()} == {0}
    twin = copy.deepcopy(model)
    ids = torch.randint(0, 30, (1, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        for rows in (ids, ids.repeat(3, 1)):  # one row (MKL's vector path) and a small batch
            assert torch.equal(model(rows).logits, twin(rows).logits)


def test_a_truncated_safetensors_file_is_named_in_the_load_error(tmp_path):
    from workflow_scripts.models.loading import saved_dtype
    from workflow_scripts.models.modeling import load_model

    dirs, _ = build_fixture(tmp_path)
    weights = dirs["base"] / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(ValueError, match=rf"{weights}: corrupt or truncated safetensors"):
        load_model(dirs["base"], "float32")
    with pytest.raises(ValueError, match=str(tmp_path / "nowhere")):
        load_model(tmp_path / "nowhere", "float32")
    with pytest.raises(ValueError, match=rf"{weights}: corrupt or truncated safetensors"):
        saved_dtype(dirs["base"])  # the evaluate job reads the dtype first


# ------------------------------------------------------------------------------------------ threads

PROBE = """
import json, os, sys
from workflow_scripts.runtime import threads  # what a stage module does first
passive = {k: os.environ.get(k) for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
import torch
state = threads.limit_threads(int(sys.argv[1]))
state.update(passive)
state.update({k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "RAYON_NUM_THREADS",
                                             "TOKENIZERS_PARALLELISM")})
state.update(torch_intra=torch.get_num_threads(), torch_inter=torch.get_num_interop_threads())
state.update(child_wait=os.environ.get("OMP_WAIT_POLICY"))
print(json.dumps(state))
"""


@pytest.mark.slow
@pytest.mark.parametrize("n", [1, 2])
def test_a_job_uses_exactly_its_threads_and_waits_passively(n):
    env = {k: v for k, v in os.environ.items() if not k.endswith("_THREADS") and k != "OMP_WAIT_POLICY"}
    proc = subprocess.run([sys.executable, "-c", PROBE, str(n)], capture_output=True, text=True, cwd=REPO,
                          env={**env, "PYTHONPATH": str(REPO)}, timeout=120, check=True)  # fmt: skip
    state = json.loads(proc.stdout.strip().splitlines()[-1])
    assert state["torch"] and state["torch_intra"] == n and state["torch_inter"] == n
    assert state["OMP_NUM_THREADS"] == state["MKL_NUM_THREADS"] == state["RAYON_NUM_THREADS"] == str(n)
    assert state["OMP_WAIT_POLICY"] == "PASSIVE" and state["GOMP_SPINCOUNT"] == "0"  # set before torch loaded
    assert state["TOKENIZERS_PARALLELISM"] == ("true" if n > 1 else "false")


@pytest.mark.slow
def test_a_job_whose_threads_cover_every_cpu_spins_and_its_children_wait_passively():
    """Threads = every CPU of the process (the warm start on 2 cores): no neighbour to steal from, so
    OpenMP keeps its spinning wait; fewer threads than CPUs (or one): passive. Children always passive."""
    cpus = len(os.sched_getaffinity(0))
    env = {k: v for k, v in os.environ.items() if not k.endswith("_THREADS") and k not in threads_env()}
    for n, spins in ((cpus, cpus > 1), (1, False)):
        proc = subprocess.run([sys.executable, "-c", PROBE, str(n)], capture_output=True, text=True, cwd=REPO,
                              env={**env, "OMP_NUM_THREADS": str(n), "PYTHONPATH": str(REPO)}, timeout=120,
                              check=True)  # fmt: skip
        state = json.loads(proc.stdout.strip().splitlines()[-1])
        assert state["omp_wait"] == ("active" if spins else "passive")
        assert (state["OMP_WAIT_POLICY"] is None) == spins  # what libgomp read when torch loaded
        assert state["child_wait"] == "PASSIVE"  # what a worker it starts inherits


def threads_env() -> tuple[str, ...]:
    return ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")


def test_limiting_threads_is_idempotent_and_imports_no_torch_itself():
    from workflow_scripts.runtime.threads import limit_threads, process_age_s

    first = limit_threads(1)
    again = limit_threads(1)
    assert first["intra_op"] == again["intra_op"] == torch.get_num_threads() == 1
    assert 0 < process_age_s() < time.time()
    code = "import sys; from workflow_scripts.runtime.threads import limit_threads; s = limit_threads(2); "
    code += "print(s['torch'], 'torch' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, check=True)  # fmt: skip
    assert proc.stdout.split() == ["False", "False"]


@pytest.mark.slow
def test_the_evaluate_stage_imports_no_trainer_vllm_or_plotting_library():
    banned = ("trl", "vllm", "matplotlib", "seaborn", "statsmodels", "datasets")
    code = f"import sys, workflow_scripts.evaluate; print(sorted(set(sys.modules) & {set(banned)!r}))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, check=True)  # fmt: skip
    assert proc.stdout.strip().splitlines()[-1] == "[]"


# ----------------------------------------------------------------------------------- snakemake level


@pytest.mark.slow
def test_a_finished_workflow_plans_only_the_jobs_a_new_seed_or_a_new_task_needs(tmp_path, tmp_path_factory):
    """Dry runs of a finished workflow (faked: empty outputs with Snakemake's records of params and code)."""
    from conftest import (
        load_test_config,
        make_workflow_dir,
        mark_done,
        placeholder_workflow,
        planned_jobs,
        set_key,
    )

    config = load_test_config()
    wf = placeholder_workflow(tmp_path_factory, tmp_path / "wf")  # every output an empty file (or folder)
    mark_done(wf)  # recorded by Snakemake as made by its job (--touch alone records no params)
    assert planned_jobs(wf) == {}
    # one more seed, typed on the command line as the README's recipe does it: only that seed's jobs
    seeds = [*config["seeds"], max(config["seeds"]) + 1]
    jobs = planned_jobs(wf, "--config", f"seeds=[{','.join(map(str, seeds))}]")
    arms, tasks = len(config["precisions"]), len(config["data"]["tasks"])
    assert {k: jobs.pop(k) for k in ("train", "evaluate", "sparsity", "overlap")} == {
        "train": arms, "evaluate": arms * tasks, "sparsity": arms, "overlap": arms}, jobs  # fmt: skip
    assert set(jobs) == {"aggregate", "stats", "learning_curves", "figures", "report", "all"}, jobs
    # one more seed of one arm (its own `seeds` list, as the default's reference has): that run alone
    ref = next(iter(config["precisions"]))
    jobs = planned_jobs(wf, "--config", f"precisions={{{ref}: {{seeds: [{','.join(map(str, seeds))}]}}}}")
    assert {k: jobs.get(k, 0) for k in ("train", "evaluate")} == {"train": 1, "evaluate": tasks}, jobs
    original = (wf / "config.yaml").read_text()
    set_key(wf / "config.yaml", "train.learning_rate", 1e-5)  # the records are live: a train change shows
    assert planned_jobs(wf)["train"] == len(config["precisions"]) * len(config["seeds"])
    (wf / "config.yaml").write_text(original)
    config["data"]["tasks"]["chain"] = {"source": "synthetic", "family": "chain", "kind": "integer",
                                        "role": "off_task", "n": 30, "max_new_tokens": 6}  # fmt: skip
    # a new task is on every run's held-out curve (train.eval_tasks null): training reruns for it
    make_workflow_dir(wf, config)
    assert planned_jobs(wf)["train"] == len(config["precisions"]) * len(config["seeds"])
    # with the curve's tasks pinned to those it was measured on (train.eval_tasks), its final evaluation only
    config["train"]["eval_tasks"] = ["add_sub", "mul", "mcq"]
    make_workflow_dir(wf, config)
    jobs = planned_jobs(wf)
    runs = 2 + len(config["precisions"]) * len(config["seeds"])  # base, base-bfloat16, the trained runs
    assert jobs.pop("evaluate", 0) == runs, jobs
    # what remains is the new task's data and the analysis downstream of every task
    assert set(jobs) <= {"prepare_eval", "aggregate", "stats", "learning_curves", "figures", "report",
                         "all"}, jobs  # fmt: skip
