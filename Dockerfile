# The attnsweep image: API, workers, migrations and Flower (docker-compose.yml builds it).
# Needs BuildKit (the default builder since Docker 23; DOCKER_BUILDKIT=1 on Docker 20.10-22).
#
# `docker build -t attnsweep .` as it is: the official Python image, the `cpu` backend, the API
# and Flower. Build arguments change that (docker-compose.yml passes them, docs/service.md):
#   BASE_IMAGE  any Debian or Ubuntu image, with or without Python: a CUDA runtime base
#               (NVRTC included) for the `cuda` backend, a ROCm base for `hip`; Python, venv and
#               git come from apt when the base lacks them.
#   EXTRAS      the project's extras: `cuda,flower` on NVIDIA, `rocm,flower` on AMD.
# Behind a proxy that re-signs TLS, hand its CA bundle to apt and pip as the build secret
# `ca_bundle` (`--secret id=ca_bundle,src=/path/ca.pem`): it is read during the build and never
# stored in the image. Air-gapped: put the wheels in docker/wheelhouse/ beforehand; when it holds
# any, pip installs from it alone, without an index (docker/wheelhouse/README.md).
ARG BASE_IMAGE=python:3.12-slim-bookworm
FROM ${BASE_IMAGE}

ARG EXTRAS=flower
ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH

# Python from the base when it has one with venv, else from the distribution; git reads a
# kernel repository's commits for CI sweeps; bubblewrap confines the build and run of a fetched
# commit's kernels (docs/security.md); a C compiler builds the inputs' normal draws once per host
# (reference/normals.py; without one, numpy draws the same bytes, slower). A base that has all of
# them needs no apt mirror.
RUN --mount=type=secret,id=ca_bundle,required=false \
    set -eu; \
    pkgs=""; \
    command -v git >/dev/null || pkgs="$pkgs git"; \
    command -v bwrap >/dev/null || pkgs="$pkgs bubblewrap"; \
    command -v cc >/dev/null || pkgs="$pkgs gcc libc6-dev"; \
    [ -s /etc/ssl/certs/ca-certificates.crt ] || pkgs="$pkgs ca-certificates"; \
    python3 -c 'import ensurepip, venv' 2>/dev/null || pkgs="$pkgs python3 python3-venv"; \
    if [ -n "$pkgs" ]; then \
      apt_ca=""; [ -s /run/secrets/ca_bundle ] && apt_ca="-o Acquire::https::CAInfo=/run/secrets/ca_bundle"; \
      apt-get $apt_ca update -q; \
      apt-get $apt_ca install -y -q --no-install-recommends $pkgs; \
      apt-get clean; rm -rf /var/lib/apt/lists/*; \
    fi; \
    python3 -m venv /opt/venv

# The shell of the pip steps: pip trusts the system bundle plus the `ca_bundle` secret, for this
# command only; with wheels in docker/wheelhouse it reads them and no index.
COPY docker/pip-install.sh /usr/local/bin/attnsweep-pip-install

WORKDIR /app
# The dependencies first, from pyproject.toml alone, so a change to the sources does not
# install them again: an empty package of the same name pulls in every requirement.
COPY pyproject.toml ./
RUN --mount=type=secret,id=ca_bundle,required=false \
    --mount=type=bind,source=docker/wheelhouse,target=/wheelhouse \
    attnsweep-pip-install ".[${EXTRAS}]" && pip uninstall -y -q attnsweep

COPY attnconfig/ attnconfig/
COPY settings/ settings/
COPY reference/ reference/
COPY kernels/ kernels/
COPY sweeps/ sweeps/
COPY store/ store/
COPY migrations/ migrations/
COPY workers/ workers/
COPY kernelsrc/ kernelsrc/
COPY isolation/ isolation/
COPY triage/ triage/
COPY ci/ ci/
COPY submit/ submit/
COPY api/ api/
COPY cli/ cli/
RUN --mount=type=secret,id=ca_bundle,required=false \
    --mount=type=bind,source=docker/wheelhouse,target=/wheelhouse \
    attnsweep-pip-install --no-deps . \
 && attnsweep --help >/dev/null

# Unprivileged; the kernel compile cache lives on a volume mounted at /cache.
RUN useradd --create-home --uid 10001 attnsweep && mkdir -p /cache/kernels /cache/repos && chown -R attnsweep /cache
USER attnsweep
ENV ATTNSWEEP_KERNEL_CACHE=/cache/kernels
EXPOSE 8000
# The default command's check (the API); docker-compose.yml gives workers and Flower their own.
HEALTHCHECK --interval=15s --timeout=10s --start-period=20s --retries=5 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=5)"]
CMD ["attnsweep", "serve", "--host", "0.0.0.0", "--port", "8000"]
