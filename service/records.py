"""A translation as it travels from a translator replica to the ingress: typed records, pickled by Ray on the
way and turned into JSON only at the edge (`json()`, the shape schemas.TranslationOut documents). They hold
plain lists and floats (service/results.py makes them from the model's results) and import nothing of the model,
so the routes that read them (sentence joining, inline tags, the compatibility APIs) need no tensors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class TrustFlagRecord:
    kind: str  # one of model.FLAG_KINDS
    side: str  # "source" or "target": which word list `words` index
    words: list[int]
    text: list[str]

    def json(self) -> dict[str, Any]:
        return {"kind": self.kind, "side": self.side, "words": self.words, "text": self.text}


@dataclass(slots=True)
class TrustRecord:
    score: float
    flags: list[TrustFlagRecord]
    signals: dict[str, float]
    mode: str
    calibrated: bool
    held_out: dict | None = None  # what the score meant on held-out translations (model.Trust.held_out)
    sentence: int | None = None  # a text joined from sentences: the least trusted sentence, whose score this is

    def json(self) -> dict[str, Any]:
        result = {
            "score": self.score,
            "flags": [flag.json() for flag in self.flags],
            "signals": self.signals,
            "mode": self.mode,
            "calibrated": self.calibrated,
            "held_out": self.held_out,
        }
        if self.sentence is not None:
            result["sentence"] = self.sentence
        return result


@dataclass(slots=True)
class AttentionRecord:
    """The "attention" object: the map alignments are read from, and with attention "full" every head's."""

    layer: int
    head: int | None
    shift: bool
    summary: list[list[float]]  # [target][source]
    cross_attention: list | None  # [layer][head][target][source], or None unless asked for in full

    def json(self) -> dict[str, Any]:
        return {
            "layer": self.layer,
            "head": self.head,
            "shift": self.shift,
            "summary": self.summary,
            "cross_attention": self.cross_attention,
        }


@dataclass(slots=True)
class ProtectedRecord:
    """A span kept byte for byte (a placeholder, URL, e-mail address or number): its text and kind, and its offsets
    [start, end) into the client's source text and into the translation's `text`."""

    text: str
    kind: str
    source_span: list[int]
    target_span: list[int]

    def json(self) -> dict[str, Any]:
        return {"text": self.text, "kind": self.kind, "source_span": self.source_span, "target_span": self.target_span}


@dataclass(slots=True)
class TermRecord:
    """A glossary term that applied: its source as the text has it, the target the glossary gives, and their
    character offsets [start, end) into the client's source text and into the translation's `text`."""

    source: str
    target: str
    source_span: list[int]
    target_span: list[int] | None  # None: the translation does not hold it (a search that could not enforce it)

    def json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "target": self.target,
            "source_span": self.source_span,
            "target_span": self.target_span,
        }


@dataclass(slots=True)
class TranslationRecord:
    """One hypothesis of one text (its alternatives inside the best one), or a text joined from its sentences
    (`sentences` set: then no explanation id, attention or alternatives of its own; service/text/split_texts.py)."""

    text: str
    source_tokens: list[str]
    target_tokens: list[str]
    alignment: list[list[int]]  # [source_index, target_index] into the token lists
    score: float = 0.0
    token_scores: list[float] = field(default_factory=list)
    word_alignment: list[list[int]] = field(default_factory=list)  # into the word lists
    source_words: list[str] = field(default_factory=list)
    target_words: list[str] = field(default_factory=list)
    alignment_method: str = "head"
    alignment_note: str | None = None
    explanation_id: str | None = None
    trust: TrustRecord | None = None  # None: trust was not asked for
    attention: AttentionRecord | None = None  # None: attention "none"
    alternatives: list[TranslationRecord] = field(default_factory=list)
    token_source_shares: list[float] | None = None  # None: source_share was not asked for
    sentences: list[TranslationRecord] | None = None
    protected: list[ProtectedRecord] | None = None  # None: protection was off
    terms: list[TermRecord] | None = None  # None: no glossary
    glossary_tokens: list[int] | None = None  # target tokens a glossary term set; None: no term enforced
    search_note: str | None = None  # how the search differed from the options asked for, and why

    @property
    def source_share(self) -> float | None:
        shares = self.token_source_shares
        return sum(shares) / len(shares) if shares else None

    def json(self) -> dict[str, Any]:
        result: dict[str, Any] = {
            "text": self.text,
            "source_tokens": self.source_tokens,
            "target_tokens": self.target_tokens,
            "score": self.score,
            "token_scores": self.token_scores,
            "alignment": self.alignment,
            "word_alignment": self.word_alignment,
            "source_words": self.source_words,
            "target_words": self.target_words,
            "alignment_method": self.alignment_method,
            "alignment_note": self.alignment_note,
            "explanation_id": self.explanation_id,
        }
        if self.trust is not None:
            result["trust"] = self.trust.json()
        if self.attention is not None:
            result["attention"] = self.attention.json()
        if self.sentences is None:
            result["alternatives"] = [alternative.json() for alternative in self.alternatives] or None
        if self.token_source_shares is not None:
            result["token_source_shares"] = self.token_source_shares
            result["source_share"] = self.source_share
        if self.protected is not None:
            result["protected"] = [span.json() for span in self.protected]
        if self.terms is not None:
            result["terms"] = [term.json() for term in self.terms]
        if self.glossary_tokens is not None:
            result["glossary_tokens"] = self.glossary_tokens
        if self.search_note is not None:
            result["search_note"] = self.search_note
        if self.sentences is not None:
            result["sentences"] = [sentence.json() for sentence in self.sentences]
        return result


__all__ = ["AttentionRecord", "ProtectedRecord", "TermRecord", "TranslationRecord", "TrustFlagRecord", "TrustRecord"]
