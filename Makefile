# Every target sets itself up: `make setup` (the runtime set) runs first when .venv is missing or
# stale; test, lint, lab and wheels also install the full set (`make setup-full`).
PY      ?= python3.11
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
FULL    := $(VENV)/.installed-full
export PYTHONUNBUFFERED := 1
# the runtime set installs without compiling bytecode: each process writes the bytecode of the modules
# it imports the first time it imports them, so a fresh clone's `make ablation` compiles the ~5,000
# modules a campaign uses, not all ~20,000 installed (a minute on 2 cores). Where
# PYTHONDONTWRITEBYTECODE is set, every process would compile its imports again, ~10 s each: the
# targets' processes write it regardless. setup-full compiles the test set's packages as it installs
# them (~4,600 modules, ~8 s): the suite's many processes import them
unexport PYTHONDONTWRITEBYTECODE
export MPLBACKEND := Agg
CAMPAIGN ?= loo-cpu
RECIPE  ?= scalerl
AXIS    ?=
PORT    ?= 5000
LAB_PORT ?= 8888
# the test suite's Debian packages, without their recommends (Chromium's alone pulled in ~100 desktop
# packages: printing, Samba, Perl), which halved their install on a fresh machine
APT_INSTALL := DEBIAN_FRONTEND=noninteractive apt-get install --no-install-recommends -y -qq >/dev/null
SLURM_DEBS := slurmctld slurmd slurm-client munge
WHEELS_PY ?= 3.12
# make test's pytest-xdist worker processes (0: one process, as plain pytest runs)
TEST_WORKERS ?= 2
# make test's tiers: quick, every test not marked slow (4.5-6.5 min of pytest on 2 cores), or all, which adds
# the slow tier: end-to-end runs through killed servers, SLURM, Ray and PostgreSQL (~20 min). Where CI is
# set (.ci/run sets it) the default is all, and the suite refuses a marker selection (tests/conftest.py)
TESTS   ?= $(if $(CI),all,quick)
TEST_SELECT := $(if $(filter quick,$(TESTS)),-m "not slow")
ifneq ($(filter test,$(MAKECMDGOALS)),)
ifeq ($(filter quick all,$(TESTS)),)
$(error TESTS=$(TESTS): make test runs the quick tier (TESTS=quick, the default) or every test (TESTS=all, the default where CI is set))
endif
endif
# the installer of the pinned sets (runners.setup.install; pip when it cannot be installed)
UV      := uv==0.13.9

.DEFAULT_GOAL := help
.PHONY: help setup setup-full test chromium slurm lint fit-demo bench-fit bench-analysis bench-fsdp bench-predict bench-sizes bench-adaptive bench-runner bench-memory ablation fit lab ui plan train base-model wheels import report postgres tracking-server seeds

help: ## list the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-14s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml requirements.lock
	@command -v $(PY) >/dev/null || { echo "error: $(PY) not found; install Python 3.11 or pass PY=python3.x"; exit 1; }
	@test -x $(BIN)/python || { echo "creating $(VENV) with $(PY)"; $(PY) -m venv $(VENV); }
	@$(BIN)/pip install --quiet --disable-pip-version-check $(UV) 2>/dev/null || \
	  echo "($(UV) could not be installed: pip installs the pinned set instead, in minutes rather than seconds)"
	@$(BIN)/python -m runners.setup.install -r requirements.lock
	@echo "installing this project into $(VENV), editable"
	@$(BIN)/pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	@touch $(STAMP)

$(FULL): $(STAMP) requirements-full.lock
	@$(BIN)/python -m runners.setup.install --compile -r requirements.lock -r requirements-full.lock
	@touch $(FULL)

setup: $(STAMP) ## create .venv with the pinned runtime set (requirements.lock) and the project, editable
setup-full: $(FULL) ## add the pinned test, lint, JupyterLab and Ray set (requirements-full.lock)

test: $(FULL) postgres chromium slurm ## ruff + the quick test tier; TESTS=all (the default under CI) adds the slow tier [TEST_WORKERS=2]
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder $(TEST_SELECT)

chromium: # Debian's headless Chromium, for the test that renders the MLflow UI (installed with apt when root)
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || \
	  { [ "$$(id -u)" = 0 ] && { $(APT_INSTALL) chromium || { apt-get update -qq && $(APT_INSTALL) chromium; }; }; } || \
	  { echo "error: the tests need a headless Chromium: apt-get install chromium"; exit 1; }

