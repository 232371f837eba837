#!/usr/bin/env bash
# Device check for a lent GPU, one command: bash bench/gpu_check.sh [WORKDIR]   (docs/device-check.md)
#
# For a GPU machine with no network and no vLLM (the device image: torch, no TRL). It runs, each step in its
# own process and under a timeout from what is left of GPU_CHECK_BUDGET_S (default 540 s: it ends within
# 9 minutes, 15 s kept for the summary):
#   1. trainer memory probes (bench/gpu_check.py probe): Qwen2 at config.one-node.yaml's 1.5B shapes at
#      T = 3072 and config.paper.yaml's 7B shapes cut to 4 layers at T = 4096, fp32 and bf16 arms, against
#      workflow_scripts/runtime/memory_plan.py within 15%;
#   2. FSDP2 in one process on the device (bench/gpu_check.py fsdp);
#   3. the Snakemake smoke with the HF sampler: bench/gpu_smoke.sh on config.gpu-check.yaml (into WORKDIR/smoke);
# then WORKDIR/summary.md (a table a person reads) and summary.json; exit 1 when a step failed.
#
# Wheels: when GPU_CHECK_WHEELS (default $REPO/.whl; bench/gpu_check_wheels.sh fills it, <= 64 MiB) holds
# wheels, they are installed (--no-deps --no-index) into WORKDIR/venv over the image's own packages
# (--system-site-packages), and every step runs with that venv's python.
# CPU twin (tests/workflow/test_gpu_check.py): GPU_CHECK_TINY=1 (the probes at tiny shapes) and
# GPU_CHECK_SMOKE=0 (no smoke: tests/workflow/test_gpu_smoke.py runs the HF smoke's own CPU twin).
set -uo pipefail

START=$(date +%s)
BUDGET="${GPU_CHECK_BUDGET_S:-540}"
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WORKDIR="$(mkdir -p "${1:-$REPO/results/gpu-check}" && cd "${1:-$REPO/results/gpu-check}" && pwd)"
PYTHON="${PYTHON:-$REPO/.venv/bin/python}"
[ -x "$PYTHON" ] || PYTHON="$(command -v python3)"
WHEELS="${GPU_CHECK_WHEELS:-$REPO/.whl}"

export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export CUBLAS_WORKSPACE_CONFIG=:4096:8 PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"

if compgen -G "$WHEELS/*.whl" >/dev/null; then
  echo "gpu_check: installing $(ls "$WHEELS"/*.whl | wc -l) wheels from $WHEELS into $WORKDIR/venv"
  "$PYTHON" -m venv --system-site-packages "$WORKDIR/venv" \
    && "$WORKDIR/venv/bin/python" -m pip install -q --no-deps --no-index "$WHEELS"/*.whl >"$WORKDIR/wheels.log" 2>&1 \
    && PYTHON="$WORKDIR/venv/bin/python" || echo "gpu_check: wheel install failed (see $WORKDIR/wheels.log)"
fi

left() { echo $(( BUDGET - ($(date +%s) - START) - 15 )); }

# step NAME OUT COMMAND...: runs COMMAND under the time left; when it leaves no OUT, NAME.err says why.
step() {
  local name="$1" out="$2" seconds
  shift 2
  seconds="$(left)"
  if [ "$seconds" -le 5 ]; then
    echo "not run: the ${BUDGET} s budget was spent" >"$WORKDIR/$name.err"
    return
  fi
  echo "gpu_check: $name (at most ${seconds} s)"
  timeout -k 5 "$seconds" "$@" >"$WORKDIR/$name.log" 2>&1
  local rc=$?
  if [ ! -s "$out" ]; then
    { echo "exit $rc$([ "$rc" -eq 124 ] && echo ' (timed out)')"; tail -c 1500 "$WORKDIR/$name.log"; } \
      >"$WORKDIR/$name.err"
  fi
}

rm -rf "$WORKDIR"/probe.*.json "$WORKDIR"/*.err "$WORKDIR/fsdp.json" "$WORKDIR/smoke.skipped" "$WORKDIR/smoke"
CASES="one-node 7b-cut"
[ "${GPU_CHECK_TINY:-0}" = 1 ] && CASES="tiny"
for case in $CASES; do
  for arm in fp32 bf16; do
    step "probe.$case.$arm" "$WORKDIR/probe.$case.$arm.json" \
      "$PYTHON" "$REPO/bench/gpu_check.py" probe --case "$case" --arm "$arm" --out "$WORKDIR/probe.$case.$arm.json"
  done
done
step fsdp "$WORKDIR/fsdp.json" "$PYTHON" "$REPO/bench/gpu_check.py" fsdp --out "$WORKDIR/fsdp.json"

if [ "${GPU_CHECK_SMOKE:-1}" = 0 ]; then
  echo "GPU_CHECK_SMOKE=0: not run (the CPU twin; tests/workflow/test_gpu_smoke.py runs the HF smoke on CPU)" \
    >"$WORKDIR/smoke.skipped"
else
  # what the whole workflow imports (its stages and analysis), checked before minutes are spent on it
  MISSING="$("$PYTHON" -c 'import importlib.util as u, sys; print(" ".join(m for m in sys.argv[1:] if u.find_spec(m) is None))' \
    snakemake yaml jsonschema numpy pandas pyarrow scipy statsmodels matplotlib seaborn torch transformers trl \
    accelerate datasets math_verify safetensors tokenizers)"
  if [ -n "$MISSING" ]; then
    echo "not run: missing modules: $MISSING (add their wheels: bench/gpu_check_wheels.sh)" >"$WORKDIR/smoke.err"
  else
    GPU_SMOKE_CONFIG="$REPO/config.gpu-check.yaml" PYTHON="$PYTHON" \
      step smoke "$WORKDIR/smoke/gpu_smoke.json" bash "$REPO/bench/gpu_smoke.sh" "$WORKDIR/smoke"
  fi
fi

"$PYTHON" "$REPO/bench/gpu_check.py" summary --workdir "$WORKDIR" --budget-s "$BUDGET" \
  --elapsed-s "$(( $(date +%s) - START ))"
