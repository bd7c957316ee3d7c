# attention-translate: the Ray Serve translation service (deploy/serve.yaml) in one image.
#
#   docker build -t attention-translate .                         # CPU torch (default)
#   docker build -t attention-translate:cuda \
#     --build-arg BASE_IMAGE=<a CUDA runtime image with python3.11 and pip> \
#     --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu124 .
#   docker run -p 8000:8000 attention-translate                   # then: curl localhost:8000/readyz
#
# The same image runs in KubeRay (deploy/k8s/rayservice.yaml), which replaces the command with `ray start`.
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG TORCH_VERSION=2.13.0

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

# Readable by the unprivileged user whatever the modes in the checkout (weights may be 0600).
RUN chmod -R a+rX /app \
    && useradd --create-home --uid 10001 --shell /usr/sbin/nologin app
USER 10001

EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s --start-period=180s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4)"]

CMD ["serve", "run", "deploy/serve.yaml"]
