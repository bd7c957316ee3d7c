"""`args.layout: colocated` on a real `serve run`: both models in the one Ingress replica, one Ray hop a request.

The session's service runs the same tiny models in the per_model layout (an Ingress, then a translator deployment
per model), tested against the oracles elsewhere; every answer of the colocated application, to the v1 routes and
to the real LibreTranslate and DeepL clients, must equal that one's: same text, tokens, alignment and explanation
id, scores to float rounding.
"""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor

import deepl
import httpx
import pytest
from libretranslatepy import LibreTranslateAPI

from service.client import TranslationClient
from tests.service.conftest import Tolerance

pytestmark = pytest.mark.slow

EN_ZH = {"source_lang": "en", "target_lang": "zh"}
ZH_EN = {"source_lang": "zh", "target_lang": "en"}
TEXTS = [
    "Hello.",
    "The cat sat on the mat.",
    "Where is the station? I have been looking for it since this morning.",
    "Open %s in {{app}} at https://example.com/a?b=1 before 2026.",
    "Tom reads a very long book about the railway.",
]


def translate(url: str, body: dict) -> httpx.Response:
    return httpx.post(f"{url}/v1/translate", json=body, timeout=60)


def assert_same_translations(got: list[dict], expected: list[dict]) -> None:
    assert len(got) == len(expected)
    for mine, theirs in zip(got, expected, strict=True):
        for key in ("text", "source_tokens", "target_tokens", "alignment", "explanation_id", "protected", "terms"):
            assert mine.get(key) == theirs.get(key), key
        assert mine["token_scores"] == pytest.approx(theirs["token_scores"], abs=Tolerance.SCORE)
        assert mine["trust"]["score"] == pytest.approx(theirs["trust"]["score"], abs=1e-4)
        alternatives, references = mine.get("alternatives") or [], theirs.get("alternatives") or []
        assert [a["text"] for a in alternatives] == [a["text"] for a in references]


def test_concurrent_requests_come_back_as_the_per_model_layout_answers_them(colocated_url, service_url):
    rng = random.Random(3)
    bodies = []
    for index in range(24):
        pair = EN_ZH if index % 3 else ZH_EN
        texts = rng.sample(TEXTS if pair is EN_ZH else ["我喜欢喝茶。", "他在哪里？"], rng.randint(1, 2))
        body = {**pair, "texts": texts, "beam_size": rng.choice([1, 2, 4]), "attention": "summary"}
        if index % 4 == 0 and body["beam_size"] > 1:
            body["n_best"] = 2
        if index % 5 == 0 and pair is EN_ZH:
            body["glossary"] = {"cat": "猫"}
        bodies.append(body)
    with ThreadPoolExecutor(8) as pool:  # concurrent: the texts share decode steps in the one replica
        colocated = list(pool.map(lambda body: translate(colocated_url, body), bodies))
    for body, response in zip(bodies, colocated, strict=True):
        assert response.status_code == 200, response.text
        expected = translate(service_url, body)
        assert expected.status_code == 200, expected.text
        assert response.json()["model"] == expected.json()["model"]
        got, reference = response.json()["translations"], expected.json()["translations"]
        assert_same_translations(got, reference)
        for mine, theirs in zip(got, reference, strict=True):
            assert ("attention" in mine) == ("attention" in theirs), (body, sorted(mine))
            summaries = [(t.get("attention") or {}).get("summary", []) for t in (mine, theirs)]
            for row, expected_row in zip(*summaries, strict=True):
                assert row == pytest.approx(expected_row, abs=Tolerance.ATTENTION)


def test_an_explanation_fetched_from_the_colocated_layout_has_the_per_model_layouts_maps(colocated_url, service_url):
    body = {**EN_ZH, "texts": ["The cat sat on the mat."], "beam_size": 4}
    (translation,) = translate(colocated_url, body).json()["translations"]
    with TranslationClient(colocated_url) as colocated, TranslationClient(service_url) as per_model:
        got = colocated.explanation(translation["explanation_id"])
        expected = per_model.explanation(translation["explanation_id"])
    assert got["target_tokens"] == expected["target_tokens"] and got["alignment"] == expected["alignment"]
    for layer, expected_layer in zip(got["cross_attention"], expected["cross_attention"], strict=True):
        for head, expected_head in zip(layer, expected_layer, strict=True):
            for row, expected_row in zip(head, expected_head, strict=True):
                assert row == pytest.approx(expected_row, abs=Tolerance.ATTENTION)
    step = httpx.post(
        f"{colocated_url}/v1/explain",
        json={"explanation_id": translation["explanation_id"], "layer": 0, "head": 0, "position": 0},
        timeout=60,
    )
    assert step.status_code == 200, step.text
    assert step.json()["target_tokens"] == translation["target_tokens"]


@pytest.mark.parametrize("beam_size", [1, 4])
def test_a_stream_from_the_colocated_layout_sends_the_tokens_of_its_translate_answer(colocated_url, beam_size):
    text = "Tom reads a very long book about the railway. The cat sat on the mat."
    with TranslationClient(colocated_url) as client:
        events = list(client.translate_stream(text, **EN_ZH, beam_size=beam_size))
    assert events[0]["type"] == "start" and events[0]["sentences"] == 2
    expected = translate(colocated_url, {**EN_ZH, "texts": [text], "beam_size": beam_size}).json()["translations"][0]
    assert events[-1]["type"] == "result" and events[-1]["translation"]["text"] == expected["text"]
    pieces = [event["piece"] for event in events if event["type"] == "token"]
    sentences = [event["translation"] for event in events if event["type"] == "sentence"]
    assert pieces == [piece for sentence in sentences for piece in sentence["target_tokens"]]


def test_the_libretranslate_and_deepl_clients_get_the_per_model_layouts_answers(colocated_url, service_url):
    text = "I like tea."
    assert LibreTranslateAPI(colocated_url).translate(text, "en", "zh") == LibreTranslateAPI(service_url).translate(
        text, "en", "zh"
    )
    texts = [
        deepl.Translator("any-key", server_url=f"{url}/").translate_text(text, source_lang="EN", target_lang="ZH").text
        for url in (colocated_url, service_url)
    ]
    assert texts[0] == texts[1]


def test_bad_input_is_refused_as_the_per_model_layout_refuses_it(colocated_url, service_url):
    bodies = [
        {**EN_ZH, "texts": ["word " * 300]},
        {**EN_ZH, "texts": ["hi"], "beam_size": 99},
        {"source_lang": "en", "target_lang": "fr", "texts": ["hi"]},
        {**EN_ZH, "texts": ["hi"], "max_length": 100000},
    ]
    for body in bodies:
        got, expected = translate(colocated_url, body), translate(service_url, body)
        assert got.status_code == expected.status_code and got.status_code >= 400, (body, got.text)
        assert got.json()["error"]["code"] == expected.json()["error"]["code"]
    assert translate(colocated_url, {**EN_ZH, "texts": ["I like tea."]}).status_code == 200  # and it goes on


def test_the_colocated_layout_serves_the_same_models(colocated_url, service_url):
    def models(url: str) -> list[tuple]:
        listed = httpx.get(f"{url}/v1/models", timeout=60).json()["models"]
        return [(m["id"], m["weights_digest"], m["precision"], m["alignment_methods"]) for m in listed]

    assert models(colocated_url) == models(service_url)
    ready = httpx.get(f"{colocated_url}/readyz", timeout=60)
    assert ready.status_code == 200 and ready.json()["models"] == ["en-zh", "zh-en"]
