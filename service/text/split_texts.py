"""Sentence splitting of client texts: `text_pieces`, the one splitter /v1/translate and the compatibility routes
share, and how /v1 decodes a text of several sentences sentence by sentence and answers it as one translation
object laid end to end (`plan_texts`, `model_texts`, `assemble`; the shape schemas.TranslationOut documents).
"""

from __future__ import annotations

from typing import Any

from service.text.sentences import Piece, join, split

# The pair lists and the lists their [source_index, target_index] pairs point into.
_INDEXED = {"alignment": ("source_tokens", "target_tokens"), "word_alignment": ("source_words", "target_words")}


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


def assemble(outcomes: list[dict], plans: list[list[Piece] | None], target_language: str) -> list[dict]:
    """One translation object per client text, from the model's outcomes in model_texts' order."""
    results: list[dict] = []
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


def _joined(pieces: list[Piece], sentences: list[dict], target_language: str) -> dict[str, Any]:
    translations = iter(sentence["text"] for sentence in sentences)
    result: dict[str, Any] = {
        "text": join(pieces, [next(translations) if piece.sentence else "" for piece in pieces], target_language),
        "source_tokens": [],
        "target_tokens": [],
        "score": 0.0,
        "token_scores": [],
        "alignment": [],
        "word_alignment": [],
        "source_words": [],
        "target_words": [],
        "explanation_id": None,
    }
    for sentence in sentences:
        for key, (source_list, target_list) in _INDEXED.items():
            source_offset, target_offset = len(result[source_list]), len(result[target_list])
            result[key].extend([s + source_offset, t + target_offset] for s, t in sentence[key])
        for key in ("source_tokens", "target_tokens", "token_scores", "source_words", "target_words"):
            result[key].extend(sentence[key])
        result["score"] += sentence["score"]
    if sentences and all("token_source_shares" in sentence for sentence in sentences):  # asked for: source_share true
        shares = [share for sentence in sentences for share in sentence["token_source_shares"]]
        result["token_source_shares"] = shares
        result["source_share"] = sum(shares) / len(shares) if shares else None
    methods = {sentence.get("alignment_method", "head") for sentence in sentences}
    result["alignment_method"] = "agreement" if methods == {"agreement"} else "head"
    notes = [sentence["alignment_note"] for sentence in sentences if sentence.get("alignment_note")]
    result["alignment_note"] = notes[0] if notes else None
    if methods == {"agreement", "head"}:
        result["alignment_note"] = "some sentences' alignment is the head's one-best (see `sentences`)"
    trusts = [sentence.get("trust") for sentence in sentences]
    if sentences and all(trusts):
        result["trust"] = _joined_trust(sentences)
    result["sentences"] = sentences
    return result


def _joined_trust(sentences: list[dict]) -> dict[str, Any]:
    """A text's trust from its sentences': the least trusted sentence's score, every flag with its word indices
    moved onto the concatenated word lists, no signals (each sentence has its own)."""
    scores = [sentence["trust"]["score"] for sentence in sentences]
    weakest = min(range(len(scores)), key=scores.__getitem__)
    flags = []
    offsets = {"source": 0, "target": 0}
    for sentence in sentences:
        for flag in sentence["trust"]["flags"]:
            offset = offsets[flag["side"]]
            flags.append({**flag, "words": [w + offset for w in flag["words"]]})
        offsets["source"] += len(sentence["source_words"])
        offsets["target"] += len(sentence["target_words"])
    trust = sentences[weakest]["trust"]
    return {
        "score": scores[weakest],
        "flags": flags,
        "signals": {},
        "mode": trust["mode"],
        "calibrated": trust["calibrated"],
        "sentence": weakest,
    }


__all__ = ["assemble", "model_texts", "plan_texts", "text_pieces"]
