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
ARGS ?=
JOB ?= train_sparse
RAY_PORT ?= 6379
RAY_DASHBOARD_PORT ?= 8265
RAY_AGENT_PORT ?= 52365
RAY_CLIENT_PORT ?= 10001
RAY_CPUS ?= $(shell nproc)
HEAD_PID := runs/ray-head.pid
# `make mlflow-server`: one tracking server for jobs on every node. Loopback unless MLFLOW_HOST opts in to a
# private address the nodes can reach; extra flags (--allowed-hosts) in MLFLOW_SERVER_ARGS. MLFLOW_APP: MLflow's
# app plugin; wxray's (wxray/tracking_ui.py) opens the UI in model-training mode, basic-auth adds logins.
MLFLOW_APP ?= wxray
MLFLOW_HOST ?= 127.0.0.1
MLFLOW_PORT ?= 5000
MLFLOW_SERVER_ARGS ?=
MLFLOW_PID := runs/mlflow-server.pid
MLFLOW_PROBE_HOST = $(if $(filter 0.0.0.0 ::,$(MLFLOW_HOST)),127.0.0.1,$(MLFLOW_HOST))

.PHONY: setup demo demo-e2e demo-edm demo-uplift demo-ensemble calibrate-dropout test test-fast lint bench mlflow-ui clean train ray-up submit ray-down \
	mlflow-server mlflow-server-down

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# Bytecode in one parallel pass at the end (pip compiles serially, package by package): half the time on 2
	# cores. Made here, not on first import: PYTHONDONTWRITEBYTECODE=1 environments would recompile every process.
	$(BIN)/pip install -q --no-compile "$(TORCH_SPEC)" "setuptools>=69" wheel
	# torch-harmonics >= 0.9.3 requires torch 2.14 (a CUDA build); 0.8.0 builds against the torch above.
	$(BIN)/pip install -q --no-compile --no-build-isolation "$(HARMONICS_SPEC)"
	$(BIN)/pip install -q --no-compile -e ".[dev]"
	@# Left out: third-party examples and files written for a newer Python (torch's py312_intrinsics.py), which
	@# do not parse on 3.11 and are never imported here. Anything else that fails to compile stops setup.
	@# Kept: torch/numpy/xarray.testing, which every process imports (uncompiled: 0.5 s more per process start).
	$(BIN)/python -m compileall -q -j 0 -x '/examples/|/py3[0-9]+_[^/]*\.py$$' $(VENV)/lib
	touch $(STAMP)

demo: setup
	$(BIN)/python jobs/train_sparse.py

# The end-to-end system on the sample: four stages (run name e2e), a forecast with station scores.
demo-e2e: setup
	for stage in encoder processor decoder chain; do \
		$(BIN)/python jobs/train_e2e.py stage=$$stage $(ARGS) || exit 1; done
	$(BIN)/python jobs/forecast_e2e.py

# The generative Res-Slim-EDM on the sample (run name edm): its 4-sample ensembles on the test split, scored.
demo-edm: setup
	$(BIN)/python jobs/train_sparse.py --config configs/edm_demo.yaml $(ARGS)
	$(BIN)/python jobs/evaluate.py forecast=runs/train_sparse/edm/forecast.zarr truth=data/sample_32x64.zarr \
		baseline=persistence out_dir=runs/evaluate/edm plots=false

# The stochastic uplift of the demo chain (finetunes if missing), its 4 x 4 nested ensemble and the deterministic
# chain over the paper's ten leads (10 steps of 6 h), scored against each other (docs/RESULTS.md).
UPLIFT_STEPS ?= 10
demo-uplift: setup
	test -d runs/train_e2e/e2e/chain || $(MAKE) demo-e2e
	test -d runs/train_e2e/e2e/stochastic_encoder || $(BIN)/python jobs/finetune_stochastic.py stage=encoder
	test -d runs/train_e2e/e2e/stochastic_processor || $(BIN)/python jobs/finetune_stochastic.py stage=processor
	$(BIN)/python jobs/forecast_e2e.py steps=$(UPLIFT_STEPS) out_dir=runs/forecast_e2e/deterministic
	$(BIN)/python jobs/forecast_e2e.py steps=$(UPLIFT_STEPS) members.M=4 members.N=4 out_dir=runs/forecast_e2e/uplift
	$(BIN)/python jobs/evaluate.py forecast=runs/forecast_e2e/uplift/forecast.zarr truth=data/sample_32x64.zarr \
		baseline=runs/forecast_e2e/deterministic/forecast.zarr out_dir=runs/evaluate/uplift

