# train: one GRPO/DAPO fine-tune per (precision, seed); code in workflow_scripts/train.py.
# Checkpoints live OUTSIDE the outputs, in results/checkpoints/{precision}/seed{seed}/ (Snakemake deletes
# directory() outputs and failed jobs' outputs before a rerun): a killed job resumes from its last
# checkpoint when it is run again; the folder is deleted after a successful run.
# params = the train section + this precision arm (+ the base model's dtype/trust flags) + the code
# version, so changing an eval/analysis setting never reruns training. `processes` (the run's world size,
# from train.distributed or one per GPU of resources.train) is a param: a new world size retrains.
# GPUs, threads and memory: config `resources.train` (job_threads/job_resources, rules/common.smk). retries:
# under a SLURM profile, what the run's estimate needs to finish by resuming within the partition's time
# limit (job_retries; workflow_scripts/runtime/retries.py), else the profile's.
# heldout.jsonl: the run's held-out curve, measured during training on every task's eval set (an input)
# with the settings heldout_spec collects (train.eval_* and the eval section's sampling and verifiers:
# a param, so changing them retrains; other eval settings do not). curriculum: train.curriculum's phases.


rule train:
    input:
        train=rules.prepare_train.output.train,
        base=rules.base_model.output.model,
        record=rules.base_model.output.record,
        heldout_data=[str(paths.eval_data(task)) for task in heldout_spec(config)["tasks"]],
        curriculum=list(CURRICULUM_FILES.values()),
    output:
        model=directory(str(paths.train_dir("{precision}", "{seed}") / "model")),
        metrics=str(paths.train_dir("{precision}", "{seed}") / "metrics.jsonl"),
        run=str(paths.train_dir("{precision}", "{seed}") / "run.json"),
        heldout=str(paths.train_dir("{precision}", "{seed}") / HELDOUT_FILE),
    params:
        train=without_heldout(config["train"]),
        heldout=heldout_spec(config),
        precision=lambda wc: paths.run_precision(config, wc.precision),
        model={k: config["model"][k] for k in ("dtype", "trust_remote_code")},
        checkpoints=lambda wc: str(paths.checkpoint_dir(wc.precision, wc.seed)),
        verifier=config["data"]["train"]["verifier"],
        processes=train_processes(config),
        snapshots={},  # rule train_snapshots: {step: folder}
        code=code("train"),
    log:
        "logs/train/{precision}/seed{seed}.log",
    benchmark:
        "benchmarks/train/{precision}/seed{seed}.tsv"
    conda:
        "../envs/train.yaml"
    threads: job_threads("train")
    resources:
        **job_resources("train"),
    retries: job_retries("train")
    script:
        "../workflow_scripts/train.py"


# train_repeat: a repeat of one (precision, seed) (config `repeats`, the numerical noise floor): the same
# job with the same seed, in its own folders results/train/{precision}/seed{seed}-r{repeat} (repeat >= 2)
# and checkpoints; run.json records the repeat. Every other setting is the train rule's.
use rule train as train_repeat with:
    output:
        model=directory(str(paths.train_dir("{precision}", "{seed}", repeat="{repeat}") / "model")),
        metrics=str(paths.train_dir("{precision}", "{seed}", repeat="{repeat}") / "metrics.jsonl"),
        run=str(paths.train_dir("{precision}", "{seed}", repeat="{repeat}") / "run.json"),
        heldout=str(paths.train_dir("{precision}", "{seed}", repeat="{repeat}") / HELDOUT_FILE),
    params:
        checkpoints=lambda wc: str(paths.checkpoint_dir(wc.precision, wc.seed, repeat=wc.repeat)),
    log:
        "logs/train/{precision}/seed{seed}-r{repeat}.log",
    benchmark:
        "benchmarks/train/{precision}/seed{seed}-r{repeat}.tsv"


# train_snapshots: the reference arm's train job when config `snapshots` has steps: the same job, which
# also saves the policy at those steps into results/train/{arm}/seed{seed}/snapshots/step{k} (outputs,
# evaluated as runs {arm}-s{seed}@step{k}: the movement-matched comparison, statistics/matched.py). Its
# outputs match the reference arm only; ruleorder makes it the reference's train job.
if SNAPSHOT_STEPS:
    REFERENCE_RUN_DIR = paths.train_dir(f"{{precision,{re.escape(PRECISIONS[0])}}}", "{seed}")

    use rule train as train_snapshots with:
        output:
            model=directory(str(REFERENCE_RUN_DIR / "model")),
            metrics=str(REFERENCE_RUN_DIR / "metrics.jsonl"),
            run=str(REFERENCE_RUN_DIR / "run.json"),
            heldout=str(REFERENCE_RUN_DIR / HELDOUT_FILE),
            **{f"snapshot{k}": directory(str(paths.snapshot_in(REFERENCE_RUN_DIR, k))) for k in SNAPSHOT_STEPS},
        params:
            snapshots=lambda wc: {k: str(paths.snapshot_dir(wc.precision, wc.seed, k)) for k in SNAPSHOT_STEPS},

    ruleorder: train_snapshots > train
