# The README's two commands: `make demo` and `make test`. Both build .venv themselves.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# CPU machines take the local CPU wheel; a bare `torch` requirement would pull a multi-GB CUDA build.
TORCH_SPEC ?= $(shell command -v nvidia-smi >/dev/null 2>&1 && echo "torch>=2.4" || echo "torch==2.13.0")
HARMONICS_SPEC ?= $(shell command -v nvidia-smi >/dev/null 2>&1 && echo "torch-harmonics>=0.8,<0.10" || echo "torch-harmonics==0.8.0")
PYTEST_ARGS ?=

.PHONY: setup demo test test-fast lint bench mlflow-ui clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH_SPEC)" "setuptools>=69" wheel
	# torch-harmonics >= 0.9.3 requires torch 2.14 (a CUDA build); 0.8.0 builds against the torch above.
	$(BIN)/pip install -q --no-build-isolation "$(HARMONICS_SPEC)"
	$(BIN)/pip install -q -e ".[dev]"
	touch $(STAMP)

demo: setup
	$(BIN)/python jobs/train_sparse.py

test: setup
	$(BIN)/python -m pytest $(PYTEST_ARGS)

test-fast: setup
	$(BIN)/python -m pytest -m "not slow" $(PYTEST_ARGS)

lint: setup
	$(BIN)/ruff check wxray jobs tests benchmarks

bench: setup
	$(BIN)/python benchmarks/bench_sparse.py
	$(BIN)/python benchmarks/bench_data.py

mlflow-ui: setup
	$(BIN)/mlflow ui --backend-store-uri sqlite:///$(CURDIR)/runs/mlflow.db --host 127.0.0.1 --port 5000

clean:
	rm -rf runs .pytest_cache
