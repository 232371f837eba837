"""Evaluation of one run on one task: pass@1 and KL to the run's reference base, one job (``evaluate``).

One job per (run, task) loads the tokenizer, the policy and the reference base once and writes the
three files of that pair (a second job per pair would pay the start-up, ~5-10 s of imports and a model
load, again for a few seconds of work). Run names (``paths``): ``base`` (results/models/base in its
saved dtype, model.dtype), ``base-<dtype>`` (the same weights cast to an arm's param dtype, as training
starts from them: ``load_model(base, param_dtype)``, what ``precision.load_policy`` does) and
``{precision}-s{seed}`` (results/train/{precision}/seed{seed}/model, in the dtype it was saved in: a
bf16 run is evaluated in bf16, which is the point of the experiment).

Per-arm reference (``reference_run``): a trained run is compared with the base in its arm's starting
dtype: dJ is paired with the samples of base run ``reference_run`` and KL is measured against the base
loaded in the arm's param dtype, so a difference measures training, not the cast. A base run is its own
reference (KL exactly 0: a separate copy of the same weights).

The job = generate -> score -> summarize, then KL (separate functions, so scoring and summaries are
tested on crafted completions):

- ``generate``: ``eval.n_samples`` samples per problem at ``eval.temperature`` / ``eval.top_p``, the task's
  ``max_new_tokens``, through the backend ``eval.backend`` names:

  | backend | sampler                                                 | where    | imports vllm |
  |---------|---------------------------------------------------------|----------|--------------|
  | hf      | ``generation.sample_completions``: batched across       | CPU, GPU | never        |
  |         | prompts, left padding, KV cache, memory-bounded batches |          |              |
  | vllm    | ``vllm_backend.sample_completions_vllm``                | GPU      | when chosen  |

- ``score``: ``verifiers.verify_batch`` (the verifier the training reward uses), ``eval.code_timeout``
  seconds per check for code tasks and ``eval.verify_timeout`` for the rest; a check that hangs or
  crashes is scored wrong with status timeout/error, never fails the job.
- ``summarize`` (``eval_summary``): pass@1 and SE, pass@k, status counts, eval-noise variance, paired
  dJ against the reference base run (estimators and their rationale: ``passk``).
- KL: ``kl.estimate_kl`` on ``eval.kl_prompts`` prompts x ``eval.kl_samples`` fresh samples of the policy
  at T=1, top_p=1 (the eval samples are not draws from pi_theta).

Seeds: sampling seed = hash(eval.seed, run, task, purpose) (``derive_seed``), purpose "eval" or "kl";
a repeat (``<precision>-s<seed>-r<k>``, the noise floor) uses the streams of the run it repeats
(``paths.stream_run``: common random numbers, so repeats differ only by their numerics).
Each run/task gets its own reproducible stream, independent of the other runs, so the finite-sample
noise of two runs' pass@1 is independent and ``eval_noise_var`` is exactly its contribution to an
across-seed variance (common random numbers across runs would correlate that noise and make the
correction wrong). KL prompts are a seeded sample that depends on (eval.seed, task) only: every run's KL
is measured on the same prompts. Both streams are the ones the former separate evaluate and kl jobs
drew, so merging the jobs changed no number (tested against the pre-merge outputs).

Outputs (results/eval/{run}/):

``{task}.samples.parquet``, one row per problem x sample (``SAMPLE_COLUMNS``): run, task, prompt_id (the
data row's id), prompt_index (row order in the eval file), sample_index, completion, extracted (the
verifier's answer, null if none), correct, status (ok / no_answer / timeout / error), length (generated
tokens, end token included), truncated (hit max_new_tokens without an end token).

``{task}.json``: run, task, kind, role, backend, dtype, bf16_matmul (the path a bf16 model's products
took: native / emulated, ``bf16_matmul``; null without a bf16 model), model_dir, seed, sampling
{temperature, top_p, max_new_tokens, n_samples}, N (problems), n (samples per problem), pass_at_1,
pass_at_1_se, pass_at_k {k: {mean, se}} for k in 1, 2, 4, ... <= n and n, eval_noise_var, counts
{samples, correct, ok, no_answer, timeout, error, truncated}, mean_length, problem_ids and correct_counts
(per-problem success counts c_i, aligned; the variance analysis reads these, not the parquet),
reference_run, dJ, dJ_se, base_pass_at_1, paired_N (null for a base run), timing {startup_s (process
start to the job's first line: interpreter, imports), load_s (tokenizer and models), generate_s, score_s,
completions_per_s}.

``{task}.kl.json`` (estimator: ``kl``): run, task, reference_run, policy_dtype, reference_dtype,
bf16_matmul, seed, temperature 1.0, top_p 1.0, max_new_tokens, k1_mean, k1_se, k3_mean, k3_se, rb_mean,
rb_se (across prompts), k1_mc_var, k3_mc_var, rb_mc_var (Monte-Carlo variance given the prompts: the eval
noise of a run's KL, since every run has the same prompts), n_prompts, n_samples, prompt_ids,
per_prompt_k1, per_prompt_k3, per_prompt_rb (aligned with prompt_ids), mean_length, truncated_frac,
timing {sample_s, score_s}. A base run against itself is exactly 0.

Resume: a finished task's files are kept in an ``atomic.ResultStore`` (paths.eval_resume_dir) keyed by its
input files, settings and code version (``inputs_key``); a retry copies them into place (timing: the first
attempt's) instead of recomputing the task. The store is removed when the job finishes.

Standard errors are null (not NaN) where undefined (a single problem or prompt); so are the mc vars
with ``eval.kl_samples`` 1.
"""

