"""`args.scheduler: continuous` on a real `serve run`: the same answers as the static policy, concurrently.

The session's service (tests/service/conftest.py) runs the static policy on the same tiny models;
every text decoded by the continuous loop, among others arriving at random moments with other
options, must come back as the static service decodes it alone: same text, tokens, alignment and
explanation id, scores equal to float rounding.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import httpx
import pytest

from service.client import AsyncTranslationClient, ServiceError, TranslationClient
from tests.harness.replica_processes import replica_pids
from tests.service.conftest import SHIPPED_MODEL, Tolerance

EN_ZH = {"source_lang": "en", "target_lang": "zh"}
SHIPPED = SHIPPED_MODEL
TEXTS = [
    "Hello.",
    "The cat sat on the mat.",
    "Where is the station? I have been looking for it since this morning and nobody knows.",
    "I like tea.",
    "Tom reads a very long book about the history of the railway in the mountains.",
    "Yes.",
]


@pytest.fixture(scope="module")
def continuous_url(continuous_service_url: str) -> str:
    return continuous_service_url


def translate(url: str, body: dict) -> httpx.Response:
    return httpx.post(f"{url}/v1/translate", json=body, timeout=60)


def test_concurrent_texts_come_back_as_the_static_scheduler_decodes_them(continuous_url, service_url):
    rng = random.Random(0)
    bodies = []
    for _ in range(24):
        bodies.append(
            {
                **EN_ZH,
                "texts": rng.sample(TEXTS, rng.randint(1, 3)),
                "beam_size": rng.choice([1, 2, 4]),
                "attention": "summary",
                "split_sentences": False,  # one translation object per text, with its attention summary
            }
        )
    with ThreadPoolExecutor(12) as pool:  # 12 at once, more rows than max_rows: some wait, all join mid-decode
        continuous = list(pool.map(lambda body: translate(continuous_url, body), bodies))
    for body, response in zip(bodies, continuous, strict=True):
        assert response.status_code == 200, response.text
        static = translate(service_url, body)
        assert static.status_code == 200, static.text
        for got, expected in zip(response.json()["translations"], static.json()["translations"], strict=True):
            for key in ("text", "target_tokens", "alignment", "word_alignment", "explanation_id"):
                assert got[key] == expected[key], (body, key)
            assert got["token_scores"] == pytest.approx(expected["token_scores"], abs=Tolerance.SCORE)
            summary, reference = got["attention"]["summary"], expected["attention"]["summary"]
            assert len(summary) == len(reference)
            for row, expected_row in zip(summary, reference, strict=True):
                assert row == pytest.approx(expected_row, abs=Tolerance.ATTENTION)


def test_bad_input_is_refused_as_by_the_static_scheduler(continuous_url):
    too_long = translate(continuous_url, {**EN_ZH, "texts": ["word " * 300]})
    assert too_long.status_code == 413 and too_long.json()["error"]["code"] == "input_too_long"
    blank = translate(continuous_url, {**EN_ZH, "texts": ["  "]})
    assert blank.status_code == 200 and blank.json()["translations"][0]["text"] == ""
    wrong = translate(continuous_url, {**EN_ZH, "texts": ["hi"], "beam_size": 99})
    assert wrong.status_code == 422


def stream(url: str, body: dict) -> list[dict]:
    with TranslationClient(url) as client:
        return list(client.translate_stream(body.pop("texts")[0], **body))


@pytest.mark.parametrize("beam_size", [1, 4])
def test_a_stream_sends_each_settled_token_then_the_translate_result(continuous_url, beam_size):
    """Greedy: each token as it is decoded. Beam search: each token once every beam shares it, so the tokens are
    the answer's, in order, none taken back."""
    text = "Tom reads a very long book about the history of the railway."
    events = stream(continuous_url, {**EN_ZH, "texts": [text], "beam_size": beam_size, "attention": "summary"})
    assert events[0] == {"type": "start", "model": "en-zh", "streams_tokens": True, "sentences": 1}
    tokens, result = events[1:-1], events[-1]
    assert result["type"] == "result" and all(e["type"] == "token" for e in tokens)
    translation = result["translation"]
    plain = translate(continuous_url, {**EN_ZH, "texts": [text], "beam_size": beam_size, "split_sentences": False})
    expected = plain.json()["translations"][0]
    for key in ("text", "target_tokens", "explanation_id"):
        assert translation[key] == expected[key], key
    assert [e["index"] for e in tokens] == list(range(len(tokens)))
    assert [e["piece"] for e in tokens] == translation["target_tokens"]
    assert [e["logprob"] for e in tokens] == pytest.approx(translation["token_scores"], abs=Tolerance.SCORE)
    # each token's attention row: the alignment map at the step that predicted it (as in the explanation)
    with TranslationClient(continuous_url) as client:
        explanation = client.explanation(translation["explanation_id"])
    layer, head = explanation["alignment_layer"], explanation["alignment_head"]
    maps = explanation["cross_attention"][layer]
    for event in tokens:
        t = event["index"]
        if head is None:
            row = [sum(h[t][s] for h in maps) / len(maps) for s in range(len(maps[0][t]))]
        else:
            row = maps[head][t]
        assert event["attention"] == pytest.approx(row, abs=Tolerance.ATTENTION)


