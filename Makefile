# dispatch: `make up` runs the service, `make test` installs what it needs and runs the whole suite.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3.11
VENV := .venv
SDK_VENV := $(VENV)/kubeflow-sdk
DOCS_VENV := $(VENV)/docs
PY := $(VENV)/bin/python
PORT ?= 8000
VAR := var
RUN := $(VAR)/run
TEST_DATABASE_URL ?= postgres://dispatch:dispatch@127.0.0.1:25432/dispatch
TEST_REDIS_URL ?= redis://127.0.0.1:26379/1

.PHONY: help venv up down status test lint docs bench chaos image cluster-build cluster-up cluster-down

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-14s %s\n", $$1, $$2}'

$(VENV)/.installed: requirements.lock pyproject.toml client/pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found (Python 3.11 is needed)"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.lock
	touch $@

# The Kubeflow SDK in its own venv: kubeflow 0.5.0 pins kubernetes<36, dispatch pins 37 (tests/client/test_kubeflow_sdk.py).
$(SDK_VENV)/.installed: requirements-kubeflow-sdk.lock $(VENV)/.installed
	$(PYTHON) -m venv $(SDK_VENV)
	$(SDK_VENV)/bin/python -m pip install -q -r requirements-kubeflow-sdk.lock
	touch $@

# The docs site's tools in their own venv (requirements-docs.lock): MkDocs pins never meet the service's.
$(DOCS_VENV)/.installed: requirements-docs.lock
	$(PYTHON) -m venv $(DOCS_VENV)
	$(DOCS_VENV)/bin/python -m pip install -q -r requirements-docs.lock
	touch $@

venv: $(VENV)/.installed ## create the virtualenv and install the pinned dependencies

cluster-build: ## compile the local Kubernetes control plane (cached under ~/.cache/dispatch-cluster)
	scripts/cluster build --kueue

cluster-up: cluster-build ## start the local control plane (prints its kubeconfig)
	scripts/cluster up

cluster-down: ## stop the local control plane
	scripts/cluster down

up: venv ## run web, worker and beat in the background (SQLite, local Redis, local cluster unless KUBECONFIG is set)
	@scripts/up

down: ## stop exactly what `make up` started
	@scripts/down

status: ## what runs
	@scripts/services status || true
	@scripts/cluster status || true
	@for f in $(RUN)/*.pid; do [[ -f $$f ]] || continue; p=$$(cat $$f); if kill -0 $$p 2>/dev/null; then echo "$$(basename $$f .pid): running (pid $$p)"; else echo "$$(basename $$f .pid): stopped"; fi; done

lint: venv ## ruff, formatting, migrations, the OpenAPI schema, mypy and the import contracts
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	DEBUG=true DATABASE_URL=sqlite:///$(VAR)/lint.sqlite3 $(PY) manage.py makemigrations --check --dry-run
	DEBUG=true DATABASE_URL=sqlite:///$(VAR)/lint.sqlite3 $(PY) manage.py spectacular --validate --fail-on-warn \
		--file $(VAR)/openapi.yaml
	DEBUG=true $(VENV)/bin/mypy .
	$(VENV)/bin/lint-imports

docs: $(DOCS_VENV)/.installed ## build the docs site (MkDocs Material, strict: a broken link fails) into var/site
	NO_MKDOCS_2_WARNING=1 $(DOCS_VENV)/bin/mkdocs build --strict
	@echo "docs: $(CURDIR)/var/site/index.html"

test: venv $(SDK_VENV)/.installed $(DOCS_VENV)/.installed ## install and start PostgreSQL, Redis and the local cluster, then lint and run the whole suite
	scripts/services up
	scripts/browser-deps
	scripts/cluster build --kueue
	scripts/monitoring-deps
	$(MAKE) --no-print-directory lint
	$(MAKE) --no-print-directory docs
	DATABASE_URL=$(TEST_DATABASE_URL) REDIS_URL=$(TEST_REDIS_URL) $(PY) -m pytest $(PYTEST_ARGS)

chaos: venv ## 200 jobs through worker kills, Redis/PostgreSQL restarts and a 30 s API outage (its own PostgreSQL and Redis; CHAOS_SEED=n replays)
	scripts/cluster up >/dev/null
	$(PY) scripts/chaos.py --jobs $${CHAOS_JOBS:-200} --seed $${CHAOS_SEED:-1}

image: venv ## build the container image with buildah (deploy/image/build; check --deploy runs inside it)
	deploy/image/build $(IMAGE_TAG)

bench: venv ## benchmarks: a report of ratios measured side by side in one run
	scripts/services up
	scripts/cluster build --kueue
	@# DEBUG on for the bench's own setup only: the servers it measures run DEBUG=false (bench_common.server_env)
	DEBUG=$${DEBUG:-true} DATABASE_URL=$(TEST_DATABASE_URL) REDIS_URL=$(TEST_REDIS_URL) $(PY) scripts/bench.py
