# latencyd developer entry points. Everything runs from the repo's .venv, which
# `make setup` (scripts/setup.sh) creates and keeps up to date; it is quiet when
# there is nothing to do, so every target can depend on it.

SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := test

VENV := .venv
PYTHON := $(VENV)/bin/python

.PHONY: setup run test lint bench clean

setup:
	@bash scripts/setup.sh

# latencyd in the foreground on a private system-like D-Bus; Ctrl-C restores and stops.
run: setup
	@bash scripts/run-dev.sh

# Tests first (kernel and e2e tests need root), then lint. pytest's exit status 5
# ("no tests collected") is a failure: a suite that ran nothing passed nothing.
test: setup
	@status=0; $(PYTHON) -m pytest || status=$$?; \
	if [ "$$status" -eq 5 ]; then echo "make test: pytest collected no tests" >&2; exit 1; fi; \
	exit "$$status"
	@$(MAKE) --no-print-directory lint-only

lint: setup
	@$(MAKE) --no-print-directory lint-only

.PHONY: lint-only
lint-only:
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

bench: setup
	$(PYTHON) -m bench

clean:
	rm -rf $(VENV) .perf-build build *.egg-info .mypy_cache .ruff_cache .pytest_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
