"""Splitting /v1 texts into sentences (service/text/split_texts.py), and POST /v1/translate with split_sentences.

The unit tests state which texts are split and how sentence answers are put together. The HTTP tests hold
each sentence to what /v1/translate answers for that sentence alone, and the joined text to the spacing rule
(no spaces between sentences of Chinese output, one space between sentences of a Chinese source in English
output, line breaks kept).
"""

from collections import Counter

import pytest

from service.records import TranslationRecord
from service.text.sentences import Piece
from service.text.split_texts import assemble, model_texts, plan_texts, text_pieces

EN_ZH = {"source_lang": "en", "target_lang": "zh"}
ZH_EN = {"source_lang": "zh", "target_lang": "en"}


def sentence(text: str, source: list[str], target: list[str]) -> TranslationRecord:
    return TranslationRecord(
        text=text,
        source_tokens=source,
        target_tokens=target,
        alignment=[[0, 0], [0, 1]],
        score=-1.0,
        token_scores=[-0.5, -0.5],
        word_alignment=[[0, 0], [0, 1]],
        source_words=source,
        target_words=target,
        explanation_id=f"id-{text}",
    )


def test_only_texts_of_two_or_more_sentences_are_split():
    texts = ["One. Two.", "One sentence only.", "", "   ", "no end mark at all"]
    plans = plan_texts(texts, "en", True)
    assert [plan is not None for plan in plans] == [True, False, False, False, False]
    assert model_texts(texts, plans) == ["One.", "Two.", *texts[1:]]
    assert plan_texts(texts, "en", False) == [None] * len(texts)


def test_a_long_sentence_is_never_cut_on_v1():
    assert plan_texts(["word " * 400], "en", True) == [None]


def test_sentence_answers_are_joined_and_laid_end_to_end():
    plans = plan_texts(["One. Two.", "Alone."], "en", True)
    first = sentence("一。", ["▁One", "</s>"], ["一", "。"])
    second = sentence("二。", ["▁Two", "</s>"], ["二", "。"])
    alone = sentence("独。", ["▁Alone", "</s>"], ["独", "。"])
    (joined, whole) = assemble([first, second, alone], plans, "zh")
    assert whole is alone
    assert joined.text == "一。二。" and joined.sentences == [first, second]
    assert joined.source_tokens == ["▁One", "</s>", "▁Two", "</s>"]
    assert joined.alignment == [[0, 0], [0, 1], [2, 2], [2, 3]]
    assert joined.word_alignment == [[0, 0], [0, 1], [2, 2], [2, 3]]
    answer = joined.json()
    assert answer["score"] == -2.0 and answer["explanation_id"] is None and "alternatives" not in answer
    assert answer["sentences"] == [first.json(), second.json()] and "trust" not in answer


def test_text_pieces_keep_a_text_whole_without_splitting():
    assert text_pieces("  One. Two.  ", "en", split_sentences=False) == [Piece("  ", "One. Two.", "  ")]
    assert text_pieces("   ", "en", split_sentences=False) == [Piece("   ", "", "")]


def test_text_pieces_cut_a_long_sentence_only_when_asked():
    long_sentence = "word " * 400
    assert len([p for p in text_pieces(long_sentence, "en") if p.sentence]) == 1
    cut = [p.sentence for p in text_pieces(long_sentence, "en", cut_long=True) if p.sentence]
    assert len(cut) > 1 and " ".join(cut) == long_sentence.strip()


# ---- over HTTP: the running service (tests/service/conftest.py) ------------------------------

SENTENCES = ["I like tea.", "The big dog runs.", "We went to school today."]


def translate(client, texts, pair=EN_ZH, **options):
    response = client.post("/v1/translate", json={"texts": texts, **pair, **options})
    assert response.status_code == 200, response.text
    return response.json()["translations"]


def alone(client, sentence, pair=EN_ZH, **options):
    (translation,) = translate(client, [sentence], pair, **options)
    assert "sentences" not in translation
    return translation


@pytest.mark.slow
def test_each_sentence_of_a_text_is_translated_as_if_sent_alone(client):
    (translation,) = translate(client, [" ".join(SENTENCES)])
    expected = [alone(client, sentence) for sentence in SENTENCES]
    assert len(translation["sentences"]) == 3
    for got, want in zip(translation["sentences"], expected, strict=True):
        assert got["target_tokens"] == want["target_tokens"]
        assert got["explanation_id"] == want["explanation_id"] and got["explanation_id"]
        assert got["text"] == want["text"]


@pytest.mark.slow
def test_the_joined_text_follows_the_spacing_rule(client):
    (chinese,) = translate(client, [f"{SENTENCES[0]} {SENTENCES[1]}\n{SENTENCES[2]}"])
    texts = [alone(client, sentence)["text"] for sentence in SENTENCES]
    assert chinese["text"] == f"{texts[0]}{texts[1]}\n{texts[2]}"  # Chinese output: no space between sentences
    (english,) = translate(client, ["我喜欢茶。猫坐了。"], ZH_EN)
    parts = [alone(client, sentence, ZH_EN)["text"] for sentence in ("我喜欢茶。", "猫坐了。")]
    assert english["text"] == f"{parts[0]} {parts[1]}"  # a Chinese source had no space: English gets one


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_a_one_sentence_text_is_answered_as_without_splitting(client):
    for text in ("The cat sat on the mat.", "  I like tea.  ", "", "tea"):
        split = client.post("/v1/translate", json={"texts": [text], **EN_ZH}).json()
        whole = client.post("/v1/translate", json={"texts": [text], **EN_ZH, "split_sentences": False}).json()
        assert split == whole


@pytest.mark.slow
def test_a_long_text_of_short_sentences_translates_instead_of_413(client):
    text = " ".join(SENTENCES * 30)[:1500].rsplit(".", 1)[0] + "."  # about 1,500 characters, 60+ sentences
    assert 1400 < len(text) <= 1500
    whole = client.post("/v1/translate", json={"texts": [text], **EN_ZH, "split_sentences": False})
    assert whole.status_code == 413 and whole.json()["error"]["code"] == "input_too_long"
    (translation,) = translate(client, [text], beam_size=1, max_length=8)
    assert len(translation["sentences"]) == text.count(".")
    assert (
        translation["sentences"][1]["target_tokens"]
        == alone(client, SENTENCES[1], beam_size=1, max_length=8)["target_tokens"]
    )
