"""service.client against the live service, and its retry policy against a mock transport."""

import asyncio
import json

import httpx
import pytest

from service.client import AsyncTranslationClient, ServiceError, TranslationClient


@pytest.mark.slow
def test_the_sync_client_translates_and_fetches_the_explanation(service_url):
    with TranslationClient(service_url) as client:
        result = client.translate(["I like tea."], source_lang="en", target_lang="zh", max_length=4)
        explanation = client.explanation(result["translations"][0]["explanation_id"])
        assert explanation["target_tokens"] == result["translations"][0]["target_tokens"]
        steps = client.explain("I like tea.", source_lang="en", target_lang="zh", layer=0, head=1)["steps"]
        assert steps["layer"] == 0 and steps["head"] == 1
        by_id = client.explain(explanation_id=explanation["explanation_id"], layer=1, head=2)
        assert by_id["target_tokens"] == explanation["target_tokens"] and by_id["steps"]["head"] == 2
        assert {m["id"] for m in client.models()["models"]} == {"en-zh", "zh-en"}
        assert client.ready()


@pytest.mark.slow
def test_the_async_client_translates(service_url):
    async def run():
        async with AsyncTranslationClient(service_url) as client:
            result = await client.translate(["我喜欢茶。"], model="zh-en", max_length=4)
            return await client.explanation(result["translations"][0]["explanation_id"])

    assert asyncio.run(run())["model"] == "zh-en"


@pytest.mark.slow
def test_the_client_raises_the_services_error(service_url):
    with TranslationClient(service_url) as client, pytest.raises(ServiceError) as raised:
        client.translate(["a"], source_lang="en", target_lang="fr")
    assert raised.value.status == 404 and raised.value.code == "model_not_found"


def overloaded_then_ok(answers: list[int]):
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        status = answers[min(len(calls) - 1, len(answers) - 1)]
        if status == 503:
            return httpx.Response(
                503, json={"error": {"code": "overloaded", "message": "busy"}}, headers={"Retry-After": "0"}
            )
        return httpx.Response(200, json={"models": []})

    return handler, calls


def test_the_client_retries_503_then_succeeds():
    handler, calls = overloaded_then_ok([503, 503, 200])
    with TranslationClient("http://service", transport=httpx.MockTransport(handler), backoff_s=0) as client:
        assert client.models() == {"models": []}
    assert len(calls) == 3


def test_the_client_gives_up_after_max_retries():
    handler, calls = overloaded_then_ok([503])
    with TranslationClient(
        "http://service", transport=httpx.MockTransport(handler), max_retries=2, backoff_s=0
    ) as client:
        with pytest.raises(ServiceError) as raised:
            client.models()
    assert raised.value.code == "overloaded" and len(calls) == 3


def test_the_async_client_retries_503():
    handler, calls = overloaded_then_ok([503, 200])

    async def run():
        async with AsyncTranslationClient(
            "http://service", transport=httpx.MockTransport(handler), backoff_s=0
        ) as client:
            return await client.models()

    assert asyncio.run(run()) == {"models": []} and len(calls) == 2


def test_the_client_sends_its_api_key():
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("authorization"))
        return httpx.Response(200, json={"models": []})

    with TranslationClient("http://service", api_key="k1", transport=httpx.MockTransport(handler)) as client:
        client.models()
    assert seen == ["Bearer k1"]


def overloaded_then_a_stream(answers: list[int]):
    """503s (Retry-After 0), then the stream route's answer: a start and a result event."""
    calls = []
    events = [{"type": "start", "streams_tokens": False}, {"type": "result", "translation": {"text": "好"}}]
    stream = "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events).encode()

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(json.loads(request.content))
        status = answers[min(len(calls) - 1, len(answers) - 1)]
        if status == 503:
            return httpx.Response(
                503, json={"error": {"code": "overloaded", "message": "busy"}}, headers={"Retry-After": "0"}
            )
        if status == 422:
            return httpx.Response(422, json={"error": {"code": "invalid_request", "message": "texts"}})
        return httpx.Response(200, content=stream, headers={"content-type": "text/event-stream"})

    return handler, calls, events


def test_a_stream_is_retried_on_503_before_it_answers_as_translate_is():
    handler, calls, events = overloaded_then_a_stream([503, 503, 200])
    with TranslationClient("http://service", transport=httpx.MockTransport(handler), backoff_s=0) as client:
        assert list(client.translate_stream("Hi.", source_lang="en", target_lang="zh", beam_size=1)) == events
    assert len(calls) == 3 and all(body == calls[0] for body in calls)  # the same request each time

    handler, calls, _ = overloaded_then_a_stream([503])
    with (
        TranslationClient(
            "http://service", transport=httpx.MockTransport(handler), max_retries=2, backoff_s=0
        ) as client,
        pytest.raises(ServiceError) as raised,
    ):
        list(client.translate_stream("Hi.", source_lang="en", target_lang="zh"))
    assert raised.value.code == "overloaded" and len(calls) == 3

    handler, calls, _ = overloaded_then_a_stream([422])  # a client error is answered at once
    with TranslationClient("http://service", transport=httpx.MockTransport(handler)) as client:
        with pytest.raises(ServiceError) as raised:
            list(client.translate_stream("Hi.", source_lang="en", target_lang="zh"))
    assert raised.value.status == 422 and len(calls) == 1


def test_an_async_stream_is_retried_on_503_before_it_answers():
    handler, calls, events = overloaded_then_a_stream([503, 200])

    async def run():
        async with AsyncTranslationClient(
            "http://service", transport=httpx.MockTransport(handler), backoff_s=0
        ) as client:
            return [event async for event in client.translate_stream("Hi.", model="en-zh")]

    assert asyncio.run(run()) == events and len(calls) == 2


def test_a_stream_whose_connection_fails_is_retried_then_raises_the_transport_error():
    calls = []

    def refused(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        raise httpx.ConnectError("connection refused")

    with (
        TranslationClient(
            "http://service", transport=httpx.MockTransport(refused), max_retries=2, backoff_s=0
        ) as client,
        pytest.raises(httpx.ConnectError),
    ):
        list(client.translate_stream("Hi.", model="en-zh"))
    assert len(calls) == 3
