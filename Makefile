# Two set-up commands: `make run` (a real sweep on the embedded default) and `make test`.
# `make compose-smoke`: the Docker Compose deployment built and run (deploy/smoke/compose_smoke.py).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
ARGS ?=

.PHONY: run test test-gpu install lint compose-smoke drills

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

# Needs a Docker engine (deploy/smoke/ensure-docker.sh installs and starts one as root on Debian);
# the script uses the host's python3 and its standard library only.
compose-smoke:
	deploy/smoke/ensure-docker.sh
	$(PYTHON) deploy/smoke/compose_smoke.py $(SMOKE_ARGS)

# The service's dependencies killed in turn (docs/service.md, Drills): its own PostgreSQL, Redis,
# API and two workers on free loopback ports; one table row per drill.
drills: $(STAMP)
	$(PY) -m drills $(ARGS)