@pytest.mark.parametrize("beam_size", [1, 4])
def test_the_static_policy_streams_tokens_too(service_url, beam_size):
    """Both policies run the one decode loop, which hands out settled tokens at every step."""
    body = {**EN_ZH, "texts": ["We walk to school."], "beam_size": beam_size}
    events = stream(service_url, dict(body))
    assert events[0]["streams_tokens"]
    expected = translate(service_url, {**body, "split_sentences": False}).json()["translations"][0]
    assert [e["piece"] for e in events if e["type"] == "token"] == expected["target_tokens"]
    assert events[-1]["translation"]["text"] == expected["text"]


# The text of issue #31: /v1/translate splits it, and a stream that did not ended on another translation.
SEVERAL_SENTENCES = "I tried to go home. I don't approve of it after dark. They work together."


@pytest.mark.parametrize("beam_size", [1, 4])
@pytest.mark.parametrize("scheduler", ["continuous", "static"])
def test_a_text_of_several_sentences_streams_sentence_by_sentence_and_ends_as_translate_answers(
    continuous_url, service_url, scheduler, beam_size
):
    """Split as /v1/translate splits it; `sentence` events in order; the result is /v1/translate's object. The
    continuous service on the shipped en-zh (the text the issue reported), the session's on the tiny one."""
    url, model = (continuous_url, SHIPPED) if scheduler == "continuous" else (service_url, "en-zh")
    body = {"model": model, "texts": [SEVERAL_SENTENCES], "beam_size": beam_size}
    events = stream(url, dict(body))
    expected = translate(url, body).json()["translations"][0]
    assert len(expected["sentences"]) == 3
    assert events[0]["type"] == "start" and events[0]["sentences"] == 3
    assert events[-1]["type"] == "result"
    translation = events[-1]["translation"]
    for key in ("text", "source_tokens", "target_tokens", "alignment", "word_alignment", "explanation_id"):
        assert translation[key] == expected[key], key
    assert translation["token_scores"] == pytest.approx(expected["token_scores"], abs=Tolerance.SCORE)
    for got, want in zip(translation["sentences"], expected["sentences"], strict=True):
        assert (got["text"], got["explanation_id"]) == (want["text"], want["explanation_id"])

    done = [e for e in events if e["type"] == "sentence"]
    assert [e["sentence"] for e in done] == [0, 1, 2]
    assert [e["translation"]["text"] for e in done] == [s["text"] for s in expected["sentences"]]
    # in order: each sentence's tokens (when tokens stream), indexed within it, then its `sentence` event
    streamed = events[0]["streams_tokens"]
    expected_order = [
        (kind, index, position)
        for index, sentence in enumerate(expected["sentences"])
        for kind, position in [
            *(("token", t) for t in range(len(sentence["target_tokens"]) if streamed else 0)),
            ("sentence", None),
        ]
    ]
    order = [(e["type"], e["sentence"], e.get("index")) for e in events[1:-1]]
    assert order == expected_order
    pieces = [[e["piece"] for e in events if e["type"] == "token" and e["sentence"] == i] for i in range(3)]
    assert pieces == ([s["target_tokens"] for s in expected["sentences"]] if streamed else [[], [], []])


