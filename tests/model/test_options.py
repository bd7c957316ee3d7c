"""One decoding-options type: validated once, accepted as an object or by keyword, equal results either way."""

from __future__ import annotations

import pytest

from model import DecodingOptions, InvalidInputError


@pytest.mark.parametrize(
    "settings",
    [{"beam_size": 0}, {"beam_size": 65}, {"beam_size": 2, "n_best": 3}, {"max_new_tokens": 0}, {"min_new_tokens": -1}],
)
def test_invalid_options_are_refused_by_name(settings):
    with pytest.raises(InvalidInputError):
        DecodingOptions(**settings)


def test_options_object_and_keywords_decode_the_same(translator):
    texts = ["The cat sat on the mat.", "We like tea."]
    by_object = translator.translate(texts, DecodingOptions(beam_size=3, n_best=2, max_new_tokens=9))
    by_keyword = translator.translate(texts, beam_size=3, num_return_sequences=2, max_new_tokens=9)
    for a, b in zip(by_object, by_keyword, strict=True):
        assert a.target_ids == b.target_ids and a.score == b.score
        assert [x.target_ids for x in a.alternatives] == [x.target_ids for x in b.alternatives]
        assert len(a.target_ids) <= 9 and len(a.alternatives) == 1
    with pytest.raises(TypeError, match="not both"):
        translator.translate(texts, DecodingOptions(), beam_size=2)
    with pytest.raises(TypeError, match="unknown decoding settings: beams"):
        translator.translate(texts, beams=2)


def test_options_are_hashable_so_equal_requests_share_a_batch():
    assert len({DecodingOptions(beam_size=2), DecodingOptions(beam_size=2), DecodingOptions()}) == 2


def test_blank_texts_translate_to_nothing_and_leave_the_others_alone(translator):
    texts = ["", "We like tea.", " \n\t "]
    results = translator.translate(texts, beam_size=2, max_new_tokens=8)
    alone = translator.translate(["We like tea."], beam_size=2, max_new_tokens=8)[0]
    for blank in (results[0], results[2]):
        assert blank.text == "" and blank.target_ids == [] and blank.alignment == [] and blank.alternatives == []
    assert results[1].target_ids == alone.target_ids and results[1].score == alone.score
