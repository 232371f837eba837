# rlvr-precision: does floating-point precision change what RL fine-tuning of an LLM does?
# The DAG: prepare_eval (task) + prepare_train -> base_model -> train (precision x seed) -> evaluate (run x task)
#          -> sparsity/overlap -> aggregate -> analysis. See README.md.
# No `configfile:` here: rules/common.smk reads config.yaml, or the --configfile you give INSTEAD of it.
from snakemake.utils import min_version

min_version("9.0")


report: "report/workflow.rst"


include: "rules/common.smk"
include: "rules/fetch.smk"
include: "rules/prepare_data.smk"
include: "rules/base_model.smk"
include: "rules/train.smk"
include: "rules/evaluate.smk"
include: "rules/sparsity.smk"
include: "rules/overlap.smk"
include: "rules/analysis.smk"


rule all:
    input:
        all_targets(),
    default_target: True
