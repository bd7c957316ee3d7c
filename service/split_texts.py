"""POST /v1/translate's sentence splitting: a text of several sentences is decoded sentence by sentence.

With `split_sentences` (the default) each text is cut into lines and sentences by service/sentences.py
(at sentence ends only: a single sentence longer than the model accepts is still refused with 413), and
every sentence of every text goes to the model as a separate text of the same call. A text of one
sentence (or a blank one) goes whole, exactly as without splitting, and its answer is unchanged. A text
of two or more sentences is answered as one translation object:

- `text`: the sentences' translations joined with the text's own spacing (service/sentences.py's rule,
  the same as the LibreTranslate and DeepL routes);
- `sentences`: one full translation object per sentence (tokens, scores, alignments, words, its own
  `explanation_id`, `attention` when asked, `alternatives` when n_best > 1), each equal to what
  /v1/translate answers for that sentence alone;
- the top-level token fields describe the whole text as the sentences laid end to end: `source_tokens`,
  `target_tokens`, `token_scores`, `source_words`, `target_words` are the sentences' lists concatenated
  (each sentence's tokens end with its own `</s>`), `alignment` and `word_alignment` index into those
  concatenated lists, and `score` is the sum of the sentences' scores (with source_share, likewise
  `token_source_shares`, and `source_share` is their mean);
- `explanation_id` is null and `attention` and `alternatives` are absent: an explanation is one decode,
  so they are given per sentence.
"""

from __future__ import annotations

from typing import Any

from service.sentences import Piece, join, split

# The pair lists and the lists their [source_index, target_index] pairs point into.
_INDEXED = {"alignment": ("source_tokens", "target_tokens"), "word_alignment": ("source_words", "target_words")}


def plan_texts(texts: list[str], language: str, split_sentences: bool) -> list[list[Piece] | None]:
    """Per text: its sentence pieces when it has two or more sentences, else None (it goes whole)."""
    plans: list[list[Piece] | None] = []
    for text in texts:
        pieces = split(text, language, cut_long=False) if split_sentences else []
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
    result["sentences"] = sentences
    return result


__all__ = ["assemble", "model_texts", "plan_texts"]
