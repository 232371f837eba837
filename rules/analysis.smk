# analysis: aggregate (tidy tables) -> stats (gate, mixed model, H1-H3) -> figures ->
# report; beside them learning_curves (every run's heldout.jsonl -> the curves table and when the arms
# part). Each rule's script: is its stage module (workflow_scripts/aggregate.py, stats.py,
# learning_curves.py, figures.py, report.py: run / from_snakemake / main). Inputs are the upstream rules'
# declared outputs.
# params: aggregate gets the task roles, precision order and each arm's base run only, so changing
# `analysis:` reruns the statistics, figures and report but never the aggregation. The figures are the
# entries of workflow_scripts/plots/figure_list.py (one output and one caption file each).

from workflow_scripts.plots.figure_list import FIGURES, caption_file

ANALYSIS = str(paths.analysis_dir())
TASK_ROLES = {task: spec["role"] for task, spec in config["data"]["tasks"].items()}
FIGURE_OUTPUTS = {
    name: report(f"{ANALYSIS}/figures/{name}.png", caption=caption_file(name), category=category)
    for name, category in FIGURES.items()
}


rule aggregate:
    input:
        evals=expand(rules.evaluate.output.summary, run=RUNS, task=TASKS),
        kls=expand(rules.evaluate.output.kl, run=RUNS, task=TASKS),
        train_metrics=train_outputs("metrics.jsonl"),  # repeats included (common.smk)
        train_runs=train_outputs("run.json"),
        sparsity=[
            str(paths.sparsity_summary(p, s)) for p in PRECISIONS for s in paths.arm_seeds(config, p)
        ],
        overlap=expand(rules.overlap.output.table, precision=PRECISIONS),
    output:
        metrics=f"{ANALYSIS}/metrics.parquet",
        curves=f"{ANALYSIS}/training_curves.parquet",
        sparsity=f"{ANALYSIS}/sparsity.parquet",
        overlap=f"{ANALYSIS}/overlap.parquet",
    params:
        roles=TASK_ROLES,
        precisions=PRECISIONS,
        references={p: paths.reference_run(config, paths.run_name(p, 0)) for p in PRECISIONS},
        code=code("aggregate"),
    log:
        "logs/aggregate/aggregate.log",
    benchmark:
        "benchmarks/aggregate/aggregate.tsv"
    conda:
        "../envs/analysis.yaml"
    threads: job_threads("aggregate")
    resources:
        **job_resources("aggregate"),
    script:
        "../workflow_scripts/aggregate.py"


# snapshot_metrics: the reference's evaluated snapshots (config snapshots; rules/evaluate.smk,
# evaluate_snapshot) and the base runs' off-task summaries as one table, apart from metrics.parquet; the
# stats job reads it for the movement-matched comparison (workflow_scripts/statistics/matched.py).
if SNAPSHOT_RUNS:

    rule snapshot_metrics:
        input:
            evals=[str(paths.eval_summary(r, t)) for r in SNAPSHOT_RUNS + paths.base_runs(config) for t in OFF_TASKS],
            kls=[str(paths.kl_summary(r, t)) for r in SNAPSHOT_RUNS + paths.base_runs(config) for t in OFF_TASKS],
        output:
            table=f"{ANALYSIS}/snapshot_metrics.parquet",
        params:
            roles=TASK_ROLES,
            precisions=PRECISIONS,
            references={p: paths.reference_run(config, paths.run_name(p, 0)) for p in PRECISIONS},
            code=code("snapshot_metrics"),
        log:
            "logs/snapshot_metrics/snapshot_metrics.log",
        benchmark:
            "benchmarks/snapshot_metrics/snapshot_metrics.tsv"
        conda:
            "../envs/analysis.yaml"
        threads: job_threads("aggregate")
        resources:
            **job_resources("aggregate"),
        script:
            "../workflow_scripts/snapshot_metrics.py"


rule stats:
    input:
        metrics=rules.aggregate.output.metrics,
        **({"snapshots": f"{ANALYSIS}/snapshot_metrics.parquet"} if SNAPSHOT_RUNS else {}),
    output:
        stats=report(f"{ANALYSIS}/stats.json", caption="../report/stats.rst", category="Report"),
    params:
        analysis=config["analysis"],
        precisions=config["precisions"],  # arm order and each arm's `control` label
        code=code("stats"),
    log:
        "logs/stats/stats.log",
    benchmark:
        "benchmarks/stats/stats.tsv"
    conda:
        "../envs/analysis.yaml"
    threads: job_threads("stats")
    resources:
        **job_resources("stats"),
    script:
        "../workflow_scripts/stats.py"


rule learning_curves:
    input:
        heldout=train_outputs("heldout.jsonl"),  # repeats included: kept in the table, not in the tests
    output:
        table=f"{ANALYSIS}/heldout_curves.parquet",
        stats=report(
            f"{ANALYSIS}/learning_curves.json", caption="../report/learning_curves.rst", category="Report"
        ),
    params:
        roles=TASK_ROLES,
        precisions=PRECISIONS,
        analysis=config["analysis"],
        code=code("learning_curves"),
    log:
        "logs/learning_curves/learning_curves.log",
    benchmark:
        "benchmarks/learning_curves/learning_curves.tsv"
    conda:
        "../envs/analysis.yaml"
    threads: job_threads("learning_curves")
    resources:
        **job_resources("learning_curves"),
    script:
        "../workflow_scripts/learning_curves.py"


rule figures:
    input:
        metrics=rules.aggregate.output.metrics,
        curves=rules.aggregate.output.curves,
        sparsity=rules.aggregate.output.sparsity,
        overlap=rules.aggregate.output.overlap,
        stats=rules.stats.output.stats,
        heldout=rules.learning_curves.output.table,
    output:
        **FIGURE_OUTPUTS,
    params:
        precisions=PRECISIONS,
        code=code("figures"),
    log:
        "logs/figures/figures.log",
    benchmark:
        "benchmarks/figures/figures.tsv"
    conda:
        "../envs/analysis.yaml"
    threads: job_threads("figures")
    resources:
        **job_resources("figures"),
    script:
        "../workflow_scripts/figures.py"


rule report:
    input:
        stats=rules.stats.output.stats,
        metrics=rules.aggregate.output.metrics,
        overlap=rules.aggregate.output.overlap,
        learning_curves=rules.learning_curves.output.stats,
        figures=rules.figures.output,
        base=rules.base_model.output.record,  # numerics provenance of every record
        runs=train_outputs("run.json"),  # repeats included: a repeat may run on another numerics path
    output:
        report=report(f"{ANALYSIS}/report.md", caption="../report/report.rst", category="Report"),
    params:
        figures=list(FIGURES),
        precisions=PRECISIONS,
        code=code("report"),
    log:
        "logs/report/report.log",
    benchmark:
        "benchmarks/report/report.tsv"
    conda:
        "../envs/analysis.yaml"
    threads: job_threads("report")
    resources:
        **job_resources("report"),
    script:
        "../workflow_scripts/report.py"
