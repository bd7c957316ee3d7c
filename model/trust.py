"""How far to believe a translation: signals, flags and a calibrated score per hypothesis.

Signals are numbers the decode already has (the forward model's token log-probabilities, the alignment head's rows,
the pieces) and, in the "full" mode, what the reverse model says when forced to write the source back from the
translation (Junczys-Dowmunt 2018's dual conditional cross-entropy). The score is a logistic regression on them
(model.calibration), fitted per model on labelled development translations (`python -m
model.training.calibrate_trust`) and stored beside the checkpoint as trust.json; without one the score is the
translation's geometric-mean token probability (exp of the length-normalised log-probability, HalOmi's most robust
single detector) and says it is uncalibrated.

Flags are typed findings about words: `omission` (a source word the alignment head hardly looked at, and in "full"
the reverse model cannot recover from the translation), `addition` (a target word with little source support),
`repetition` (a stretch repeated back to back that the source does not repeat), `untranslated` (source words
copied through) and `truncated` (the length budget ended the hypothesis before </s>).
"""

from __future__ import annotations

import math
import unicodedata
from dataclasses import dataclass

from torch import Tensor

from model.tokenizer import is_lone_space, is_special_piece, piece_owners, word_groups

# The signals each mode computes; a mode's calibration reads these (and model.calibration's products of them).
FAST_SIGNALS = (
    "forward_logprob",  # mean log-probability of the translation's tokens, </s> included (Seq-Logprob)
    "forward_min_logprob",  # the least likely token's log-probability
    "source_coverage",  # share of the source's words the alignment head gives at least COVERED mass
    "target_support",  # mean over target words of the most alignment mass one source word gets from it
    "repetition",  # share of the translation's pieces inside a back-to-back repeat the source does not have
    "length_ratio",  # log(target pieces / source pieces)
    "untranslated",  # share of the translation's words copied verbatim from the source
    "truncated",  # 1 when the hypothesis ended without </s>
    "source_length",  # log(1 + the source's pieces): longer sources come back wrong more often
    "source_familiarity",  # mean unigram log-probability of the source's pieces under its tokenizer (rare: low)
)
FULL_SIGNALS = (*FAST_SIGNALS, "reverse_logprob")  # the reverse model's mean log-probability of the source

COVERED = 0.2  # column mass (target tokens' worth of attention) above which a source word counts as covered
# An omission: a source word of content (not only the tokenizer's most frequent pieces) no target word links to,
# which in "fast" the alignment head also hardly looks at (column mass below OMITTED) and which in "full" the
# reverse model, forced to write the source back from the translation, finds unlikely (its pieces' mean
# log-probability at most RECOVERED).
OMITTED = 0.3
RECOVERED = math.log(0.3)
SUPPORTED = 0.3  # a target word giving no source word this much of its alignment mass is an addition candidate
UNSUPPORTED_LOGPROB = math.log(0.1)  # … and only if the forward model was this unsure of it
MIN_REPEATS = 3  # a piece repeated this many times back to back (a longer stretch: twice) is a repetition


@dataclass
class TrustFlag:
    kind: str  # one of FLAG_KINDS
    side: str  # "source" or "target": which sentence `words` index
    words: list[int]  # word indices (Translation.source_words / target_words)
    text: list[str]  # those words


@dataclass
class Trust:
    score: float  # estimated probability that the translation is adequate, in [0, 1]
    flags: list[TrustFlag]
    signals: dict[str, float]
    mode: str  # "fast" or "full"
    calibrated: bool  # False: the score is the uncalibrated default (exp of forward_logprob)
    # What the score meant on translations the fit never saw: the held-out bin it falls in (ModeCalibration.held_out)
    held_out: dict | None = None


# ---- signals ----------------------------------------------------------------------------------------
def _content(word: str) -> bool:
    return any(unicodedata.category(c)[0] in "LN" for c in word)


def _folded(word: str) -> str:
    return unicodedata.normalize("NFKC", word).casefold().strip()


def _groups(tokens: list[str]) -> list[list[int]]:
    """Word groups without special tokens or lone "▁" pieces."""
    groups = []
    for group in word_groups(tokens):
        pieces = [i for i in group if not is_special_piece(tokens[i]) and not is_lone_space(tokens[i])]
        groups.append(pieces)
    return groups


