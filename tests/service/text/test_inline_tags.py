"""service/text/inline_tags.py: inline elements placed around the target words aligned to the words they wrapped.

These use hand-made translation objects whose alignment is stated in the test; the running service's
own alignments are the oracle in tests/service/compat/test_html_tags.py.
"""

from dataclasses import replace

from service.records import TranslationRecord
from service.text.inline_tags import locate, place
from service.text.markup import InlineElement

SOURCE = "I like big cats."
TRANSLATION = TranslationRecord(
    text="我喜欢大猫？",
    source_tokens=["▁I", "▁like", "▁big", "▁cat", "s", ".", "</s>"],
    target_tokens=["▁我", "喜欢", "大", "猫", "?", "</s>"],  # sentencepiece's NFKC "?" for the text's "？"
    alignment=[[0, 0], [1, 1], [2, 2], [3, 3], [5, 4], [5, 5]],
)


def element(tag: str, start: int, end: int, attributes: str = "") -> InlineElement:
    return InlineElement(f"<{tag}{attributes}>", f"</{tag}>", start, end)


def test_tokens_are_found_in_order_through_nfkc():
    assert locate(TRANSLATION.target_tokens, TRANSLATION.text) == [(0, 1), (1, 3), (3, 4), (4, 5), (5, 6), None]
    assert locate(["▁dog"], "I like cats.") is None


def test_an_element_wraps_the_target_words_aligned_to_its_source_words():
    wrapped = element("b", SOURCE.index("big"), SOURCE.index("."), ' class="x&amp;y"')
    assert place(SOURCE, [wrapped], TRANSLATION) == '我喜欢<b class="x&amp;y">大猫</b>？'


def test_elements_follow_their_words_when_the_translation_reorders_them():
    translation = replace(TRANSLATION, alignment=[[3, 0], [1, 1], [2, 2], [0, 3], [5, 4], [5, 5]])
    placed = place(SOURCE, [element("i", 0, 1), element("b", 11, 15)], translation)
    assert placed == "<b>我</b>喜欢大<i>猫</i>？"


def test_the_span_is_the_smallest_stretch_covering_every_aligned_word():
    translation = replace(TRANSLATION, alignment=[[2, 0], [1, 1], [0, 2], [2, 3], [5, 4], [5, 5]])
    assert place(SOURCE, [element("b", 7, 10)], translation) == "<b>我喜欢大猫</b>？"


def test_a_tag_never_cuts_a_word_of_a_spaced_language():
    translation = TranslationRecord(
        text="He likes cats.",
        source_tokens=["▁我", "喜欢", "猫", "。", "</s>"],
        target_tokens=["▁He", "▁like", "s", "▁cats", ".", "</s>"],
        alignment=[[0, 0], [1, 1], [0, 2], [2, 3], [3, 4], [3, 5]],
    )
    assert place("我喜欢猫。", [element("em", 1, 3)], translation) == "He <em>likes</em> cats."


def test_an_element_with_no_aligned_word_stays_empty_after_its_nearest_aligned_neighbour():
    translation = replace(TRANSLATION, alignment=[[0, 0], [1, 1], [1, 2], [3, 3], [5, 4], [5, 5]])
    assert place(SOURCE, [element("a", 7, 10, ' href="/x"')], translation) == '我喜欢大<a href="/x"></a>猫？'


def test_interleaved_elements_and_cut_tokens_are_refused():
    crossing = replace(TRANSLATION, alignment=[[1, 0], [3, 1], [1, 2], [3, 3], [5, 4], [5, 5]])
    assert place(SOURCE, [element("i", 2, 6), element("b", 11, 15)], crossing) is None
    assert place(SOURCE, [element("b", 12, 15)], TRANSLATION) is None  # "c|ats": the tag would cut a token
