# sparsity: which weights did training move, per run (workflow_scripts/sparsity.py); overlap: do the seeds
# of one arm move the same weights (workflow_scripts/overlap.py). Both compare with the base cast to the
# run's saved dtype (the run's real start point).
rule sparsity:
    input:
        base=rules.base_model.output.model,
        final=rules.train.output.model,
    output:
        table=str(paths.sparsity_table("{precision}", "{seed}")),
        summary=str(paths.sparsity_summary("{precision}", "{seed}")),
    params:
        etas=config["sparsity"]["etas"],
        code=code("sparsity"),
    log:
        "logs/sparsity/{precision}/seed{seed}.log",
    benchmark:
        "benchmarks/sparsity/{precision}/seed{seed}.tsv"
    conda:
        "../envs/core.yaml"
    threads: job_threads("sparsity")
    resources:
        **job_resources("sparsity"),
    script:
        "../workflow_scripts/sparsity.py"


rule overlap:
    input:
        base=rules.base_model.output.model,
        finals=lambda wc: [str(paths.train_dir(wc.precision, s) / "model") for s in SEEDS],
    output:
        table=str(paths.overlap_table("{precision}")),
        by_module=str(paths.overlap_by_module("{precision}")),
    params:
        etas=config["sparsity"]["etas"],
        seeds=SEEDS,
        code=code("overlap"),
    log:
        "logs/overlap/{precision}.log",
    benchmark:
        "benchmarks/overlap/{precision}.tsv"
    conda:
        "../envs/core.yaml"
    threads: job_threads("overlap")
    resources:
        **job_resources("overlap"),
    script:
        "../workflow_scripts/overlap.py"
