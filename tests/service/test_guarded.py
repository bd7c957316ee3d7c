"""API keys, CORS, backpressure (503 + Retry-After) and timeouts (504) on the "guarded" application."""

import asyncio

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
