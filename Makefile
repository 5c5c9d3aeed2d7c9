# Two set-up commands: `make run` (a real sweep on the embedded default) and `make test`.
# `make compose-smoke`: the Docker Compose deployment built and run (deploy/smoke/compose_smoke.py).
# `make hip-compile`: the AMD compile gate alone (kernels/hipgate.py; needs hipcc).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
ARGS ?=

.PHONY: run test test-gpu install lint compose-smoke drills security-drills hip-compile tools-test

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(VENV)/bin/attnsweep run --samples 50 $(ARGS)

# The layer contract (pyproject.toml [tool.importlinter]) first, then the AMD compile gate where
# hipcc is installed (.ci/run installs it), then the tests.
test: $(STAMP)
	$(VENV)/bin/lint-imports --no-cache
	@if command -v hipcc >/dev/null 2>&1; then $(PY) -m kernels.hipgate; \
	else echo "hip-compile: skipped, hipcc not installed (Debian: apt-get install hipcc libamdhip64-dev)"; fi
	$(PY) -m pytest -q -m "not gpu" $(PYTEST_ARGS)

# Every kernel variant the selector picks for ROCm, compiled with hipcc for gfx90a, gfx1030 and
# gfx1100 through the hip backend's options; prints targets x variants compiled. Never run.
hip-compile: $(STAMP)
	$(PY) -m kernels.hipgate $(ARGS)

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

# The attacks of docs/security.md against a real API, worker, PostgreSQL and Redis of their own
# (bubblewrap for the kernel code's confinement, Chromium for the cross-site case); one table row per
# attack, exit status 1 when one is not contained.
security-drills: $(STAMP)
	$(PY) -m drills.security $(ARGS)

# The checks of tools/ (tools/tests: sass_diff's normalization, run as a command); tools are no
# part of the product, so `make test` leaves them out.
tools-test: $(STAMP)
	$(PY) -m pytest -q tools/tests $(PYTEST_ARGS)
