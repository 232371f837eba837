# base_model: the base model every arm starts from, saved in model.dtype (workflow_scripts/base_model.py).
# It reads the warm-start pool and the on-task eval set (its greedy accuracy is recorded); params = the
# model section + the data keys the warm start depends on (base_model.recipe: the on-task and real tasks,
# never a synthetic off-task one), so adding a synthetic off-task task never rebuilds it. With
# model.shipped it loads the shipped base (data/base) after checking its sha256s and recipe: those files
# are inputs, so a rebuilt base (`make base`) reruns it.
rule base_model:
    input:
        unpack(base_model_inputs),
    output:
        model=directory(str(paths.base_model_dir())),
        record=str(paths.base_record()),
    params:
        model=config["model"],
        data=shipped_base.recipe(config["model"], config["data"])["data"],
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
    retries: job_retries("base_model")
    script:
        "../workflow_scripts/base_model.py"
