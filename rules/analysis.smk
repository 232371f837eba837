# analysis: aggregate (tidy tables) -> analysis_stats (H1-H3) -> analysis_figures -> analysis_report.
# Logic and tests in workflow_scripts/aggregate.py, stats.py, figures.py, report.py; the scripts/ adapters
# only pass paths. Inputs are the upstream rules' declared outputs (rules.<rule>.output), nothing else.
# params: aggregate gets the task roles and precision order only, so changing `analysis:` reruns the
# statistics, figures and report but never the aggregation.

ANALYSIS = f"{RESULTS}/analysis"
TASK_ROLES = {task: spec["role"] for task, spec in config["data"]["tasks"].items()}
# figure name -> report category (names are the keys of workflow_scripts.figures.FIGURES)
ANALYSIS_FIGURES = {
    "dJ_by_task": "Performance",
    "variance_ratios": "Variance tests",
    "kl_by_task": "KL to base",
    "sparsity_by_module": "Update sparsity",
    "sparsity_vs_eta": "Update sparsity",
    "training_curves": "Training",
}


FIGURE_OUTPUTS = {
    name: report(f"{ANALYSIS}/figures/{name}.png", caption=f"../report/{name}.rst", category=category)
    for name, category in ANALYSIS_FIGURES.items()
}


rule aggregate:
    input:
        evals=expand(rules.evaluate.output.summary, run=RUNS, task=TASKS),
        kls=expand(rules.kl.output.kl, run=RUNS, task=TASKS),
        train_metrics=expand(rules.train.output.metrics, precision=PRECISIONS, seed=SEEDS),
        train_runs=expand(rules.train.output.run, precision=PRECISIONS, seed=SEEDS),
        sparsity=expand(rules.sparsity.output.summary, precision=PRECISIONS, seed=SEEDS),
    output:
        metrics=f"{ANALYSIS}/metrics.parquet",
        curves=f"{ANALYSIS}/training_curves.parquet",
        sparsity=f"{ANALYSIS}/sparsity.parquet",
    params:
        roles=TASK_ROLES,
        precisions=PRECISIONS,
    log:
        "logs/aggregate/aggregate.log",
    benchmark:
        "benchmarks/aggregate/aggregate.tsv"
    conda:
        "../envs/analysis.yaml"
    threads: 1
    resources:
        mem_mb=2000,
    script:
        "../scripts/aggregate.py"


rule analysis_stats:
    input:
        metrics=rules.aggregate.output.metrics,
    output:
        stats=report(f"{ANALYSIS}/stats.json", caption="../report/stats.rst", category="Report"),
    params:
        analysis=config["analysis"],
        precisions=PRECISIONS,
    log:
        "logs/analysis_stats/analysis_stats.log",
    benchmark:
        "benchmarks/analysis_stats/analysis_stats.tsv"
    conda:
        "../envs/analysis.yaml"
    threads: 1
    resources:
        mem_mb=2000,
    script:
        "../scripts/analysis_stats.py"


rule analysis_figures:
    input:
        metrics=rules.aggregate.output.metrics,
        curves=rules.aggregate.output.curves,
        sparsity=rules.aggregate.output.sparsity,
        stats=rules.analysis_stats.output.stats,
    output:
        **FIGURE_OUTPUTS,
    params:
        precisions=PRECISIONS,
    log:
        "logs/analysis_figures/analysis_figures.log",
    benchmark:
        "benchmarks/analysis_figures/analysis_figures.tsv"
    conda:
        "../envs/analysis.yaml"
    threads: 1
    resources:
        mem_mb=2000,
    script:
        "../scripts/analysis_figures.py"


rule analysis_report:
    input:
        stats=rules.analysis_stats.output.stats,
        metrics=rules.aggregate.output.metrics,
        figures=rules.analysis_figures.output,
    output:
        report=report(f"{ANALYSIS}/report.md", caption="../report/report.rst", category="Report"),
    params:
        figures=list(ANALYSIS_FIGURES),
        precisions=PRECISIONS,
    log:
        "logs/analysis_report/analysis_report.log",
    benchmark:
        "benchmarks/analysis_report/analysis_report.tsv"
    conda:
        "../envs/analysis.yaml"
    threads: 1
    resources:
        mem_mb=1000,
    script:
        "../scripts/analysis_report.py"
