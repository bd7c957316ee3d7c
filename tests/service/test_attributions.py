"""Attributions over HTTP: POST /v1/explain's methods and /v1/translate's source_share are the engine's numbers
(tests/model/test_attribution.py holds those equal to inseq and to the ALTI+ paper), on a real Ray Serve."""

from __future__ import annotations

import pytest
import torch

from model import Translator
from tests.service.conftest import Tolerance

EN_ZH = {"source_lang": "en", "target_lang": "zh"}
SOURCE = "The cat sat on the mat."


@pytest.fixture(scope="module")
def engine(tiny_models):
    """The served en-zh model, loaded here as the engine the replicas run."""
    return Translator.from_pretrained(tiny_models["en-zh"], device="cpu")


def explain(client, **body):
    response = client.post("/v1/explain", json={**body})
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.parametrize("method", ["saliency", "integrated_gradients", "value_zeroing", "alti_plus"])
def test_explain_returns_the_engines_attributions(client, engine, method):
    result = explain(client, source=SOURCE, target="猫坐在垫子上。", **EN_ZH, method=method)
    attributions = result["attributions"]
    source_ids = engine.encode_source([SOURCE])[0]
    target_ids = engine.tokenizer.encode_target("猫坐在垫子上。")
    expected = engine.attribute(source_ids, target_ids, method)
    # this process's engine against a replica's: equal to float32 rounding (tests/service/conftest.py)
    tolerance = Tolerance.VALUE_ZEROING if method == "value_zeroing" else Tolerance.ATTRIBUTION
    assert attributions["method"] == method
    assert len(attributions["source"]) == len(result["target_tokens"]) == len(target_ids)
    assert len(attributions["source"][0]) == len(result["source_tokens"])
    for key in ("source", "target", "source_share"):
        torch.testing.assert_close(torch.tensor(attributions[key]), getattr(expected, key), atol=tolerance, rtol=0)
    assert "steps" in result and "cross_attention" in result  # the attention explanation is still all there


def test_explain_by_id_attributes_exactly_the_decoded_tokens_with_the_steps_asked(client, engine):
    translation = client.post("/v1/translate", json={"texts": [SOURCE], **EN_ZH}).json()["translations"][0]
    body = {"explanation_id": translation["explanation_id"], "method": "integrated_gradients", "steps": 4}
    attributions = explain(client, **body)["attributions"]
    source_ids = engine.encode_source([SOURCE])[0]
    target_ids = engine.generate([source_ids], beam_size=4)[0][0].token_ids
    expected = engine.attribute(source_ids, target_ids, "integrated_gradients", steps=4)
    source = torch.tensor(attributions["source"])
    torch.testing.assert_close(source, expected.source, atol=Tolerance.ATTRIBUTION, rtol=0)


def test_the_attention_method_adds_no_attributions(client):
    assert explain(client, source=SOURCE, **EN_ZH).get("attributions") is None


@pytest.mark.parametrize(
    "extra",
    [
        {"method": "gradcam"},
        {"method": "saliency", "steps": 8},
        {"method": "integrated_gradients", "steps": 0},
        {"method": "integrated_gradients", "steps": 10_000},
    ],
)
def test_bad_attribution_requests_are_422(client, extra):
    response = client.post("/v1/explain", json={"source": SOURCE, **EN_ZH, **extra})
    assert response.status_code == 422, response.text
    assert response.json()["error"]["code"]


def test_a_pair_too_long_for_attributions_is_413_and_attention_still_works(client):
    long_source = " ".join(["the quick brown fox sat on the mat"] * 12)
    body = {"source": long_source, "target": "猫" * 90, **EN_ZH}
    response = client.post("/v1/explain", json={**body, "method": "alti_plus"})
    assert response.status_code == 413, response.text
    assert "at most" in response.json()["error"]["message"]
    assert client.post("/v1/explain", json=body).status_code == 200


def test_translate_with_source_share_returns_the_alti_plus_shares(client, engine):
    body = {"texts": [SOURCE, ""], **EN_ZH, "source_share": True, "n_best": 2, "beam_size": 2}
    first, blank = client.post("/v1/translate", json=body).json()["translations"]
    source_ids = engine.encode_source([SOURCE])[0]
    hypotheses = engine.generate([source_ids], beam_size=2, num_return_sequences=2)[0]
    for returned, hypothesis in zip([first, first["alternatives"][0]], hypotheses):
        expected = engine.attribute(source_ids, hypothesis.token_ids, "alti_plus").source_share
        assert len(returned["token_source_shares"]) == len(returned["target_tokens"])
        shares = torch.tensor(returned["token_source_shares"])
        torch.testing.assert_close(shares, expected, atol=Tolerance.ATTRIBUTION, rtol=0)
        assert returned["source_share"] == pytest.approx(float(expected.mean()), abs=Tolerance.ATTRIBUTION)
    assert blank["token_source_shares"] == [] and blank["source_share"] is None


def test_source_shares_of_a_split_text_are_its_sentences_laid_end_to_end(client):
    body = {"texts": ["I like tea. The cat sat on the mat."], **EN_ZH, "source_share": True}
    (translation,) = client.post("/v1/translate", json=body).json()["translations"]
    sentences = translation["sentences"]
    shares = [share for sentence in sentences for share in sentence["token_source_shares"]]
    assert len(sentences) == 2 and translation["token_source_shares"] == shares
    assert translation["source_share"] == pytest.approx(sum(shares) / len(shares))


def test_translate_without_source_share_carries_none(client):
    (translation,) = client.post("/v1/translate", json={"texts": [SOURCE], **EN_ZH}).json()["translations"]
    assert translation.get("token_source_shares") is None and translation.get("source_share") is None
