"""Each error case answers its status with {"error": {"code", "message"}} and nothing internal."""

import pytest

from service.config import DEFAULT_EXPLANATION_SECRET
from service.explanations import ExplanationKey, encode_explanation_id

pytestmark = pytest.mark.slow

EN_ZH = {"source_lang": "en", "target_lang": "zh"}


def assert_error(response, status: int, code: str | None = None) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}, body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    for leak in ("Traceback", 'File "', "/work/", "ray.", "RayTaskError"):
        assert leak not in body["error"]["message"]
    if code is not None:
        assert body["error"]["code"] == code
    return body["error"]


@pytest.mark.parametrize(
    "body",
    [
        {**EN_ZH},
        {"texts": [], **EN_ZH},
        {"texts": ["a"] * 65, **EN_ZH},
        {"texts": ["a" * 2001], **EN_ZH},
        {"texts": "not a list", **EN_ZH},
        {"texts": [3], **EN_ZH},
        {"texts": ["a"], "beam_size": 0, **EN_ZH},
        {"texts": ["a"], "beam_size": 9, **EN_ZH},
        {"texts": ["a"], "beam_size": 2, "n_best": 3, **EN_ZH},
        {"texts": ["a"], "max_length": 0, **EN_ZH},
        {"texts": ["a"], "max_length": 513, **EN_ZH},
        {"texts": ["a"], "attention": "everything", **EN_ZH},
        {"texts": ["a"], "beams": 4, **EN_ZH},
        {"texts": ["a"], "source_lang": "en"},
        {"texts": ["a"], "model": "en-zh", "target_lang": "en"},
    ],
    ids=[
        "no-texts",
        "empty-texts",
        "too-many-texts",
        "text-too-long",
        "texts-not-a-list",
        "text-not-a-string",
        "beam-0",
        "beam-9",
        "n-best-over-beam",
        "max-length-0",
        "max-length-513",
        "bad-attention",
        "unknown-field",
        "half-a-language-pair",
        "model-and-other-languages",
    ],
)
def test_an_invalid_translate_request_is_422(client, body):
    assert_error(client.post("/v1/translate", json=body), 422)


def test_an_unknown_language_pair_is_404_listing_what_is_available(client):
    error = assert_error(
        client.post("/v1/translate", json={"texts": ["a"], "source_lang": "en", "target_lang": "fr"}), 404
    )
    assert error["code"] == "model_not_found" and "en-zh" in error["message"] and "zh-en" in error["message"]


def test_an_unknown_model_is_404(client):
    assert_error(client.post("/v1/translate", json={"texts": ["a"], "model": "../../etc"}), 404, "model_not_found")


def test_malformed_json_is_400(client):
    response = client.post("/v1/translate", content=b'{"texts": ["a"', headers={"content-type": "application/json"})
    assert_error(response, 400, "invalid_json")


@pytest.mark.parametrize(
    "content_type", ["application/x-www-form-urlencoded", "text/plain"], ids=["form, as curl -d sends it", "text"]
)
def test_a_json_body_sent_under_another_content_type_is_415_saying_so(client, content_type):
    """A valid request body under another content type is not read as JSON (FastAPI's rule); the answer names
    the fix rather than a field error about a dictionary. With no content type at all it is read as JSON."""
    body = b'{"texts": ["I like tea."], "source_lang": "en", "target_lang": "zh"}'
    headers = {"content-type": content_type}
    error = assert_error(client.post("/v1/translate", content=body, headers=headers), 415, "unsupported_media_type")
    assert "content-type: application/json" in error["message"]
    assert client.post("/v1/translate", content=body, headers={"content-type": "application/json"}).status_code == 200


def test_a_json_array_body_is_422(client):
    assert_error(client.post("/v1/translate", json=[1, 2]), 422)


@pytest.mark.parametrize(
    "content",
    [b'{"texts": ["\xff\xfe"]}', b'{"texts": ["a"], "beam_size": NaN}', b'{"texts": ["a"], "beam_size": Infinity}'],
)
def test_bytes_that_are_not_a_valid_request_are_400_or_422(client, content):
    response = client.post("/v1/translate", content=content, headers={"content-type": "application/json"})
    assert response.status_code in (400, 422)
    assert_error(response, response.status_code)


def test_a_body_over_the_limit_is_413(client):
    response = client.post("/v1/translate", content=b" " * 1_000_001, headers={"content-type": "application/json"})
    assert_error(response, 413, "body_too_large")


def test_a_streamed_body_over_the_limit_is_413(client):
    chunks = (b" " * 100_000 for _ in range(11))  # no Content-Length: counted while read
    response = client.post("/v1/translate", content=chunks, headers={"content-type": "application/json"})
    assert_error(response, 413, "body_too_large")


def test_a_text_longer_than_the_model_allows_is_413(client):
    # 2,000 characters are within the request limit but far beyond the tiny model's 128 positions
    text = " ".join(["tomorrow"] * 222)
    response = client.post("/v1/translate", json={"texts": [text], **EN_ZH})
    assert_error(response, 413, "input_too_long")
    # the message names both limits, as /v1/models states them
    info = next(m for m in client.get("/v1/models").json()["models"] if m["id"] == "en-zh")
    message = response.json()["error"]["message"]
    assert f"{info['max_text_characters']} characters" in message and f"{info['max_source_tokens']} tokens" in message


