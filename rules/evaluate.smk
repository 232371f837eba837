# evaluate: one job per (run, task) writes the samples, the pass@1 summary and the KL to the run's
# reference base (workflow_scripts/evaluate.py), loading the policy and the base once. run = base,
# base-<dtype> (the base cast to an arm's param dtype) or <precision>-s<seed> (paths.py). A trained run
# is paired (dJ) with the samples of its reference base run and its KL is measured against the base in
# its arm's param dtype (evaluate_reference). params = the eval section + this task's entry + the
# reference, so changing an analysis or train setting never reruns evaluation, and adding a task adds
# only that task's jobs. bf16_matmul: the path the run's bf16 products took in training (its arm's
# precision field; a bf16 base run: the one its arms share), so evaluation computes as training did.

# Input functions (evaluate_inputs, evaluate_reference, evaluate_matmul, evaluate_task) live in common.smk (snakemake --lint).


rule evaluate:
    input:
        unpack(evaluate_inputs),
    output:
        samples=str(paths.eval_samples("{run}", "{task}")),
        summary=str(paths.eval_summary("{run}", "{task}")),
        kl=str(paths.kl_summary("{run}", "{task}")),
    params:
        eval=config["eval"],
        task=evaluate_task,
        reference=evaluate_reference,
        bf16_matmul=evaluate_matmul,
        trust_remote_code=config["model"]["trust_remote_code"],
        code=code("evaluate"),
    log:
        "logs/evaluate/{run}/{task}.log",
    benchmark:
        "benchmarks/evaluate/{run}/{task}.tsv"
    conda:
        "../envs/train.yaml"
    threads: job_threads("evaluate")
    resources:
        **job_resources("evaluate"),
    script:
        "../workflow_scripts/evaluate.py"
