"""Placeholders, URLs and numbers come back byte for byte on every route of the running service.

What must come back is what translate-toolkit's placeables find (printf, Python, Qt, ICU and brace formats,
URLs, e-mail addresses), on UI strings from Debian's evaluation catalogs (English msgids for en→zh, their
Chinese msgstrs for zh→en), Tatoeba dev sentences with a name turned into a placeholder, and sentences with a
URL added. The clients are the real ones (libretranslatepy, the deepl SDK). The service's tiny random models
drop or garble most stand-ins, which is the hard case: every span must still come back, once per occurrence.
"""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

import deepl
import httpx
import pytest
from libretranslatepy import LibreTranslateAPI

from tests.harness.placeables import evaluation_messages, toolkit_spans

pytestmark = pytest.mark.slow

TATOEBA_DEV = Path(__file__).resolve().parents[4] / "shared" / "data" / "tatoeba-en-zh" / "dev.tsv"
PLACEHOLDERS = ["%s", "{name}", "{{name}}", "%(name)s", "%1$s", "${name}"]
PER_SOURCE = 60  # texts per kind and direction


def catalog_strings(direction: str) -> list[str]:
    strings = [
        text
        for message in evaluation_messages()
        if (text := message[0] if direction == "en-zh" else message[1])
        and "\n" not in text.strip()
        and len(text) < 300
        and toolkit_spans(text, braces=True)
    ]
    random.Random(0).shuffle(strings)
    return strings[:PER_SOURCE]


def tatoeba_strings(direction: str) -> tuple[list[str], list[str]]:
    """(sentences with a name turned into a placeholder, sentences with a URL added), in the source language."""
    if not TATOEBA_DEV.exists():
        pytest.skip(f"shared data missing at {TATOEBA_DEV}")
    with open(TATOEBA_DEV, encoding="utf-8") as handle:
        rows = [row for row in csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE) if len(row) >= 2]
    column, name = (0, "Tom") if direction == "en-zh" else (1, "汤姆")
    named = [row[column] for row in rows if name in row[column]]
    placeholders = [s.replace(name, PLACEHOLDERS[i % len(PLACEHOLDERS)]) for i, s in enumerate(named[:PER_SOURCE])]
    plain = [row[column] for row in rows if name not in row[column]][:PER_SOURCE]
    urls = [
        f"{s} https://example.com/help/{i}?lang=en" if i % 2 else f"https://docs.example.org/{i}#top {s}"
        for i, s in enumerate(plain)
    ]
    return placeholders, urls


def kept(source: str, translation: str) -> bool:
    return all(translation.count(span) >= source.count(span) for span in toolkit_spans(source, braces=True))


@pytest.mark.parametrize("direction", ["en-zh", "zh-en"])
def test_ui_strings_placeholders_and_urls_come_back_byte_for_byte_through_libretranslate(service_url, direction):
    source, target = direction.split("-")
    placeholders, urls = tatoeba_strings(direction)
    texts = catalog_strings(direction) + placeholders + urls
    assert len(texts) >= 2 * PER_SOURCE
    api = LibreTranslateAPI(service_url)
    translations = [api.translate(text, source, target) for text in texts]
    failures = [(s, t) for s, t in zip(texts, translations, strict=True) if not kept(s, t)]
    assert len(failures) <= 0.01 * len(texts), failures[:5]


def test_v1_lists_each_span_where_it_stands_in_the_source_and_the_translation(client):
    text = "Hello %s, open {{page}} at https://example.com/a. You have 4521 new %s messages."
    response = client.post("/v1/translate", json={"texts": [text], "source_lang": "en", "target_lang": "zh"})
    assert response.status_code == 200, response.text
    translation = response.json()["translations"][0]
    protected = translation["protected"]
    assert [span["text"] for span in protected] == ["%s", "{{page}}", "https://example.com/a", "4521", "%s"]
    assert [span["kind"] for span in protected] == ["placeholder", "placeholder", "url", "number", "placeholder"]
    for span in protected:
        assert text[slice(*span["source_span"])] == span["text"]
        assert translation["text"][slice(*span["target_span"])] == span["text"]
    for sentence in translation["sentences"]:  # two sentences: each lists its own, offsets into its own text
        for span in sentence["protected"]:
            assert sentence["text"][slice(*span["target_span"])] == span["text"]


