"""Protected spans: what is found in a text, what the model reads instead, and how each span comes back.

The finder is checked against translate-toolkit's placeables (an independent implementation of the same
conventions) on Debian's evaluation catalogs; the put-back rules against hand-made translations whose
alignment the test states. The running service's own decodes are the oracle in
tests/service/compat/test_protected_spans.py.
"""

from __future__ import annotations

import pytest

from service.records import TranslationRecord
from service.text.protected import find_spans, protect, restore
from tests.harness.placeables import evaluation_messages, toolkit_spans


def spans(text: str) -> list[str]:
    return [span.text for span in find_spans(text)]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Hello %s, you have %d new messages.", ["%s", "%d"]),
        ("Could not open '%1$s': %2$s", ["%1$s", "%2$s"]),
        ("%-10s %lu bytes, 100%% done", ["%-10s", "%lu", "100", "%%"]),
        ("Hello %(name)s, {name} and {0} and {}", ["%(name)s", "{name}", "{0}", "{}"]),
        ("Welcome back, {{name}}!", ["{{name}}"]),
        ("Set ${HOME} first", ["${HOME}"]),
        ("See https://example.com/help?q=1. Or www.example.org.", ["https://example.com/help?q=1", "www.example.org"]),
        ("Mail bob.smith+tag@mail.example.co.uk now", ["bob.smith+tag@mail.example.co.uk"]),
        ("Your order #4521 ships on 12/08, 1,250.50 in all.", ["4521", "1,250.50"]),
        ("Qt says %1 of %L2", ["%1", "%L2"]),
    ],
)
def test_each_kind_of_span_is_found_whole(text, expected):
    assert spans(text) == expected


def test_an_icu_argument_is_one_span_with_its_nested_braces():
    text = "You have {count, plural, one {# file} other {# files}} left."
    assert spans(text) == ["{count, plural, one {# file} other {# files}}"]


def test_prose_with_percent_signs_and_short_numbers_has_no_spans():
    assert spans("50% off for 3 days, 12 of 99 left.") == []


def test_spans_carry_their_offsets_and_kinds():
    text = "Open %s at https://x.org or mail a@b.io about 1234."
    found = find_spans(text)
    assert [(s.kind, text[s.start : s.end]) for s in found] == [
        ("placeholder", "%s"),
        ("url", "https://x.org"),
        ("email", "a@b.io"),
        ("number", "1234"),
    ]


def test_every_placeholder_translate_toolkit_finds_in_the_evaluation_catalogs_lies_in_one_span():
    checked = missed = 0
    for text, _ in evaluation_messages():
        ours = find_spans(text)
        for found in toolkit_spans(text):
            checked += 1
            start = text.find(found)
            if not any(s.start <= start and start + len(found) <= s.end for s in ours):
                missed += 1
    assert checked > 1000
    assert missed / checked <= 0.01, f"{missed} of {checked} placeables not protected"


def test_the_model_reads_stand_ins_that_the_text_does_not_already_hold():
    protected = protect("Tom sent %s to %s.", "en", "zh")
    assert protected.text == "Tom sent Mary to John."
    assert [protected.text[s:e] for s, e in protected.stand_ins] == ["Mary", "John"]
    numeric = protect("You have %d messages and 4521 points.", "en", "zh")
    assert numeric.text == "You have 3 messages and 7 points."  # not 5: the text holds one


SOURCE = "Hello %s, you have %d new messages."


def record(text: str, source_tokens: list[str], target_tokens: list[str], alignment: list[list[int]]):
    return TranslationRecord(text=text, source_tokens=source_tokens, target_tokens=target_tokens, alignment=alignment)


SOURCE_TOKENS = ["▁Hello", "▁Tom", ",", "▁you", "▁have", "▁3", "▁new", "▁messages", ".", "</s>"]


def test_a_stand_in_the_model_rendered_is_replaced_by_its_span():
    protected = protect(SOURCE, "en", "zh")
    translation = record(
        "你好汤姆，你有3条新消息。",
        SOURCE_TOKENS,
        ["▁你好", "汤姆", ",", "你有", "3", "条", "新", "消息", "。", "</s>"],
        [[0, 0], [1, 1], [2, 2], [4, 3], [5, 4], [5, 5], [6, 6], [7, 7], [8, 8], [9, 9]],
    )
    restored = restore(protected, translation, "zh")
    assert restored.text == "你好%s，你有%d条新消息。"
    assert [(p.text, p.source_span, restored.text[slice(*p.target_span)]) for p in restored.protected] == [
        ("%s", [6, 8], "%s"),
        ("%d", [19, 21], "%d"),
    ]
    assert restored.target_tokens == translation.target_tokens  # the model's tokens, as it wrote them


def test_a_lost_stand_in_goes_after_the_words_aligned_to_the_source_before_it():
    protected = protect(SOURCE, "en", "zh")
    translation = record(
        "你好，你有新消息。",  # the model dropped both stand-ins
        SOURCE_TOKENS,
        ["▁你好", ",", "你有", "新", "消息", "。", "</s>"],
        [[0, 0], [2, 1], [4, 2], [6, 3], [7, 4], [8, 5], [9, 6]],
    )
    assert restore(protected, translation, "zh").text == "你好%s，你有%d新消息。"


def test_an_insertion_into_spaced_text_gets_spaces_and_an_echoed_stand_in_is_dropped():
    protected = protect("欢迎%s回来", "zh", "en")
    assert protected.text == "欢迎汤姆回来"
    translation = record(
        "Welcome back Tom, Tom.",
        ["▁欢迎", "汤姆", "回来", "</s>"],
        ["▁Welcome", "▁back", "▁Tom", ",", "▁Tom", ".", "</s>"],
        [[0, 0], [2, 1], [1, 2], [3, 3], [1, 4], [3, 5], [3, 6]],
    )
    assert restore(protected, translation, "en").text == "Welcome back %s,."
    lost = record("Welcome back.", ["▁欢迎", "汤姆", "回来", "</s>"], ["▁Welcome", "▁back", ".", "</s>"],
                  [[0, 0], [2, 1], [3, 2], [3, 3]])  # fmt: skip
    assert restore(protected, lost, "en").text == "Welcome %s back."


def test_every_span_comes_back_as_often_as_the_source_has_it_whatever_the_model_wrote():
    text = "Copy %s to %s, then %s: see https://a.io/x and https://a.io/x"
    protected = protect(text, "en", "zh")
    for garbage in ("", "汤姆汤姆汤姆", "玛丽是约翰", "？"):
        restored = restore(protected, record(garbage, [], [], []), "zh")
        assert restored.text.count("%s") == 3
        assert restored.text.count("https://a.io/x") == 2
        assert len(restored.protected) == 5
        for span in restored.protected:
            assert restored.text[slice(*span.target_span)] == span.text
            assert text[slice(*span.source_span)] == span.text
