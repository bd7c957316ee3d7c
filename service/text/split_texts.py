"""Sentence splitting of client texts: `text_pieces`, the one splitter /v1/translate and the compatibility routes
share, and how /v1 decodes a text of several sentences sentence by sentence and answers it as one translation
object laid end to end (`plan_texts`, `model_texts`, `assemble`; the shape schemas.TranslationOut documents).
"""

from __future__ import annotations

from dataclasses import replace

from service.records import TranslationRecord, TrustFlagRecord, TrustRecord
from service.text.sentences import Piece, join_with_starts, split


def text_pieces(text: str, language: str, split_sentences: bool = True, cut_long: bool = False) -> list[Piece]:
    """A text's sentences with the whitespace around them; split_sentences False: the whole text, one piece.

    cut_long also cuts a sentence longer than the model accepts (at clause breaks or spaces); without it such
    a sentence stays whole and the model refuses it (413).
    """
    if split_sentences:
        return split(text, language, cut_long=cut_long)
    stripped = text.strip()
    start = text.index(stripped) if stripped else len(text)
    return [Piece(text[:start], stripped, text[start + len(stripped) :])]


def plan_texts(texts: list[str], language: str, split_sentences: bool) -> list[list[Piece] | None]:
    """Per text: its sentence pieces when it has two or more sentences, else None (it goes whole)."""
    plans: list[list[Piece] | None] = []
    for text in texts:
        pieces = text_pieces(text, language, split_sentences)
        plans.append(pieces if sum(1 for piece in pieces if piece.sentence) > 1 else None)
    return plans


def model_texts(texts: list[str], plans: list[list[Piece] | None]) -> list[str]:
    """What the model translates: each whole text, or each sentence of a split one, in order."""
    out: list[str] = []
    for text, pieces in zip(texts, plans, strict=True):
        out.extend([text] if pieces is None else [piece.sentence for piece in pieces if piece.sentence])
    return out


def assemble(
    outcomes: list[TranslationRecord], plans: list[list[Piece] | None], target_language: str
) -> list[TranslationRecord]:
    """One translation per client text, from the model's outcomes in model_texts' order."""
    results: list[TranslationRecord] = []
    position = 0
    for pieces in plans:
        if pieces is None:
            results.append(outcomes[position])
            position += 1
            continue
        count = sum(1 for piece in pieces if piece.sentence)
        results.append(_joined(pieces, outcomes[position : position + count], target_language))
        position += count
    return results


def _joined(pieces: list[Piece], sentences: list[TranslationRecord], target_language: str) -> TranslationRecord:
    translations = iter(sentence.text for sentence in sentences)
    text, starts = join_with_starts(
        pieces, [next(translations) if piece.sentence else "" for piece in pieces], target_language
    )
    result = TranslationRecord(text=text, source_tokens=[], target_tokens=[], alignment=[], sentences=sentences)
    offsets = [start for piece, start in zip(pieces, starts, strict=True) if piece.sentence]
    if sentences and all(sentence.protected is not None for sentence in sentences):  # offsets into the joined text
        result.protected = [
            replace(span, target_span=[s + offset for s in span.target_span])
            for sentence, offset in zip(sentences, offsets, strict=True)
            for span in sentence.protected
        ]
    if sentences and all(sentence.terms is not None for sentence in sentences):
        result.terms = [
            replace(term, target_span=[s + offset for s in term.target_span])
            for sentence, offset in zip(sentences, offsets, strict=True)
            for term in sentence.terms
        ]
    for sentence in sentences:
        source_offset, target_offset = len(result.source_tokens), len(result.target_tokens)
        result.alignment.extend([s + source_offset, t + target_offset] for s, t in sentence.alignment)
        source_offset, target_offset = len(result.source_words), len(result.target_words)
        result.word_alignment.extend([s + source_offset, t + target_offset] for s, t in sentence.word_alignment)
        result.source_tokens.extend(sentence.source_tokens)
        result.target_tokens.extend(sentence.target_tokens)
        result.token_scores.extend(sentence.token_scores)
        result.source_words.extend(sentence.source_words)
        result.target_words.extend(sentence.target_words)
        result.score += sentence.score
    if sentences and all(sentence.token_source_shares is not None for sentence in sentences):  # source_share true
        result.token_source_shares = [share for sentence in sentences for share in sentence.token_source_shares]
    methods = {sentence.alignment_method for sentence in sentences}
    result.alignment_method = "agreement" if methods == {"agreement"} else "head"
    notes = [sentence.alignment_note for sentence in sentences if sentence.alignment_note]
    result.alignment_note = notes[0] if notes else None
    if methods == {"agreement", "head"}:
        result.alignment_note = "some sentences' alignment is the head's one-best (see `sentences`)"
    if sentences and all(sentence.trust is not None for sentence in sentences):
        result.trust = _joined_trust(sentences)
    return result


def _joined_trust(sentences: list[TranslationRecord]) -> TrustRecord:
    """A text's trust from its sentences': the least trusted sentence's score, every flag with its word indices
    moved onto the concatenated word lists, no signals (each sentence has its own)."""
    trusts = [sentence.trust for sentence in sentences]
    weakest = min(range(len(trusts)), key=lambda index: trusts[index].score)
    flags = []
    offsets = {"source": 0, "target": 0}
    for sentence, trust in zip(sentences, trusts, strict=True):
        for flag in trust.flags:
            offset = offsets[flag.side]
            flags.append(TrustFlagRecord(flag.kind, flag.side, [w + offset for w in flag.words], flag.text))
        offsets["source"] += len(sentence.source_words)
        offsets["target"] += len(sentence.target_words)
    trust = trusts[weakest]
    return TrustRecord(trust.score, flags, {}, trust.mode, trust.calibrated, trust.held_out, sentence=weakest)


__all__ = ["assemble", "model_texts", "plan_texts", "text_pieces"]
