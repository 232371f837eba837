#!/usr/bin/env bash
# The wheels bench/gpu_check.sh installs on a lent GPU machine (no network there; its image has torch, numpy,
# pandas, pyarrow, scipy and their kin, not TRL, vLLM or Snakemake), downloaded here into DEST (default
# $REPO/.whl, git-ignored; a device run carries it: run(carry=[".whl"])) and held to 64 MiB, what may
# travel. Pure-Python wheels only, so the image's Python version does not matter; a module the image lacks
# beyond these shows up in gpu_check's summary ("missing modules"). Versions: pyproject.toml's pins.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="${1:-$REPO/.whl}"
PYTHON="${PYTHON:-$REPO/.venv/bin/python}"
LIMIT_BYTES=$(( 64 * 1024 * 1024 ))
mkdir -p "$DEST"
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: -d "$DEST" \
  trl==1.16.0 transformers==5.24.0 accelerate==1.15.0 datasets==5.2.0 huggingface_hub==2.4.0 \
  math-verify==0.9.0 latex2sympy2-extended==1.11.0 antlr4-python3-runtime==4.13.2 \
  snakemake==9.27.1 snakemake-interface-common==1.23.0 snakemake-interface-executor-plugins==9.4.0 \
  snakemake-interface-logger-plugins==2.1.0 snakemake-interface-report-plugins==1.3.0 \
  snakemake-interface-scheduler-plugins==2.0.2 snakemake-interface-storage-plugins==4.4.1 \
  yte==1.9.4 dpath==2.2.0 conda-inject==1.3.2 configargparse==1.9.0 throttler==1.2.3 smart-open==7.7.1 \
  argparse-dataclass==2.0.0 humanfriendly==10.0 tabulate==0.10.0 pulp==3.3.2 gitpython==3.2.1 gitdb==4.0.12 \
  smmap==5.0.3 docutils==0.22.4 nbformat==5.11.1 fastjsonschema==2.22.3 jupyter-core==5.9.1 traitlets==5.16.1 \
  jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 seaborn==0.13.2
TOTAL=$(du -cb "$DEST"/*.whl | tail -1 | cut -f1)
echo "gpu_check_wheels: $(ls "$DEST"/*.whl | wc -l) wheels, $(( TOTAL / 1024 / 1024 )) MiB in $DEST"
[ "$TOTAL" -le "$LIMIT_BYTES" ] || { echo "gpu_check_wheels: more than 64 MiB: too large to travel" >&2; exit 1; }
