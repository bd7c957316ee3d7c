"""Security properties beyond test_guarded.py: nothing internal leaks, keys are strict, no pickle loads.

test_guarded.py covers 401 without/with a wrong key and CORS for a configured origin; this module
checks the headers and bodies of every kind of answer, keys in places they must not work, and the
code paths that could load untrusted files.
"""

import re
from pathlib import Path

import httpx
import pytest

from service.middleware import key_is_valid
from tests.service.conftest import API_KEYS

REPO = Path(__file__).resolve().parents[2]
LEAKS = re.compile(r"Traceback|File \"|site-packages|/work/|/root/|/tmp/|Ray|ray\.|RayTaskError|pid=|0x[0-9a-f]{6,}")
ALLOWED_HEADERS = {
    "date",
    "server",
    "content-length",
    "content-type",
    "x-request-id",  # x-request-id: Ray Serve's, for tracing
    "retry-after",
    "www-authenticate",
    "allow",
    "vary",
    # HAProxy's "close" on a kept-alive connection its previous process still holds after Serve reloaded its
    # config (the ingress replicas changed, as when test_reliability kills one): hop-by-hop, it reveals nothing
    "connection",
}
TRANSLATE = {"texts": ["I like tea."], "source_lang": "en", "target_lang": "zh", "max_length": 4}


@pytest.fixture(scope="module")
def answers(client: httpx.Client, guarded_url: str) -> dict[str, httpx.Response]:
    """One answer of every kind the service gives: successes, each 4xx and a 504."""
    with httpx.Client(base_url=guarded_url, timeout=60) as guarded:
        key = {"Authorization": f"Bearer {API_KEYS[0]}"}
        return {
            "200 translate": client.post("/v1/translate", json=TRANSLATE),
            "200 healthz": client.get("/healthz"),
            "400 json": client.post("/v1/translate", content=b"{", headers={"Content-Type": "application/json"}),
            "400 id": client.get("/v1/explanations/%00"),
            "401": guarded.get("/v1/models"),
            "404 route": client.get("/v1/nothing"),
            "404 model": client.post("/v1/translate", json={"texts": ["a"], "model": "/etc/passwd"}),
            "404 id": client.get("/v1/explanations/AQVlbi16aAAAAAAAAAAAAAEBAQE"),
            "405": client.delete("/v1/translate"),
            "413": client.post("/v1/translate", content=b"x" * 1_100_000, headers={"Content-Type": "application/json"}),
            "422": client.post("/v1/translate", json={"texts": []}),
            "504": guarded.post("/v1/translate", json=TRANSLATE, headers=key),
        }


@pytest.mark.slow
def test_no_answer_carries_internals_in_its_headers(answers):
    for name, response in answers.items():
        unexpected = set(response.headers) - ALLOWED_HEADERS
        assert not unexpected, f"{name}: {unexpected}"
        # Ray Serve's proxy (uvicorn) names itself, without a version; nothing else may
        assert response.headers.get("server", "uvicorn") == "uvicorn", name


@pytest.mark.slow
def test_no_error_body_carries_internals(answers):
    for name, response in answers.items():
        if response.status_code >= 400:
            assert set(response.json()) == {"error"}, name
            assert not LEAKS.search(response.text), f"{name}: {response.text}"


@pytest.mark.slow
def test_cors_preflight_is_refused_by_default(client):
    preflight = {"Origin": "https://anywhere.example", "Access-Control-Request-Method": "POST"}
    response = client.options("/v1/translate", headers=preflight)
    assert not [header for header in response.headers if header.startswith("access-control-")]


@pytest.mark.slow
@pytest.mark.parametrize(
    "request_kwargs",
    [
        {"params": {"api_key": API_KEYS[0]}},
        {"headers": {"Authorization": "Bearer"}},
        {"headers": {"Authorization": f"Bearer {API_KEYS[0].upper()}"}},
        {"headers": {"Authorization": f"Basic {API_KEYS[0]}"}},
        {"headers": {"X-API-Key": f"{API_KEYS[0]},{API_KEYS[1]}"}},
        {"headers": {"Cookie": f"api_key={API_KEYS[0]}"}},
        {"headers": {"Authorization": f"Bearer X{API_KEYS[0][1:]}"}},
        {"headers": {"Authorization": f"Bearer {API_KEYS[0][:-1]}X"}},
    ],
    ids=[
        "query-string",
        "empty-bearer",
        "other-case",
        "basic-scheme",
        "two-keys-in-one",
        "cookie",
        "first-character-differs",
        "last-character-differs",
    ],
)
def test_a_key_is_accepted_only_exactly_and_only_in_a_header(guarded_url, request_kwargs):
    response = httpx.get(f"{guarded_url}/v1/models", timeout=30, **request_kwargs)
    assert response.status_code == 401, response.text


def with_character_replaced(key: str, index: int) -> str:
    """The key with one character changed: same length, differing only at `index`."""
    replacement = "Z" if key[index] != "Z" else "Y"
    return key[:index] + replacement + key[index + 1 :]


@pytest.mark.parametrize("accepted", [API_KEYS, API_KEYS[::-1]], ids=["first-listed", "last-listed"])
def test_only_an_exact_key_is_valid_whichever_character_differs(accepted):
    for key in API_KEYS:
        assert key_is_valid(key, list(accepted))
        for index in (0, len(key) // 2, len(key) - 1):
            assert not key_is_valid(with_character_replaced(key, index), list(accepted)), (key, index)
        for near_miss in (key[:-1], key + key[-1], key.upper(), f" {key}"):
            assert not key_is_valid(near_miss, list(accepted)), near_miss


@pytest.mark.parametrize("presented", [None, "", "ключ", "k\x00ey"])
def test_missing_empty_and_unusual_keys_are_refused_without_an_error(presented):
    assert not key_is_valid(presented, list(API_KEYS))
    assert not key_is_valid(presented, [""])  # an empty accepted key never admits an empty presented one
    assert not key_is_valid(presented, [])


def test_no_code_path_unpickles_files():
    pattern = re.compile(
        r"\bimport pickle\b|\bpickle\.loads?\(|\btorch\.load\(|\bcloudpickle\b|weights_only\s*=\s*False"
    )
    for package in ("model", "service"):
        for path in (REPO / package).rglob("*.py"):
            assert not pattern.search(path.read_text()), f"{path.relative_to(REPO)} may unpickle a file"
