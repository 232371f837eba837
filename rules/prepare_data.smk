rule prepare_data:
    output:
        **data_outputs(),
    params:
        data=config["data"],
    log:
        "logs/prepare_data/prepare_data.log",
    benchmark:
        "benchmarks/prepare_data/prepare_data.tsv"
    conda:
        "../envs/core.yaml"
    threads: 1
    script:
        "../scripts/prepare_data.py"
