# kimik3-operator: `make demo` runs the demo, `make test` runs every test tier.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PYTEST := $(PY) -m pytest -q --durations=15
export KUBECONFIG_E2E := $(CURDIR)/e2e/.run/kubeconfig
# Python's byte-compiled files are kept where a machine turns them off (they go next to the
# sources: the venvs in the cache and this tree's ignored __pycache__): otherwise each of the
# tests' Python processes compiles again all it imports (vLLM's engine arguments: 30.5 s of
# CPU against 13.9 s with them).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: help deps venv lint fmt unit e2e test-unit test-vllm test-e2e test-real test prepare \
	cluster-tools cluster-up cluster-down demo vllm-venv clean

help:
	@echo "make demo          local control plane + fake GPU nodes + operator + sample deployment"
	@echo "make test          every tier below, the unit tests first (a red one stops the run)"
	@echo "make test-unit     unit tests (the project's venv only; seconds)"
	@echo "make test-vllm     the real-vllm tier (builds the vllm venv once)"
	@echo "make test-e2e      end to end on the real control plane with KWOK's GPU nodes"
	@echo "make test-real     real containers and vLLM on the two real nodes"
	@echo "make lint          ruff and mypy"
	@echo "make cluster-up    start (or reuse) the control plane; cluster-down stops it"

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	"$$(bash scripts/uv.sh)" pip install -q --python $(PY) -e '.[dev]'
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

# Each tier alone; `make test` runs them all. The tiers are pytest markers (pyproject.toml):
# unit (no marker), vllm, kwok, real_node.
test-unit unit: venv
	$(PYTEST) -m "not vllm" operator/tests

vllm-venv:
	bash scripts/vllm-venv.sh

test-vllm: venv vllm-venv
	$(PYTEST) -m vllm operator/tests

cluster-tools:
	bash e2e/cluster/build-tools.sh

cluster-up: deps venv
	PYTHON=$(CURDIR)/$(PY) bash e2e/cluster/up.sh

cluster-down:
	bash e2e/cluster/down.sh

test-e2e: cluster-up
	$(PYTEST) -m kwok e2e

test-real: cluster-up
	bash e2e/runtime/prebuild.sh start
	bash e2e/runtime/prebuild.sh wait
	$(PYTEST) -m real_node e2e

# Everything the other tiers need, side by side (the Go tools beside the packages, venvs and
# root filesystem).
prepare: venv
	bash scripts/prepare.sh

# The whole suite (scripts/test.sh): the unit tests before any build, then the builds side by
# side, the real tier's images in the background while the vllm and KWOK tiers run.
test: venv
	bash scripts/test.sh

demo: venv cluster-up
	PYTHON=$(CURDIR)/$(PY) bash e2e/demo.sh

clean: cluster-down
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache

# The names these tiers had before.
e2e: test-e2e
