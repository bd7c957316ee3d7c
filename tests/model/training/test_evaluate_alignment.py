"""Attention scored as a word aligner (model.training.evaluate_alignment): hand-made answers."""

from __future__ import annotations

import pytest
import torch

from model.training.evaluate_alignment import (
    AlignmentItem,
    ForcedMaps,
    encoder_position_similarity,
    gold_items,
    normalized_entropy,
    score_head,
)
from model.training.gold import GoldLinks, alignment_error_rate, piece_spans, pieces_to_words
from model.translator import Translator


def test_evaluation_reproduces_a_hand_made_answer(tmp_path, model_dir):
    """A gold file whose alignment by a known attention map is worked out by hand."""
    (tmp_path / "zh.txt").write_text("猫 坐\n", encoding="utf-8")
    (tmp_path / "en.txt").write_text("cat sat -LRB- down -RRB-\n", encoding="utf-8")
    (tmp_path / "gold.align").write_text("0-0 1-1 1-3-P\n", encoding="utf-8")
    (item,) = gold_items(tmp_path, "en")  # an en→zh model: gold links transposed to (en, zh)
    assert item.source == "cat sat ( down )" and item.target == "猫坐"
    assert item.reference.sure == {(0, 0), (1, 1)} and item.reference.possible == {(0, 0), (1, 1), (3, 1)}

    translator = Translator.from_pretrained(model_dir, device="cpu")
    tokenizer = translator.tokenizer
    source_map = pieces_to_words(piece_spans(tokenizer.source_spm, item.source), item.source_words)
    target_map = pieces_to_words(piece_spans(tokenizer.target_spm, item.target), item.target_words)
    source_len, target_len = len(source_map) + 1, len(target_map) + 1
    # attention: every target piece of 猫 on the first piece of "cat", of 坐 on the first piece of "sat"
    attention = torch.full((1, 1, target_len, source_len), 0.01)
    first_piece = {w: next(p for p, owners in enumerate(source_map) if w in owners) for w in (0, 1)}
    for t, owners in enumerate(target_map):
        for w in owners:
            attention[0, 0, t, first_piece[w]] = 0.9
    maps = [ForcedMaps(attention, source_map, target_map)]
    score = score_head(maps, [item], layer=0, head=0)
    assert score.aer == 0.0 and score.predicted == 2


def test_items_score_links_in_the_models_direction():
    item = AlignmentItem("a b", "x", [(0, 1), (2, 3)], [(0, 1)], GoldLinks({(1, 0)}, {(1, 0)}))
    assert alignment_error_rate([{(1, 0)}], [item.reference]).aer == 0.0


def test_encoder_similarity_tells_a_collapsed_encoder_from_a_working_one(model_dir):
    """Identical position vectors measure 1.0; a random encoder's distinct positions measure well below."""
    translator = Translator.from_pretrained(model_dir, device="cpu")
    texts = ["the cat sat on the mat", "we like tea and coffee"]
    working = encoder_position_similarity(translator.model, translator.tokenizer, texts)
    assert working < 0.9
    # collapse it: every layer's output replaced by its mean over positions (what the old en→zh encoder did)
    last = translator.model.encoder_layers[-1]
    handle = last.register_forward_hook(
        lambda _m, _i, out: (out[0].mean(dim=1, keepdim=True).expand_as(out[0]), out[1])
    )
    try:
        assert encoder_position_similarity(translator.model, translator.tokenizer, texts) == pytest.approx(
            1.0, abs=1e-4
        )
    finally:
        handle.remove()


def test_normalized_entropy_is_one_for_uniform_rows_and_zero_for_one_hot_rows():
    assert normalized_entropy(torch.full((2, 4), 0.25)) == pytest.approx(1.0)
    assert normalized_entropy(torch.eye(4)) == pytest.approx(0.0, abs=1e-6)
