# Developer entry points. `make test` works on a fresh machine: it creates .venv, installs the project with
# its dev extra, provisions the local Kubernetes control plane into ~/.cache/asyncrl, then lints and tests.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PYTEST_ARGS ?=

.PHONY: test lint pytest setup control-plane clean

test: lint pytest

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	$(BIN)/python -m pip install -e ".[dev,trainer]"
	touch $@

control-plane:
	scripts/provision-k8s.sh

lint: setup
	$(BIN)/ruff check src tests
	$(BIN)/ruff format --check src tests
	$(BIN)/mypy

pytest: setup control-plane
	$(BIN)/pytest $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
