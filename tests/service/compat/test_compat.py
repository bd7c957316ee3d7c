"""LibreTranslate's and DeepL's APIs on the running service, spoken by their real clients.

The clients are the ones from PyPI (libretranslatepy, libretranslate-aio sync and async, the deepl
SDK with server_url), plus the exact request shapes Mastodon, Weblate and Discourse send
(fixtures/client_requests.json, recorded from their source). The test service runs tiny random
models (en-zh, zh-en), so these tests check shapes, routing, detection, errors and equality with
/v1/translate, never translation quality.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import deepl
import httpx
import libretranslate_aio
import pytest
from libretranslatepy import LibreTranslateAPI

from tests.service.conftest import API_KEYS

pytestmark = pytest.mark.slow

FIXTURES = json.loads((Path(__file__).parent / "fixtures" / "client_requests.json").read_text())["requests"]
TAG = re.compile(r"<[^>]+>")


def v1_text(client: httpx.Client, text: str, source: str = "en", target: str = "zh", **options) -> str:
    body = {"texts": [text], "source_lang": source, "target_lang": target, **options}
    response = client.post("/v1/translate", json=body)
    assert response.status_code == 200, response.text
    return response.json()["translations"][0]["text"]


def assert_libretranslate_error(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and isinstance(body["error"], str) and body["error"], body
    return body["error"]


def assert_deepl_error(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"message"} and isinstance(body["message"], str) and body["message"], body
    return body["message"]


# ---- LibreTranslate: the real clients ---------------------------------------------------------


def test_libretranslatepy_translates_like_v1(service_url, client):
    api = LibreTranslateAPI(service_url)
    assert api.translate("I like tea.", "en", "zh") == v1_text(client, "I like tea.")


def test_libretranslatepy_detects_and_lists_languages(service_url):
    api = LibreTranslateAPI(service_url)
    detections = api.detect("I like tea very much.")
    assert detections[0]["language"] == "en" and 0 <= detections[0]["confidence"] <= 100
    languages = {language["code"]: language for language in api.languages()}
    assert languages["en"]["targets"] == ["zh"] and languages["zh"]["targets"] == ["en"]
    assert languages["en"]["name"] == "English"


def test_libretranslate_aio_sync_translates_a_list_with_alternatives(service_url, client):
    with libretranslate_aio.LibreTranslate(service_url) as api:
        result = api.translate(["I like tea.", "The cat sat."], "en", "zh", alternatives=2)
        assert result.translated_text == [v1_text(client, "I like tea."), v1_text(client, "The cat sat.")]
        assert len(result.alternatives) == 2 and all(len(others) <= 2 for others in result.alternatives)
        assert api.health() is True
        settings = api.frontend_settings()
        assert settings.language.source.code == "auto" and settings.char_limit > 0
        assert {language.code for language in api.languages()} == {"en", "zh"}


def test_libretranslate_aio_async_detects_the_source_of_each_text(service_url):
    async def run():
        async with libretranslate_aio.AsyncLibreTranslate(service_url) as api:
            translated = await api.translate(["I like tea.", "The weather is nice today."], "auto", "zh")
            detected = await api.detect("我喜欢喝茶。")
            return translated, detected

    translated, detected = asyncio.run(run())
    assert [d.language for d in translated.detected_language] == ["en", "en"]
    assert all(0 < d.confidence <= 100 for d in translated.detected_language)
    assert detected[0].language == "zh"


def test_libretranslate_aio_gets_a_bad_request_for_an_unserved_language(service_url):
    with libretranslate_aio.LibreTranslate(service_url) as api:
        with pytest.raises(libretranslate_aio.BadRequestError, match="de is not supported"):
            api.translate("I like tea.", "en", "de")


# ---- LibreTranslate: request shapes and errors -------------------------------------------------


def test_repeated_form_keys_are_a_list_of_texts(client):
    response = client.post("/translate", data={"q": ["I like tea.", "The cat sat."], "source": "en", "target": "zh"})
    assert response.status_code == 200, response.text
    assert response.json() == {"translatedText": [v1_text(client, "I like tea."), v1_text(client, "The cat sat.")]}


def test_auto_gives_one_detected_language_per_text(client):
    body = {"q": ["I like tea.", "我喜欢喝茶。"], "source": "auto", "target": "en"}
    message = assert_libretranslate_error(client.post("/translate", json=body), 400)
    assert "detected as English" in message and "en→en" in message  # the English text has no model to en
    detected = client.post("/translate", json={**body, "q": ["我喜欢喝茶。", "今天天气很好。"]}).json()
    assert [d["language"] for d in detected["detectedLanguage"]] == ["zh", "zh"]
    assert detected["translatedText"] == [
        v1_text(client, "我喜欢喝茶。", "zh", "en"),
        v1_text(client, "今天天气很好。", "zh", "en"),
    ]


def test_detect_answers_per_text_for_a_list(client):
    answer = client.post("/detect", json={"q": ["I like tea very much.", "我喜欢喝茶。"]}).json()
    assert [candidates[0]["language"] for candidates in answer] == ["en", "zh"]


@pytest.mark.parametrize("text", ["", "   "])
def test_empty_texts_give_empty_translations(client, text):
    response = client.post("/translate", json={"q": [text, "I like tea."], "source": "en", "target": "zh"})
    assert response.json()["translatedText"] == [text, v1_text(client, "I like tea.")]


@pytest.mark.parametrize(
    "body, fragment",
    [
        ({"source": "en", "target": "zh"}, "missing q parameter"),
        ({"q": "Hi", "target": "zh"}, "missing source parameter"),
        ({"q": "Hi", "source": "en"}, "missing target parameter"),
        ({"q": "Hi", "source": "en", "target": "zh", "format": "pdf"}, "pdf format is not supported"),
        ({"q": "Hi", "source": "en", "target": "zh", "alternatives": "many"}, "alternatives"),
        ({"q": "Hi", "source": "xx", "target": "zh"}, "xx is not supported"),
        ({"q": [1, 2], "source": "en", "target": "zh"}, "q must be"),
        ({"q": ["Hi"] * 129, "source": "en", "target": "zh"}, "exceeds text limit"),
    ],
)
def test_invalid_libretranslate_requests_are_400_with_an_error_string(client, body, fragment):
    assert fragment in assert_libretranslate_error(client.post("/translate", json=body), 400)


def test_malformed_json_is_400_invalid_json_format(client):
    response = client.post("/translate", content=b"{not json", headers={"content-type": "application/json"})
    assert assert_libretranslate_error(response, 400) == "Invalid JSON format"


def test_a_body_over_the_limit_is_400_on_libretranslate_and_413_on_deepl(client):
    big = "a" * 1_100_000
    assert_libretranslate_error(client.post("/translate", data={"q": big, "source": "en", "target": "zh"}), 400)
    assert_deepl_error(client.post("/v2/translate", data={"text": big, "target_lang": "ZH"}), 413)


def test_a_long_text_is_translated_sentence_by_sentence_and_joined(client):
    # 2,400 characters: past what /v1/translate takes in one text, and past what the tiny model takes at once
    sentence = v1_text(client, "I like tea.")
    text = "I like tea. " * 200 + "\nI like tea."
    response = client.post("/translate", json={"q": text, "source": "en", "target": "zh"})
    assert response.status_code == 200, response.text
    assert response.json()["translatedText"] == sentence * 200 + "\n" + sentence  # zh: no spaces between sentences
    english = v1_text(client, "我喜欢喝茶。", "zh", "en")
    response = client.post("/translate", json={"q": "我喜欢喝茶。我喜欢喝茶。", "source": "zh", "target": "en"})
    assert response.json()["translatedText"] == f"{english} {english}"  # en: one space where zh had none


def test_html_keeps_every_tag_and_attribute(client):
    html = '<p class="x">I like <b>tea</b>.<br/>The <a href="https://e.example/?a=1&amp;b=2">cat</a> sat.</p>'
    response = client.post("/translate", json={"q": html, "source": "en", "target": "zh", "format": "html"})
    translated = response.json()["translatedText"]
    assert TAG.findall(translated) == TAG.findall(html)
    assert translated.startswith('<p class="x">') and v1_text(client, "tea") in translated


def test_libretranslate_routes_are_counted_by_route_template(client):
    client.post("/translate", json={"q": "Hi", "source": "en", "target": "zh"})
    client.post("/v2/translate", json={"text": ["Hi"], "target_lang": "ZH"})
    metrics = client.get("/metrics").text
    assert 'route="/translate"' in metrics and 'route="/v2/translate"' in metrics


# ---- API keys on the guarded application -------------------------------------------------------


@pytest.fixture(scope="module")
def guarded(guarded_url):
    with httpx.Client(base_url=guarded_url, timeout=60) as session:
        yield session


def test_a_missing_key_is_400_and_a_wrong_key_403_as_libretranslate_answers(guarded):
    body = {"q": "Hi", "source": "en", "target": "zh"}
    assert "API key" in assert_libretranslate_error(guarded.post("/translate", json=body), 400)
    assert assert_libretranslate_error(guarded.post("/translate", json={**body, "api_key": "wrong"}), 403) == (
        "Invalid API key"
    )
    assert_libretranslate_error(guarded.post("/detect", data={"q": "Hi", "api_key": "wrong"}), 403)


@pytest.mark.parametrize("where", ["json", "form", "query"])
def test_a_service_key_is_accepted_as_api_key(guarded, where):
    key = API_KEYS[1]
    if where == "json":
        response = guarded.post("/detect", json={"q": "I like tea.", "api_key": key})
    elif where == "form":
        response = guarded.post("/detect", data={"q": "I like tea.", "api_key": key})
    else:
        response = guarded.post("/detect", params={"api_key": key}, data={"q": "I like tea."})
    assert response.status_code == 200 and response.json()[0]["language"] == "en"


def test_languages_settings_and_health_need_no_key(guarded):
    for path in ("/languages", "/frontend/settings", "/health"):
        assert guarded.get(path).status_code == 200
    assert guarded.get("/frontend/settings").json()["keyRequired"] is True


def test_deepl_keys_come_from_the_deepl_auth_key_header(guarded):
    assert_deepl_error(guarded.get("/v2/usage"), 403)
    assert_deepl_error(guarded.get("/v2/usage", headers={"Authorization": "DeepL-Auth-Key wrong"}), 403)
    assert guarded.get("/v2/usage", headers={"Authorization": f"DeepL-Auth-Key {API_KEYS[0]}"}).status_code == 200


def test_overload_is_429_for_libretranslate_clients(guarded_url):
    # Two requests at once against the guarded in-flight limit of one (see test_guarded.py): one waits
    # for its batch past the timeout (LibreTranslate's 500), the other is refused meanwhile (429).
    body = {"q": "I like tea.", "source": "en", "target": "zh", "api_key": API_KEYS[0]}

    async def both() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=guarded_url, timeout=60) as session:
            return list(await asyncio.gather(*(session.post("/translate", json=body) for _ in range(2))))

    refused, timed_out = sorted(asyncio.run(both()), key=lambda response: response.status_code)
    assert_libretranslate_error(refused, 429)
    assert refused.headers["retry-after"] == "1"
    assert_libretranslate_error(timed_out, 500)


# ---- DeepL: the official SDK -------------------------------------------------------------------


@pytest.fixture(scope="module")
def translator(service_url):
    session = deepl.Translator("any-key", server_url=service_url)
    yield session
    session.close()


def test_deepl_sdk_translates_one_text_like_v1(translator, client):
    result = translator.translate_text("I like tea.", target_lang="ZH")
    assert result.text == v1_text(client, "I like tea.")
    assert result.detected_source_lang == "EN"


def test_deepl_sdk_translates_a_list_with_detection_per_text(translator, client):
    results = translator.translate_text(["我喜欢喝茶。", "今天天气很好。"], target_lang="EN-US")
    assert [r.text for r in results] == [
        v1_text(client, "我喜欢喝茶。", "zh", "en"),
        v1_text(client, "今天天气很好。", "zh", "en"),
    ]
    assert [r.detected_source_lang for r in results] == ["ZH", "ZH"]
    assert translator.translate_text("I like tea.", source_lang="EN", target_lang="ZH-HANS").text == v1_text(
        client, "I like tea."
    )


def test_deepl_sdk_lists_source_and_target_languages(translator):
    assert [language.code for language in translator.get_source_languages()] == ["EN", "ZH"]
    targets = {language.code for language in translator.get_target_languages()}
    assert {"EN-US", "EN-GB", "ZH", "ZH-HANS"} <= targets
    assert translator.get_usage().character.limit_reached is False


def test_deepl_sdk_gets_a_clear_error_for_a_language_without_a_model(translator):
    with pytest.raises(deepl.DeepLException, match="detected as English"):
        translator.translate_text("I like tea very much.", target_lang="EN-GB")


@pytest.mark.parametrize(
    "body, status",
    [({"target_lang": "ZH"}, 400), ({"text": ["Hi"]}, 400), ({"text": ["Hi"], "target_lang": "DE"}, 400)],
)
def test_invalid_deepl_requests_answer_deepl_errors(client, body, status):
    assert_deepl_error(client.post("/v2/translate", json=body), status)


def test_deepl_split_sentences_0_translates_each_text_whole(client):
    text = "I like tea. The cat sat."
    whole = client.post("/v2/translate", json={"text": [text], "target_lang": "ZH", "split_sentences": "0"}).json()
    assert whole["translations"][0]["text"] == v1_text(client, text, split_sentences=False)


# ---- request shapes recorded from Mastodon, Weblate and Discourse ------------------------------


def check_answer(kind: str, request: dict, answer) -> None:
    if kind == "libretranslate_list":
        assert isinstance(answer["translatedText"], list) and len(answer["translatedText"]) == len(request["json"]["q"])
        if request["json"]["source"] == "auto":
            assert [d["language"] for d in answer["detectedLanguage"]] == ["en"] * len(request["json"]["q"])
        if request["json"].get("format") == "html":
            for source, translated in zip(request["json"]["q"], answer["translatedText"]):
                assert TAG.findall(translated) == TAG.findall(source)
    elif kind == "libretranslate_text":
        assert isinstance(answer["translatedText"], str) and answer["translatedText"].startswith("<p>")
    elif kind == "libretranslate_detect":
        assert answer[0]["language"] == "en"
    elif kind == "libretranslate_languages":
        assert {language["code"] for language in answer} == {"en", "zh"}
    elif kind == "deepl_translations":
        texts = request["json"]["text"] if "json" in request else [v for k, v in request["form"] if k == "text"]
        assert len(answer["translations"]) == len(texts)
        for source, translation in zip(texts, answer["translations"]):
            assert translation["detected_source_language"] == "EN"
            assert TAG.findall(translation["text"]) == TAG.findall(source)
    elif kind == "deepl_languages":
        assert all(set(language) >= {"language", "name"} for language in answer) and answer
    else:
        raise AssertionError(f"unknown expectation {kind}")


@pytest.mark.parametrize("request_shape", FIXTURES, ids=[f["client"] for f in FIXTURES])
def test_recorded_client_requests_get_the_answers_the_clients_read(client, request_shape):
    options = {"headers": request_shape.get("headers", {})}
    if "json" in request_shape:
        options["json"] = request_shape["json"]
    if "form" in request_shape:
        options["content"] = httpx.QueryParams(request_shape["form"]).__str__().encode()
        options["headers"] = {**options["headers"], "Content-Type": "application/x-www-form-urlencoded"}
    response = client.request(request_shape["method"], request_shape["path"], **options)
    assert response.status_code == 200, response.text
    check_answer(request_shape["expect"], request_shape, response.json())
