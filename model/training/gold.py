"""Gold word alignments: pieces ↔ words (and guided alignment's piece guides), Pharaoh links (`i-j` sure,
`i-j-P` possible, first index on the gold file's first language), AER, and grow-diag-final-and.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from model.explanations.agreement import overlapping_words as pieces_to_words  # noqa: F401 - the piece→word map the service uses too
from model.explanations.alignment import Link

# ---- pieces ↔ words -------------------------------------------------------------------------
_WORD = re.compile(r"\w+(?:[-'’.]\w+)*|[^\w\s]", re.UNICODE)


def is_chinese(language: str) -> bool:
    return language.split("-")[0].lower() in ("zh", "cmn", "yue", "wuu")


def split_words(text: str, language: str) -> list[tuple[int, int]]:
    """Character spans of a text's words: jieba for Chinese, letters/digits runs and punctuation otherwise."""
    if is_chinese(language):
        import jieba  # a training/evaluation dependency only

        jieba.setLogLevel(60)
        spans, position = [], 0
        for token in jieba.cut(text, HMM=True):
            start = position
            position += len(token)
            if token.strip():
                spans.append((start, position))
        return spans
    return [match.span() for match in _WORD.finditer(text)]


def piece_spans(processor, text: str) -> list[tuple[int, int]]:
    """Character span in `text` of each sentencepiece piece (empty for a piece that is only "▁")."""
    try:
        encoded = processor.encode(text, return_type="proto")
    except TypeError:  # sentencepiece before return_type
        encoded = processor.encode(text, out_type="immutable_proto")
    raw = text.encode("utf-8")
    spans = []
    for piece in encoded.pieces:
        start = len(raw[: piece.begin].decode("utf-8", errors="ignore"))
        end = len(raw[: piece.end].decode("utf-8", errors="ignore"))
        while start < end and text[start].isspace():
            start += 1
        spans.append((start, end))
    return spans


def words_from_pieces(piece_links: Iterable[Link], source_map: list[list[int]], target_map: list[list[int]]) -> set:
    """Piece links → word links: a word pair is linked when any of their pieces are."""
    links = set()
    for source, target in piece_links:
        if source < len(source_map) and target < len(target_map):
            for s in source_map[source]:
                for t in target_map[target]:
                    links.add((s, t))
    return links


def piece_guide(word_links: Iterable[Link], source_map: list[list[int]], target_map: list[list[int]]) -> list[Link]:
    """Word links → piece links (every piece of a linked source word with every piece of the target word)."""
    by_source_word: dict[int, list[int]] = {}
    for piece, words in enumerate(source_map):
        for w in words:
            by_source_word.setdefault(w, []).append(piece)
    by_target_word: dict[int, list[int]] = {}
    for piece, words in enumerate(target_map):
        for w in words:
            by_target_word.setdefault(w, []).append(piece)
    links = set()
    for s, t in word_links:
        for sp in by_source_word.get(s, ()):
            for tp in by_target_word.get(t, ()):
                links.add((sp, tp))
    return sorted(links)


# ---- gold links and AER -----------------------------------------------------------------------
@dataclass
class GoldLinks:
    sure: set
    possible: set  # includes the sure links


def parse_pharaoh(line: str) -> GoldLinks:
    """`i-j` sure and `i-j-P` possible links (first index on the file's first language)."""
    sure, possible = set(), set()
    for item in line.split():
        parts = item.split("-")
        link = (int(parts[0]), int(parts[1]))
        possible.add(link)
        if len(parts) == 2 or parts[2].upper() == "S":
            sure.add(link)
    return GoldLinks(sure, possible)


def transpose(links: Iterable[Link]) -> set:
    return {(b, a) for a, b in links}


@dataclass
class AlignmentScore:
    aer: float
    precision: float
    recall: float
    predicted: int
    sure: int

    def as_dict(self) -> dict:
        return {
            "aer": round(100 * self.aer, 2),
            "precision": round(100 * self.precision, 2),
            "recall": round(100 * self.recall, 2),
            "links": self.predicted,
            "sure_links": self.sure,
        }


def alignment_error_rate(predicted: Sequence[set], gold: Sequence[GoldLinks]) -> AlignmentScore:
    """Corpus AER (Och & Ney 2003): 1 − (|A∩S| + |A∩P|) / (|A| + |S|), with precision and recall."""
    a_and_s = a_and_p = a_total = s_total = 0
    for links, reference in zip(predicted, gold, strict=True):
        a_and_s += len(links & reference.sure)
        a_and_p += len(links & reference.possible)
        a_total += len(links)
        s_total += len(reference.sure)
    aer = 1.0 - (a_and_s + a_and_p) / max(a_total + s_total, 1)
    return AlignmentScore(aer, a_and_p / max(a_total, 1), a_and_s / max(s_total, 1), a_total, s_total)


# ---- symmetrization (for the statistical baseline) ------------------------------------------
def grow_diag_final_and(forward: set, reverse: set) -> set:
    """Koehn et al.'s grow-diag-final-and of two directional link sets (both as (source, target))."""
    union = forward | reverse
    links = set(forward & reverse)
    sources, targets = {s for s, _ in links}, {t for _, t in links}
    neighbours = [(-1, 0), (0, -1), (1, 0), (0, 1), (-1, -1), (-1, 1), (1, -1), (1, 1)]

    def add(link: Link) -> None:
        links.add(link)
        sources.add(link[0])
        targets.add(link[1])

    added = True
    while added:
        added = False
        for s, t in sorted(links):
            for ds, dt in neighbours:
                candidate = (s + ds, t + dt)
                if candidate in union and candidate not in links:
                    if candidate[0] not in sources or candidate[1] not in targets:
                        add(candidate)
                        added = True
    for directional in (forward, reverse):
        for candidate in sorted(directional):
            if candidate[0] not in sources and candidate[1] not in targets:
                add(candidate)
    return links
