"""Gold word alignments: Pharaoh links, AER and grow-diag-final-and worked by hand; pieces mapped to words."""

from __future__ import annotations

import pytest
import sentencepiece

from model.training.gold import (
    alignment_error_rate,
    grow_diag_final_and,
    parse_pharaoh,
    piece_guide,
    piece_spans,
    pieces_to_words,
    words_from_pieces,
)


def test_aer_counts_sure_and_possible_links_as_och_and_ney_define_it():
    gold = [parse_pharaoh("0-0 1-1 1-2-P 2-3")]
    assert gold[0].sure == {(0, 0), (1, 1), (2, 3)}
    assert gold[0].possible == {(0, 0), (1, 1), (1, 2), (2, 3)}
    # A = {0-0 (sure), 1-2 (possible), 3-3 (wrong)}: |A∩S| = 1, |A∩P| = 2, |A| = 3, |S| = 3
    score = alignment_error_rate([{(0, 0), (1, 2), (3, 3)}], gold)
    assert score.aer == pytest.approx(1 - (1 + 2) / (3 + 3))
    assert score.precision == pytest.approx(2 / 3)
    assert score.recall == pytest.approx(1 / 3)
    assert alignment_error_rate([gold[0].sure], gold).aer == 0.0


def test_grow_diag_final_and_keeps_the_intersection_and_grows_along_neighbours():
    forward = {(0, 0), (1, 1), (2, 2)}
    reverse = {(0, 0), (1, 1), (1, 2), (3, 3)}
    # Worked by hand with Koehn's neighbour order (-1,0) (0,-1) (1,0) (0,1) (-1,-1) (-1,1) (1,-1) (1,1):
    # start from the intersection {0-0, 1-1}; from 1-1, 1-2 (union, target 2 unaligned) is added, then
    # 2-2 (diagonal of 1-1, source 2 unaligned); final-and adds 3-3 (both ends unaligned).
    assert grow_diag_final_and(forward, reverse) == {(0, 0), (1, 1), (1, 2), (2, 2), (3, 3)}
    # a union link whose both ends are aligned already never enters
    assert grow_diag_final_and({(0, 0), (1, 1)}, {(0, 0), (1, 1), (0, 1)}) == {(0, 0), (1, 1)}


def test_pieces_map_to_the_words_whose_characters_they_cover(model_dir):
    processor = sentencepiece.SentencePieceProcessor()
    processor.Load(str(model_dir / "source.spm"))
    text = "the cat sat"
    spans = piece_spans(processor, text)
    pieces = processor.encode(text, out_type=str)
    assert len(spans) == len(pieces)
    # every piece's span spells its surface (sentencepiece's "▁" stands for the space before it)
    assert [text[s:e] for s, e in spans] == [p.replace("\u2581", "") for p in pieces]
    words = [(0, 3), (4, 7), (8, 11)]
    mapping = pieces_to_words(spans, words)
    for (start, end), owners in zip(spans, mapping, strict=True):
        assert owners == [w for w, (ws, we) in enumerate(words) if start < we and ws < end]
    assert sorted({w for owners in mapping for w in owners}) == [0, 1, 2]


def test_word_links_become_piece_links_and_back():
    source_map = [[0], [0], [1], []]  # word 0 in two pieces, a "▁"-only piece, then </s> (no word)
    target_map = [[0], [1], [1]]
    guide = piece_guide([(0, 1), (1, 0)], source_map, target_map)
    assert guide == [(0, 1), (0, 2), (1, 1), (1, 2), (2, 0)]
    assert words_from_pieces(guide, source_map, target_map) == {(0, 1), (1, 0)}
