"""Metrics are right across replicas, and dynamic batching really batches."""

import asyncio

import httpx
import pytest

from tests.harness.prometheus_text import by_label, total
from tests.service.conftest import static_batcher_only

pytestmark = pytest.mark.slow


def scrape(client) -> str:
    response = client.get("/metrics")
    assert response.status_code == 200
    return response.text


async def send_concurrently(service_url: str, bodies: list[dict], concurrency: int) -> list[int]:
    limit = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=service_url, timeout=120) as session:

        async def one(body: dict) -> int:
            async with limit:
                return (await session.post("/v1/translate", json=body)).status_code

        return await asyncio.gather(*(one(body) for body in bodies))


@static_batcher_only
def test_concurrent_requests_share_batches(client, service_url):
    before = scrape(client)
    bodies = [{"texts": [f"I like tea {i}."], "model": "zh-en", "max_length": 4} for i in range(24)]
    assert asyncio.run(send_concurrently(service_url, bodies, concurrency=24)) == [200] * 24
    after = scrape(client)
    batches = total(after, "translation_batch_size_count", model="zh-en") - total(
        before, "translation_batch_size_count", model="zh-en"
    )
    texts = total(after, "translation_batch_size_sum", model="zh-en") - total(
        before, "translation_batch_size_sum", model="zh-en"
    )
    assert texts == 24
    assert batches < 24, "every text was decoded alone: no batching"
    single = total(after, "translation_batch_size_bucket", model="zh-en", le="1.0") - total(
        before, "translation_batch_size_bucket", model="zh-en", le="1.0"
    )
    assert single < batches, "the batch-size histogram shows no batch larger than 1"


async def post_concurrently(service_url: str, bodies: list[dict]) -> list[httpx.Response]:
    async with httpx.AsyncClient(base_url=service_url, timeout=120) as session:
        return await asyncio.gather(*(session.post("/v1/translate", json=body) for body in bodies))


@static_batcher_only
def test_concurrent_requests_share_ingress_calls_and_each_gets_its_own_answer(client, service_url):
    """Coalescing at the ingress (service/coalescing.py): shared calls, yet every request is answered alone."""
    too_long = " ".join(["tomorrow"] * 222)  # beyond the tiny model's positions: 413 for that request only
    bodies = []
    for i in range(30):
        if i % 10 == 3:
            bodies.append({"texts": ["I like tea.", too_long], "model": "en-zh"})
        else:
            texts = [f"We walk to school {i}."] + (["The cat sat."] if i % 3 == 0 else [])
            bodies.append({"texts": texts, "model": "en-zh", "beam_size": 1 + i % 2, "max_length": 6})
    alone = {}
    for index, body in enumerate(bodies):  # the oracle: each request sent on its own
        if body.get("beam_size"):
            alone[index] = translate_tokens(client.post("/v1/translate", json=body))
    before = scrape(client)
    responses = asyncio.run(post_concurrently(service_url, bodies))
    after = scrape(client)
    for index, response in enumerate(responses):
        if index in alone:
            assert translate_tokens(response) == alone[index]
        else:
            assert response.status_code == 413 and response.json()["error"]["code"] == "input_too_long"
    calls = total(after, "translation_call_requests_count", model="en-zh") - total(
        before, "translation_call_requests_count", model="en-zh"
    )
    requests = total(after, "translation_call_requests_sum", model="en-zh") - total(
        before, "translation_call_requests_sum", model="en-zh"
    )
    assert requests == len(bodies)
    assert calls < requests, "every request went to a translator in a call of its own: no coalescing"


def translate_tokens(response: httpx.Response) -> list[list[str]]:
    assert response.status_code == 200, response.text
    return [translation["target_tokens"] for translation in response.json()["translations"]]


def test_requests_with_different_options_still_share_batches(client, service_url):
    before = scrape(client)
    bodies = [
        {"texts": ["We see the river."], "model": "zh-en", "beam_size": 1 + i % 3, "max_length": 4} for i in range(12)
    ]
    assert asyncio.run(send_concurrently(service_url, bodies, concurrency=12)) == [200] * 12
    after = scrape(client)
    batches = total(after, "translation_batch_size_count", model="zh-en") - total(
        before, "translation_batch_size_count", model="zh-en"
    )
    assert batches < 12


@static_batcher_only
def test_a_request_with_many_texts_is_spread_over_a_batch(client):
    before = scrape(client)
    response = client.post(
        "/v1/translate", json={"texts": [f"text {i}" for i in range(8)], "model": "zh-en", "max_length": 4}
    )
    assert response.status_code == 200 and len(response.json()["translations"]) == 8
    after = scrape(client)
    batches = total(after, "translation_batch_size_count", model="zh-en") - total(
        before, "translation_batch_size_count", model="zh-en"
    )
    assert 1 <= batches < 8


def test_counts_from_two_replicas_add_up_to_the_requests_sent(client, service_url):
    info = scrape(client)
    live = by_label(info, "translation_replica_info", "replica", deployment="translator-en-zh")
    assert len(live) == 2, f"expected two en-zh translator replicas, saw {live}"
    assert len(by_label(info, "translation_replica_info", "replica", deployment="Ingress")) == 2

    requests = 40
    route = {"route": "/v1/translate", "status": "200"}
    before = scrape(client)
    bodies = [{"texts": [f"The dog {i}."], "model": "en-zh", "max_length": 3} for i in range(requests)]
    assert asyncio.run(send_concurrently(service_url, bodies, concurrency=8)) == [200] * requests
    after = scrape(client)

    assert (
        total(after, "translation_http_requests_total", **route)
        - total(before, "translation_http_requests_total", **route)
        == requests
    )
    per_replica_before = by_label(before, "translation_texts_total", "replica", model="en-zh")
    per_replica = {
        replica: count - per_replica_before.get(replica, 0.0)
        for replica, count in by_label(after, "translation_texts_total", "replica", model="en-zh").items()
    }
    assert sum(per_replica.values()) == requests
    assert sum(1 for count in per_replica.values() if count > 0) == 2, (
        f"load did not reach both replicas: {per_replica}"
    )


def test_token_counters_and_latency_histograms_move(client):
    before = scrape(client)
    client.post("/v1/translate", json={"texts": ["I like tea."], "model": "en-zh", "max_length": 4})
    after = scrape(client)
    for name in ("translation_source_tokens_total", "translation_target_tokens_total"):
        assert total(after, name, model="en-zh") > total(before, name, model="en-zh")
    latency = "translation_http_request_duration_seconds_count"
    assert total(after, latency, route="/v1/translate") == total(before, latency, route="/v1/translate") + 1
    for name in ("translation_batch_queue_wait_seconds_count", "translation_batch_duration_seconds_count"):
        assert total(after, name, model="en-zh") > total(before, name, model="en-zh"), name


def test_model_info_names_each_served_model(client):
    models = by_label(scrape(client), "translation_model_info", "model")
    assert set(models) == {"en-zh", "zh-en"}
