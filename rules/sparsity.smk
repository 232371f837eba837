# sparsity: which weights did training move, per run (workflow_scripts/sparsity.py), compared with the
# base cast to the run's saved dtype (the run's real start point). First runs only: `{seed}` is digits
# (common.smk), so a repeat's folder seed<s>-r<k> never matches, and all_targets asks for the seeds.
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

