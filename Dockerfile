# attention-translate: the Ray Serve translation service in one image; it serves $SERVE_CONFIG.
#
#   docker build -t attention-translate .                         # CPU torch, deploy/serve.yaml (default)
#   docker run -p 8000:8000 attention-translate                   # then: curl localhost:8000/readyz
#
# CUDA: torch's default Linux x86_64 wheel on PyPI is a CUDA 13 build that brings the CUDA libraries
# as nvidia-*-cu13 wheels, so no CUDA base image and no special index are needed:
#   docker build -t attention-translate:cuda --build-arg TORCH_INDEX_URL=https://pypi.org/simple \
#     --build-arg SERVE_CONFIG=deploy/serve-gpu.yaml .
#   docker run --gpus all -p 8000:8000 attention-translate:cuda
# The host needs an NVIDIA driver for CUDA 13 (580 or later) and the NVIDIA container toolkit.
# deploy/serve-gpu.yaml shares one GPU between the translators (two replicas per model, num_gpus: 0.25 each).
#
# The same image runs in KubeRay (deploy/k8s/rayservice.yaml; the CUDA one in deploy/k8s/rayservice-gpu.yaml),
# which replaces the command with `ray start`.
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG TORCH_VERSION=2.13.0

# Ray Serve's high-throughput mode (HAProxy ingress, direct gRPC between replicas): docs/operations.md.
# HAProxy's retry of a request whose ingress was lost (a node gone) is set by CMD below (docs/operations.md).
ENV RAY_SERVE_ENABLE_HA_PROXY=1 \
    RAY_SERVE_THROUGHPUT_OPTIMIZED=1

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    RAY_USAGE_STATS_ENABLED=0 \
    PYTHONPATH=/app

WORKDIR /app

# Dependencies first (they change less often than the code): torch from the chosen index,
# then the rest of pyproject.toml's dependencies.
COPY pyproject.toml ./
RUN pip install --no-cache-dir --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}" \
    && python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" \
        > /tmp/requirements.txt \
    && pip install --no-cache-dir -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt

COPY model ./model
COPY service ./service
COPY deploy ./deploy

# The compiled decoding runtime (model/runtime), built now rather than when the first replica loads; the compiler
# leaves the image again (loading the built step needs none). Without it the service would decode eagerly.
ENV TRANSLATE_RUNTIME_BUILD_DIR=/app/runtime-build
# Any g++ of the base image's release builds it, and none stays in the image: its version is not pinned.
# hadolint ignore=DL3008
RUN apt-get update && apt-get install -y --no-install-recommends g++ \
    && python -m model.runtime build --strict \
    && apt-get purge -y g++ && apt-get autoremove -y && rm -rf /var/lib/apt/lists/*

# Readable by the unprivileged user whatever the modes in the checkout (weights may be 0600).
RUN chmod -R a+rX /app \
    && useradd --create-home --uid 10001 --shell /usr/sbin/nologin app
USER 10001

# The Serve config the CMD runs (late, so that changing it rebuilds no dependency layer).
ARG SERVE_CONFIG=deploy/serve.yaml
ENV SERVE_CONFIG=${SERVE_CONFIG}

EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s --start-period=180s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4)"]

# sh -c so that $SERVE_CONFIG expands; exec hands PID 1 (and the stop signal) to serve. Unless set already,
# RAY_SERVE_HAPROXY_RETRY_ON gets two lines (an ENV value cannot hold a newline): HAProxy sends a request whose
# ingress closed without answering to another ingress, and buffers each request whole so that it can
# (tests/service/test_haproxy_retry.py, docs/operations.md).
CMD ["sh", "-c", "export RAY_SERVE_HAPROXY_RETRY_ON=\"${RAY_SERVE_HAPROXY_RETRY_ON:-$(printf 'conn-failure empty-response\\noption http-buffer-request')}\"; exec serve run \"$SERVE_CONFIG\""]
