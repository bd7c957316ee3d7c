"""Hostile input: every entry gets a 4xx JSON error (or a normal 200), never a 5xx, and the service stays up.

The exact status of the common mistakes is specified in test_errors.py; this catalogue is about
surviving what a fuzzer or an attacker sends: huge, deep, malformed, odd-Unicode and numeric edge cases.
"""

import json

import pytest

from tests.harness.loadgen import is_error_body

pytestmark = pytest.mark.slow

PAIR = {"source_lang": "en", "target_lang": "zh"}
EN_ZH = {**PAIR, "beam_size": 1, "max_length": 8}
TWO_MEGABYTES = 2 * 1024 * 1024
# a right-to-left override around English, then Hebrew and Arabic
RIGHT_TO_LEFT = "\u202eI like tea.\u202c \u05e9\u05dc\u05d5\u05dd \u0645\u0631\u062d\u0628\u0627"


def translate(texts, **fields):
    return {"json": {"texts": texts, **EN_ZH, **fields}}


def raw(body: bytes, content_type: str = "application/json"):
    return {"content": body, "headers": {"Content-Type": content_type}}


def with_field(fragment: bytes):
    """A translate body with one raw JSON field: numbers Python's json writes differently or not at all."""
    return raw(b'{"texts": ["tea"], ' + fragment + b', "source_lang": "en", "target_lang": "zh"}')


def nested(depth: int) -> bytes:
    return b'{"texts": ' + b"[" * depth + b"]" * depth + b', "source_lang": "en", "target_lang": "zh"}'


