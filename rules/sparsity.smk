rule sparsity:
    input:
        base=rules.base_model.output.model,
        final=f"{RESULTS}/train/{{precision}}/seed{{seed}}/model",
    output:
        table=f"{RESULTS}/sparsity/{{precision}}/seed{{seed}}.parquet",
        summary=f"{RESULTS}/sparsity/{{precision}}/seed{{seed}}.summary.json",
    params:
        etas=config["sparsity"]["etas"],
    log:
        "logs/sparsity/{precision}/seed{seed}.log",
    benchmark:
        "benchmarks/sparsity/{precision}/seed{seed}.tsv"
    conda:
        "../envs/core.yaml"
    threads: 1
    resources:
        mem_mb=2000,
    script:
        "../scripts/sparsity.py"


rule overlap:
    input:
        base=rules.base_model.output.model,
        finals=expand(f"{RESULTS}/train/{{{{precision}}}}/seed{{seed}}/model", seed=SEEDS),
    output:
        table=f"{RESULTS}/sparsity/{{precision}}/overlap.parquet",
        by_module=f"{RESULTS}/sparsity/{{precision}}/overlap.by_module.parquet",
    params:
        etas=config["sparsity"]["etas"],
        seeds=SEEDS,
    log:
        "logs/overlap/{precision}.log",
    benchmark:
        "benchmarks/overlap/{precision}.tsv"
    conda:
        "../envs/core.yaml"
    threads: 1
    resources:
        mem_mb=2000,
    script:
        "../scripts/overlap.py"