def test_protect_false_sends_the_text_to_the_model_as_written(client):
    body = {"texts": ["Hello %s, see https://example.com."], "source_lang": "en", "target_lang": "zh"}
    off = client.post("/v1/translate", json={**body, "protect": False}).json()["translations"][0]
    assert "protected" not in off
    on = client.post("/v1/translate", json=body).json()["translations"][0]
    assert "%s" in on["text"] and "https://example.com" in on["text"]
    assert "Tom" in "".join(on["source_tokens"])  # the stand-in the model read
    assert "Tom" not in "".join(off["source_tokens"])


def test_alternatives_keep_the_spans_too(client):
    body = {"texts": ["Delete %s from %s?"], "source_lang": "en", "target_lang": "zh", "beam_size": 4, "n_best": 3}
    translation = client.post("/v1/translate", json=body).json()["translations"][0]
    for hypothesis in [translation, *translation["alternatives"]]:
        assert hypothesis["text"].count("%s") == 2
        assert [span["text"] for span in hypothesis["protected"]] == ["%s", "%s"]


def test_the_stream_result_keeps_the_spans(client):
    body = {"texts": ["Welcome back, {{name}}! Visit https://example.com/x."], "source_lang": "en", "target_lang": "zh"}
    with client.stream("POST", "/v1/translate/stream", json=body) as response:
        assert response.status_code == 200
        lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    result = json.loads(lines[-1][len("data: ") :])
    assert result["type"] == "result"
    assert "{{name}}" in result["translation"]["text"] and "https://example.com/x" in result["translation"]["text"]


def test_the_deepl_sdk_gets_placeholders_back_in_text_and_html(service_url):
    translator = deepl.Translator("any-key", server_url=service_url)
    text = translator.translate_text("Could not open '%1$s': %2$s", source_lang="EN", target_lang="ZH").text
    assert "%1$s" in text and "%2$s" in text
    html = translator.translate_text(
        "<p>Hello <b>%s</b>, read <a href='/x'>the guide</a> at https://example.com/g.</p>",
        source_lang="EN",
        target_lang="ZH",
        tag_handling="html",
    ).text
    assert "%s" in html and "https://example.com/g" in html and "<a href='/x'>" in html


def test_a_text_in_libretranslate_html_keeps_spans_inside_text_nodes(service_url):
    response = httpx.post(
        f"{service_url}/translate",
        json={"q": "<p>Hi {{user}}, mail <i>me</i> at me@example.org</p>", "source": "en", "target": "zh"}
        | {"format": "html"},
    )
    assert response.status_code == 200, response.text
    translated = response.json()["translatedText"]
    assert "{{user}}" in translated and "me@example.org" in translated and translated.startswith("<p>")


def test_deepl_ignore_tags_keep_their_content_as_written_and_non_splitting_tags_stay_balanced(service_url):
    translator = deepl.Translator("any-key", server_url=service_url)
    text = "<p>Open <x>the file</x> and <term>green tea</term> now.</p>"
    ignored = translator.translate_text(
        text, source_lang="EN", target_lang="ZH", tag_handling="xml", ignore_tags=["x"], non_splitting_tags="term"
    ).text
    assert "<x>the file</x>" in ignored and ignored.startswith("<p>") and ignored.endswith("</p>")
    assert ignored.count("<term>") == 1 and ignored.count("</term>") == 1
    plain = translator.translate_text(text, source_lang="EN", target_lang="ZH", tag_handling="xml").text
    assert "<x>the file</x>" not in plain  # without ignore_tags its words are translated