def streamed(total: int, chunk: int = 64 * 1024):
    """A chunked body with no Content-Length: the limit must hold while reading, not only on the header."""

    def chunks():
        yield b'{"texts": ["'
        for _ in range(total // chunk):
            yield b"a" * chunk
        yield b'"], "source_lang": "en", "target_lang": "zh"}'

    return {"content": chunks(), "headers": {"Content-Type": "application/json"}}


TRANSLATE_CATALOGUE = [
    pytest.param(raw(b'{"texts": ["' + b"a" * TWO_MEGABYTES + b'"]}'), id="huge-body"),
    pytest.param(streamed(TWO_MEGABYTES), id="huge-chunked-body-without-length"),
    pytest.param(raw(nested(100_000)), id="deeply-nested-arrays"),
    pytest.param(raw(b'{"a":' * 50_000 + b"1" + b"}" * 50_000), id="deeply-nested-objects"),
    pytest.param(raw(b'{"texts": ["\xff\xfe\xc3\x28"], "source_lang": "en", "target_lang": "zh"}'), id="invalid-utf8"),
    pytest.param(raw(b'{"texts": ["\\ud800 tea"], "source_lang": "en", "target_lang": "zh"}'), id="lone-surrogate"),
    pytest.param(with_field(b'"beam_size": NaN'), id="nan"),
    pytest.param(with_field(b'"max_length": Infinity'), id="inf"),
    pytest.param(with_field(b'"beam_size": -Infinity'), id="-inf"),
    pytest.param(with_field(b'"beam_size": 1e400'), id="overflow"),
    pytest.param(with_field(b'"beam_size": ' + b"9" * 5000), id="5000-digit-integer"),
    pytest.param(raw(b""), id="empty-body"),
    pytest.param(raw(b"null"), id="null-body"),
    pytest.param(raw(b"\xef\xbb\xbf" + json.dumps({"texts": ["tea"], **EN_ZH}).encode()), id="byte-order-mark"),
    pytest.param(raw(json.dumps({"texts": ["tea"], **EN_ZH}).encode(), "text/plain"), id="wrong-content-type"),
    pytest.param(with_field(b'"texts": 5'), id="duplicate-keys"),
    pytest.param(translate(["\x00\x01\x07\x1b[31m tea \x7f\x9f"]), id="control-characters"),
    pytest.param(translate(["\u200b\u200c\u200d\ufeff\u2060"]), id="zero-width-only"),
    pytest.param(translate(["I\u200b like\u200d tea."]), id="zero-width-inside"),
    pytest.param(translate([RIGHT_TO_LEFT]), id="rtl"),
    pytest.param(translate(["👍🏽 👨‍👩‍👧 🇨🇳 tea 🫖"]), id="emoji"),
    pytest.param(translate(["\U0010fffd\ue000\ufffe"]), id="private-use-and-noncharacters"),
    pytest.param(translate(["e\u0301" * 300]), id="combining-marks"),
    pytest.param(translate(["a" * 10_000]), id="one-character-10000-times"),
    pytest.param(translate(["a" * 2000]), id="one-character-2000-times"),
    pytest.param(translate(["tea " * 500] * 64), id="64-texts-of-2000-characters"),
    pytest.param(translate([""]), id="empty-text"),
    pytest.param(translate(["   \t\n  "]), id="whitespace-text"),
    pytest.param({"json": {"texts": ["tea"], "model": "en-zh\x00"}}, id="model-id-with-nul"),
    pytest.param({"json": {"texts": ["tea"], "model": "/etc/passwd"}}, id="model-id-a-path"),
    pytest.param({"json": {"texts": ["tea"], "source_lang": "e\u0301n", "target_lang": "zh"}}, id="odd-language-code"),
]

EXPLANATION_IDS = [
    pytest.param("AQVlbi16aAAAAAAAAAAAAAEBAQE" * 3, id="forged"),
    pytest.param("A" * 8000, id="forged-near-the-size-limit"),
    pytest.param("A" * 12_000, id="oversized"),
    pytest.param("A", id="one-character"),
    pytest.param("____----", id="separators-only"),
    pytest.param("AQVlbi16aA==", id="base64-padding"),
    pytest.param("%F0%9F%91%8D", id="emoji"),
    pytest.param("%00", id="nul"),
    pytest.param("..%2F..%2Fetc%2Fpasswd", id="encoded-path-traversal"),
]

EXPLAIN_CATALOGUE = [
    pytest.param({"source": "tea", **PAIR, "position": 10**12}, id="huge-position"),
    pytest.param({"source": "tea", **PAIR, "head": -(10**12)}, id="huge-negative-head"),
    pytest.param({"source": "tea", "target": "\x00\u202e👍", **PAIR}, id="odd-target"),
    pytest.param({"source": "", "target": "", **PAIR}, id="empty-source-and-target"),
    pytest.param({"source": "a" * 10_000, **PAIR}, id="source-10000-characters"),
    pytest.param({"source": "tea", "target": "茶" * 10_000, **PAIR}, id="long-target"),
    pytest.param({"source": ["tea"], **PAIR}, id="source-a-list"),
]


def assert_survived(response, client) -> None:
    assert response.status_code < 500, response.text[:500]
    if response.status_code >= 400:
        assert is_error_body(response.json()), response.text[:500]
    else:
        json.loads(response.text)  # a 200 is valid JSON, whatever the input was
    assert client.get("/healthz").status_code == 200


@pytest.mark.parametrize("request_kwargs", TRANSLATE_CATALOGUE)
def test_hostile_translate_requests_get_a_clean_answer(client, request_kwargs):
    assert_survived(client.post("/v1/translate", **request_kwargs), client)


@pytest.mark.parametrize("explanation_id", EXPLANATION_IDS)
def test_hostile_explanation_ids_get_a_4xx(client, explanation_id):
    response = client.get(f"/v1/explanations/{explanation_id}")
    assert_survived(response, client)
    assert 400 <= response.status_code < 500


@pytest.mark.parametrize("body", EXPLAIN_CATALOGUE)
def test_hostile_explain_requests_get_a_clean_answer(client, body):
    assert_survived(client.post("/v1/explain", json=body), client)


def test_the_service_still_translates_after_the_catalogue(client):
    response = client.post("/v1/translate", json={"texts": ["I like tea."], **EN_ZH})
    assert response.status_code == 200 and response.json()["translations"][0]["explanation_id"]
