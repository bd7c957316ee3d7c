"""What the engine answers with: a Translation (with its alternatives and trust), a StreamedToken as it settles,
and an Explanation of a given pair.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor

from model.choices import AlignmentMethod
from model.trust import Trust


@dataclass
class Translation:
    """One translated text, its tokens, scores and the attention that produced it."""

    text: str
    source_tokens: list[str]
    target_tokens: list[str]
    source_ids: list[int]
    target_ids: list[int]
    score: float
    token_logprobs: list[float]
    alignment: list[tuple[int, int]]  # (source token index, target token index), one per target token
    word_alignment: list[tuple[int, int]]  # (source word index, target word index)
    source_words: list[str]
    target_words: list[str]
    cross_attention: Tensor | None = None  # (layers, heads, T, S)
    alternatives: list[Translation] = field(default_factory=list)
    # HEAD: one link per target token; AGREEMENT: model.explanations.agreement
    alignment_method: AlignmentMethod = AlignmentMethod.HEAD
    alignment_note: str | None = None  # why "agreement" was asked for and "head" given
    # the alignment head's rows (T, S) as decoded, unread: what an agreement after decoding starts from
    alignment_rows: Tensor | None = field(default=None, repr=False, compare=False)
    trust: Trust | None = None  # how far to believe it (Translator.assess; model.trust)
    forced: list[bool] = field(default_factory=list)  # per target token: set by a glossary term (empty: none asked)
    search_note: str | None = None  # how the search differed from the options asked for, and why


@dataclass
class StreamedToken:
    """One token as greedy decoding produced it (Translator.submit's on_token)."""

    index: int  # position in the output, from 0; the last streamed token is </s>
    token_id: int
    piece: str
    logprob: float
    attention: list[float] | None  # the alignment head's weights over the source tokens (</s> last) at this step


@dataclass
class Explanation:
    """A given (source, target) pair run through the model by teacher forcing: the maps that produced it."""

    source_ids: list[int]
    target_ids: list[int]
    source_tokens: list[str]
    target_tokens: list[str]
    source_text: str
    text: str
    token_logprobs: list[float]
    alignment: list[tuple[int, int]]
    word_alignment: list[tuple[int, int]]
    source_words: list[str]
    target_words: list[str]
    alignment_head: tuple[int, int | None]
    cross_attention: Tensor  # (decoder_layers, heads, T, S)
    encoder_self_attention: Tensor | None = None  # (encoder_layers, heads, S, S)
    alignment_shift: bool = False  # alignments read at the step where each target token is the decoder's input
    alignment_method: AlignmentMethod = AlignmentMethod.HEAD  # as Translation's
    alignment_note: str | None = None


def blank_translation() -> Translation:
    """What a blank text translates to: nothing, with nothing to explain."""
    return Translation("", [], [], [], [], 0.0, [], [], [], [], [], None)


__all__ = ["Explanation", "StreamedToken", "Translation", "blank_translation"]
