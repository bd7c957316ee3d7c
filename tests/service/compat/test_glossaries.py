"""DeepL's v2 glossary API on the running service, spoken by the official deepl SDK unchanged, and glossaries on
/v1 and LibreTranslate's route: made through one ingress replica, read and used through either (the test service
runs two behind HAProxy), refused with DeepL's and our error bodies when wrong. The test service's tiny random
models translate nothing well, which is the hard case for a term: it must be in every translation anyway.
"""

from __future__ import annotations

import deepl
import httpx
import pytest
from libretranslatepy import LibreTranslateAPI

from tests.service.conftest import API_KEYS, GUARDED_PREFIX

pytestmark = pytest.mark.slow

ENTRIES = {"green tea": "绿茶", "cat": "猫"}


@pytest.fixture
def translator(service_url) -> deepl.Translator:
    return deepl.Translator("any-key", server_url=service_url)


@pytest.fixture
def glossary(translator):
    made = translator.create_glossary("UI terms", "EN", "ZH", ENTRIES)
    yield made
    try:
        translator.delete_glossary(made)
    except deepl.GlossaryNotFoundException:
        pass


def test_the_sdk_creates_lists_reads_and_deletes_a_glossary(translator):
    made = translator.create_glossary("Kitchen", "EN", "ZH", ENTRIES)
    assert (made.name, made.source_lang, made.target_lang, made.entry_count) == ("Kitchen", "EN", "ZH", 2)
    assert made.ready
    for _ in range(6):  # both ingress replicas answer in turn
        assert translator.get_glossary(made.glossary_id).name == "Kitchen"
        assert translator.get_glossary_entries(made) == ENTRIES
    assert made.glossary_id in [g.glossary_id for g in translator.list_glossaries()]
    translator.delete_glossary(made)
    for _ in range(6):
        with pytest.raises(deepl.GlossaryNotFoundException):
            translator.get_glossary(made.glossary_id)
    assert made.glossary_id not in [g.glossary_id for g in translator.list_glossaries()]


def test_the_sdk_lists_the_served_pairs(translator):
    pairs = {(p.source_lang.lower(), p.target_lang.lower()) for p in translator.get_glossary_languages()}
    assert pairs == {("en", "zh"), ("zh", "en")}


def test_a_translation_with_the_glossary_holds_every_term_that_applies(translator, glossary):
    texts = ["My cat likes green tea.", "The CAT sat.", "Green tea, green tea!", "Concatenate the files."]
    results = translator.translate_text(texts, source_lang="EN", target_lang="ZH", glossary=glossary)
    assert "猫" in results[0].text and "绿茶" in results[0].text
    assert "猫" in results[1].text  # case-insensitive
    assert results[2].text.count("绿茶") == 2
    assert "猫" not in results[3].text or "猫" in translator.translate_text(texts[3], target_lang="ZH").text


def test_the_sdk_creates_a_glossary_from_csv(translator):
    made = translator.create_glossary_from_csv("from csv", "EN", "ZH", '"tea, green",绿茶\ncat,猫,en,zh\n')
    try:
        assert translator.get_glossary_entries(made) == {"tea, green": "绿茶", "cat": "猫"}
    finally:
        translator.delete_glossary(made)


def assert_deepl_error(response: httpx.Response, status: int, part: str) -> None:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"message"} and part in body["message"], body


@pytest.mark.parametrize(
    ("fields", "status", "part"),
    [
        ({"entries": "cat\t猫\ncat\t猫咪"}, 400, "repeats the source term"),
        ({"entries": "cat\t"}, 400, "empty"),
        ({"entries": "cat,猫,en", "entries_format": "csv"}, 400, "CSV entry"),
        ({"entries": '"cat,猫', "entries_format": "csv"}, 400, "malformed"),
        ({"entries": "cat 猫"}, 400, "tab"),
        ({"source_lang": "de"}, 400, "Unsupported glossary source and target language pair"),
        ({"name": ""}, 400, "name"),
    ],
)
def test_bad_glossaries_get_deepls_error_body_and_nothing_is_stored(service_url, translator, fields, status, part):
    before = len(translator.list_glossaries())
    body = {"name": "bad", "source_lang": "en", "target_lang": "zh", "entries": "cat\t猫", "entries_format": "tsv"}
    response = httpx.post(f"{service_url}/v2/glossaries", json={**body, **fields})
    assert_deepl_error(response, status, part)
    assert len(translator.list_glossaries()) == before


def test_an_unknown_glossary_id_is_404_on_every_glossary_route_and_400_on_translate(service_url):
    unknown = "00000000-0000-0000-0000-000000000000"
    for method, path in (("GET", ""), ("GET", "/entries"), ("DELETE", "")):
        assert_deepl_error(httpx.request(method, f"{service_url}/v2/glossaries/{unknown}{path}"), 404, "not found")
    body = {"text": ["cat"], "source_lang": "EN", "target_lang": "ZH", "glossary_id": unknown}
    response = httpx.post(f"{service_url}/v2/translate", json=body)
    assert_deepl_error(response, 404, "not found")


