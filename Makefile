# The two commands a newcomer needs: `make demo` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: demo test lint bench bench-quick install install-base services

# compat: the checkout goes on sys.path as a plain path, which type checkers follow (the
# default editable install hides it behind an import hook).
EDITABLE := --config-settings editable_mode=compat

# agentq and its own dependencies: all the demo needs, so the first `make demo` is quick.
$(VENV)/.installed-base: pyproject.toml Makefile
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(EDITABLE) -e .
	touch $@

# Beside it, what the tests, linters and benchmarks use.
$(VENV)/.installed: $(VENV)/.installed-base
	$(PY) -m pip install --quiet $(EDITABLE) -e '.[test,bench]'
	touch $@

install-base: $(VENV)/.installed-base

install: $(VENV)/.installed

# Redis and RabbitMQ for the tests and benchmarks (the demo needs neither).
services:
	bash scripts/services

demo: install-base
	$(VENV)/bin/agentq demo

lint: install
	$(VENV)/bin/ruff check agentq tests $(wildcard bench) examples
	$(VENV)/bin/ruff format --check agentq tests $(wildcard bench) examples
	$(VENV)/bin/mypy

test: lint services
	$(PY) -m pytest --cov --cov-report=term

bench: install services
	$(PY) -m bench

# Every benchmark at a small size: proves they run, measures nothing worth quoting.
bench-quick: install services
	$(PY) -m bench --quick
