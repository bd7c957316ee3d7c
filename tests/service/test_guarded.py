"""API keys, CORS, backpressure (503 + Retry-After) and timeouts (504) on the "guarded" application."""

import asyncio
import time

import httpx
import pytest

from tests.service.conftest import ALLOWED_ORIGIN, API_KEYS

pytestmark = pytest.mark.slow

TRANSLATE = {"texts": ["I like tea."], "source_lang": "en", "target_lang": "zh"}
BEARER = {"Authorization": f"Bearer {API_KEYS[0]}"}


@pytest.fixture(scope="module")
def guarded(guarded_url):
    with httpx.Client(base_url=guarded_url, timeout=60) as session:
        yield session


def assert_error(response, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    assert response.json() == {"error": {"code": code, "message": response.json()["error"]["message"]}}


@pytest.mark.parametrize(
    "method, path",
    [("GET", "/v1/models"), ("POST", "/v1/translate"), ("POST", "/v1/explain"), ("GET", "/v1/explanations/AAAA")],
)
def test_a_request_without_a_key_is_401(guarded, method, path):
    response = guarded.request(method, path, json=TRANSLATE if method == "POST" else None)
    assert_error(response, 401, "unauthorized")
    assert response.headers["www-authenticate"] == "Bearer"


@pytest.mark.parametrize(
    "headers", [{"Authorization": "Bearer wrong"}, {"X-API-Key": API_KEYS[0] + "x"}, {"Authorization": API_KEYS[0]}]
)
def test_a_wrong_key_is_401(guarded, headers):
    assert_error(guarded.get("/v1/models", headers=headers), 401, "unauthorized")


@pytest.mark.parametrize("headers", [BEARER, {"X-API-Key": API_KEYS[1]}])
def test_a_valid_key_is_accepted(guarded, headers):
    response = guarded.get("/v1/models", headers=headers)
    assert response.status_code == 200 and response.json()["models"][0]["id"] == "en-zh"


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/metrics", "/", "/openapi.json"])
def test_operational_and_public_routes_stay_open(guarded, path):
    assert guarded.get(path).status_code == 200


def test_cors_allows_a_configured_origin(guarded):
    preflight = {
        "Origin": ALLOWED_ORIGIN,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type",
    }
    response = guarded.options("/v1/translate", headers=preflight)
    assert response.status_code == 200
    assert response.headers["access-control-allow-origin"] == ALLOWED_ORIGIN


def test_cors_refuses_other_origins(guarded):
    preflight = {"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"}
    response = guarded.options("/v1/translate", headers=preflight)
    assert "access-control-allow-origin" not in response.headers


def test_cors_is_closed_by_default(client):
    response = client.get("/healthz", headers={"Origin": ALLOWED_ORIGIN})
    assert "access-control-allow-origin" not in response.headers


def test_a_model_call_over_the_timeout_is_504(guarded):
    # the guarded translator waits 4 s for its batch to fill; the request timeout is 2 s
    assert_error(guarded.post("/v1/translate", json=TRANSLATE, headers=BEARER), 504, "timeout")


def test_a_request_over_the_in_flight_limit_is_503_with_retry_after(guarded_url):
    # Two requests at once against a limit of one: whichever takes the slot waits for its batch until
    # the 2 s timeout (504), so the other arrives while the slot is held, whatever their order.
    async def both() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=guarded_url, timeout=60, headers=BEARER) as client:
            return list(await asyncio.gather(*(client.post("/v1/translate", json=TRANSLATE) for _ in range(2))))

    refused, timed_out = sorted(asyncio.run(both()), key=lambda response: response.status_code)
    assert_error(refused, 503, "overloaded")
    assert refused.headers["retry-after"] == "1"
    assert_error(timed_out, 504, "timeout")


def test_a_service_at_its_in_flight_limit_is_still_ready(guarded_url):
    """/readyz and /v1/models are not refused by the in-flight limit: a readiness probe failing under load would
    take a busy replica out of rotation. For 12 s the one slot is held (each translation waits 2 s for its 504),
    longer than the ingress caches model info (10 s), so a refresh happens while the limit is reached."""

    async def run() -> tuple[list[int], list[int]]:
        async with httpx.AsyncClient(base_url=guarded_url, timeout=60, headers=BEARER) as client:
            held = asyncio.Event()

            async def hold() -> None:
                end = time.monotonic() + 12
                while time.monotonic() < end:
                    request = asyncio.create_task(client.post("/v1/translate", json=TRANSLATE))
                    await asyncio.sleep(0.2)
                    held.set()
                    await request

            async def probe(holding: asyncio.Task) -> tuple[list[int], list[int]]:
                await held.wait()
                ready, refused = [], []
                while not holding.done():
                    ready += [(await client.get(path)).status_code for path in ("/readyz", "/v1/models")]
                    refused.append((await client.post("/v1/translate", json=TRANSLATE)).status_code)
                    await asyncio.sleep(0.2)
                return ready, refused

            holding = asyncio.create_task(hold())
            return await probe(holding)

    ready, translations = asyncio.run(run())
    assert translations.count(503) >= 10, translations  # the limit was reached throughout
    assert ready and set(ready) == {200}, ready