def test_max_length_or_min_length_beyond_the_model_is_413(client):
    limit = next(m for m in client.get("/v1/models").json()["models"] if m["id"] == "en-zh")["max_source_tokens"]
    for field in ("max_length", "min_length"):
        response = client.post("/v1/translate", json={"texts": ["a"], field: 300, **EN_ZH})
        error = assert_error(response, 413, "input_too_long")
        assert field in error["message"] and str(limit) in error["message"]


def test_a_malformed_explanation_id_is_400(client):
    assert_error(client.get("/v1/explanations/not.an~id"), 400, "invalid_explanation_id")


def test_an_overlong_explanation_id_is_400(client):
    assert_error(client.get("/v1/explanations/" + "A" * 9000), 400, "invalid_explanation_id")


def test_a_forged_explanation_id_is_404(client):
    assert_error(client.get("/v1/explanations/AQVlbi16aAAAAAAAAAAAAAEBAQE"), 404, "explanation_not_found")


@pytest.mark.parametrize(
    "model, digest", [("en-zh", "0" * 16), ("de-en", "0" * 16)], ids=["other-weights", "unserved-model"]
)
def test_a_signed_id_for_weights_or_a_model_not_served_is_404(client, model, digest):
    key = ExplanationKey(model, digest, (5, 6, 0), (7, 0))
    explanation_id = encode_explanation_id(key, DEFAULT_EXPLANATION_SECRET.encode())
    assert_error(client.get(f"/v1/explanations/{explanation_id}"), 404, "explanation_not_found")


def test_explain_by_a_forged_explanation_id_is_404(client):
    body = {"explanation_id": "AQVlbi16aAAAAAAAAAAAAAEBAQE"}
    assert_error(client.post("/v1/explain", json=body), 404, "explanation_not_found")


@pytest.mark.parametrize(
    "extra", [{}, {"source": "I like tea."}, {"model": "en-zh"}], ids=["neither", "id-and-source", "id-and-model"]
)
def test_explain_needs_exactly_one_way_to_name_the_translation(client, extra):
    body = dict(extra)
    if extra:
        response = client.post("/v1/translate", json={"texts": ["I like tea."], "max_length": 4, **EN_ZH})
        body["explanation_id"] = response.json()["translations"][0]["explanation_id"]
    assert_error(client.post("/v1/explain", json=body), 422)


def test_a_truncated_explanation_id_is_404(client):
    response = client.post("/v1/translate", json={"texts": ["I like tea."], "max_length": 4, **EN_ZH})
    explanation_id = response.json()["translations"][0]["explanation_id"]
    assert_error(client.get(f"/v1/explanations/{explanation_id[:-3]}"), 404, "explanation_not_found")


@pytest.mark.parametrize(
    "body",
    [
        {"source": "I like tea.", **EN_ZH, "layer": 7},
        {"source": "I like tea.", **EN_ZH, "head": 4},
        {"source": "I like tea.", **EN_ZH, "position": 500},
        {"source": "I like tea.", **EN_ZH, "kind": "decoder_self"},
        {"source": "I like tea.", **EN_ZH, "layer": -1},
        {**EN_ZH},
    ],
    ids=["layer", "head", "position", "kind", "negative-layer", "no-source"],
)
def test_an_invalid_explain_request_is_422(client, body):
    assert_error(client.post("/v1/explain", json=body), 422)


def test_an_unknown_route_is_404(client):
    assert_error(client.get("/v3/translate"), 404, "not_found")  # /v2/translate is DeepL's (service/compat/deepl_v2.py)


def test_a_wrong_method_is_405(client):
    assert_error(client.get("/v1/translate"), 405, "method_not_allowed")


def test_a_missing_static_file_is_404(client):
    assert_error(client.get("/static/no-such-file.js"), 404)


def lost_replica_errors() -> list[BaseException]:
    """What Ray raises at the ingress for a call whose replica went away (real exception objects)."""
    import grpc
    from ray.exceptions import ActorDiedError, ActorUnavailableError, NodeDiedError, WorkerCrashedError
    from ray.serve.exceptions import ReplicaUnavailableError

    broken = grpc.aio.AioRpcError(grpc.StatusCode.UNKNOWN, grpc.aio.Metadata(), grpc.aio.Metadata(), "reset")
    return [
        ActorDiedError(),
        ActorUnavailableError("Actor is unavailable.", None),
        ReplicaUnavailableError("replica-1"),
        broken,
        WorkerCrashedError(),
        NodeDiedError("node lost"),
    ]


@pytest.mark.parametrize("error", lost_replica_errors(), ids=lambda error: type(error).__name__)
def test_a_lost_replica_is_sent_again_and_otherwise_answers_503_with_retry_after(error):
    from service.errors import describe, replica_lost

    assert replica_lost(error)
    status, code, message, headers = describe(error, retry_after_s=2)
    assert (status, code, headers) == (503, "unavailable", {"Retry-After": "2"})
    assert "Actor" not in message and "replica-1" not in message  # no Ray internals in the answer


def test_a_cancelled_call_is_not_sent_again():
    from ray.exceptions import TaskCancelledError
    from ray.serve.exceptions import RequestCancelledError

    from service.errors import describe, replica_lost

    for error in (RequestCancelledError("r"), TaskCancelledError()):
        assert not replica_lost(error)
        assert describe(error)[0] == 503
