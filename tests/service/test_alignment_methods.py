"""The alignment option of /v1 (`alignment_method`): "agreement", both served models' alignment heads agreeing,
and "head", the one-best; every answer names the one given, an explanation id keeps it, a bad value is 422, and an
application that serves no reverse model gives the head's one-best and says why. The oracle is the engine's own
public API in this process (model.explanations.agreement is checked against transformers in
tests/model/test_agreement.py).
"""

from __future__ import annotations

import pytest

from model import Translator
from tests.harness.services import API_KEYS
from tests.service.test_errors import assert_error

SENTENCE = "The big dog runs to the house."
EN_ZH = {"source_lang": "en", "target_lang": "zh"}


@pytest.fixture(scope="module")
def engines(tiny_models) -> dict[str, Translator]:
    return {name: Translator.from_pretrained(path, device="cpu") for name, path in tiny_models.items()}


def translated(client, **options) -> dict:
    response = client.post("/v1/translate", json={"texts": [SENTENCE], **EN_ZH, **options})
    assert response.status_code == 200, response.text
    return response.json()["translations"][0]


def test_translate_gives_the_heads_one_best_unless_asked_for_agreement(client, engines):
    translation = translated(client)
    assert translation["alignment_method"] == "head" and translation["alignment_note"] is None
    assert len(translation["alignment"]) == len(translation["target_tokens"])  # one link per target token

    agreed = translated(client, alignment_method="agreement")
    assert agreed["alignment_method"] == "agreement" and agreed["alignment_note"] is None
    assert agreed["target_tokens"] == translation["target_tokens"]  # the alignment changes, not the decode
    expected = engines["en-zh"].translate([SENTENCE], beam_size=4, reverse=engines["zh-en"])[0]
    assert expected.target_tokens == agreed["target_tokens"]
    assert agreed["alignment"] == [list(pair) for pair in expected.alignment]
    assert agreed["word_alignment"] == [list(pair) for pair in expected.word_alignment]


def test_every_text_of_a_request_gets_its_own_agreed_alignment(client, engines):
    """The texts of one request are agreed together (the reverse model's forced decodes share a batch); each gets
    the links the engine gives that text, and a blank text stays blank."""
    texts = [SENTENCE, "", "A cat.", "The small house is near the big river and the old tree."]
    response = client.post("/v1/translate", json={"texts": texts, **EN_ZH, "alignment_method": "agreement"})
    assert response.status_code == 200, response.text
    answers = response.json()["translations"]
    expected = engines["en-zh"].translate(texts, beam_size=4, reverse=engines["zh-en"])
    assert answers[1]["text"] == "" and answers[1]["alignment"] == []
    for answer, engine in zip(answers, expected, strict=True):
        assert answer["target_tokens"] == engine.target_tokens
        if engine.target_ids:
            assert answer["alignment_method"] == "agreement"
        assert answer["alignment"] == [list(pair) for pair in engine.alignment]


@pytest.mark.parametrize("method", ["agreement", "head"])
def test_an_explanation_id_gives_the_alignment_its_translation_was_given(client, method):
    translation = translated(client, alignment_method=method, n_best=2, beam_size=2)
    for hypothesis in [translation, *translation["alternatives"]]:
        fetched = client.get(f"/v1/explanations/{hypothesis['explanation_id']}").json()
        explained = client.post("/v1/explain", json={"explanation_id": hypothesis["explanation_id"]}).json()
        for answer in (fetched, explained):
            assert answer["alignment_method"] == method
            for key in ("alignment", "word_alignment", "source_words", "target_words"):
                assert answer[key] == hypothesis[key], key


def test_explain_defaults_to_agreement_and_gives_the_head_when_asked(client, engines):
    forward, reverse = engines["en-zh"], engines["zh-en"]
    target = forward.translate([SENTENCE], beam_size=4)[0].text
    body = {"source": SENTENCE, "target": target, **EN_ZH}  # the target re-tokenized here as there
    agreed = client.post("/v1/explain", json=body).json()
    head = client.post("/v1/explain", json={**body, "alignment_method": "head"}).json()
    assert (agreed["alignment_method"], head["alignment_method"]) == ("agreement", "head")
    assert agreed["cross_attention"] == head["cross_attention"]  # the raw maps are the same either way
    source_ids, target_ids = forward.tokenizer.encode_source(SENTENCE), forward.tokenizer.encode_target(target)
    assert agreed["target_tokens"] == forward.tokenizer.target_tokens(target_ids)
    expected = forward.explain(source_ids, target_ids, reverse=reverse)
    assert agreed["alignment"] == [list(pair) for pair in expected.alignment]
    assert head["alignment"] == [list(pair) for pair in forward.explain(source_ids, target_ids).alignment]


@pytest.mark.parametrize(
    "path, body",
    [
        ("/v1/translate", {"texts": [SENTENCE], **EN_ZH, "alignment_method": "best"}),
        ("/v1/explain", {"source": SENTENCE, **EN_ZH, "alignment_method": "union"}),
        ("/v1/explain", {"source": SENTENCE, **EN_ZH, "alignment_method": 1}),
    ],
)
def test_an_unknown_alignment_method_is_a_422_with_a_json_error(client, path, body):
    assert "alignment_method" in assert_error(client.post(path, json=body), 422)["message"]


def test_models_say_which_alignments_they_can_give(client):
    models = {m["id"]: m for m in client.get("/v1/models").json()["models"]}
    assert models["en-zh"]["alignment_methods"] == models["zh-en"]["alignment_methods"] == ["agreement", "head"]


def test_without_the_reverse_model_agreement_falls_back_to_the_head_and_says_why(guarded_url, engines):
    import httpx

    headers = {"Authorization": f"Bearer {API_KEYS[0]}"}
    with httpx.Client(base_url=guarded_url, timeout=60, headers=headers) as guarded:  # serves en-zh alone
        assert guarded.get("/v1/models").json()["models"][0]["alignment_methods"] == ["head"]
        target = translated_text = engines["en-zh"].translate([SENTENCE], beam_size=4)[0].text
        answer = guarded.post("/v1/explain", json={"source": SENTENCE, "target": target, **EN_ZH}).json()
    assert answer["alignment_method"] == "head"
    assert "no model translating zh→en is served" in answer["alignment_note"]
    forward = engines["en-zh"]
    one_best = forward.explain(
        forward.tokenizer.encode_source(SENTENCE), forward.tokenizer.encode_target(translated_text)
    )
    assert answer["alignment"] == [list(pair) for pair in one_best.alignment]
