"""POST /v1/translate with split_sentences: each sentence decoded as if sent alone, the text joined back.

The oracle for every sentence is /v1/translate itself, called with that sentence alone; the oracle for
the joined text is the spacing rule stated in README (no spaces between sentences of Chinese output, one
space between sentences of a Chinese source in English output, line breaks kept).
"""

from collections import Counter

import pytest

pytestmark = pytest.mark.slow

EN_ZH = {"source_lang": "en", "target_lang": "zh"}
ZH_EN = {"source_lang": "zh", "target_lang": "en"}
SENTENCES = ["I like tea.", "The big dog runs.", "We went to school today."]


def translate(client, texts, pair=EN_ZH, **options):
    response = client.post("/v1/translate", json={"texts": texts, **pair, **options})
    assert response.status_code == 200, response.text
    return response.json()["translations"]


def alone(client, sentence, pair=EN_ZH, **options):
    (translation,) = translate(client, [sentence], pair, **options)
    assert "sentences" not in translation
    return translation


def test_each_sentence_of_a_text_is_translated_as_if_sent_alone(client):
    (translation,) = translate(client, [" ".join(SENTENCES)])
    expected = [alone(client, sentence) for sentence in SENTENCES]
    assert len(translation["sentences"]) == 3
    for got, want in zip(translation["sentences"], expected, strict=True):
        assert got["target_tokens"] == want["target_tokens"]
        assert got["explanation_id"] == want["explanation_id"] and got["explanation_id"]
        assert got["text"] == want["text"]


def test_the_joined_text_follows_the_spacing_rule(client):
    (chinese,) = translate(client, [f"{SENTENCES[0]} {SENTENCES[1]}\n{SENTENCES[2]}"])
    texts = [alone(client, sentence)["text"] for sentence in SENTENCES]
    assert chinese["text"] == f"{texts[0]}{texts[1]}\n{texts[2]}"  # Chinese output: no space between sentences
    (english,) = translate(client, ["我喜欢茶。猫坐了。"], ZH_EN)
    parts = [alone(client, sentence, ZH_EN)["text"] for sentence in ("我喜欢茶。", "猫坐了。")]
    assert english["text"] == f"{parts[0]} {parts[1]}"  # a Chinese source had no space: English gets one


def test_the_top_level_fields_are_the_sentences_laid_end_to_end(client):
    (translation,) = translate(client, [" ".join(SENTENCES)])
    sentences = translation["sentences"]
    for key in ("source_tokens", "target_tokens", "token_scores", "source_words", "target_words"):
        assert translation[key] == [item for sentence in sentences for item in sentence[key]]
    assert translation["score"] == pytest.approx(sum(sentence["score"] for sentence in sentences))
    assert translation["explanation_id"] is None and "attention" not in translation
    # the alignments index into the concatenated lists: the same token pairs as the sentences' own
    for key, (sources, targets) in {
        "alignment": ("source_tokens", "target_tokens"),
        "word_alignment": ("source_words", "target_words"),
    }.items():
        top = Counter((translation[sources][s], translation[targets][t]) for s, t in translation[key])
        each = Counter((x[sources][s], x[targets][t]) for x in sentences for s, t in x[key])
        assert top == each


def test_attention_and_alternatives_are_given_per_sentence(client):
    (translation,) = translate(client, [" ".join(SENTENCES[:2])], attention="summary", n_best=2)
    assert "attention" not in translation and translation.get("alternatives") is None
    for sentence, text in zip(translation["sentences"], SENTENCES[:2], strict=True):
        want = alone(client, text, attention="summary", n_best=2)
        flat = [value for row in sentence["attention"]["summary"] for value in row]
        assert flat == pytest.approx([value for row in want["attention"]["summary"] for value in row], abs=1e-5)
        assert [a["explanation_id"] for a in sentence["alternatives"]] == [
            a["explanation_id"] for a in want["alternatives"]
        ]


def test_a_one_sentence_text_is_answered_as_without_splitting(client):
    for text in ("The cat sat on the mat.", "  I like tea.  ", "", "tea"):
        split = client.post("/v1/translate", json={"texts": [text], **EN_ZH}).json()
        whole = client.post("/v1/translate", json={"texts": [text], **EN_ZH, "split_sentences": False}).json()
        assert split == whole


def test_a_long_text_of_short_sentences_translates_instead_of_413(client):
    text = " ".join(SENTENCES * 30)[:1500].rsplit(".", 1)[0] + "."  # about 1,500 characters, 60+ sentences
    assert 1400 < len(text) <= 1500
    whole = client.post("/v1/translate", json={"texts": [text], **EN_ZH, "split_sentences": False})
    assert whole.status_code == 413 and whole.json()["error"]["code"] == "input_too_long"
    (translation,) = translate(client, [text], beam_size=1, max_length=8)
    assert len(translation["sentences"]) == text.count(".")
    assert translation["sentences"][1]["target_tokens"] == alone(client, SENTENCES[1], beam_size=1, max_length=8)[
        "target_tokens"
    ]
