# The two commands a newcomer needs: `make demo` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: demo test lint bench bench-quick install

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
	$(PY) -m bench

# Every benchmark at a small size: proves they run, measures nothing worth quoting.
bench-quick: install
	$(PY) -m bench --quick