# Nested 4 x 4 (x 2 routing) ensembles of the uplifted chain on Ray actors, then each stream denied in turn.
# Builds what it needs first: the chain (demo-e2e) and its stochastic uplift. The OSE runs on a copy of the
# stages (e2e_deny, links but for its encoder) whose encoder noise was finetuned with streams withheld
# (stochastic.deny_prob), so that it has learned what a missing stream costs (docs/RESULTS.md).
DENY_STAGES := runs/train_e2e/e2e_deny
demo-ensemble: setup
	test -d runs/train_e2e/e2e/chain || $(MAKE) demo-e2e
	test -d runs/train_e2e/e2e/stochastic_encoder || $(BIN)/python jobs/finetune_stochastic.py stage=encoder
	test -d runs/train_e2e/e2e/stochastic_processor || $(BIN)/python jobs/finetune_stochastic.py stage=processor
	$(BIN)/python jobs/ensemble.py members.M=4 members.N=4 members.R=2 out_dir=runs/ensemble/demo $(ARGS)
	test -d $(DENY_STAGES)/stochastic_encoder || { mkdir -p $(DENY_STAGES) && \
		for s in chain decoder encoder processor stochastic_processor; do ln -sfn ../e2e/$$s $(DENY_STAGES)/$$s; done && \
		$(BIN)/python jobs/finetune_stochastic.py stage=encoder stochastic.deny_prob=0.3 stages=$(DENY_STAGES); }
	$(BIN)/python jobs/ose.py stages=$(DENY_STAGES) members.M=4 members.N=4 members.R=2 out_dir=runs/ose/demo $(ARGS)

# The uplifted chain's inference dropout p, scored by spread-skill (the paper's selection of p = 0.05).
calibrate-dropout: setup
	for p in 0.05 0.1 0.2; do \
		$(BIN)/python jobs/forecast_e2e.py members.M=1 members.N=8 dropout=$$p out_dir=runs/calibrate_dropout/p$$p \
		&& $(BIN)/python jobs/evaluate.py forecast=runs/calibrate_dropout/p$$p/forecast.zarr \
			truth=data/sample_32x64.zarr out_dir=runs/calibrate_dropout/p$$p/evaluate plots=false || exit 1; done

train: setup   # make train ARGS="model.keep_ratio=0.5 train.epochs=10"
	$(BIN)/python jobs/train_sparse.py $(ARGS)

# A local Ray cluster for `ray job submit`, started from the venv (its python is what jobs run with).
# --block ties the head's processes to one process group, so `make ray-down` stops this cluster and no other.
# Every fixed port a head needs is checked first (another Ray often holds the job agent's), and the head is
# reported up only once its own job agent answers (wxray/platform/cluster/head.py).
HEAD := $(BIN)/python -m wxray.platform.cluster.head
ray-up: setup
	@mkdir -p runs
	@PATH=$(CURDIR)/$(BIN):$$PATH RAY_AUTH_MODE=token $(HEAD) up --pid $(HEAD_PID) --log runs/ray-head.log \
		--ray $(BIN)/ray --port=$(RAY_PORT) --dashboard-port=$(RAY_DASHBOARD_PORT) \
		--dashboard-agent-listen-port=$(RAY_AGENT_PORT) --ray-client-server-port=$(RAY_CLIENT_PORT) --cpus=$(RAY_CPUS)

# Submits jobs/$(JOB).py; WXRAY_HOME makes its outputs and MLflow runs land here, not in Ray's copy. A failed
# submission (no head, no agent) is one line, not the CLI's traceback.
submit: setup
	@RAY_AUTH_MODE=token $(HEAD) submit --ray $(BIN)/ray --dashboard-port $(RAY_DASHBOARD_PORT) -- \
		--working-dir . --runtime-env-json '{"env_vars": {"WXRAY_HOME": "$(CURDIR)"}}' \
		-- python jobs/$(JOB).py $(ARGS)

# Waits until the head has drained and its ports are free again (up to a minute).
ray-down:
	@$(HEAD) down --pid $(HEAD_PID)

