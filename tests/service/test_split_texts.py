"""service/split_texts.py: which /v1 texts are split, and how sentence answers are put together."""

from service.split_texts import assemble, model_texts, plan_texts


def sentence(text: str, source: list[str], target: list[str]) -> dict:
    return {
        "text": text,
        "source_tokens": source,
        "target_tokens": target,
        "score": -1.0,
        "token_scores": [-0.5, -0.5],
        "alignment": [[0, 0], [0, 1]],
        "word_alignment": [[0, 0], [0, 1]],
        "source_words": source,
        "target_words": target,
        "explanation_id": f"id-{text}",
        "alternatives": None,
    }


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
    alone: dict = {}
    (joined, whole) = assemble([first, second, alone], plans, "zh")
    assert whole is alone
    assert joined["text"] == "一。二。" and joined["sentences"] == [first, second]
    assert joined["source_tokens"] == ["▁One", "</s>", "▁Two", "</s>"]
    assert joined["alignment"] == [[0, 0], [0, 1], [2, 2], [2, 3]]
    assert joined["score"] == -2.0 and joined["explanation_id"] is None and "alternatives" not in joined