def tandem_repeats(pieces: list[str]) -> list[tuple[int, int]]:
    """(start, end) piece spans that repeat back to back: one piece MIN_REPEATS times or more, a stretch of 2-8
    pieces twice or more. Each span covers the repeats after the first."""
    spans = []
    count = len(pieces)
    index = 0
    while index < count:
        found = None
        for width in range(1, 9):
            unit = pieces[index : index + width]
            if len(unit) < width:
                break
            repeats = 1
            while pieces[index + repeats * width : index + (repeats + 1) * width] == unit:
                repeats += 1
            if repeats >= (MIN_REPEATS if width == 1 else 2) and any(_content(p) for p in unit):
                found = (index + width, index + repeats * width)
                break
        if found:
            spans.append(found)
            index = found[1]
        else:
            index += 1
    return spans


def _repeated_share(pieces: list[str]) -> tuple[float, list[tuple[int, int]]]:
    spans = tandem_repeats(pieces)
    covered = sum(end - start for start, end in spans)
    return (covered / len(pieces) if pieces else 0.0), spans


@dataclass
class _Reading:
    """What the signals and flags of one hypothesis are read from."""

    source_tokens: list[str]
    target_tokens: list[str]
    token_logprobs: list[float]
    rows: Tensor | list[list[float]] | None  # (T, S) alignment-head rows read as the model declares (or as host
    # lists: model.host.matrices_to_lists), or None
    ended: bool  # the hypothesis ends with </s>
    source_words: list[str]
    target_words: list[str]
    reverse_logprobs: list[float] | None = None  # the reverse model's, one per source piece (its own pieces)
    reverse_pieces: list[str] | None = None
    source_text: str = ""
    frequent: frozenset[str] = frozenset()  # the source tokenizer's most frequent pieces: never omission candidates
    linked_source: frozenset[int] = frozenset()  # source words some target word links to (word_alignment)
    piece_scores: dict[str, float] | None = None  # the source tokenizer's unigram log-probability of each piece
    rarest_score: float = 0.0  # … and its least: what a piece it does not have counts as
    forced: list[bool] | None = None  # per target token: a glossary term set it (not the model's own choice)


def piece_scores(processor) -> dict[str, float]:
    """Each piece of a sentencepiece model with its unigram log-probability (character models: log frequency)."""
    return {processor.IdToPiece(i): processor.GetScore(i) for i in range(processor.GetPieceSize())}


def frequent_pieces(processor, count: int = 100) -> frozenset[str]:
    """The `count` pieces a sentencepiece model scores most likely (function words: "▁the", "的", …)."""
    scored = sorted(range(processor.GetPieceSize()), key=processor.GetScore, reverse=True)
    return frozenset(processor.IdToPiece(i) for i in scored[:count])