from workflow_scripts.runtime import startup  # noqa: F401  first: no garbage collection during imports
from workflow_scripts.runtime.threads import (
    limit_threads,
    log_startup,
    process_age_s,
)  # first: sets OpenMP's wait policy

# isort: split

import argparse
import logging
import os
import time
from dataclasses import dataclass

from workflow_scripts.measures.eval_summary import finite, score, summarize
from workflow_scripts.models.generation import Completion, sample_completions
from workflow_scripts.models.loading import dtype_of, load_pair, load_run_model
from workflow_scripts.models.modeling import load_tokenizer
from workflow_scripts.runtime import paths
from workflow_scripts.runtime.atomic import ResultStore, inputs_key, write_json, write_parquet
from workflow_scripts.runtime.eval_matmul import bf16_matmul as eval_bf16_matmul
from workflow_scripts.runtime.seeds import derive_seed
from workflow_scripts.runtime.seeds import seeded_subset as kl_prompt_indices
from workflow_scripts.runtime.smk import main_from
from workflow_scripts.tasks.rows import Row, read_json, read_parquet, read_rows
from workflow_scripts.training.bf16_matmul import bf16_matmul as matmul_context
from workflow_scripts.training.bf16_matmul import resolve as resolve_matmul

log = logging.getLogger("evaluate")

BACKENDS = ("hf", "vllm")


def _check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"eval.backend: unknown backend {backend!r}; known: {BACKENDS}")


# ------------------------------------------------------------------------------------ generate


