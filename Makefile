# kimik3-operator: `make demo` runs the demo, `make test` runs every test tier.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
export KUBECONFIG_E2E := $(CURDIR)/e2e/.run/kubeconfig

.PHONY: help deps venv lint fmt unit test-vllm e2e test cluster-tools cluster-up cluster-down demo vllm-venv clean

help:
	@echo "make demo          local control plane + fake GPU nodes + operator + sample deployment"
	@echo "make test          unit tests, the real-vllm parser tier and the end-to-end tests"
	@echo "make lint          ruff and mypy"
	@echo "make cluster-up    start (or reuse) the control plane; cluster-down stops it"

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[dev]'
	touch $@

venv: $(VENV)/.installed

deps:
	bash scripts/install-deps.sh

lint: venv
	$(VENV)/bin/ruff check operator e2e bench observability scripts
	$(VENV)/bin/ruff format --check operator e2e bench observability scripts
	$(VENV)/bin/mypy

fmt: venv
	$(VENV)/bin/ruff format operator e2e bench
	$(VENV)/bin/ruff check --fix operator e2e bench

unit: venv
	$(PY) -m pytest -q -m "not vllm" operator/tests

vllm-venv:
	bash scripts/vllm-venv.sh

test-vllm: venv vllm-venv
	$(PY) -m pytest -q operator/tests/vllm_tier

cluster-tools:
	bash e2e/cluster/build-tools.sh

cluster-up: deps venv
	PYTHON=$(CURDIR)/$(PY) bash e2e/cluster/up.sh

cluster-down:
	bash e2e/cluster/down.sh

e2e: deps venv cluster-up
	$(PY) -m pytest -q e2e

# The whole suite in one run: unit, real-vllm parser tier, end-to-end on the real control plane.
test: deps venv vllm-venv cluster-up
	$(PY) -m pytest -q operator/tests e2e

demo: venv cluster-up
	PYTHON=$(CURDIR)/$(PY) bash e2e/demo.sh

clean: cluster-down
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
