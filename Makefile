# Two commands on a fresh machine: `make demo` (install + run the pipeline on the embedded defaults)
# and `make test` (install + run the tests). Both install what they need into .venv.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

# No phone-home anywhere: tests, demo, UI.
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export MLFLOW_DISABLE_TELEMETRY := true
export DO_NOT_TRACK := 1
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export DVC_NO_ANALYTICS := 1
export PREFECT_HOME := $(CURDIR)/.prefect
export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS := 180
# llama-cpp-python compiles from source: build only the library the server needs (no llava, tools,
# examples or tests) and use both cores.
export CMAKE_ARGS ?= -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF
export CMAKE_BUILD_PARALLEL_LEVEL ?= 2

.PHONY: install sandbox-backend demo storage test test-fast coverage mlflow-ui prefect-ui serve retrain benchmarks bench-rl replay critique critique-lm arena mtrouter orchestra clean

# `make install` (and `make demo`) installs what the main pipeline needs; a target that needs a feature's
# extra (pyproject.toml: orchestrator, mtrouter, team, dev) depends on install-EXTRA, which adds it; `make
# test` installs them all in one pip run (`all`), which also counts as the main install.
define new_venv
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip wheel
	$(BIN)/pip install --quiet torch==2.13.0
endef

$(STAMP): pyproject.toml
	$(new_venv)
	$(BIN)/pip install --quiet -e .
	touch $(STAMP)

$(VENV)/.installed-all: pyproject.toml
	$(new_venv)
	$(BIN)/pip install --quiet -e ".[all]"
	touch $(STAMP) $@

$(VENV)/.installed-%: $(STAMP)
	$(BIN)/pip install --quiet -e ".[$*]"
	touch $@

.PRECIOUS: $(VENV)/.installed-%  # a stamp, not an intermediate file for make to delete

install: sandbox-backend $(STAMP)
install-%: sandbox-backend $(VENV)/.installed-%
	@:

# The python tool runs model-written code only inside bubblewrap (README: "The code sandbox"); without
# it the tool refuses and the sandbox tests skip. Installed here on Debian/Ubuntu when we are root.
sandbox-backend:
	@command -v bwrap >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing bubblewrap, the code sandbox's isolation backend"; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap libseccomp2 >/dev/null) \
	      || echo "could not install bubblewrap: the python tool will refuse to run code"; \
	  else \
	    echo "bubblewrap (bwrap) is missing: the python tool will refuse to run code until it is installed" \
	         "(Debian/Ubuntu: sudo apt-get install -y bubblewrap; Fedora: sudo dnf install bubblewrap)"; \
	  fi; }

demo: install
	PATH="$(CURDIR)/$(BIN):$$PATH" routerops run main

# Point this checkout at the team's S3 store (README: "Team storage"): the endpoint from
# ROUTEROPS_S3_ENDPOINT_URL into the git-ignored .dvc/config.local, the buckets created; keys from AWS_*.
storage: install-team
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m services.s3

# Two pytest-xdist workers by default (PYTEST_WORKERS=0: one process), a test module to a worker
# (--dist loadscope: a module's servers and stores are set up once), each worker with its own Prefect
# home (tests/conftest.py). The servers and subprocesses the tests start wait on I/O much of the time,
# so two workers keep both cores busy (docs/operations/tests.md).
PYTEST_WORKERS ?= 2
test: install-all
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadscope

# The inner loop: unit tests only, no server, subprocess pipeline or model training (marked slow/e2e).
test-fast: install-all
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m pytest -n $(PYTEST_WORKERS) -m "not slow and not e2e"

# `make test` with line coverage of the project's packages ([tool.coverage] in pyproject.toml).
coverage: install-all
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadscope \
		--cov --cov-report=term --cov-report=json:coverage.json

# The store follows its project folder: opening it first rewrites the artifact paths of a moved or copied
# store (evaluation/mlflow_store.py; docs/operations/runs.md).
mlflow-ui: install
	MLFLOW_TRACKING_URI=sqlite:///mlflow/mlflow.db PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m evaluation.tracking
	MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/mlflow ui --backend-store-uri sqlite:///mlflow/mlflow.db \
		--default-artifact-root mlflow/artifacts --host 127.0.0.1 --port $${MLFLOW_PORT:-5000}