def signals_and_flags(reading: _Reading) -> tuple[dict[str, float], list[TrustFlag]]:
    source_groups = _groups(reading.source_tokens)
    target_groups = _groups(reading.target_tokens)
    # a token a glossary term set is not the model's confidence: the log-probability signals leave it out
    forced = reading.forced or []
    own = [lp for i, lp in enumerate(reading.token_logprobs) if not (i < len(forced) and forced[i])]
    logprobs = own or [0.0]
    signals: dict[str, float] = {
        "forward_logprob": sum(logprobs) / len(logprobs),
        "forward_min_logprob": min(logprobs),
    }
    flags: list[TrustFlag] = []
    source_content = [w for w, g in enumerate(source_groups) if g and _content(reading.source_words[w])]
    target_content = [w for w, g in enumerate(target_groups) if g and _content(reading.target_words[w])]

    # Alignment: source words' column mass, target words' mass on real source pieces.
    column_mass: dict[int, float] = {}
    support: dict[int, float] = {}
    rows = reading.rows.float().tolist() if isinstance(reading.rows, Tensor) else reading.rows
    if rows and rows[0]:
        # each row normalised to sum 1, in Python lists: a torch call per word cost more than its arithmetic
        rows = [[value / total for value in row] for row, total in ((row, max(sum(row), 1e-9)) for row in rows)]
        width = len(rows[0])
        target_rows = [i for i, t in enumerate(reading.target_tokens) if not is_special_piece(t)]
        columns = [sum(column) for column in zip(*(rows[i] for i in target_rows))] if target_rows else [0.0] * width
        for word in source_content:
            column_mass[word] = sum(columns[p] for p in source_groups[word])
        if source_content:
            # (target tokens, source words): each source word's pieces summed
            by_word = [[sum(row[p] for p in source_groups[word]) for word in source_content] for row in rows]
            for word in target_content:
                pieces = target_groups[word]
                support[word] = max(
                    sum(by_word[t][c] for t in pieces) / len(pieces) for c in range(len(source_content))
                )
    covered = [w for w in source_content if column_mass.get(w, 1.0) >= COVERED]
    signals["source_coverage"] = len(covered) / len(source_content) if source_content else 1.0
    signals["target_support"] = sum(support.values()) / len(support) if support else 1.0

    target_pieces = [t for t in reading.target_tokens if not is_special_piece(t)]
    source_pieces = [t for t in reading.source_tokens if not is_special_piece(t)]
    repeated, spans = _repeated_share(target_pieces)
    source_repeated, _ = _repeated_share(source_pieces)
    signals["repetition"] = max(0.0, repeated - source_repeated)
    signals["length_ratio"] = math.log(max(len(target_pieces), 1) / max(len(source_pieces), 1))
    signals["source_length"] = math.log1p(len(source_pieces))
    scores, rarest = reading.piece_scores or {}, reading.rarest_score
    signals["source_familiarity"] = (
        sum(scores.get(piece, rarest) for piece in source_pieces) / len(source_pieces) if source_pieces else 0.0
    )

    source_set = {_folded(reading.source_words[w]) for w in source_content}
    copied = [
        w
        for w in target_content
        if _folded(reading.target_words[w]) in source_set
        and not _folded(reading.target_words[w]).isdigit()
        and any(unicodedata.category(c)[0] == "L" for c in reading.target_words[w])
    ]
    signals["untranslated"] = len(copied) / len(target_content) if target_content else 0.0
    signals["truncated"] = 0.0 if reading.ended else 1.0

    # Flags.
    recovered = _recovered_words(reading, source_groups) if reading.reverse_logprobs is not None else None
    candidates = [
        w
        for w in source_content
        if w not in reading.linked_source
        and not all(reading.source_tokens[p] in reading.frequent for p in source_groups[w])
    ]
    if recovered is None:
        omitted = [w for w in candidates if column_mass.get(w, 1.0) < OMITTED]
    else:
        omitted = [w for w in candidates if w not in recovered]
    if omitted:
        flags.append(TrustFlag("omission", "source", omitted, [reading.source_words[w] for w in omitted]))
    token_logprob = {i: lp for i, lp in enumerate(reading.token_logprobs) if not (i < len(forced) and forced[i])}
    added = [
        w
        for w in target_content
        if support.get(w, 1.0) < SUPPORTED
        and min(token_logprob.get(p, 0.0) for p in target_groups[w]) < UNSUPPORTED_LOGPROB
    ]
    if added:
        flags.append(TrustFlag("addition", "target", added, [reading.target_words[w] for w in added]))
    if spans and signals["repetition"] > 0:
        target_index = [i for i, t in enumerate(reading.target_tokens) if not is_special_piece(t)]
        owner = piece_owners(target_groups, len(reading.target_tokens))
        words = sorted({owner[target_index[p]] for s, e in spans for p in range(s, e)} - {None})
        flags.append(TrustFlag("repetition", "target", words, [reading.target_words[w] for w in words]))
    if target_content and len(copied) * 2 >= len(target_content) and len(source_content) >= 2:
        flags.append(TrustFlag("untranslated", "target", copied, [reading.target_words[w] for w in copied]))
    if not reading.ended:
        last = [w for w, g in enumerate(target_groups) if g][-1:]  # the last word with text (not </s>)
        flags.append(TrustFlag("truncated", "target", last, [reading.target_words[w] for w in last]))
    return signals, flags


def _recovered_words(reading: _Reading, source_groups: list[list[int]]) -> set[int]:
    """Source words whose characters the reverse model, forced to write the source from the translation, finds
    likely (mean log-probability of the reverse pieces overlapping the word above RECOVERED)."""
    from model.explanations.agreement import piece_offsets

    text = reading.source_text
    forward_spans = piece_offsets(text, reading.source_tokens)
    reverse_spans = piece_offsets(text, reading.reverse_pieces or [])
    recovered = set()
    for word, pieces in enumerate(source_groups):
        spans = [forward_spans[p] for p in pieces if forward_spans[p][0] < forward_spans[p][1]]
        if not spans:
            continue
        start, end = min(s for s, _ in spans), max(e for _, e in spans)
        overlapping = [
            reading.reverse_logprobs[i]
            for i, (s, e) in enumerate(reverse_spans)
            if s < end and start < e and i < len(reading.reverse_logprobs)
        ]
        if overlapping and sum(overlapping) / len(overlapping) > RECOVERED:
            recovered.add(word)
    return recovered