def test_a_glossary_on_translate_needs_the_source_language_and_its_own_pair(service_url, glossary):
    base = {"text": ["cat"], "target_lang": "ZH", "glossary_id": glossary.glossary_id}
    assert_deepl_error(httpx.post(f"{service_url}/v2/translate", json=base), 400, "requires the source_lang")
    wrong = {**base, "source_lang": "ZH", "target_lang": "EN-US"}
    assert_deepl_error(httpx.post(f"{service_url}/v2/translate", json=wrong), 400, "glossary is EN→ZH")


def test_entries_past_the_limit_are_413(service_url):
    entries = "\n".join(f"term{i}\t{'词' * 400}" for i in range(9000))  # about 10.9 MB of UTF-8
    response = httpx.post(
        f"{service_url}/v2/glossaries",
        json={"name": "big", "source_lang": "en", "target_lang": "zh", "entries": entries},
        timeout=60,
    )
    assert response.status_code == 413, response.text[:200]


def test_v1_takes_an_inline_glossary_and_lists_where_each_term_stands(client):
    text = "The cat drinks green tea. My cat too."
    body = {"texts": [text], "source_lang": "en", "target_lang": "zh", "glossary": ENTRIES}
    translation = client.post("/v1/translate", json=body).json()["translations"][0]
    assert [(t["source"], t["target"]) for t in translation["terms"]] == [
        ("cat", "猫"),
        ("green tea", "绿茶"),
        ("cat", "猫"),
    ]
    for term in translation["terms"]:
        assert text[slice(*term["source_span"])] == term["source"]
        assert translation["text"][slice(*term["target_span"])] == term["target"]
    plain = client.post("/v1/translate", json={**body, "glossary": None}).json()["translations"][0]
    assert "terms" not in plain


def test_v1_uses_a_stored_glossary_by_id_and_refuses_a_mismatched_or_unknown_one(client, glossary):
    body = {"texts": ["A cat."], "source_lang": "en", "target_lang": "zh", "glossary_id": glossary.glossary_id}
    translation = client.post("/v1/translate", json=body).json()["translations"][0]
    assert translation["terms"][0]["target"] == "猫" and "猫" in translation["text"]
    wrong = client.post("/v1/translate", json={**body, "source_lang": "zh", "target_lang": "en", "texts": ["猫"]})
    assert wrong.status_code == 422 and wrong.json()["error"]["code"] == "invalid_request"
    unknown = client.post("/v1/translate", json={**body, "glossary_id": "nope"})
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "glossary_not_found"
    both = client.post("/v1/translate", json={**body, "glossary": ENTRIES})
    assert both.status_code == 422
    duplicate = client.post(
        "/v1/translate", json={"texts": ["x"], "source_lang": "en", "target_lang": "zh", "glossary": {"cat": " "}}
    )
    assert duplicate.status_code == 400 and duplicate.json()["error"]["code"] == "invalid_glossary"


def test_libretranslate_takes_a_glossary_id_as_an_extension(service_url, glossary):
    response = httpx.post(
        f"{service_url}/translate",
        json={"q": "I have a cat.", "source": "en", "target": "zh", "glossary_id": glossary.glossary_id},
    )
    assert response.status_code == 200 and "猫" in response.json()["translatedText"]
    assert LibreTranslateAPI(service_url).translate("I have a cat.", "en", "zh")  # its client, unchanged


def test_with_api_keys_a_glossary_is_its_keys_alone(service_url):
    guarded = f"{service_url}{GUARDED_PREFIX}/"  # the SDK joins its paths to the URL: without the slash, "guarded" goes
    one = deepl.Translator(API_KEYS[0], server_url=guarded)
    two = deepl.Translator(API_KEYS[1], server_url=guarded)
    made = one.create_glossary("private", "EN", "ZH", {"cat": "猫"})
    try:
        assert made.glossary_id not in [g.glossary_id for g in two.list_glossaries()]
        with pytest.raises(deepl.GlossaryNotFoundException):
            two.get_glossary(made.glossary_id)
        with pytest.raises(deepl.GlossaryNotFoundException):
            two.delete_glossary(made.glossary_id)
        assert one.get_glossary_entries(made) == {"cat": "猫"}
    finally:
        one.delete_glossary(made)
    anonymous = httpx.get(f"{service_url}{GUARDED_PREFIX}/v2/glossaries")
    assert anonymous.status_code == 403


def test_v1_marks_the_tokens_a_term_set_and_leaves_them_out_of_the_models_confidence(client):
    """The search holds the translation to the terms: their tokens are listed as the glossary's, a greedy request
    says it searched wider, and trust's log-probability signals are the mean over the model's own tokens."""
    body = {"texts": ["My cat drinks green tea."], "source_lang": "en", "target_lang": "zh", "glossary": ENTRIES,
            "beam_size": 1, "trust": "fast"}
    translation = client.post("/v1/translate", json=body).json()["translations"][0]
    assert "beam of" in translation["search_note"]
    marked = translation["glossary_tokens"]
    pieces = "".join(translation["target_tokens"][i] for i in marked)
    assert "猫" in pieces and "绿茶" in pieces
    own = [score for i, score in enumerate(translation["token_scores"]) if i not in marked]
    assert translation["trust"]["signals"]["forward_logprob"] == pytest.approx(sum(own) / len(own), abs=1e-6)
    plain = client.post("/v1/translate", json={**body, "glossary": None}).json()["translations"][0]
    assert "glossary_tokens" not in plain and "search_note" not in plain
