"""Texts cut into lines and sentences (sentencex), each piece keeping the whitespace around it, and translations
joined back with the text's own spacing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import sentencex

from service.text.languages import UNSPACED

# A sentence longer than this is cut further (at clause punctuation, else at spaces, else anywhere):
# about 150 tokens for English, within the shipped models' 256, and about 200 for Chinese.
MAX_PIECE_CHARS = 600
MAX_PIECE_CHARS_CJK = 200
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]")
_TRAILING_SPACES = re.compile(r"[ \t]+(?=\n)")
_CLAUSE_END = re.compile(r"(?<=[,;:，；：、])\s*|\s+")


@dataclass(frozen=True)
class Piece:
    """One sentence (or part of one) of a text, with the whitespace before and after it."""

    before: str
    sentence: str
    after: str


def _limit(text: str) -> int:
    return MAX_PIECE_CHARS_CJK if len(_CJK.findall(text)) * 3 > len(text) else MAX_PIECE_CHARS


def _cut(sentence: str) -> list[str]:
    """A sentence over the limit, cut at the last clause break or space before it (or at the limit)."""
    limit = _limit(sentence)
    parts = []
    while len(sentence) > limit:
        breaks = [match.end() for match in _CLAUSE_END.finditer(sentence, 1, limit) if match.end() < limit]
        cut = breaks[-1] if breaks else limit
        parts.append(sentence[:cut])
        sentence = sentence[cut:]
    parts.append(sentence)
    return parts


def split(text: str, language: str, cut_long: bool = True) -> list[Piece]:
    """The pieces of a text; "".join(before + sentence + after) gives the text back.

    cut_long=False keeps a sentence over the length limit whole (the model may then refuse it).
    """
    pieces: list[Piece] = []
    for line in text.splitlines(keepends=True):
        for segment in sentencex.segment(language, line) if line.strip() else [line]:
            for part in _cut(segment) if cut_long else [segment]:
                stripped = part.strip()
                if not stripped:
                    if pieces:  # whitespace only: it belongs after the previous piece
                        last = pieces[-1]
                        pieces[-1] = Piece(last.before, last.sentence, last.after + part)
                    else:
                        pieces.append(Piece(part, "", ""))
                    continue
                start = part.index(stripped)
                pieces.append(Piece(part[:start], stripped, part[start + len(stripped) :]))
    return pieces


def join(pieces: list[Piece], translations: list[str], target_language: str) -> str:
    """The translated text: each piece's translation in place of its sentence (see `join_with_starts`)."""
    return join_with_starts(pieces, translations, target_language)[0]


def join_with_starts(pieces: list[Piece], translations: list[str], target_language: str) -> tuple[str, list[int]]:
    """The translated text, and where in it each piece's translation starts: each in place of its sentence.

    The whitespace between two sentences is kept as it was (line breaks and indentation included), except that
    spaces and tabs before a line break, or making up the whole gap, are dropped when the target language writes
    sentences without spaces (Chinese, Japanese), and one space is put between two sentences that had none (a
    Chinese source) when the target language separates sentences by spaces.
    """
    unspaced = target_language.split("-")[0] in UNSPACED
    out: list[str] = []
    starts: list[int] = []
    length = 0
    previous_after: str | None = None
    for piece, translation in zip(pieces, translations, strict=True):
        gap = (previous_after or "") + piece.before
        if previous_after is not None and piece.sentence:
            if unspaced:
                gap = _TRAILING_SPACES.sub("", gap) if "\n" in gap else ""
            elif not unspaced and not gap and out and translation:
                gap = " "
        out.append(gap if previous_after is not None else piece.before)
        length += len(out[-1])
        starts.append(length)
        out.append(translation)
        length += len(translation)
        previous_after = piece.after
    out.append(previous_after or "")
    return "".join(out), starts


__all__ = ["Piece", "join", "join_with_starts", "split"]
