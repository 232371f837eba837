# evaluate: pass@1 by sampling and KL to the run's reference base (workflow_scripts/evaluate.py), the
# tokenizer, the policy, the base (and a vLLM engine) loaded once per job. Two job shapes (config
# eval.jobs): per_task, one job per (run, task), where changing one task's settings reruns only that
# task's jobs (the CPU default: small jobs spread over the cores); per_run, one job per run for every
# task (GPU configs: one engine start and one model load per run instead of one per task; a task's
# change reruns every run's evaluation). Every number is the same in both shapes. run = base,
# base-<dtype> (the base cast to an arm's param dtype) or <precision>-s<seed> (paths.py). A trained run
# is paired (dJ) with the samples of its reference base run and its KL is measured against the base in
# its arm's param dtype (evaluate_reference). params = the eval section + the tasks' entries + the
# reference, so changing an analysis or train setting never reruns evaluation. bf16_matmul: the path
# the run's bf16 products took in training (its arm's precision field; a bf16 base run: the one its
# arms share), so evaluation computes as training did.

# Input functions (evaluate_inputs, evaluate_reference, evaluate_matmul, evaluate_tasks) and the job's shape
# (evaluate_outputs, EVALUATE_JOB) live in common.smk (snakemake --lint).

rule evaluate:
    input:
        unpack(evaluate_inputs),
    output:
        samples=evaluate_outputs(paths.eval_samples),
        summary=evaluate_outputs(paths.eval_summary),
        kl=evaluate_outputs(paths.kl_summary),
    params:
        eval=config["eval"],
        tasks=evaluate_tasks,
        reference=evaluate_reference,
        bf16_matmul=evaluate_matmul,
        trust_remote_code=config["model"]["trust_remote_code"],
        code=code("evaluate"),
    log:
        f"logs/evaluate/{EVALUATE_JOB}.log",
    benchmark:
        f"benchmarks/evaluate/{EVALUATE_JOB}.tsv"
    conda:
        "../envs/train.yaml"
    threads: job_threads("evaluate")
    resources:
        **job_resources("evaluate"),
    retries: job_retries("evaluate")
    script:
        "../workflow_scripts/evaluate.py"


# evaluate_snapshot: a snapshot of the reference (run {arm}-s{seed}@step{k}, config snapshots) on every
# off-task task in one job (one start-up and model load for its tasks: they are 4 jobs' work in one), for
# the movement-matched comparison (statistics/matched.py). Otherwise the evaluate job: its inputs, params
# and numbers (a snapshot draws its run's eval streams, paths.stream_run).
if SNAPSHOT_RUNS:
    SNAPSHOT_RUN = "{run," + "|".join(re.escape(r) for r in SNAPSHOT_RUNS) + "}"

    use rule evaluate as evaluate_snapshot with:
        output:
            samples=[str(paths.eval_samples(SNAPSHOT_RUN, t)) for t in OFF_TASKS],
            summary=[str(paths.eval_summary(SNAPSHOT_RUN, t)) for t in OFF_TASKS],
            kl=[str(paths.kl_summary(SNAPSHOT_RUN, t)) for t in OFF_TASKS],
        log:
            "logs/evaluate/{run}.log",
        benchmark:
            "benchmarks/evaluate/{run}.tsv"
