"""`trust` on a real `serve run`: present by default, its modes and their refusal, the same in a stream's result as
in /v1/translate's answer, named in /v1/models and counted in the metrics; the compatibility routes unchanged."""

from __future__ import annotations

import httpx
import pytest

from service.client import TranslationClient
from tests.harness.prometheus_text import by_label
from tests.service.conftest import Tolerance

EN_ZH = {"source_lang": "en", "target_lang": "zh"}


def translate(url: str, body: dict) -> httpx.Response:
    return httpx.post(f"{url}/v1/translate", json=body, timeout=60)


def assert_same_trust(got: dict, expected: dict) -> None:
    assert got["mode"] == expected["mode"] and got["calibrated"] == expected["calibrated"]
    assert got["held_out"] == expected["held_out"]
    assert got["flags"] == expected["flags"]
    assert got["score"] == pytest.approx(expected["score"], abs=1e-3)
    assert set(got["signals"]) == set(expected["signals"])
    for name, value in expected["signals"].items():
        assert got["signals"][name] == pytest.approx(value, abs=Tolerance.SCORE * 10), name


def test_every_hypothesis_carries_trust_by_default(service_url):
    body = {**EN_ZH, "texts": ["The cat sat on the mat.", "Hello."], "beam_size": 4, "n_best": 2}
    response = translate(service_url, body)
    assert response.status_code == 200, response.text
    for translation in response.json()["translations"]:
        for hypothesis in [translation, *(translation["alternatives"] or [])]:
            trust = hypothesis["trust"]
            assert trust["mode"] == "fast" and 0 <= trust["score"] <= 1
            assert {"forward_logprob", "source_coverage", "repetition", "length_ratio"} <= set(trust["signals"])
            mean = sum(hypothesis["token_scores"]) / len(hypothesis["token_scores"])
            assert trust["signals"]["forward_logprob"] == pytest.approx(mean, abs=1e-6)
            held = trust["held_out"]  # what such a score meant held out: only with a calibration
            assert (held is None) == (not trust["calibrated"])
            if held is not None:
                assert held["answers"] > 0 and 0 <= held["adequate"] <= 1 and held["low"] <= held["high"]
            for flag in trust["flags"]:
                words = hypothesis["source_words" if flag["side"] == "source" else "target_words"]
                assert flag["text"] == [words[i] for i in flag["words"]]


def test_the_modes_and_the_refusal_of_others(service_url):
    off = translate(service_url, {**EN_ZH, "texts": ["Hello."], "trust": "off"})
    assert off.status_code == 200 and "trust" not in off.json()["translations"][0]
    full = translate(service_url, {**EN_ZH, "texts": ["Hello."], "trust": "full"})
    assert full.status_code == 200, full.text
    trust = full.json()["translations"][0]["trust"]
    assert trust["mode"] == "full" and "reverse_logprob" in trust["signals"]  # the tiny zh-en is served too
    for bad in ("deep", "", None, 3, "FAST"):
        refused = translate(service_url, {**EN_ZH, "texts": ["Hello."], "trust": bad})
        assert refused.status_code == 422, bad
        assert refused.json()["error"]["code"] and "trust" in refused.json()["error"]["message"]


def test_a_text_of_several_sentences_is_as_trusted_as_its_least_trusted_sentence(service_url):
    response = translate(service_url, {**EN_ZH, "texts": ["I like tea. The cat sat on the mat. Yes."]})
    translation = response.json()["translations"][0]
    scores = [sentence["trust"]["score"] for sentence in translation["sentences"]]
    assert translation["trust"]["score"] == min(scores)
    assert translation["trust"]["sentence"] == scores.index(min(scores))
    flags = [flag for sentence in translation["sentences"] for flag in sentence["trust"]["flags"]]
    assert len(translation["trust"]["flags"]) == len(flags)
    for flag in translation["trust"]["flags"]:
        words = translation["source_words" if flag["side"] == "source" else "target_words"]
        assert flag["text"] == [words[i] for i in flag["words"]]


@pytest.mark.parametrize("mode", ["fast", "full"])
def test_a_streams_result_carries_the_same_trust(continuous_service_url, service_url, mode):
    body = {**EN_ZH, "texts": ["Tom reads a very long book."], "beam_size": 1, "trust": mode}
    for url in (continuous_service_url, service_url):
        with TranslationClient(url) as client:
            *_, result = list(
                client.translate_stream(body["texts"][0], **{k: v for k, v in body.items() if k != "texts"})
            )
        expected = translate(url, body).json()["translations"][0]
        assert result["translation"]["text"] == expected["text"]
        assert_same_trust(result["translation"]["trust"], expected["trust"])


