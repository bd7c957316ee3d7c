"""Inline tags (`I like <b>big cats</b>.`) put back into a sentence's translation where the token alignment says
their words went (`place`); None when they cannot be placed, and the caller translates the text nodes apart.
"""

from __future__ import annotations

import html
import unicodedata

from service.records import TranslationRecord
from service.text.markup import InlineElement

WORD_BOUNDARY = "\u2581"


def _normalized(text: str) -> tuple[str, list[int]]:
    """NFKC form of text, and for each of its characters the index of the character it came from."""
    characters: list[str] = []
    origin: list[int] = []
    for index, character in enumerate(text):
        normal = unicodedata.normalize("NFKC", character)
        characters.append(normal)
        origin.extend([index] * len(normal))
    return "".join(characters), origin


def locate(tokens: list[str], text: str) -> list[tuple[int, int] | None] | None:
    """Character span in text of each token, in order (None for </s> or a lone ▁); None when one is not there."""
    normal, origin = _normalized(text)
    spans: list[tuple[int, int] | None] = []
    cursor = 0
    for token in tokens:
        if token == "</s>":
            spans.append(None)
            continue
        piece = unicodedata.normalize("NFKC", token.replace(WORD_BOUNDARY, " ")).strip()
        if not piece:
            spans.append(None)
            continue
        while cursor < len(normal) and normal[cursor].isspace():
            cursor += 1
        if not normal.startswith(piece, cursor):
            return None  # <unk>, or text the tokenizer changed in a way we cannot follow
        spans.append((origin[cursor], origin[cursor + len(piece) - 1] + 1))
        cursor += len(piece)
    return spans


def _in_word(character: str) -> bool:
    return character.isalnum() and unicodedata.east_asian_width(character) not in ("W", "F")


def _widen(text: str, start: int, end: int) -> tuple[int, int]:
    while 0 < start < len(text) and _in_word(text[start - 1]) and _in_word(text[start]):
        start -= 1
    while 0 < end < len(text) and _in_word(text[end - 1]) and _in_word(text[end]):
        end += 1
    return start, end


def place(source: str, elements: list[InlineElement], translation: TranslationRecord) -> str | None:
    """The translation of `source` as HTML with each element placed by the alignment; None: cannot be placed.

    `elements` carry offsets into `source`; of `translation`, the sentence's, its text, tokens and alignment
    are read.
    1. An element wraps the source tokens whose characters lie inside it (a token cut by the element's edge
       gives up on the sentence).
    2. It is placed around the smallest contiguous stretch of the translation that covers every target token
       aligned to those source tokens, widened to whole words (letters or digits outside CJK scripts).
    3. An element with no aligned target token is kept empty, right after the target tokens of the nearest
       source token before it that has any (else right before those of the nearest one after it, else at the
       start), moved past any placed element it would fall inside.
    4. When two elements' stretches overlap, or tokens cannot be found in the texts, the answer is None.
    Tokens are found in the texts in order after NFKC normalization (what sentencepiece applies); start tags
    are copied byte for byte.
    """
    target = translation.text
    source_spans = locate(translation.source_tokens, source)
    target_spans = locate(translation.target_tokens, target)
    if source_spans is None or target_spans is None:
        return None
    aligned: dict[int, list[tuple[int, int]]] = {}
    for source_index, target_index in translation.alignment:
        span = target_spans[target_index]
        if span is not None and source_spans[source_index] is not None:
            aligned.setdefault(source_index, []).append(span)
    spans: list[tuple[int, int, InlineElement]] = []
    empty: list[InlineElement] = []
    for element in elements:
        wrapped = []
        for index, span in enumerate(source_spans):
            if span is None:
                continue
            inside = element.start <= span[0] and span[1] <= element.end
            if not inside and span[0] < element.end and element.start < span[1]:
                return None  # the element's edge cuts a token
            if inside:
                wrapped.append(index)
        targets = [span for index in wrapped for span in aligned.get(index, [])]
        if targets:
            start, end = _widen(target, min(s for s, _ in targets), max(e for _, e in targets))
            spans.append((start, end, element))
        else:
            empty.append(element)
    spans.sort(key=lambda item: (item[0], item[1]))
    for (_, previous_end, _), (start, _, _) in zip(spans, spans[1:]):
        if start < previous_end:
            return None  # two elements' words interleave in the translation
    events: list[tuple[int, int, int, str]] = []  # (position, order at that position, sequence, markup)
    for start, end, element in spans:
        events.append((start, 2, len(events), element.start_tag))
        events.append((end, 0, len(events), element.end_tag))
    for element in empty:
        position = _empty_position(element, source_spans, aligned)
        for start, end, _ in spans:
            if start < position < end:
                position = end
        events.append((position, 1, len(events), element.start_tag + element.end_tag))
    out: list[str] = []
    cursor = 0
    for position, _, _, markup in sorted(events):
        out.append(html.escape(target[cursor:position], quote=False))
        out.append(markup)
        cursor = position
    out.append(html.escape(target[cursor:], quote=False))
    return "".join(out)


def _empty_position(
    element: InlineElement, source_spans: list[tuple[int, int] | None], aligned: dict[int, list[tuple[int, int]]]
) -> int:
    known = [(i, span) for i, span in enumerate(source_spans) if span is not None and i in aligned]
    before = [i for i, span in known if span[1] <= element.start]
    if before:
        return max(end for _, end in aligned[before[-1]])
    after = [i for i, span in known if span[0] >= element.end]
    if after:
        return min(start for start, _ in aligned[after[0]])
    return 0


__all__ = ["locate", "place"]
