# Fresh machine -> results or green tests. `make run` and `make test` do all set-up themselves.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
CORES ?= 2
# Test workers: the suite is start-up bound (each end-to-end test's jobs import torch one at a time), so
# two workers keep both cores busy; loadfile keeps a module's tests and its shared fixtures on one worker.
TEST_WORKERS ?= 2
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: setup run test lint dryrun dag bench clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# the CPU wheel first: an unpinned resolve would pull a multi-GB CUDA build
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev,slurm,tracking]'
	touch $(STAMP)

setup: $(STAMP)

run: $(STAMP)
	$(BIN)/snakemake --cores $(CORES)

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadfile

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/snakemake --lint

dryrun: $(STAMP)
	$(BIN)/snakemake -n

dag: $(STAMP)
	$(BIN)/snakemake --rulegraph | dot -Tpng > rulegraph.png  # the README's command

bench: $(STAMP)
	for b in bench/bench_*.py; do $(BIN)/python $$b || exit 1; done

clean:
	rm -rf results logs benchmarks .snakemake
