# base_model: the base model every arm starts from, saved in model.dtype (workflow_scripts/base_model.py).
# It reads the warm-start pool and the on-task eval set (its greedy accuracy is recorded); params = the
# model section + the on-task entry only, so adding an off-task task never rebuilds it.
rule base_model:
    input:
        sft=rules.prepare_train.output.sft,
        on_task=str(paths.eval_data(ON_TASK)),
    output:
        model=directory(str(paths.base_model_dir())),
        record=str(paths.base_record()),
    params:
        model=config["model"],
        data={"tasks": {ON_TASK: config["data"]["tasks"][ON_TASK]}},
        code=code("base_model"),
    log:
        "logs/base_model/base_model.log",
    benchmark:
        "benchmarks/base_model/base_model.tsv"
    conda:
        "../envs/train.yaml"
    threads: job_threads("base_model")
    resources:
        **job_resources("base_model"),
    script:
        "../workflow_scripts/base_model.py"