slurm: # Debian's SLURM (slurmctld, slurmd, client commands) and munge, for the SLURM backend's tests (installed with apt when root)
	@{ command -v slurmctld && command -v slurmd && command -v sbatch && command -v munged; } >/dev/null 2>&1 || \
	  { [ "$$(id -u)" = 0 ] && { $(APT_INSTALL) $(SLURM_DEBS) || { apt-get update -qq && $(APT_INSTALL) $(SLURM_DEBS); }; }; } || \
	  { echo "error: the tests need Debian's SLURM and munge: apt-get install $(SLURM_DEBS)"; exit 1; }

postgres: # Debian's PostgreSQL server binaries, for the tracking-server test (installed with apt when root)
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null || \
	  { [ "$$(id -u)" = 0 ] && { $(APT_INSTALL) postgresql || { apt-get update -qq && $(APT_INSTALL) postgresql; }; }; } || \
	  { echo "error: the tests need Debian's PostgreSQL server: apt-get install postgresql"; exit 1; }

tracking-server: $(STAMP) postgres ## shared MLflow server on PostgreSQL, 127.0.0.1:5001 [PORT=] [AUTH=1: MLflow basic-auth] (docs/operations.md)
	$(BIN)/python -m runners tracking-server $(if $(filter-out 5000,$(PORT)),--port $(PORT)) $(if $(AUTH),--auth)

lint: $(FULL) ## ruff only
	$(BIN)/ruff check .

fit-demo: $(STAMP) ## fit bundled example curves (paper Table 1 + noise) → artifacts/fit-demo/{fit.json,fit.png}
	$(BIN)/python -m scalefit demo --out artifacts/fit-demo

bench-fit: $(STAMP) ## naive per-cell curve_fit vs the vectorised grid fit; forecast time; fit and forecast time and peak memory up to 200k points
	$(BIN)/python -m tests.bench_fit

bench-analysis: $(STAMP) ## time of `analysis fit` on a recorded campaign's curves.csv, median of 3 wall and CPU times (target <= 10 s) [CAMPAIGN=loo-gpu6]
	$(BIN)/python -m tests.bench_analysis --campaign $(if $(filter-out loo-cpu,$(CAMPAIGN)),$(CAMPAIGN),loo-gpu6)

bench-predict: $(STAMP) ## are predictions where observations land? synthetic (known truth) + results/*/curves.csv, baselines to beat, unstable flag → artifacts/bench-predict/
	$(BIN)/python -m tests.bench_predict

bench-build: $(STAMP) ## are two builds of one base-model key the same weights? deterministic vs default builds, hashes and time [RECIPE=scalerl] [SIZE=] [BUILDS=2]
	$(BIN)/python -m tests.bench_build --recipe $(or $(RECIPE),scalerl) $(if $(SIZE),--size $(SIZE)) --builds $(or $(BUILDS),2) --out artifacts/bench-build

bench-sizes: $(STAMP) ## across-size fit: time for 10 sizes x 5 seeds (target < 5 s) and calibration on synthetic scale studies
	$(BIN)/python -m tests.bench_sizes

bench-adaptive: $(STAMP) ## replay adaptive-campaign decisions on synthetic and recorded curves: right/wrong stops, compute saved
	$(BIN)/python -m tests.bench_adaptive

bench-runner: $(STAMP) ## runner vs plain TRL throughput, evaluation share, packed vs sequential runs [RECIPE=]
	$(BIN)/python -m tests.bench_runner $(if $(filter-out scalerl,$(RECIPE)),$(RECIPE))
	$(BIN)/python -m tests.bench_packing $(if $(filter-out scalerl,$(RECIPE)),$(RECIPE)) --solo

bench-memory: $(STAMP) ## peak memory by phase vs generations per prompt and completion length, GRPO and RLOO → artifacts/bench-memory/
	$(BIN)/python -m tests.bench_memory $(if $(filter-out scalerl,$(RECIPE)),$(RECIPE)) --baseline both

bench-fsdp: $(STAMP) ## a short run's peak memory on each GPU and tokens/s: make bench-fsdp GPUS=4 [CONFIG=experiments/accelerate/fsdp2.yaml] [SHAPE=28x4096] [RECIPE=]
	$(BIN)/python -m tests.bench_fsdp $(if $(filter-out scalerl,$(RECIPE)),$(RECIPE),scalerl-gpu4) --gpus $(or $(GPUS),1) $(if $(CONFIG),--accelerate-config $(CONFIG)) $(if $(SHAPE),--random-model $(SHAPE))