# Two pytest workers, a test file each at a time (its fixtures built once), each with its own session Ray cluster:
# most of a Ray test's time is spent waiting for processes to start, so two run side by side on two cores.
PYTEST_PARALLEL ?= -n 2 --dist loadfile --no-loadscope-reorder
test: setup
	$(BIN)/python -m pytest $(PYTEST_PARALLEL) $(PYTEST_ARGS)

test-fast: setup
	$(BIN)/python -m pytest -m "not slow" $(PYTEST_PARALLEL) $(PYTEST_ARGS)

lint: setup
	$(BIN)/ruff check wxray jobs tests benchmarks

bench: setup
	$(BIN)/python benchmarks/bench_sparse.py
	$(BIN)/python benchmarks/bench_data.py
	$(BIN)/python benchmarks/bench_setconv.py
	$(BIN)/python benchmarks/bench_significance.py

# MLflow 3's UI opens experiments on its GenAI overview unless the link says otherwise: open the printed links
# (the runs table with each job's metrics as columns; wxray/tracking_view.py says why).
MLFLOW_UI_PORT ?= 5000
# MLflow 3's servers start a job runner and huey consumers for its GenAI jobs (judges, prompt optimisation), which
# nothing here uses: 15 processes instead of 7, ~8 CPU-s more per start (measured 2026-12-05). MLFLOW_JOBS=true
# brings them back.
MLFLOW_JOBS ?= false
mlflow-ui mlflow-server: export MLFLOW_SERVER_ENABLE_JOB_EXECUTION = $(MLFLOW_JOBS)
mlflow-ui: setup
	@mkdir -p runs
	@echo "MLflow UI on http://127.0.0.1:$(MLFLOW_UI_PORT) (Ctrl-C stops it); open an experiment's runs table:"
	@$(BIN)/python -m wxray.tracking_view sqlite:///$(CURDIR)/runs/mlflow.db http://127.0.0.1:$(MLFLOW_UI_PORT)
	$(BIN)/mlflow ui --app-name wxray --backend-store-uri sqlite:///$(CURDIR)/runs/mlflow.db --host 127.0.0.1 --port $(MLFLOW_UI_PORT)

# A tracking server (sqlite under runs/, artifacts served through the server) for jobs on a cluster: they log over
# HTTP with MLFLOW_TRACKING_URI=http://<host>:$(MLFLOW_PORT), never to a shared sqlite file. setsid puts the server
# and its workers in one process group, so `make mlflow-server-down` stops exactly them.
mlflow-server: setup
	@mkdir -p runs/mlflow-server-artifacts
	@if [ -f $(MLFLOW_PID) ] && kill -0 $$(cat $(MLFLOW_PID)) 2>/dev/null; then \
		echo "an MLflow server started by make is already running (pid $$(cat $(MLFLOW_PID)))"; exit 1; fi
	setsid nohup $(BIN)/mlflow server --app-name $(MLFLOW_APP) --host $(MLFLOW_HOST) --port $(MLFLOW_PORT) \
		--backend-store-uri sqlite:///$(CURDIR)/runs/mlflow-server.db \
		--serve-artifacts --artifacts-destination $(CURDIR)/runs/mlflow-server-artifacts \
		$(MLFLOW_SERVER_ARGS) > runs/mlflow-server.log 2>&1 & echo $$! > $(MLFLOW_PID)
	@for i in $$(seq 60); do \
		if $(BIN)/python -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)" \
			http://$(MLFLOW_PROBE_HOST):$(MLFLOW_PORT)/health >/dev/null 2>&1; then \
			echo "MLflow server up: export MLFLOW_TRACKING_URI=http://$(MLFLOW_HOST):$(MLFLOW_PORT);" \
				"stop with make mlflow-server-down (log: runs/mlflow-server.log)"; exit 0; fi; \
		kill -0 $$(cat $(MLFLOW_PID)) 2>/dev/null || break; sleep 1; done; \
		echo "the MLflow server did not answer on port $(MLFLOW_PORT); see runs/mlflow-server.log"; \
		kill -- -$$(cat $(MLFLOW_PID)) 2>/dev/null; rm -f $(MLFLOW_PID); exit 1

mlflow-server-down:
	@if [ -f $(MLFLOW_PID) ]; then kill -- -$$(cat $(MLFLOW_PID)) 2>/dev/null || true; rm -f $(MLFLOW_PID); \
		echo "stopped the MLflow server started by make mlflow-server"; \
		else echo "no MLflow server started by make mlflow-server"; fi

clean:
	rm -rf runs .pytest_cache
