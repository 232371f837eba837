# train: one GRPO/DAPO fine-tune per (precision, seed); logic and tests in workflow_scripts/train.py.
# Checkpoints live OUTSIDE the outputs, in results/checkpoints/{precision}/seed{seed}/ (Snakemake deletes
# directory() outputs and failed jobs' outputs before a rerun): a killed job resumes from its last
# checkpoint when it is run again; the folder is deleted after a successful run.
# params = the train section + this precision mode (+ the base model's dtype/trust flags), so changing an
# eval/analysis setting never reruns training.

# GPU hook: GPU slots one training job asks for (0 on CPU configs). A GPU profile/colleague sets this
# (e.g. from the profile's resources); with >1 the job has to be launched through `accelerate launch`
# (see workflow_scripts/train.py), the `script:` below is the single-process path.
TRAIN_GPUS = 0


rule train:
    input:
        train=data_outputs()["train"],
        base=rules.base_model.output.model,
        record=rules.base_model.output.record,
    output:
        model=directory(f"{RESULTS}/train/{{precision}}/seed{{seed}}/model"),
        metrics=f"{RESULTS}/train/{{precision}}/seed{{seed}}/metrics.jsonl",
        run=f"{RESULTS}/train/{{precision}}/seed{{seed}}/run.json",
    params:
        train=config["train"],
        precision=lambda wc: config["precisions"][wc.precision],
        model={k: config["model"][k] for k in ("dtype", "trust_remote_code")},
        checkpoints=lambda wc: f"{RESULTS}/checkpoints/{wc.precision}/seed{wc.seed}",
    log:
        "logs/train/{precision}/seed{seed}.log",
    benchmark:
        "benchmarks/train/{precision}/seed{seed}.tsv"
    conda:
        "../envs/train.yaml"
    threads: 1
    resources:
        mem_mb=4000,
        gpu=TRAIN_GPUS,
    script:
        "../scripts/train.py"
