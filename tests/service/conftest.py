"""The service tests' fixtures: the session's two real Ray Serve instances (tests/harness/services.py), their URLs,
and the float32 bounds two answers may differ by.

- `serve_instance`: "translate" at / (two ingress replicas, two en-zh translator replicas, one zh-en) and
  "guarded" at /guarded (API keys, CORS for one origin, a 1-request in-flight limit and a batch wait longer than
  the request timeout, so 503 and 504 are certain);
- `continuous_service_url`: the main application on the continuous scheduler, with the shipped en-zh and a
  shift model beside the tiny ones.

Both start when the first is asked for, so that their startups overlap.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.harness.services import (  # noqa: F401 (some re-exported: the service tests import them from here)
    ALLOWED_ORIGIN,
    API_KEYS,
    COLOCATED_PREFIX,
    CONTINUOUS,
    GUARDED_PREFIX,
    SHIFT_MODEL,
    SHIPPED_MODEL,
    SHIPPED_PREFIX,
    ServiceLaunch,
    ServiceLaunches,
    continuous_config_for_tests,
    make_shift_model,
    make_tiny_models,
    serve_config_for_tests,
)

TEST_POSTGRES_URL = os.environ.get("TRANSLATE_TEST_POSTGRES_URL")

# Tests of the static batcher's own behaviour (batches, coalesced calls, their metrics).
static_batcher_only = pytest.mark.skipif(CONTINUOUS, reason="the static policy's batches and the ingress's coalescing")


# ---- float32 bounds between two runs of the same computation ----------------------------------------------------
FLOAT32_EPS = 2.0**-23  # one ulp of 1.0: float32 keeps 24 significant bits


class Tolerance:
    """How far apart two answers computed by the same float32 arithmetic may be.

    The service computes a number twice when a test compares two answers: the decode against the forced decode of
    an explanation fetched later, two forced decodes on different replicas, in different batches, on a different
    kernel path (fused scaled-dot-product attention, or the explicit softmax that returns the encoder's weights), or
    in this process against a replica (1 thread against 2). A GEMM blocked differently rounds each d_model-term dot
    product differently by a few ulps; the bounds follow from that, measured on a 2-core AMD EPYC (AVX2, no AMX).
    """

    # Attention weights lie in [0, 1]: softmaxes over the source positions of scores that went through every layer,
    # each rounded as above. Two runs differ by a few tens of ulps of 1.0 (at most 2.4e-6, about 20 ulps, between
    # decode and forced decode or between kernel paths on the tiny models); the bound leaves a factor of 4.
    ATTENTION = 84 * FLOAT32_EPS  # ≈ 1e-5
    # Token log-probabilities: log_softmax over the vocabulary, whose logits (magnitude ~10) carry the same relative
    # rounding; measured at most 3.7e-6 between decode and forced decode.
    SCORE = 840 * FLOAT32_EPS  # ≈ 1e-4
    # Gradient attributions and ALTI+ shares: sums of d_model-term products normalised by row totals near 1
    # (measured at most 6.4e-7 between 1 and 2 threads).
    ATTRIBUTION = 84 * FLOAT32_EPS  # ≈ 1e-5
    # Value zeroing: each score is 1 − cosine(clean, corrupted) of two float32 layer outputs, normalised by its
    # row's total. A rounding difference of a few ulps of 1.0 in the cosine becomes a few FLOAT32_EPS / total after
    # the normalisation, and the tiny models' rows total as little as 0.004 (FLOAT32_EPS / 0.004 ≈ 3e-5; measured
    # at most 1.1e-5). Bound: a few ulps of the cosine over the smallest total.
    VALUE_ZEROING = 3.4 * FLOAT32_EPS / 0.004  # ≈ 1e-4


# The fixtures below that use each service; a test that uses one needs it started.
SERVICE_FIXTURES = ("serve_instance", "continuous_service_url")


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request, tmp_path) -> str:
    """The shared store on both its databases: a fresh SQLite file, and the real PostgreSQL .ci/run starts (named by
    TRANSLATE_TEST_POSTGRES_URL, shared by the whole run: tests keep to their own owners and directories)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'state.db'}"
    if TEST_POSTGRES_URL is None:
        pytest.skip("TRANSLATE_TEST_POSTGRES_URL is not set (.ci/run starts PostgreSQL and sets it)")
    return TEST_POSTGRES_URL


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_tiny_models(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="session")
def service_launches(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, tiny_models: dict[str, Path]
) -> Iterator[ServiceLaunches]:
    def main() -> ServiceLaunch:
        return ServiceLaunch(
            tmp_path_factory.mktemp("serve"),
            lambda port, metrics: serve_config_for_tests(tiny_models, metrics, port),
            ("/readyz", f"{GUARDED_PREFIX}/readyz", f"{COLOCATED_PREFIX}/readyz"),
        )

    def continuous() -> ServiceLaunch:
        root = tmp_path_factory.mktemp("continuous")
        models = {**tiny_models, SHIFT_MODEL: make_shift_model(tiny_models["en-zh"], root)}
        return ServiceLaunch(root, lambda port, metrics: continuous_config_for_tests(models, metrics, port))

    launches = ServiceLaunches(request.session, dict(zip(SERVICE_FIXTURES, (main, continuous), strict=True)))
    try:
        yield launches
    finally:
        launches.stop()


@pytest.fixture(scope="session")
def serve_instance(service_launches: ServiceLaunches) -> dict:
    """A running `serve run` of the test config: {"url", "guarded_url", "config", "log"}."""
    url, config, log_path = service_launches.ready("serve_instance")
    return {"url": url, "guarded_url": url + GUARDED_PREFIX, "config": config, "log": log_path}


@pytest.fixture(scope="session")
def continuous_service_url(service_launches: ServiceLaunches) -> str:
    """Base URL of a second `serve run`, shared by every suite that needs the continuous scheduler or the shift
    model (one start instead of one per suite): the tiny models first (a pair's default model is its first),
    then SHIPPED_MODEL and SHIFT_MODEL (the tiny en-zh with "alignment_shift": true)."""
    return service_launches.ready("continuous_service_url")[0]


@pytest.fixture(scope="session")
def shipped_url(continuous_service_url: str) -> str:
    """Base URL of deploy/serve.yaml's application on the shipped en-zh alone (beside the continuous one)."""
    url = continuous_service_url + SHIPPED_PREFIX
    for _ in range(300):
        try:
            if httpx.get(f"{url}/readyz", timeout=5).status_code == 200:
                return url
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise RuntimeError(f"{url} did not become ready")


@pytest.fixture(scope="session")
def service_url(serve_instance: dict) -> str:
    """Base URL of the main application (tiny en-zh and zh-en models), e.g. http://127.0.0.1:PORT."""
    return serve_instance["url"]


@pytest.fixture(scope="session")
def colocated_url(serve_instance: dict) -> str:
    """Base URL of the main application's models in the colocated layout (one Ingress replica loading both)."""
    return serve_instance["url"] + COLOCATED_PREFIX


@pytest.fixture(scope="session")
def guarded_url(serve_instance: dict) -> str:
    """Base URL of the application with API keys, CORS, a 1-request limit and a short timeout."""
    return serve_instance["guarded_url"]


@pytest.fixture(scope="session")
def client(service_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=service_url, timeout=60) as session:
        yield session