def generate(
    model_dir: str | os.PathLike,
    prompts: list[str],
    eval_cfg: dict,
    max_new_tokens: int,
    seed: int,
    trust_remote_code: bool = False,
    *,
    model=None,
    tokenizer=None,
    dtype: str | None = None,
    threads: int | None = None,
    engine=None,
) -> tuple[list[Completion], dict]:
    """``eval.n_samples`` completions per prompt (prompt-major) and {backend, dtype, generate_s, vllm}
    (vllm: the engine's record, ``vllm_engine.engine_record`` + start_s and this call's sample_s; None on
    the hf backend).

    ``model``/``tokenizer``: already loaded ones (hf backend; the evaluate job loads them once for
    sampling and KL); else loaded from ``model_dir`` in ``dtype`` (default: the saved dtype). ``engine``:
    an open ``EvalEngine`` (vllm backend; the per-run job samples every task through one); else one is
    started for this call and shut down before it returns."""
    backend = eval_cfg["backend"]
    _check_backend(backend)
    tokenizer = tokenizer or load_tokenizer(model_dir, trust_remote_code)
    if backend == "vllm" and engine is None:
        from workflow_scripts.models.vllm_backend import open_engine

        with open_engine(model_dir, tokenizer, eval_cfg.get("vllm"), dtype, seed, threads) as engine:
            completions, info = generate(model_dir, prompts, eval_cfg, max_new_tokens, seed,
                                         trust_remote_code, tokenizer=tokenizer, engine=engine)  # fmt: skip
        info["generate_s"] = round(info["generate_s"] + info["vllm"]["start_s"], 3)
        return completions, info
    start = time.perf_counter()
    common = {
        "n_samples": eval_cfg["n_samples"],
        "temperature": eval_cfg["temperature"],
        "top_p": eval_cfg["top_p"],
        "max_new_tokens": max_new_tokens,
        "seed": seed,
    }
    record = None
    if backend == "vllm":
        completions, seconds = engine.sample(prompts, **common)
        dtype = engine.record["model_dtype"]
        record = engine.record | {"sample_s": round(seconds, 3)}
    else:
        if model is None:
            model, dtype = load_run_model(model_dir, trust_remote_code, dtype=dtype)
        else:
            dtype = dtype or str(next(model.parameters()).dtype).removeprefix("torch.")
        completions = sample_completions(
            model,
            tokenizer,
            prompts,
            batch_size=eval_cfg["batch_size"],
            memory_budget_gb=eval_cfg.get("memory_budget_gb"),
            **common,
        )
    info = {"backend": backend, "dtype": dtype, "generate_s": round(time.perf_counter() - start, 3),
            "vllm": record}  # fmt: skip
    return completions, info


# ------------------------------------------------------------------------------------------ KL


def measure_kl(policy, reference, tokenizer, rows: list[Row], eval_cfg: dict, max_new_tokens: int,
               run: str, task: str) -> dict:  # fmt: skip
    """KL(pi_run || pi_reference) on this task's KL prompts (``kl.estimate_kl``), as the kl.json dict."""
    from workflow_scripts.measures.kl import estimate_kl

    prompt_seed = derive_seed(eval_cfg["seed"], task, "kl-prompts")
    chosen = kl_prompt_indices(len(rows), eval_cfg["kl_prompts"], prompt_seed)
    seed = derive_seed(eval_cfg["seed"], paths.stream_run(run), task, "kl")
    est = estimate_kl(
        policy,
        reference,
        tokenizer,
        [rows[i]["prompt"] for i in chosen],
        n_samples=eval_cfg["kl_samples"],
        max_new_tokens=max_new_tokens,
        batch_size=eval_cfg["batch_size"],
        seed=seed,
        memory_budget_gb=eval_cfg.get("memory_budget_gb"),
    )
    out = est.as_dict()
    timing = {"sample_s": round(out.pop("sample_seconds"), 3), "score_s": round(out.pop("score_seconds"), 3)}
    out.update(
        run=run,
        task=task,
        seed=seed,
        temperature=1.0,
        top_p=1.0,
        max_new_tokens=max_new_tokens,
        prompt_ids=[str(rows[i]["id"]) for i in chosen],
        timing=timing,
    )
    return out


# ------------------------------------------------------------------------------------ the stage


def _read_task_rows(data_path: str | os.PathLike, kind: str) -> list[Row]:
    rows = read_rows(data_path)
    if not rows:
        raise ValueError(f"{data_path}: no problems")
    kinds = {r["kind"] for r in rows}
    if kinds != {kind}:
        raise ValueError(f"{data_path}: rows have kind(s) {sorted(kinds)} but the task's kind is {kind!r}")
    return rows


@dataclass(frozen=True)
class TaskJob:
    """One task of an evaluate job: its settings, eval data, three outputs and (for a trained run) the
    reference base run's samples of the task, which pair dJ."""

    task: str
    cfg: dict
    data: str | os.PathLike
    samples_out: str | os.PathLike
    summary_out: str | os.PathLike
    kl_out: str | os.PathLike
    base_samples: str | os.PathLike | None = None

    def files(self) -> dict:  # the outputs, by their names in a ResultStore
        return {"samples.parquet": self.samples_out, "summary.json": self.summary_out, "kl.json": self.kl_out}


