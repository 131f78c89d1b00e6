# The two commands a newcomer needs: `make test` (and, later, `make demo`).
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: demo test lint bench install

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

install: $(VENV)/.installed

demo: install
	$(VENV)/bin/agentq demo

lint: install
	$(VENV)/bin/ruff check agentq tests $(wildcard bench)
	$(VENV)/bin/mypy

test: lint
	$(PY) -m pytest

bench: install
	$(PY) -m bench.store
