"""Spans a translation keeps byte for byte (placeholders, URLs, e-mail addresses, numbers of three digits or more):
found in a client text, read by the model as a stand-in (a name or a digit it translates well), and put back where
the stand-in went in the translation: its rendering, else the words aligned to it, else beside its neighbour's.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from service.records import ProtectedRecord, TermRecord, TranslationRecord
from service.text.inline_tags import locate
from service.text.languages import UNSPACED
from service.text.sentences import Piece

_PRINTF = r"%(?:\d+\$)?[-+0#']*(?:\d+|\*)?(?:\.(?:\d+|\*))?(?:hh|h|ll|l|L|q|j|z|Z|t|I64|I32)?[diouxXeEfFgGaAcCsSpn%]"
# Order matters only for spans that start at the same character: the longer one is kept.
PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    ("url", re.compile(r"\b(?:https?|ftp|file)://[^\s<>\"'`]+|\bwww\.[^\s<>\"'`]+\.[^\s<>\"'`]+")),
    ("email", re.compile(r"\b[\w.+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+")),
    ("placeholder", re.compile(r"\{\{[^{}]*\}\}")),  # {{name}} (Mustache, Jinja, i18next)
    ("placeholder", re.compile(r"\$\{[^{}]+\}")),  # ${var}
    ("placeholder", re.compile(r"%\([^()\s]+\)[-+0# ]*\d*(?:\.\d+)?[diouxXeEfFgGcrsa%]")),  # %(name)s
    ("placeholder", re.compile(_PRINTF)),  # %s, %d, %1$s, %-10s, %lu, %%
    ("placeholder", re.compile(r"%L?\d+")),  # Qt's %1, %L1
    ("placeholder", re.compile(r"\{[A-Za-z_0-9][\w.\[\]]*(?:![rsa])?(?::[^{}\s]*)?\}|\{\}")),  # {name}, {0}, {}
    ("number", re.compile(r"(?<![\d.,])\d+(?:[.,]\d+)*")),  # kept only with three digits or more
]
_ICU_START = re.compile(r"\{\s*[\w.]+\s*,\s*(?:plural|select|selectordinal|number|date|time|spellout|ordinal)\b")
_URL_TAIL = ".,;:!?)]}'\"。，；：！？）"


@dataclass(frozen=True)
class Span:
    """A stretch of a client text that is kept as written (or, a glossary term, written as `replacement`); start
    and end are character offsets into that text."""

    kind: str  # "placeholder", "url", "email", "number", or "term"
    start: int
    end: int
    text: str
    replacement: str | None = None  # a term's target side

    @property
    def written(self) -> str:
        """What the translation holds in its place."""
        return self.text if self.replacement is None else self.replacement


def _icu_blocks(text: str) -> list[tuple[int, int]]:
    """ICU MessageFormat arguments ({count, plural, one {# file} other {# files}}), whole, braces balanced."""
    blocks = []
    for match in _ICU_START.finditer(text):
        depth = 0
        for index in range(match.start(), len(text)):
            depth += {"{": 1, "}": -1}.get(text[index], 0)
            if depth == 0:
                blocks.append((match.start(), index + 1))
                break
    return blocks


def find_terms(text: str, terms: Sequence[tuple[str, str]], source_lang: str, taken: list[Span]) -> list[Span]:
    """Where a glossary's source terms occur outside `taken`: whole words, case-insensitively, in a language
    written with spaces; anywhere in one written without (Chinese). The longest term wins an overlap."""
    spaced = source_lang.split("-")[0] not in UNSPACED
    found: list[Span] = []
    occupied = [(s.start, s.end) for s in taken]
    for source, target in sorted(terms, key=lambda term: -len(term[0])):
        pattern = re.escape(source)
        if spaced:
            pattern = rf"(?<!\w){pattern}(?!\w)"
        for match in re.finditer(pattern, text, re.IGNORECASE):
            start, end = match.span()
            if all(end <= s or e <= start for s, e in occupied):
                occupied.append((start, end))
                found.append(Span("term", start, end, match.group(0), target))
    return found


def find_spans(text: str) -> list[Span]:
    """The protected spans of a text, in order, none overlapping (the earliest, then the longest, wins)."""
    candidates = [("placeholder", start, end) for start, end in _icu_blocks(text)]
    for kind, pattern in PATTERNS:
        for match in pattern.finditer(text):
            start, end = match.span()
            if kind == "url":
                while end > start and text[end - 1] in _URL_TAIL:
                    end -= 1
            if kind == "number" and sum(character.isdigit() for character in text[start:end]) < 3:
                continue
            candidates.append((kind, start, end))
    spans: list[Span] = []
    for kind, start, end in sorted(candidates, key=lambda item: (item[1], -item[2])):
        if end > start and (not spans or start >= spans[-1].end):
            spans.append(Span(kind, start, end, text[start:end]))
    return spans


# What the model reads in place of a span, per language: its written forms there (the first one is what the
# source shows). Names and digits the shipped models translate reliably, Tatoeba's favourites.
_NAMES = [
    {"en": ("Tom",), "zh": ("汤姆",)},
    {"en": ("Mary",), "zh": ("玛丽",)},
    {"en": ("John",), "zh": ("约翰",)},
    {"en": ("Jack",), "zh": ("杰克",)},
    {"en": ("Alice",), "zh": ("爱丽丝",)},
    {"en": ("Ken",), "zh": ("肯",)},
]
_DIGITS = [
    {"en": (digit, word), "zh": (digit, numeral)}
    for digit, word, numeral in zip("35792468", "three five seven nine two four six eight".split(), "三五七九二四六八")
]
_NUMERIC_PLACEHOLDER = re.compile(r"%(?:\d+\$)?[-+0#']*\d*(?:hh|h|ll|l|L|q|j|z|Z|t)?[diuxX]$")


def _forms(stand_in: dict[str, tuple[str, ...]], language: str) -> tuple[str, ...]:
    return stand_in.get(language.split("-")[0], stand_in["en"])


@dataclass
class Protected:
    """A model input with its stand-ins: `text` is what the model reads."""

    text: str
    spans: list[Span] = field(default_factory=list)  # offsets into the client's text
    stand_ins: list[tuple[int, int]] = field(default_factory=list)  # offsets into `text`, one per span
    renderings: list[tuple[str, ...]] = field(default_factory=list)  # how each stand-in may read in the target
    keep_spans: bool = True  # placeholders, URLs and numbers protected (their list is answered)
    glossary: bool = False  # a glossary applied (its terms' list is answered)
    # the glossary's terms found, each with where it starts in `text`: the search enforces their targets
    terms: list[tuple[Span, int]] = field(default_factory=list)

    @property
    def term_targets(self) -> list[str]:
        """The target terms this input's translation must contain (one per occurrence, in order)."""
        return [span.written for span, _ in self.terms]

    def listed(self, placed: list[ProtectedRecord]) -> list[ProtectedRecord] | None:
        return placed if self.keep_spans else None

    def listed_terms(self, terms: list[TermRecord]) -> list[TermRecord] | None:
        return terms if self.glossary else None

    def within(self, start: int, end: int) -> Protected:
        """The part of this input from `start` to `end` (a sentence of it), its stand-ins' offsets moved there."""
        kept = [i for i, (s, e) in enumerate(self.stand_ins) if start <= s and e <= end]
        return Protected(
            self.text[start:end],
            [self.spans[i] for i in kept],
            [(self.stand_ins[i][0] - start, self.stand_ins[i][1] - start) for i in kept],
            [self.renderings[i] for i in kept],
            self.keep_spans,
            self.glossary,
            [(span, at - start) for span, at in self.terms if start <= at < end],
        )


def protect(
    text: str,
    source_lang: str,
    target_lang: str,
    terms: Sequence[tuple[str, str]] = (),
    keep_spans: bool = True,
) -> Protected:
    """The text with each protected span (keep_spans) replaced by a stand-in that occurs nowhere in it, nor its
    renderings, and each glossary term's occurrence found (its target is enforced in the search)."""
    spans = find_spans(text) if keep_spans else []
    found_terms = sorted(find_terms(text, terms, source_lang, spans), key=lambda span: span.start)
    protected = Protected(text, keep_spans=keep_spans, glossary=bool(terms))
    if not spans:
        protected.terms = [(span, span.start) for span in found_terms]
        return protected
    folded = text.casefold()

    def unused(pool: list[dict[str, tuple[str, ...]]]) -> list[dict[str, tuple[str, ...]]]:
        languages = (source_lang, target_lang)
        return [s for s in pool if not any(f.casefold() in folded for lang in languages for f in _forms(s, lang))]

    names, digits = unused(_NAMES), unused(_DIGITS)
    out: list[str] = []
    protected.spans = spans
    shift: list[tuple[int, int]] = []  # (client offset past a span, how far `text` has moved there)
    cursor = 0
    for span in spans:
        numeric = span.kind == "number" or (span.kind == "placeholder" and _NUMERIC_PLACEHOLDER.match(span.text))
        pool = (digits or names) if numeric else (names or digits)
        out.append(text[cursor : span.start])
        position = sum(len(part) for part in out)
        if pool:
            stand_in = pool.pop(0)
            written = _forms(stand_in, source_lang)[0]
            renderings = _forms(stand_in, target_lang)
        else:  # more spans than stand-ins: the span is left out and placed beside its neighbours' words
            written, renderings = "", ()
        out.append(written)
        protected.stand_ins.append((position, position + len(written)))
        protected.renderings.append(renderings)
        shift.append((span.end, position + len(written) - span.end))
        cursor = span.end
    out.append(text[cursor:])
    protected.text = "".join(out)
    protected.terms = [(term, term.start + _moved(shift, term.start)) for term in found_terms]
    return protected


def _moved(shift: list[tuple[int, int]], offset: int) -> int:
    """How far a client offset moved in the protected text: the last span ending at or before it says."""
    moved = 0
    for end, by in shift:
        if end <= offset:
            moved = by
    return moved


def sentence_starts(pieces: list[Piece]) -> list[int]:
    """Where each piece's sentence starts in the text the pieces were cut from."""
    starts = []
    position = 0
    for piece in pieces:
        starts.append(position + len(piece.before))
        position += len(piece.before) + len(piece.sentence) + len(piece.after)
    return starts


def model_protections(protections: list[Protected], plans: list[list[Piece] | None]) -> list[Protected]:
    """Per model text (model_texts' order: a whole text, or each sentence of a split one), its part of the
    protection."""
    parts = []
    for protected, pieces in zip(protections, plans, strict=True):
        if pieces is None:
            parts.append(protected)
            continue
        for piece, start in zip(pieces, sentence_starts(pieces), strict=True):
            if piece.sentence:
                parts.append(protected.within(start, start + len(piece.sentence)))
    return parts


def _is_word(character: str) -> bool:
    return character.isalnum() and unicodedata.east_asian_width(character) not in ("W", "F")


def _occurrences(target: str, rendering: str) -> list[tuple[int, int]]:
    """Where a rendering stands in the target as a word of its own (a CJK rendering: anywhere)."""
    found = []
    start = target.find(rendering)
    while start >= 0 and rendering:
        end = start + len(rendering)
        bounded = not _is_word(rendering[0]) or start == 0 or not _is_word(target[start - 1])
        bounded = bounded and (not _is_word(rendering[-1]) or end == len(target) or not _is_word(target[end]))
        if bounded:
            found.append((start, end))
        start = target.find(rendering, start + 1)
    return found


def _aligned_targets(protected: Protected, record: TranslationRecord) -> list[list[tuple[int, int]]] | None:
    """Per stand-in, the character spans of the target tokens aligned to its source tokens; None: tokens unfound."""
    source_spans = locate(record.source_tokens, protected.text)
    target_spans = locate(record.target_tokens, record.text)
    if source_spans is None or target_spans is None:
        return None
    per_stand_in: list[list[tuple[int, int]]] = [[] for _ in protected.stand_ins]
    for source_index, target_index in record.alignment:
        source, target = source_spans[source_index], target_spans[target_index]
        if source is None or target is None:
            continue
        for i, (start, end) in enumerate(protected.stand_ins):
            if source[0] < end and start < source[1]:
                per_stand_in[i].append(target)
    return per_stand_in


def _neighbour_position(protected: Protected, record: TranslationRecord, index: int) -> int:
    """Where a stand-in the translation lost goes: after the words aligned to the source just before it (else
    before those of the source just after it, else at the end)."""
    source_spans = locate(record.source_tokens, protected.text)
    target_spans = locate(record.target_tokens, record.text)
    if source_spans is None or target_spans is None:
        return len(record.text.rstrip("。.!?！？"))
    start, end = protected.stand_ins[index]
    before: dict[int, list[int]] = {}
    after: dict[int, list[int]] = {}
    for source_index, target_index in record.alignment:
        source, target = source_spans[source_index], target_spans[target_index]
        if source is None or target is None:
            continue
        if source[1] <= start:
            before.setdefault(source[1], []).append(target[1])
        elif source[0] >= end:
            after.setdefault(source[0], []).append(target[0])
    if before:
        return max(before[max(before)])
    if after:
        return min(after[min(after)])
    return len(record.text.rstrip("。.!?！？"))


def restore(protected: Protected, record: TranslationRecord, target_lang: str) -> TranslationRecord:
    """The record with each span back in its text where its stand-in went, `protected` listing where; its
    alternatives likewise. Tokens, scores and alignment stay the model's (they are what it read and wrote)."""
    alternatives = [restore(protected, alternative, target_lang) for alternative in record.alternatives]
    if not protected.spans:
        terms = protected.listed_terms(_found_terms(protected, record.text))
        return replace(record, protected=protected.listed([]), terms=terms, alternatives=alternatives)
    target = record.text
    aligned = _aligned_targets(protected, record)
    claimed: list[tuple[int, int]] = []
    edits: list[tuple[int, int, int]] = []  # (start, end, span index or -1 to delete) in the model's text

    def free(start: int, end: int) -> bool:
        return all(end <= s or e <= start for s, e in claimed)

    lost = []
    for index, renderings in enumerate(protected.renderings):
        found = [o for r in renderings for o in _occurrences(target, r) if free(*o)]
        if not found:
            lost.append(index)
            continue
        near = aligned[index] if aligned else []
        centre = min(s for s, _ in near) if near else found[0][0]
        best = min(found, key=lambda o: abs(o[0] - centre))
        for occurrence in found:  # other copies of a stand-in the source never had: the model's echoes of it
            if occurrence != best and _is_name(renderings):
                claimed.append(occurrence)
                edits.append((*occurrence, -1))
        claimed.append(best)
        edits.append((*best, index))
    for index in lost:
        near = [span for span in (aligned[index] if aligned else []) if free(*span)]
        position = min(s for s, _ in near) if near else _neighbour_position(protected, record, index)
        for start, end in claimed:
            if start < position < end:
                position = end
        edits.append((position, position, index))
    spaced = target_lang.split("-")[0] not in UNSPACED
    out: list[str] = []
    placed: list[ProtectedRecord] = []
    cursor = 0
    for start, end, index in sorted(edits, key=lambda edit: (edit[0], edit[1])):
        out.append(target[cursor:start])
        if index >= 0:
            span = protected.spans[index]
            text = span.written
            if start == end and spaced:  # an insertion between words gets its spaces
                written = "".join(out)
                if written and not written[-1].isspace() and (_is_word(written[-1]) or written[-1] in ",;:"):
                    text = " " + text
                if end < len(target) and _is_word(target[end]):
                    text = text + " "
            offset = sum(len(part) for part in out) + (len(text) - len(text.lstrip(" ")))
            target_span = [offset, offset + len(span.written)]
            placed.append(ProtectedRecord(span.text, span.kind, [span.start, span.end], target_span))
            out.append(text)
        elif spaced and out and out[-1].endswith(" ") and not (end < len(target) and _is_word(target[end])):
            out[-1] = out[-1][:-1]  # a deleted word leaves one space, not two
        cursor = max(cursor, end)
    out.append(target[cursor:])
    text = "".join(out)
    return replace(
        record,
        text=text,
        protected=protected.listed(placed),
        terms=protected.listed_terms(_found_terms(protected, text)),
        alternatives=alternatives,
    )


def _found_terms(protected: Protected, text: str) -> list[TermRecord]:
    """Each term that applied, with where its target stands in the translation: occurrences in order, one each
    (None where the translation does not hold it)."""
    records, taken = [], []
    for span, _ in protected.terms:
        free = [o for o in _occurrences(text, span.written) if o not in taken]
        if not free:  # a target not written as a word of its own: anywhere
            free = [o for o in _substrings(text, span.written) if o not in taken]
        where = free[0] if free else None
        if where is not None:
            taken.append(where)
        records.append(TermRecord(span.text, span.written, [span.start, span.end], list(where) if where else None))
    return records


def _substrings(text: str, part: str) -> list[tuple[int, int]]:
    found, start = [], text.find(part)
    while start >= 0 and part:
        found.append((start, start + len(part)))
        start = text.find(part, start + 1)
    return found


def _is_name(renderings: tuple[str, ...]) -> bool:
    return any(not rendering.isdigit() for rendering in renderings)


__all__ = [
    "PATTERNS",
    "Protected",
    "Span",
    "find_spans",
    "protect",
    "model_protections",
    "restore",
    "sentence_starts",
]