def run(
    *,
    model: str | os.PathLike,
    base: str | os.PathLike,
    data: str | os.PathLike,
    samples_out: str | os.PathLike,
    summary_out: str | os.PathLike,
    kl_out: str | os.PathLike,
    eval_cfg: dict,
    task_cfg: dict,
    run: str,
    task: str,
    base_samples: str | os.PathLike | None = None,
    **job,
) -> tuple[dict, dict]:
    """One (run, task) -> its samples, summary and KL files (``run_tasks`` with one task). Returns
    (summary, kl)."""
    one = TaskJob(task, task_cfg, data, samples_out, summary_out, kl_out, base_samples)
    return run_tasks(model=model, base=base, tasks=[one], eval_cfg=eval_cfg, run=run, **job)[0]


def run_tasks(
    *,
    model: str | os.PathLike,
    base: str | os.PathLike,
    tasks: list[TaskJob],
    eval_cfg: dict,
    run: str,
    reference_run: str | None = None,
    policy_dtype: str | None = None,
    reference_dtype: str | None = None,
    threads: int = 1,
    trust_remote_code: bool = False,
    bf16_matmul: str = "auto",
    resume: dict | None = None,
) -> list[tuple[dict, dict]]:
    """The ``evaluate`` rule: one run on one task (``eval.jobs: per_task``) or on every task
    (``per_run``), each task's samples, summary and KL files written atomically when it is done.

    The tokenizer, the vLLM engine (backend vllm: every task sampled through one start, then shut down),
    the policy and the reference are loaded once per job, whatever its number of tasks; every number of a
    task is the same in both job shapes (its seeds depend on the run and the task only).

    ``model`` in ``policy_dtype`` (None: as saved) is the policy; ``base`` in ``reference_dtype`` (None:
    the policy's dtype) the KL reference; a task's ``base_samples`` pair dJ; ``bf16_matmul`` how a bf16
    model's products run (``bf16_matmul.resolve``: auto = emulated on a CPU without bf16 GEMM kernels;
    recorded as ``bf16_matmul`` in both files): the rule and the CLI pass the run's training setting
    (``runtime.eval_matmul``); ``resume``: {dir, code} (module docstring). Returns [(summary, kl)]."""
    startup_s = process_age_s()
    limit_threads(threads)
    reference_run = reference_run or run
    rows = {job.task: _read_task_rows(job.data, job.cfg["kind"]) for job in tasks}  # every input, first
    stream = paths.stream_run(run)  # a repeat draws its run's streams
    seeds = {job.task: derive_seed(eval_cfg["seed"], stream, job.task, "eval") for job in tasks}
    for job in tasks:
        log.info("%s/%s: %d problems x %d samples, seed %d", run, job.task, len(rows[job.task]),
                 eval_cfg["n_samples"], seeds[job.task])  # fmt: skip
    store = ResultStore(resume["dir"]) if resume else None
    settings = [eval_cfg, run, reference_run, policy_dtype, reference_dtype, bf16_matmul, threads,
                resume and resume.get("code")]  # fmt: skip
    keys, done = {}, {}
    for job in tasks if store else ():
        keys[job.task] = inputs_key([*settings, job.task, job.cfg], [model, base, job.data, job.base_samples])
        if store.restore(job.task, keys[job.task], job.files()):  # finished by an earlier attempt
            log.info("%s/%s: restored from %s, not recomputed", run, job.task, store.root)
            done[job.task] = (read_json(job.summary_out), read_json(job.kl_out))
    if store and len(done) == len(tasks):
        store.clear(keys)
        return [done[job.task] for job in tasks]
    start = time.perf_counter()
    tokenizer = load_tokenizer(model, trust_remote_code)
    load_s = time.perf_counter() - start
    generated: dict[str, tuple[list[Completion], dict]] = {}
    if eval_cfg["backend"] == "vllm":  # vLLM holds the GPU while it samples: models after it
        from workflow_scripts.models.vllm_backend import open_engine

        with open_engine(
            model, tokenizer, eval_cfg.get("vllm"), policy_dtype, seeds[tasks[0].task], threads
        ) as engine:
            for job in (job for job in tasks if not done.get(job.task)):
                generated[job.task] = generate(
                    model, [r["prompt"] for r in rows[job.task]], eval_cfg, job.cfg["max_new_tokens"],
                    seeds[job.task], trust_remote_code, tokenizer=tokenizer, engine=engine,
                )  # fmt: skip
        log.info("vLLM engine: started in %.1fs, sampled %d task(s), shut down", engine.record["start_s"],
                 len(tasks))  # fmt: skip
    start = time.perf_counter()
    policy, reference = load_pair(model, base, policy_dtype, reference_dtype, trust_remote_code)
    load_s += time.perf_counter() - start
    log_startup(startup_s, load_s)
    log.info("%s: started after %.1fs, tokenizer and models loaded in %.1fs (policy %s, reference %s)",
             run, startup_s, load_s, dtype_of(policy), dtype_of(reference))  # fmt: skip
    bf16 = "bfloat16" in (dtype_of(policy), dtype_of(reference))
    matmul = resolve_matmul(bf16_matmul, next(policy.parameters()).device.type) if bf16 else "native"
    shared = {"run": run, "reference_run": reference_run, "model_dir": str(model), "startup_s": startup_s,
              "load_s": load_s, "tasks_in_job": len(tasks), "matmul": matmul if bf16 else None}  # fmt: skip
    results = []
    for job in tasks:
        if done.get(job.task):
            results.append(done[job.task])
            continue
        if job.task not in generated:
            with matmul_context(matmul):
                generated[job.task] = generate(
                    model, [r["prompt"] for r in rows[job.task]], eval_cfg, job.cfg["max_new_tokens"],
                    seeds[job.task], trust_remote_code, model=policy, tokenizer=tokenizer,
                    dtype=dtype_of(policy),
                )  # fmt: skip
        completions, info = generated.pop(job.task)
        results.append(_finish_task(job, rows[job.task], completions, info, seeds[job.task], policy,
                                    reference, tokenizer, eval_cfg, threads, shared))  # fmt: skip
        if store:
            store.save(job.task, keys[job.task], job.files())
    if store:
        store.clear(keys)
    return results


