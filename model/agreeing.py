"""The alignment a translation answers with: the alignment head's rows read as the model declares them (shifted or
not), turned into token and word links, and agreed with the model translating the other way (its rows over the pair
forced back, in shared batches), as Translator.translate(..., reverse=...) and Translator.with_agreements give it.
Translator delegates here; model.explanations.agreement holds the arithmetic.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from torch import Tensor

from model.choices import AlignmentMethod
from model.errors import InputTooLongError
from model.explanations.agreement import AlignmentChoice, AlignmentItem, AlignmentRows, agreed_alignment
from model.explanations.alignment import attention_links, shift_rows
from model.explanations.explain import forced_alignment_rows, forced_readings
from model.host import matrices_to_lists
from model.tokenizer import MarianTokenizer, is_lone_space, is_special_piece, word_groups
from model.transformer import Transformer

if TYPE_CHECKING:
    from model.results import Translation


def word_links(
    matrix: Tensor | list[list[float]], source_tokens: list[str], target_tokens: list[str]
) -> tuple[list[tuple[int, int]], list[str], list[str]]:
    """Merge pieces into words; each target word aligns to the source word receiving most attention mass
    in the alignment head's (T, S) rows (never the source's final </s>): (pairs, source words, target words).
    `matrix`: the rows, or the same as host lists (model.host.matrices_to_lists: what a batch's translations use)."""
    source_groups = word_groups(source_tokens)
    target_groups = word_groups(target_tokens)
    rows = matrix.float().tolist() if isinstance(matrix, Tensor) else matrix
    candidates = [w for w, pieces in enumerate(source_groups) if not is_special_piece(source_tokens[pieces[0]])]
    if not candidates:
        candidates = list(range(len(source_groups)))
    # Each target word's rows averaged, then each candidate source word's columns summed, over host lists (a
    # torch call per word cost more than its arithmetic).
    pairs = []
    for target_word, pieces in enumerate(target_groups):
        # a lone "▁" is part of its word's text, not of what the word attends to (unless it is the whole word)
        used = [piece for piece in pieces if not is_lone_space(target_tokens[piece])] or pieces
        average = [sum(column) / len(used) for column in zip(*(rows[piece] for piece in used))]
        mass = [sum(average[piece] for piece in source_groups[word]) for word in candidates]
        pairs.append((candidates[max(range(len(mass)), key=mass.__getitem__)], target_word))
    return (
        pairs,
        [_word_text(source_tokens, g) for g in source_groups],
        [_word_text(target_tokens, g) for g in target_groups],
    )


def _word_text(tokens: list[str], group: list[int]) -> str:
    return "".join(tokens[i] for i in group).replace("\u2581", " ").strip() or tokens[group[0]]


Pair = tuple[list[int], list[int]]  # (source ids, target ids) to force


class ReverseReading:
    """The reverse model's reading of translations forced back (each one's source forced after it), shared by the
    agreement and trust "full" of one batch: each (source, translation) is tokenized for the reverse model once and
    forced once, its alignment rows (`rows`) and token log-probabilities (`logprobs`) read from the same pass.
    `Translator.reverse_reading` makes one (of that model's Aligner); give it to Translator.with_agreements and
    Translator.assess over the same translations; made without one, each reads what it needs alone."""

    def __init__(self, reverse: Aligner, rows: bool = True, logprobs: bool = True) -> None:
        self.reverse, self.want_rows, self.want_logprobs = reverse, rows, logprobs  # the reverse model's Aligner
        self._pairs: dict[tuple[str, str], tuple[Pair | None, str | None]] = {}
        self._read: dict[tuple[tuple[int, ...], tuple[int, ...]], tuple[AlignmentRows | None, list[float] | None]] = {}
        self.forced = 0  # pairs forced through the reverse model so far

    def pair(self, source_text: str, translation: str) -> tuple[Pair | None, str | None]:
        """Aligner.reverse_pair of the reverse model, once per (source, translation)."""
        key = (source_text, translation)
        if key not in self._pairs:
            self._pairs[key] = self.reverse.reverse_pair(source_text, translation)
        return self._pairs[key]

    def rows(self, pairs: list[Pair]) -> list[AlignmentRows]:
        return [rows for rows, _ in self._reads(pairs, rows=True)]

    def logprobs(self, pairs: list[Pair]) -> list[list[float]]:
        return [logprobs for _, logprobs in self._reads(pairs, rows=False)]

    def _reads(self, pairs: list[Pair], rows: bool) -> list[tuple[AlignmentRows | None, list[float] | None]]:
        keys = [(tuple(source), tuple(target)) for source, target in pairs]
        part = 0 if rows else 1
        missing = list(dict.fromkeys(k for k in keys if self._read.get(k, (None, None))[part] is None))
        if missing:
            want_rows, want_logprobs = self.want_rows or rows, self.want_logprobs or not rows
            aligner = self.reverse
            forced = [(list(source), list(target)) for source, target in missing]
            read = forced_readings(
                aligner.exact_model, forced, aligner.alignment_head if want_rows else None, want_logprobs
            )
            matrices = [r.rows for r in read] if want_rows else None
            made = aligner.forced_rows(forced, matrices) if want_rows else [None] * len(forced)
            for key, reading, rows_of in zip(missing, read, made, strict=True):
                had_rows, had_logprobs = self._read.get(key, (None, None))
                self._read[key] = (rows_of or had_rows, reading.logprobs or had_logprobs)
            self.forced += len(missing)
        return [self._read[key] for key in keys]


class Aligner:
    """One model's alignments: its links from rows, its forced rows (through `exact_model`), its side of an
    agreement. `name` says whose, in notes; `max_positions` bounds a pair it forces."""

    def __init__(
        self,
        tokenizer: MarianTokenizer,
        exact_model: Transformer,
        alignment_head: tuple[int, int | None],
        alignment_shift: bool,
        name: str,
    ) -> None:
        self.tokenizer, self.exact_model, self.name = tokenizer, exact_model, name
        self.alignment_head, self.alignment_shift = alignment_head, alignment_shift
        self.max_positions = exact_model.config.max_position_embeddings

    def with_agreements(
        self, translations: list[Translation], reverse: Aligner, reading: ReverseReading | None = None
    ) -> list[Translation]:
        """Translator.with_agreements."""
        hypotheses = [h for t in translations if t.target_ids for h in (t, *t.alternatives)]
        agreed = self.agreements(
            [
                AlignmentItem(h.source_ids, h.target_ids, h.alignment, h.word_alignment, h.alignment_rows)
                for h in hypotheses
            ],
            reverse,
            reading,
        )
        by_hypothesis = {id(h): links for h, links in zip(hypotheses, agreed, strict=True)}

        def rebuilt(translation: Translation) -> Translation:
            if id(translation) not in by_hypothesis:  # a blank text: nothing was decoded, nothing to align
                return translation
            choice = by_hypothesis[id(translation)]
            return replace(
                translation,
                alignment=choice.token_links,
                word_alignment=choice.word_links,
                alignment_method=choice.method,
                alignment_note=choice.note,
                alternatives=[rebuilt(alternative) for alternative in translation.alternatives],
            )

        return [rebuilt(translation) for translation in translations]


    def links(
        self, matrix: Tensor, source_tokens: list[str], target_tokens: list[str], rows: list[list[float]] | None = None
    ):
        """Token and word alignments from the alignment head's (T, S) rows, read as the model declares (`rows`: that
        reading as host lists, where the caller made them for a batch; else made here, in one read)."""
        if rows is None:
            (rows,) = matrices_to_lists([self.read_rows(matrix)])
        return attention_links(rows), word_links(rows, source_tokens, target_tokens)

    def pair_ids(self, source: str, target: str) -> tuple[list[int], list[int]]:
        """(source ids, target ids) of a pair to force; InputTooLongError past the model's positions."""
        source_ids = self.tokenizer.encode_source(source)
        target_ids = self.tokenizer.encode_target(target)
        limit = self.max_positions
        if max(len(source_ids), len(target_ids)) > limit:
            raise InputTooLongError(f"the pair has more than the {limit} tokens this model accepts")
        return source_ids, target_ids

    def reverse_pair(
        self, source_text: str, translation: str
    ) -> tuple[tuple[list[int], list[int]] | None, str | None]:
        """As the reverse model of a translation: the (source ids, target ids) that force `source_text` after
        `translation`, or None and why it cannot (for the agreement and for trust "full")."""
        if not source_text.strip() or not translation.strip():
            return None, "nothing to agree on: the source or the translation is empty"
        try:
            return self.pair_ids(translation, source_text), None
        except InputTooLongError:
            return None, f"the pair is too long for the reverse model {self.name}"

    def forced_rows(
        self, pairs: list[tuple[list[int], list[int]]], matrices: list[Tensor | None] | None = None
    ) -> list[AlignmentRows]:
        """The alignment head's rows over each (source ids, target ids) pair, read as the model declares, with the
        pieces they belong to: `matrices[i]` where given (rows already made, unread), else from forced decodes of
        the exact model in shared batches (model.explanations.explain.forced_alignment_rows)."""
        matrices = list(matrices) if matrices is not None else [None] * len(pairs)
        missing = [i for i, matrix in enumerate(matrices) if matrix is None]
        computed = forced_alignment_rows(self.exact_model, [pairs[i] for i in missing], *self.alignment_head)
        for i, matrix in zip(missing, computed, strict=True):
            matrices[i] = matrix
        tokenizer = self.tokenizer
        return [
            AlignmentRows(
                self.read_rows(matrix), tokenizer.source_tokens(source), tokenizer.target_tokens(target)
            )
            for (source, target), matrix in zip(pairs, matrices, strict=True)
        ]

    def read_rows(self, matrix: Tensor) -> Tensor:
        return shift_rows(matrix) if self.alignment_shift else matrix

    def agreements(
        self, items: list[AlignmentItem], reverse: Aligner | None, reading: ReverseReading | None = None
    ) -> list[AlignmentChoice]:
        """Per item, the alignment agreed with `reverse`, or the head's one-best given (without `reverse`, or where
        the reverse model cannot read the pair: the note says why).

        Rows not given come from forced decodes of the exact model, as an explanation recomputes them; the
        reverse model's always do, in shared batches. So a link whose product lies within float rounding (or,
        under int8 decoding, quantization error) of the threshold can differ between an answer and a later fetch.
        `reading`: the reverse model's reading to share (ReverseReading), else one made here."""
        results: list[AlignmentChoice | None] = [None] * len(items)
        wanted: list[int] = []
        backward: list[tuple[list[int], list[int]]] = []
        tokenizer = self.tokenizer
        texts = [(tokenizer.source_text(item.source_ids), tokenizer.detokenize(item.target_ids)) for item in items]

        def head(item: AlignmentItem, note: str | None = None) -> AlignmentChoice:
            return AlignmentChoice(item.token_links, item.word_links, AlignmentMethod.HEAD, note)

        if reverse is not None and reading is None:
            reading = ReverseReading(reverse, rows=True, logprobs=False)
        for index, (item, (source_text, translation)) in enumerate(zip(items, texts, strict=True)):
            if reverse is None:
                results[index] = head(item)
                continue
            pair, note = reading.pair(source_text, translation)
            if pair is None:
                results[index] = head(item, note)
            else:
                backward.append(pair)
                wanted.append(index)
        if wanted:
            forward_rows = self.forced_rows(
                [(items[i].source_ids, items[i].target_ids) for i in wanted], [items[i].rows for i in wanted]
            )
            reverse_rows = reading.rows(backward)
            for index, forward, back in zip(wanted, forward_rows, reverse_rows, strict=True):
                agreed = agreed_alignment(forward, back, *texts[index])
                results[index] = AlignmentChoice(agreed.token_links, agreed.word_links, AlignmentMethod.AGREEMENT)
        return results

