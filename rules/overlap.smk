# overlap: do the seeds of one arm move the same weights (workflow_scripts/overlap.py)? Each seed is
# compared with the base cast to the run's saved dtype, as in rules/sparsity.smk. The configured seeds
# only: a repeat (config `repeats`, the noise floor) is not a seed, so it is never an extra seed pair;
# of an arm with its own seeds (a 16-seed reference) those among config `seeds` (paths.overlap_seeds).
rule overlap:
    input:
        base=rules.base_model.output.model,
        finals=lambda wc: [
            str(paths.train_dir(wc.precision, s) / "model") for s in paths.overlap_seeds(config, wc.precision)
        ],
    output:
        table=str(paths.overlap_table("{precision}")),
        by_module=str(paths.overlap_by_module("{precision}")),
    params:
        etas=config["sparsity"]["etas"],
        seeds=lambda wc: paths.overlap_seeds(config, wc.precision),
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
