#!/usr/bin/env bash
# GPU smoke check, one command: bash bench/gpu_smoke.sh [WORKDIR]   (docs/gpu-and-slurm.md, "GPU smoke check")
#
# First a preflight (bench/gpu_smoke.py preflight): prints the NVIDIA driver, the CUDA version torch was
# built with, the GPU and its memory, and stops with exit 3 and one line saying what to install when the
# driver is too old for the torch wheel (torch 2.13.0 from PyPI is a CUDA 13.0 build: driver >= 580), torch
# is a CPU build beside a driver, or torch sees no GPU; without a driver it says so and the GPU-only checks
# are skipped. Then it runs the whole workflow on config.gpu-smoke.yaml (a 0.36B Llama built locally,
# 2 arms x 1 seed, vLLM rollouts and evaluation) in WORKDIR (default results/gpu-smoke; its results/,
# logs/, benchmarks/ are the workflow's), offline, then bench/gpu_smoke.py, which writes
# WORKDIR/gpu_smoke.json (checks and figures, each check with a status and a reason) and exits 1 when a
# check fails. The script always gets to the JSON: a failed job shows up
# there as failed checks (and in WORKDIR/snakemake.log and WORKDIR/logs/), not as a lost run.
#
# Environment: GPU_SMOKE_CONFIG (default config.gpu-smoke.yaml; tests/workflow/test_gpu_smoke.py passes a tiny
# CPU copy), GPU_SMOKE_CORES (default: all cores), PYTHON (default .venv/bin/python, else python3).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WORKDIR="$(mkdir -p "${1:-$REPO/results/gpu-smoke}" && cd "${1:-$REPO/results/gpu-smoke}" && pwd)"
CONFIG="$(realpath "${GPU_SMOKE_CONFIG:-$REPO/config.gpu-smoke.yaml}")"
PYTHON="${PYTHON:-$REPO/.venv/bin/python}"
[ -x "$PYTHON" ] || PYTHON="$(command -v python3)"
SNAKEMAKE="$(dirname "$PYTHON")/snakemake"
[ -x "$SNAKEMAKE" ] || SNAKEMAKE="$(command -v snakemake)"
CORES="${GPU_SMOKE_CORES:-$(nproc)}"

export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"

set +e
"$PYTHON" "$REPO/bench/gpu_smoke.py" preflight --workdir "$WORKDIR" --out "$WORKDIR/gpu_smoke.json"
PREFLIGHT=$?
set -e
[ "$PREFLIGHT" -eq 0 ] || exit "$PREFLIGHT"

# Device memory every 0.5 s with its time, whatever process holds it (vLLM's pool included): the report
# takes each arm's peak from the samples taken while its train job ran.
SAMPLER=""
MEMORY_LOG=""
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then
  MEMORY_LOG="$WORKDIR/gpu_memory.csv"
  nvidia-smi --query-gpu=timestamp,memory.used,memory.total --format=csv,noheader,nounits -lms 500 \
    >"$MEMORY_LOG" &
  SAMPLER=$!
fi
stop_sampler() { [ -n "$SAMPLER" ] && kill "$SAMPLER" 2>/dev/null || true; }
trap stop_sampler EXIT

echo "gpu_smoke: snakemake --cores $CORES --resources gpu=1 --configfile $CONFIG in $WORKDIR"
START_MS=$(( $(date +%s%N) / 1000000 ))
set +e
"$SNAKEMAKE" --snakefile "$REPO/Snakefile" --directory "$WORKDIR" --configfile "$CONFIG" \
  --cores "$CORES" --resources gpu=1 --keep-going --rerun-incomplete >"$WORKDIR/snakemake.log" 2>&1
RC=$?
set -e
ELAPSED_MS=$(( $(date +%s%N) / 1000000 - START_MS ))
SECONDS_TAKEN="$(( ELAPSED_MS / 1000 )).$(printf %03d $(( ELAPSED_MS % 1000 )))"
echo "gpu_smoke: snakemake exited $RC after ${SECONDS_TAKEN}s (log: $WORKDIR/snakemake.log)"

"$PYTHON" "$REPO/bench/gpu_smoke.py" report --config "$CONFIG" --workdir "$WORKDIR" \
  --out "$WORKDIR/gpu_smoke.json" --snakemake-rc "$RC" --snakemake-seconds "$SECONDS_TAKEN" \
  --memory-log "$MEMORY_LOG"