def test_the_async_client_streams_the_same_events(continuous_url):
    async def collect() -> list[dict]:
        async with AsyncTranslationClient(continuous_url) as client:
            return [event async for event in client.translate_stream("I like tea.", **EN_ZH, beam_size=1)]

    events = asyncio.run(collect())
    assert events == stream(continuous_url, {**EN_ZH, "texts": ["I like tea."], "beam_size": 1})


def test_stream_errors_are_json_answers_before_the_stream_starts(continuous_url):
    with TranslationClient(continuous_url) as client:
        with pytest.raises(ServiceError) as too_long:
            list(client.translate_stream("word " * 300, **EN_ZH, beam_size=1))
        assert too_long.value.status == 413 and too_long.value.code == "input_too_long"
    two = httpx.post(f"{continuous_url}/v1/translate/stream", json={**EN_ZH, "texts": ["a", "b"]}, timeout=30)
    assert two.status_code == 422 and "one text" in two.json()["error"]["message"]


def metric(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


def test_a_client_that_disconnects_stops_its_decode(continuous_url):
    """250 tokens to decode (min_length); the client leaves after two. Measured on the server: the decode was
    cut short (counted only when it had not finished) and the rows in flight fall back to 0."""
    cancelled_before = metric(continuous_url, "translation_cancelled_texts_total")
    text = "The old railway station in the mountains was closed last winter."
    with TranslationClient(continuous_url) as client:
        events = client.translate_stream(text, model=SHIPPED, beam_size=1, min_length=250, max_length=256)
        seen = [next(events) for _ in range(3)]  # start and two tokens
        assert [e["type"] for e in seen] == ["start", "token", "token"], seen
        events.close()  # leave mid-stream: closes the connection
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        cancelled = metric(continuous_url, "translation_cancelled_texts_total") - cancelled_before
        if cancelled == 1 and metric(continuous_url, "translation_decoder_rows") == 0:
            break
        time.sleep(0.2)
    assert metric(continuous_url, "translation_cancelled_texts_total") == cancelled_before + 1
    assert metric(continuous_url, "translation_decoder_rows") == 0


def test_a_streams_result_carries_the_source_shares_asked_for(continuous_url, service_url):
    """source_share on /v1/translate/stream: the result event carries what /v1/translate returns for the text,
    whether the tokens were streamed (continuous, greedy) or not (static)."""
    body = {**EN_ZH, "texts": ["I like green tea."], "beam_size": 1, "source_share": True}
    for url in (continuous_url, service_url):
        *_, result = stream(url, dict(body))
        translation = result["translation"]
        expected = translate(url, dict(body)).json()["translations"][0]
        assert len(translation["token_source_shares"]) == len(translation["target_tokens"])
        shares = expected["token_source_shares"]
        assert translation["token_source_shares"] == pytest.approx(shares, abs=Tolerance.ATTRIBUTION)
        assert translation["source_share"] == pytest.approx(expected["source_share"], abs=Tolerance.ATTRIBUTION)


def test_a_stream_whose_replica_dies_mid_answer_ends_with_an_error_event(continuous_url):
    """The answer has begun (200, tokens sent) when the only replica of the model is killed: the stream is not
    started again (the client has tokens already) and does not hang; its last event is an `error` event with the
    JSON error object, and the model serves again once Serve has replaced the replica."""
    port = urlsplit(continuous_url).port
    (victim,) = replica_pids(port, "translate", f"translator-{SHIPPED}")
    text = "The old railway station in the mountains was closed last winter."
    with TranslationClient(continuous_url, timeout=60) as client:
        events = client.translate_stream(text, model=SHIPPED, beam_size=1, min_length=250, max_length=256)
        seen = [next(events) for _ in range(3)]  # start and two tokens
        assert [e["type"] for e in seen] == ["start", "token", "token"], seen
        os.kill(victim, signal.SIGKILL)
        started = time.monotonic()
        rest = list(events)
    assert time.monotonic() - started < 30, "the stream hung after its replica died"
    assert rest and rest[-1]["type"] == "error", rest[-3:]
    assert rest[-1]["error"]["code"] and rest[-1]["error"]["message"]
    assert all(event["type"] == "token" for event in rest[:-1])
    deadline = time.monotonic() + 90
    while True:
        response = translate(continuous_url, {"model": SHIPPED, "texts": ["I like tea."]})
        if response.status_code == 200:
            break
        assert response.status_code == 503 and time.monotonic() < deadline, response.text
        time.sleep(1)
