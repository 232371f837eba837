rule base_model:
    input:
        sft=rules.prepare_data.output.sft,
        evals=rules.prepare_data.output.evals,
    output:
        model=directory(f"{RESULTS}/models/base"),
        record=f"{RESULTS}/models/base.json",
    params:
        model=config["model"],
        tasks=config["data"]["tasks"],
    log:
        "logs/base_model/base_model.log",
    benchmark:
        "benchmarks/base_model/base_model.tsv"
    conda:
        "../envs/train.yaml"
    threads: 2
    resources:
        mem_mb=4000,
    script:
        "../scripts/base_model.py"