# The Prefect UI over the flow runs `make demo` and the other flows left in .prefect (PREFECT_HOME), on
# any port (`make prefect-ui PREFECT_PORT=4255`): the UI's browser code calls the API at PREFECT_UI_API_URL,
# which otherwise names port 4200 whatever --port says.
PREFECT_PORT ?= 4200
prefect-ui: install
	PREFECT_UI_API_URL=http://127.0.0.1:$(PREFECT_PORT)/api PREFECT_SERVER_API_PORT=$(PREFECT_PORT) PATH="$(CURDIR)/$(BIN):$$PATH" \
		$(BIN)/prefect server start --host 127.0.0.1 --port $(PREFECT_PORT)

# routerops as a team's service: a real Prefect server (or the one PREFECT_API_URL names), the cpu/gpu
# work pools, every deployment (the retrain on its cron and on published price books / pools) and a worker.
serve: install-team
	PATH="$(CURDIR)/$(BIN):$$PATH" routerops serve

# One retrain by hand, under the price book and pool in force (params.yaml: ops).
retrain: install
	PATH="$(CURDIR)/$(BIN):$$PATH" routerops run retrain

# RouteLLM's GSM8K logged outcomes (bundled in datasets/): every router, MTRouter included, cross-fitted.
replay: install
	PATH="$(CURDIR)/$(BIN):$$PATH" routerops import-routellm --csv datasets/routellm/gsm8k_responses.csv \
		--contaminated datasets/routellm/gsm8k_contaminated_prompts.jsonl --train datasets/gsm8k/train_first8.jsonl \
		--out data/replay/routellm_gsm8k.parquet
	PATH="$(CURDIR)/$(BIN):$$PATH" routerops replay --table data/replay/routellm_gsm8k.parquet \
		--prices configs/prices/routellm-2024.yaml --out reports/replay/routellm_gsm8k.csv

# Critique-and-route (paper 002) + CoRL budget modes (003) on RouteLLM's GSM8K logs (params.yaml: critique).
critique: install
	PATH="$(CURDIR)/$(BIN):$$PATH" routerops run critique

# The LM critique-and-route / CoRL controllers (issue 24; params.yaml: critique_lm): warm-up SFT, RL through
# the shared core, evaluation on the fixed split's test queries, then registration through the gate.
critique-lm: install-orchestrator
	PATH="$(CURDIR)/$(BIN):$$PATH" routerops run critique-lm

# Every method on RouteLLM's GSM8K pool under one split, paired comparisons at matched cost (issue 39;
# params.yaml: arena): benchmarks/results/arena.json and reports/arena/accuracy_cost.png. Resumable.
arena: install
	PATH="$(CURDIR)/$(BIN):$$PATH" routerops run arena

# MTRouter at small scale on ScienceWorld with the embedded pool (params.yaml: mtrouter).
mtrouter: install-mtrouter
	PATH="$(CURDIR)/$(BIN):$$PATH" routerops run mtrouter

# The orchestrator (paper 004) at small scale: teacher → verifier filter → SFT of SmolLM2-135M → evaluate
# before/after SFT and RL beside the baselines → register (params.yaml: orchestra). ~30 min on 2 cores before
# the 16-step RL stage of issue 23, which adds roughly 10-15 min (not re-timed end to end).
orchestra: install-orchestrator
	PATH="$(CURDIR)/$(BIN):$$PATH" routerops run orchestra

benchmarks: install
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python benchmarks/collect_throughput.py
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python benchmarks/routing_latency.py
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python benchmarks/sandbox_overhead.py

# Seconds per RL step and peak RSS of our trainer vs TRL's GRPOTrainer (G=4, 256-token prompt, 64-token
# completions; a few minutes on 2 cores). Scale up with ARGS, e.g. make bench-rl ARGS="--group-size 8 --rounds 3".
bench-rl: install-orchestrator
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python benchmarks/rl_step.py $(ARGS)

clean:
	rm -rf data reports .routerops .prefect
