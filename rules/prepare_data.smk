# prepare_train / prepare_eval: the data sets of config `data:` (workflow_scripts/prepare_data.py).
# One prepare_eval job per task, params = that task's entry (+ data.seed, + data.train for train_val), so
# adding or changing a task reruns only its own data and evaluation. prepare_train writes the training
# prompts and the warm-start pool, deduplicated against the REAL (hub/local) eval sets only: synthetic
# eval sets are held out by construction (synthetic.on_side). Adding a real-data task therefore may
# rerun training: contamination is a real dependency. prepare_train also writes train.curriculum's
# phase prompt sets (data/curriculum/phase{k}.jsonl), de-duplicated the same way.
rule prepare_eval:
    input:
        hub=lambda wildcards: hub_inputs([config["data"]["tasks"][wildcards.task]]),
    output:
        eval=str(paths.eval_data("{task}")),
    params:
        data=prepare_eval_data,
        code=code("prepare_data"),
    log:
        "logs/prepare_eval/{task}.log",
    benchmark:
        "benchmarks/prepare_eval/{task}.tsv"
    conda:
        "../envs/core.yaml"
    threads: job_threads("prepare_eval")
    resources:
        **job_resources("prepare_eval"),
    script:
        "../workflow_scripts/prepare_data.py"


rule prepare_train:
    input:
        real_evals=[str(paths.eval_data(task)) for task in REAL_TASKS],
        # data.train's and the phases' copies, and the real tasks' (on_bad_row: skip re-reads them)
        hub=hub_inputs([config["data"]["train"], *CURRICULUM, *config["data"]["tasks"].values()]),
    output:
        train=str(paths.data_dir() / "train.jsonl"),
        sft=str(paths.data_dir() / "sft.jsonl"),
        summary=str(paths.data_dir() / "prepare.json"),
        **CURRICULUM_FILES,
    params:
        data=prepare_train_data(),
        curriculum=CURRICULUM,
        code=code("prepare_data"),
    log:
        "logs/prepare_train/prepare_train.log",
    benchmark:
        "benchmarks/prepare_train/prepare_train.tsv"
    conda:
        "../envs/core.yaml"
    threads: job_threads("prepare_train")
    resources:
        **job_resources("prepare_train"),
    script:
        "../workflow_scripts/prepare_data.py"
