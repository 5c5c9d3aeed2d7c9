# The attnsweep image: API, workers, migrations and Flower (docker-compose.yml builds it).
# NVIDIA (default): a CUDA runtime base (NVRTC included) and the `cuda` extra.
# AMD: --build-arg BASE_IMAGE=rocm/dev-ubuntu-24.04:6.4 --build-arg EXTRAS=rocm,flower
ARG BASE_IMAGE=nvidia/cuda:12.6.3-runtime-ubuntu24.04
FROM ${BASE_IMAGE}

ARG EXTRAS=cuda,flower
ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PATH=/opt/venv/bin:$PATH

RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv python3-pip git \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/venv

WORKDIR /app
COPY pyproject.toml ./
COPY attnconfig/ attnconfig/
COPY core/ core/
COPY reference/ reference/
COPY kernels/ kernels/
COPY sweeps/ sweeps/
COPY store/ store/
COPY migrations/ migrations/
COPY workers/ workers/
COPY kernelsrc/ kernelsrc/
COPY ci/ ci/
COPY api/ api/
COPY cli/ cli/
RUN pip install ".[${EXTRAS}]"

# Unprivileged; the kernel compile cache lives on a volume mounted at /cache.
RUN useradd --create-home --uid 10001 attnsweep && mkdir -p /cache/kernels && chown -R attnsweep /cache
USER attnsweep
ENV ATTNSWEEP_KERNEL_CACHE=/cache/kernels
EXPOSE 8000
CMD ["attnsweep", "serve", "--host", "0.0.0.0", "--port", "8000"]
