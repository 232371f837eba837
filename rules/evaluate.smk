# evaluate / kl: one job per run x task; logic and tests in workflow_scripts/evaluate.py (estimators:
# passk.py, kl.py). run = base (results/models/base) or {precision}-s{seed} (the train stage's model folder),
# loaded in the dtype it was saved in. A non-base evaluate also reads the base run's samples of the same
# task (paired dJ). params = the eval keys each rule uses + the task entry, so changing an analysis or
# train setting never reruns evaluation, and eval.kl_* settings rerun only the kl rule.

# Input functions (get_model_dir, evaluate_inputs) live in common.smk.

# GPU hook: GPU slots one evaluate/kl job asks for (0 on CPU configs); a GPU profile/colleague sets this.
EVAL_GPUS = 0
EVAL_PARAMS = {k: v for k, v in config["eval"].items() if k not in ("kl_prompts", "kl_samples")}
KL_PARAMS = {k: v for k, v in config["eval"].items() if k not in ("n_samples", "temperature", "top_p",
                                                                    "verify_timeout", "code_timeout",
                                                                    "backend")}


rule evaluate:
    input:
        unpack(evaluate_inputs),
    output:
        samples=f"{RESULTS}/eval/{{run}}/{{task}}.samples.parquet",
        summary=f"{RESULTS}/eval/{{run}}/{{task}}.json",
    params:
        eval=EVAL_PARAMS,
        task=lambda wc: config["data"]["tasks"][wc.task],
        trust_remote_code=config["model"]["trust_remote_code"],
    log:
        "logs/evaluate/{run}/{task}.log",
    benchmark:
        "benchmarks/evaluate/{run}/{task}.tsv"
    conda:
        "../envs/train.yaml"
    threads: 1
    resources:
        mem_mb=4000,
        gpu=EVAL_GPUS,
    script:
        "../scripts/evaluate.py"


rule kl:
    input:
        model=get_model_dir,
        base=f"{RESULTS}/models/base",
        data=f"{RESULTS}/data/eval/{{task}}.jsonl",
    output:
        kl=f"{RESULTS}/eval/{{run}}/{{task}}.kl.json",
    params:
        eval=KL_PARAMS,
        task=lambda wc: config["data"]["tasks"][wc.task],
        trust_remote_code=config["model"]["trust_remote_code"],
    log:
        "logs/kl/{run}/{task}.log",
    benchmark:
        "benchmarks/kl/{run}/{task}.tsv"
    conda:
        "../envs/train.yaml"
    threads: 1
    resources:
        mem_mb=4000,
        gpu=EVAL_GPUS,
    script:
        "../scripts/kl.py"
