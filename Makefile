# Two set-up commands: `make run` (a real sweep on the embedded default) and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
ARGS ?=

.PHONY: run test test-gpu install lint drills

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(VENV)/bin/attnsweep run --samples 50 $(ARGS)

test: $(STAMP)
	$(PY) -m pytest -q -m "not gpu" $(PYTEST_ARGS)

test-gpu: $(STAMP)
	$(PY) -m pytest -q -m gpu tests/gpu $(PYTEST_ARGS)

# The service's dependencies killed in turn (docs/service.md, Drills): its own PostgreSQL, Redis,
# API and two workers on free loopback ports; one table row per drill.
drills: $(STAMP)
	$(PY) -m drills $(ARGS)
