"""service/text/sentences.py: texts cut into sentences that join back with their own spacing."""

import pytest

from service.text.sentences import MAX_PIECE_CHARS, join, split

TEXTS = [
    ("Hello Mr. Smith. How are you?  I'm fine.\nNew line here", "en"),
    ("你好。你好吗？\n\n我很好！谢谢", "zh"),
    ("  leading and trailing  ", "en"),
    ("\n\nOne.\n", "en"),
    ("", "en"),
    ("   ", "en"),
]


@pytest.mark.parametrize("text, language", TEXTS)
def test_the_pieces_give_the_text_back(text, language):
    assert "".join(p.before + p.sentence + p.after for p in split(text, language)) == text


def test_english_and_chinese_punctuation_end_sentences():
    assert [p.sentence for p in split("Hello Mr. Smith. How are you?", "en")] == ["Hello Mr. Smith.", "How are you?"]
    assert [p.sentence for p in split("你好。你好吗？我很好！", "zh")] == ["你好。", "你好吗？", "我很好！"]


def test_a_sentence_over_the_limit_is_cut_at_spaces():
    pieces = split("word " * 400, "en")
    assert len(pieces) > 1 and all(len(p.sentence) <= MAX_PIECE_CHARS for p in pieces)


def test_join_keeps_line_breaks_and_drops_spaces_between_sentences_for_chinese():
    pieces = split("One. Two.  \nThree.", "en")
    assert join(pieces, ["一。", "二。", "三。"], "zh") == "一。二。\n三。"
    assert join(pieces, ["1.", "2.", "3."], "en") == "1. 2.  \n3."


def test_join_puts_a_space_between_sentences_a_chinese_source_did_not_separate():
    assert join(split("一。二。", "zh"), ["One.", "Two."], "en") == "One. Two."


def test_blank_pieces_stay_blank():
    assert join(split("  ", "en"), [""], "zh") == "  "