def _finish_task(job: TaskJob, rows: list[Row], completions: list[Completion], info: dict, seed: int,
                 policy, reference, tokenizer, eval_cfg: dict, threads: int,
                 shared: dict) -> tuple[dict, dict]:  # fmt: skip
    """Score, summarize and measure KL for one task of a job, then write its three files."""
    run, task, reference_run, matmul = shared["run"], job.task, shared["reference_run"], shared["matmul"]
    log.info("%s/%s: generated %d completions in %.1fs (%s, %s)", run, task, len(completions),
             info["generate_s"], info["backend"], info["dtype"])  # fmt: skip
    start = time.perf_counter()
    samples = score(rows, completions, job.cfg["kind"], eval_cfg, workers=threads, run=run, task=task,
                    settings=job.cfg.get("verifier"))  # fmt: skip
    score_s = time.perf_counter() - start
    paired = read_parquet(job.base_samples) if job.base_samples and reference_run != run else None
    summary = summarize(samples, eval_cfg["n_samples"], paired)
    summary.update(
        run=run,
        task=task,
        kind=job.cfg["kind"],
        role=job.cfg.get("role"),
        backend=info["backend"],
        dtype=info["dtype"],
        vllm=info["vllm"],
        bf16_matmul=matmul,
        model_dir=shared["model_dir"],
        seed=seed,
        reference_run=reference_run,
        sampling={
            "temperature": eval_cfg["temperature"],
            "top_p": eval_cfg["top_p"],
            "max_new_tokens": job.cfg["max_new_tokens"],
            "n_samples": eval_cfg["n_samples"],
        },
        timing={
            "startup_s": round(shared["startup_s"], 3),
            "load_s": round(shared["load_s"], 3),
            "tasks_in_job": shared["tasks_in_job"],
            "generate_s": info["generate_s"],
            "score_s": round(score_s, 3),
            "completions_per_s": round(len(completions) / max(info["generate_s"], 1e-9), 2),
        },
    )
    summary = finite(summary)
    with matmul_context(matmul or "native"):
        kl = measure_kl(policy, reference, tokenizer, rows, eval_cfg, job.cfg["max_new_tokens"], run, task)
    kl.update(
        reference_run=reference_run,
        policy_dtype=dtype_of(policy),
        reference_dtype=dtype_of(reference),
        bf16_matmul=matmul,
    )
    kl = finite(kl)
    write_parquet(job.samples_out, samples)
    write_json(job.summary_out, summary)
    write_json(job.kl_out, kl)
    log.info("%s/%s: pass@1 %.4f +- %s; counts %s; dJ %s vs %s", run, task, summary["pass_at_1"],
             summary["pass_at_1_se"], summary["counts"], summary["dJ"], reference_run)  # fmt: skip
    log.info("%s/%s: KL k1 %.4g +- %s, k3 %.4g +- %s (%d prompts x %d) vs %s in %s", run, task, kl["k1_mean"],
             kl["k1_se"], kl["k3_mean"], kl["k3_se"], kl["n_prompts"], kl["n_samples"], reference_run,
             kl["reference_dtype"])  # fmt: skip
    return summary, kl


