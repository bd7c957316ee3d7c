"""service.client against the live service, and its retry policy against a mock transport."""

import asyncio

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
