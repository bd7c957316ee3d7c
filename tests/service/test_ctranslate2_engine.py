"""A model served with `engine: ctranslate2` (the conftest's /fast application, the same tiny en-zh in float32):
CTranslate2's translations with alignments, /v1/models says so, explanations computed by our exact engine."""

from __future__ import annotations

import httpx
import pytest

pytestmark = pytest.mark.slow

TEXT = "The cat sat on the mat."


@pytest.fixture(scope="module")
def fast(fast_url):
    with httpx.Client(base_url=fast_url, timeout=60) as session:
        yield session


def translate(session: httpx.Client, **settings) -> dict:
    body = {"texts": [TEXT], "model": "en-zh", "beam_size": 4, "max_length": 12, **settings}
    response = session.post("/v1/translate", json=body)
    assert response.status_code == 200, response.text
    return response.json()["translations"][0]


def test_the_model_info_names_the_engine_and_how_explanations_run(fast, client):
    (info,) = fast.get("/v1/models").json()["models"]
    assert (info["engine"], info["precision"], info["explanation_precision"]) == ("ctranslate2", "float32", "float32")
    assert {m["engine"] for m in client.get("/v1/models").json()["models"]} == {"torch"}


def test_a_translation_carries_alignments_equal_to_our_engines(fast, client):
    """float32 CTranslate2 over the same weights: the tokens, alignments and scores of our engine."""
    ours, theirs = translate(client), translate(fast)
    assert theirs["target_tokens"] == ours["target_tokens"]
    assert theirs["alignment"] == ours["alignment"] and theirs["word_alignment"] == ours["word_alignment"]
    assert theirs["token_scores"] == pytest.approx(ours["token_scores"], abs=1e-4)


def flat(maps: list) -> list[float]:
    return [x for layer in maps for head in layer for row in head for x in row]


def test_its_explanation_id_is_computed_by_the_exact_model(fast, client):
    translation = translate(fast)
    explanation = fast.get(f"/v1/explanations/{translation['explanation_id']}").json()
    assert explanation["target_tokens"] == translation["target_tokens"]
    assert explanation["alignment"] == translation["alignment"]
    # what our own engine's application computes for the same tokens (same model id, weights and secret)
    exact = client.get(f"/v1/explanations/{translation['explanation_id']}").json()
    assert flat(explanation["cross_attention"]) == pytest.approx(flat(exact["cross_attention"]), abs=1e-5)
    assert explanation["token_scores"] == pytest.approx(exact["token_scores"], abs=1e-5)