def from_snakemake(smk) -> None:
    """Both job shapes of the rule (rules/evaluate.smk): one task (wildcard ``task``, outputs are files) or
    every task of the run (``eval.jobs: per_run``: outputs, data and base samples are lists in the order of
    ``params.tasks``)."""
    tasks = dict(smk.params.tasks)
    names = list(tasks)

    def per_task(files) -> list:
        return [files] if isinstance(files, str) else list(files)

    base_samples = smk.input.get("base_samples")
    base_samples = per_task(base_samples) if base_samples else [None] * len(names)
    jobs = [
        TaskJob(task, dict(tasks[task]), data, samples, summary, kl, paired)
        for task, data, samples, summary, kl, paired in zip(
            names, per_task(smk.input.data), per_task(smk.output.samples), per_task(smk.output.summary),
            per_task(smk.output.kl), base_samples, strict=True,
        )
    ]  # fmt: skip
    run_tasks(
        model=smk.input.model,
        base=smk.input.base,
        tasks=jobs,
        eval_cfg=dict(smk.params.eval),
        run=smk.wildcards.run,
        threads=smk.threads,
        trust_remote_code=smk.params.trust_remote_code,
        bf16_matmul=smk.params.bf16_matmul,  # the run's training path (runtime/eval_matmul.py)
        resume={"dir": paths.eval_resume_dir(smk.wildcards.run), "code": smk.params.code},
        **dict(smk.params.reference),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Evaluate a run on tasks (one job, models loaded once): pass@1 and KL to its base."
    )
    parser.add_argument("--config", default="config.yaml")
    parser.add_argument("--run", default=paths.BASE)
    parser.add_argument("--task", action="append", help="a task of the config (repeatable; default: all)")
    parser.add_argument("--results", default=paths.RESULTS)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    from workflow_scripts.runtime.codehash import code_version
    from workflow_scripts.runtime.config import load_config

    config = load_config(args.config)
    res = args.results
    reference = paths.reference_spec(config, args.run)
    known = config["data"]["tasks"]
    if unknown := sorted(set(args.task or ()) - set(known)):
        parser.error(f"--task {', '.join(unknown)}: not in data.tasks of {args.config} ({', '.join(known)})")
    jobs = [
        TaskJob(task, known[task], paths.eval_data(task, res), paths.eval_samples(args.run, task, res),
                paths.eval_summary(args.run, task, res), paths.kl_summary(args.run, task, res),
                None if reference["reference_run"] == args.run
                else paths.eval_samples(reference["reference_run"], task, res))
        for task in (args.task or known)
    ]  # fmt: skip
    run_tasks(model=paths.model_dir(args.run, res), base=paths.base_model_dir(res), tasks=jobs,
              eval_cfg=config["eval"], run=args.run, threads=args.threads,
              trust_remote_code=config["model"]["trust_remote_code"],
              bf16_matmul=eval_bf16_matmul(config, args.run), **reference,
              resume={"dir": paths.eval_resume_dir(args.run, res), "code": code_version("evaluate")},
              )  # fmt: skip
    return 0


if __name__ == "__main__":
    main_from(globals())