wheels: $(FULL) ## pinned runtime wheels for an offline machine → wheels/ [PROVIDED=file of packages it has] [WITH=ray]
	$(BIN)/python -m runners.setup.wheelhouse --out wheels --python $(WHEELS_PY) $(if $(PROVIDED),--provided $(PROVIDED)) $(foreach w,$(WITH),--with $(w))

import: $(STAMP) ## copy an MLflow store made elsewhere into ./mlflow.db: make import SRC=path/mlflow.db [ARTIFACTS=dir]
	$(BIN)/python -m runners import $(SRC) $(if $(ARTIFACTS),--artifacts $(ARTIFACTS))

# one axis, or runs that failed (exit 1): the fit of what there is, into fit-partial/ (the complete fit stays)
ablation: $(STAMP) ## run a LOO campaign and fit it: make ablation [CAMPAIGN=loo-cpu] [AXIS=loss]
	@$(BIN)/python -m runners campaign $(CAMPAIGN) $(if $(AXIS),--axis $(AXIS)); rc=$$?; \
	  [ $$rc -gt 1 ] && exit $$rc; partial=$(if $(AXIS),--partial); [ $$rc -eq 1 ] && partial=--partial; \
	  $(BIN)/python -m analysis fit $(CAMPAIGN) $$partial || exit $$?; exit $$rc

fit: $(STAMP) ## fit a campaign from MLflow → artifacts/campaigns/NAME/fit/{loo_table.md,curves.csv,loo_curves.png}
	$(BIN)/python -m analysis fit $(CAMPAIGN)

seeds: $(STAMP) ## seed planner: what the seeds resolve, seeds a margin needs: make seeds CAMPAIGN= [CURVES=results/X/curves.csv]
	$(BIN)/python -m analysis plan $(CAMPAIGN) $(if $(CURVES),--curves $(CURVES))

report: $(STAMP) ## a run's Markdown report with plots and anomalies: make report RUN=<run id or name> [CAMPAIGN=]
	@test -n "$(RUN)" || { echo "usage: make report RUN=<run id or name, e.g. baseline/seed0> [CAMPAIGN=loo-cpu]"; exit 2; }
	$(BIN)/python -m analysis report "$(RUN)" $(if $(filter-out loo-cpu,$(CAMPAIGN)),--experiment $(CAMPAIGN))

lab: $(FULL) ## JupyterLab on 127.0.0.1 (token on) with analysis/loo.ipynb over the project's store [LAB_PORT=8888] [CAMPAIGN=]
	@echo "JupyterLab: open the http://127.0.0.1:$(LAB_PORT)/lab?token=... address printed below (store $${MLFLOW_TRACKING_URI:-sqlite:///$(CURDIR)/mlflow.db}, campaign $(CAMPAIGN))"
	MLFLOW_TRACKING_URI=$${MLFLOW_TRACKING_URI:-sqlite:///$(CURDIR)/mlflow.db} PRL_CAMPAIGN=$(CAMPAIGN) \
	  $(BIN)/jupyter lab --ServerApp.ip=127.0.0.1 --ServerApp.port=$(LAB_PORT) --ServerApp.port_retries=0 \
	  --ServerApp.open_browser=False --ServerApp.root_dir=$(CURDIR) $$([ "$$(id -u)" = 0 ] && echo --allow-root) \
	  analysis/loo.ipynb

ui: $(STAMP) ## MLflow UI on 127.0.0.1 over the project's store; prints each campaign's curves address: make ui [PORT=5000] [CAMPAIGN=]
	$(BIN)/python -m runners ui --tracking-uri sqlite:///$(CURDIR)/mlflow.db --port $(PORT) --campaign $(CAMPAIGN)

plan: $(STAMP) ## print the batch plan of a campaign's baseline run, or of a recipe: make plan [CAMPAIGN=loo-cpu | RECIPE=scalerl] [GPUS=N] [CONFIG=experiments/accelerate/fsdp2.yaml]
	$(BIN)/python -m runners plan $(if $(filter command% environment%,$(origin RECIPE)),$(RECIPE),--campaign $(CAMPAIGN)) $(if $(GPUS),--gpus $(GPUS)) $(if $(CONFIG),--accelerate-config $(CONFIG))

train: $(STAMP) ## one run of a recipe, tracked in MLflow (experiment 'runs'), then its report: make train [RECIPE=scalerl]
	$(BIN)/python -m runners train $(RECIPE) --experiment runs
	$(BIN)/python -m analysis report latest --experiment runs

base-model: $(STAMP) ## build (or find cached) the embedded base model of a recipe
	$(BIN)/python -m runners base-model $(RECIPE)