def test_models_say_whether_the_score_is_calibrated(service_url):
    models = httpx.get(f"{service_url}/v1/models", timeout=30).json()["models"]
    for model in models:
        trust = model["trust"]
        assert isinstance(trust["calibrated"], bool) and trust["modes"] == ["off", "fast", "full"]
        # chosen by measurement (bench.trust_heldout): Seq-Logprob, calibrated, in both modes
        assert trust["score_signals"] == {"fast": ["forward_logprob"], "full": ["forward_logprob"]}
        if not trust["calibrated"]:
            assert trust["note"]
        else:
            for bins in trust["reliability"].values():
                assert sum(found["answers"] for found in bins) == trust["fitted_on"]["held_out_translations"]


def test_scores_and_flags_reach_the_metrics(service_url):
    def count() -> float:
        text = httpx.get(f"{service_url}/metrics", timeout=30).text
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("translation_trust_score_count") and 'mode="fast"' in line
        )

    before = count()
    assert (
        translate(service_url, {**EN_ZH, "texts": ["One.", "Two.", "Three."], "split_sentences": False}).status_code
        == 200
    )
    assert count() - before == 3


def test_the_compatibility_routes_answer_as_before_and_give_scores_on_request(service_url):
    body = {"q": ["Hello.", "The cat sat on the mat."], "source": "en", "target": "zh"}
    plain = httpx.post(f"{service_url}/translate", json=body, timeout=60)
    assert plain.status_code == 200 and set(plain.json()) == {"translatedText"}
    assert "x-trust-score" not in plain.headers
    asked = httpx.post(f"{service_url}/translate", json=body, headers={"X-Trust": "fast"}, timeout=60)
    assert asked.json() == plain.json()  # the body its clients read is unchanged
    scores = [float(x) for x in asked.headers["x-trust-score"].split(",")]
    expected = translate(service_url, {**EN_ZH, "texts": body["q"]}).json()["translations"]
    assert scores == pytest.approx([t["trust"]["score"] for t in expected], abs=1e-3)
    deepl = httpx.post(
        f"{service_url}/v2/translate",
        data={"text": ["Hello.", "Yes."], "target_lang": "ZH", "source_lang": "EN"},
        headers={"X-Trust": "full"},
        timeout=60,
    )
    assert deepl.status_code == 200, deepl.text
    assert len(deepl.headers["x-trust-score"].split(",")) == 2
    refused = httpx.post(f"{service_url}/translate", json=body, headers={"X-Trust": "maybe"}, timeout=60)
    assert refused.status_code == 400 and "X-Trust" in refused.json()["error"]


def test_agreement_and_full_trust_together_force_each_hypothesis_through_the_reverse_model_once(service_url):
    def forced() -> dict[str, float]:
        text = httpx.get(f"{service_url}/metrics", timeout=30).text
        by_kind = by_label(text, "translation_forced_decodes_total", "kind", model="en-zh")
        return {kind: by_kind.get(kind, 0.0) for kind in ("agreement", "trust")}

    texts = ["The river froze early this winter.", "Nobody answered the second letter."]
    body = {**EN_ZH, "texts": texts, "split_sentences": False, "trust": "full", "alignment_method": "agreement"}
    before = forced()
    response = translate(service_url, body)
    assert response.status_code == 200, response.text
    translations = response.json()["translations"]
    assert all(t["alignment_method"] == "agreement" and t["trust"]["mode"] == "full" for t in translations)
    after = forced()
    distinct = len({(text, t["text"]) for text, t in zip(texts, translations, strict=True)})
    assert after["agreement"] - before["agreement"] == distinct
    assert after["trust"] - before["trust"] == 0  # trust read what the agreement forced

    alone = translate(service_url, {**body, "alignment_method": "head"})
    assert alone.status_code == 200, alone.text
    assert forced()["trust"] - after["trust"] == distinct  # without agreement, trust forces them itself
    for together, single in zip(translations, alone.json()["translations"], strict=True):
        assert together["trust"]["score"] == pytest.approx(single["trust"]["score"], abs=1e-6)
