"""How a decode's hypotheses become Translations (model.results): tokens, text and alignments built for a whole batch
from one host read of its alignment rows; and the checks and options every entry point shares.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor

from model.agreeing import Aligner
from model.config import ModelConfig
from model.decoding.search import Hypothesis
from model.errors import InputTooLongError, InvalidInputError
from model.explanations.alignment import alignment_matrix
from model.host import matrices_to_lists
from model.options import DecodingOptions
from model.results import StreamedToken, Translation, blank_translation
from model.tokenizer import MarianTokenizer


def decoding_options(options: DecodingOptions | None, settings: dict) -> DecodingOptions:
    """`options`, or one built from keyword settings (`num_return_sequences` is n_best's transformers name)."""
    settings = dict(settings)
    if "num_return_sequences" in settings:
        settings["n_best"] = settings.pop("num_return_sequences")
    unknown = set(settings) - set(DecodingOptions.__dataclass_fields__)
    if unknown:
        raise TypeError(f"unknown decoding settings: {', '.join(sorted(unknown))}")
    if options is not None and settings:
        raise TypeError("give DecodingOptions or keyword settings, not both")
    return options if options is not None else DecodingOptions(**settings)


def encode_texts(tokenizer: MarianTokenizer, limit: int, texts: list[str]) -> list[list[int]]:
    """Texts → source ids with the final </s> (Translator.encode_source); InputTooLongError past `limit` tokens."""
    if isinstance(texts, str) or not isinstance(texts, list):
        raise InvalidInputError("texts must be a list of strings")
    ids = []
    for index, text in enumerate(texts):
        if not isinstance(text, str):
            raise InvalidInputError(f"texts[{index}] is not a string")
        encoded = tokenizer.encode_source(text)
        if len(encoded) > limit:
            raise InputTooLongError(f"texts[{index}] has {len(encoded)} tokens; this model accepts at most {limit}")
        ids.append(encoded)
    return ids


def check_source_ids(config: ModelConfig, source_ids: list[list[int]]) -> None:
    """Reject a source id list that is empty, holds an id outside the vocabulary, or is past the positions."""
    vocab = config.vocab_size
    for index, ids in enumerate(source_ids):
        if not ids or any((not isinstance(i, int)) or i < 0 or i >= vocab for i in ids):
            raise InvalidInputError(f"source_ids[{index}] must be a non-empty list of ids below {vocab}")
        if len(ids) > config.max_position_embeddings:
            raise InputTooLongError(f"source_ids[{index}] is longer than max_position_embeddings")


class Builder:
    """One model's Translations of decoded hypotheses, and its streamed tokens."""

    def __init__(self, tokenizer: MarianTokenizer, aligner: Aligner, alignment_head: tuple[int, int | None]) -> None:
        self.tokenizer, self.aligner, self.alignment_head = tokenizer, aligner, alignment_head

    def translations(
        self, source_ids: list[list[int]], nbest: list[list[Hypothesis]], keep_attention: list[bool]
    ) -> list[Translation]:
        """The Translations of decoded texts (their n-best, best first; [] for a blank text). Every hypothesis's
        alignment rows come to the host in one read; what follows is Python over those lists."""
        aligner = self.aligner
        matrices = [self.alignment_matrix(h) for hs in nbest for h in hs]
        aligned = iter(zip(matrices, matrices_to_lists([aligner.read_rows(m) for m in matrices]), strict=True))
        results = []
        for ids, hypotheses, keep in zip(source_ids, nbest, keep_attention, strict=True):
            if not hypotheses:
                results.append(blank_translation())
                continue
            built = [self.build(ids, h, keep, *next(aligned)) for h in hypotheses]
            best = built[0]
            best.alternatives = built[1:]
            results.append(best)
        return results

    def alignment_matrix(self, hypothesis: Hypothesis) -> Tensor:
        """The alignment head's (T, S) rows of a hypothesis, unread (from its maps where it kept them)."""
        attention = hypothesis.cross_attention
        if attention is not None:
            return alignment_matrix(attention, *self.alignment_head)
        return hypothesis.alignment_attention

    def build(
        self, source_ids: list[int], hypothesis: Hypothesis, keep_attention: bool, matrix: Tensor | None = None,
        rows: list[list[float]] | None = None,
    ) -> Translation:
        """A Translation of one hypothesis; `matrix` and `rows`: its alignment rows (`alignment_matrix`) and the
        same read, as host lists, where the caller made them for a whole batch, else made here."""
        tokenizer = self.tokenizer
        source_tokens = tokenizer.source_tokens(source_ids)
        target_tokens = tokenizer.target_tokens(hypothesis.token_ids)
        if matrix is None:
            matrix = self.alignment_matrix(hypothesis)
        pairs, words = self.aligner.links(matrix, source_tokens, target_tokens, rows)
        return Translation(
            text=tokenizer.detokenize(hypothesis.token_ids),
            source_tokens=source_tokens,
            target_tokens=target_tokens,
            source_ids=list(source_ids),
            target_ids=list(hypothesis.token_ids),
            score=hypothesis.score,
            token_logprobs=hypothesis.token_logprobs,
            alignment=pairs,
            word_alignment=words[0],
            source_words=words[1],
            target_words=words[2],
            cross_attention=hypothesis.cross_attention if keep_attention else None,
            alignment_rows=matrix,
            forced=list(hypothesis.forced),
        )

    def streamed(self, on_token: Callable[[StreamedToken], None]):
        """The decode loop's token callback that hands `on_token` StreamedTokens."""

        def each(request, token_id: int, logprob: float, attention: Tensor | None) -> None:
            # attention: the alignment head's row (S,), or every head's (layers, heads, S) where the text keeps
            # its maps (return_attention), whose alignment head's row is read as for a whole output
            row = None
            if attention is not None:
                head = self.alignment_head
                row = (attention if attention.dim() == 1 else alignment_matrix(attention, *head)).tolist()
            piece = self.tokenizer.target_tokens([token_id])[0]
            on_token(StreamedToken(request.step - 1, token_id, piece, logprob, row))

        return each
