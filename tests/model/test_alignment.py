"""Alignment scoring and guided alignment: known answers by hand, and a tiny model that learns to align."""

from __future__ import annotations

import json
import random

import pytest
import sentencepiece
import torch

from model.alignment import (
    GoldLinks,
    alignment_error_rate,
    alignment_matrix,
    attention_links,
    grow_diag_final_and,
    normalized_entropy,
    parse_pharaoh,
    piece_guide,
    piece_spans,
    pieces_to_words,
    words_from_pieces,
)
from model.evaluate_alignment import AlignmentItem, gold_items, score_head
from model.train import guide_tensor, guided_alignment_loss
from model.transformer import Transformer
from tests.tiny import make_model_dir


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


def test_alignment_never_points_at_the_source_end_token_and_shift_reads_the_next_row():
    matrix = torch.tensor(
        [
            [0.1, 0.2, 0.7],  # </s> is the largest: must not be chosen
            [0.6, 0.3, 0.1],
            [0.2, 0.5, 0.3],
        ]
    )
    assert attention_links(matrix) == [(1, 0), (0, 1), (1, 2)]
    assert attention_links(matrix, shift=True) == [(0, 0), (1, 1), (1, 2)]
    assert normalized_entropy(torch.full((2, 4), 0.25)) == pytest.approx(1.0)
    assert normalized_entropy(torch.eye(4)) == pytest.approx(0.0, abs=1e-6)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("alignment"), shared=True, seed=3)


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


def test_evaluation_reproduces_a_hand_made_answer(tmp_path, model_dir):
    """A gold file whose alignment by a known attention map is worked out by hand."""
    from model.translator import Translator

    (tmp_path / "zh.txt").write_text("猫 坐\n", encoding="utf-8")
    (tmp_path / "en.txt").write_text("cat sat -LRB- down -RRB-\n", encoding="utf-8")
    (tmp_path / "gold.align").write_text("0-0 1-1 1-3-P\n", encoding="utf-8")
    (item,) = gold_items(tmp_path, "en")  # an en→zh model: gold links transposed to (en, zh)
    assert item.source == "cat sat ( down )" and item.target == "猫坐"
    assert item.reference.sure == {(0, 0), (1, 1)} and item.reference.possible == {(0, 0), (1, 1), (3, 1)}

    translator = Translator.from_pretrained(model_dir, device="cpu")
    tokenizer = translator.tokenizer
    from model.evaluate_alignment import ForcedMaps

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


@pytest.mark.parametrize("shift", [False, True])
def test_guided_loss_pulls_the_head_toward_the_links(shift):
    """A few optimizer steps on the guided loss alone move the head's weights onto the given links, and the
    alignment read the same way (at the predicting step, or with `shift` where the token is the decoder's
    input) gives back exactly those links."""
    from model.config import ModelConfig

    torch.manual_seed(0)
    config = ModelConfig(
        vocab_size=40,
        d_model=32,
        encoder_layers=1,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=32,
        pad_token_id=39,
        eos_token_id=0,
        decoder_start_token_id=39,
        dropout=0.0,
    )
    model = Transformer(config)
    rng = random.Random(0)
    batch, length = 8, 6
    # distinct tokens in each source: a repeated token's positions would share one key and split the weight
    source = torch.tensor([rng.sample(range(1, 39), length) for _ in range(batch)])
    target = torch.tensor([[39] + [rng.randrange(1, 39) for _ in range(length - 1)] for _ in range(batch)])
    mask = torch.ones_like(source, dtype=torch.bool)
    # links: target position t ↔ source position length-2-t (a reversal: nothing the untrained model does)
    guides = [[(length - 2 - t, t) for t in range(length - 1)] for _ in range(batch)]
    guide = guide_tensor(guides, length, length, shift)
    layer, head = 0, 1

    def on_links() -> float:
        with torch.no_grad():
            _, cross = model.decode(target, model.encode(source, mask), need_weights=True)
        return float((cross[layer][:, head] * (guide > 0)).sum() / (guide > 0).sum())

    before = on_links()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(80):
        _, cross = model.decode(target, model.encode(source, mask), need_weights=True)
        loss = guided_alignment_loss(cross[layer][:, head], guide)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    after = on_links()
    assert before < 0.3 and after > 0.9, (before, after)
    with torch.no_grad():
        _, cross = model.decode(target, model.encode(source, mask), need_weights=True)
    read_back = []
    for row in range(batch):
        matrix = alignment_matrix(torch.stack(cross, dim=1)[row], layer, head, shift)
        # the source's last position stands for </s>; the guide's links never use it
        read_back += [link in guides[row] for link in attention_links(matrix)[: length - 1]]
    # chance is 1 in 5; a row or two may still be split between two positions after so few steps
    assert sum(read_back) >= 0.9 * len(read_back), read_back


def test_a_shifted_guide_moves_each_token_to_the_step_where_it_is_the_decoders_input():
    guides = [[(2, 0), (0, 1), (1, 2)]]
    plain, shifted = guide_tensor(guides, 4, 4), guide_tensor(guides, 4, 4, shift=True)
    assert torch.equal(shifted[0, 1:], plain[0, :-1]) and shifted[0, 0].sum() == 0
    # alignment_matrix(shift=True) reads row t + 1 for token t, so the shifted guide reads back as the links
    assert attention_links(alignment_matrix(shifted[None], 0, 0, shift=True))[:3] == guides[0]


def test_guides_are_built_from_word_links_of_the_training_file(tmp_path, model_dir):
    from model.tokenizer import MarianTokenizer
    from model.train import load_guides

    tokenizer = MarianTokenizer.from_directory(model_dir)
    pairs = [("cat sat", "猫坐")]
    record = {
        "en": "cat sat",
        "zh": "猫坐",
        "en_words": [[0, 3], [4, 7]],
        "zh_words": [[0, 1], [1, 2]],
        "links": [[0, 0], [1, 1]],
    }
    path = tmp_path / "links.jsonl"
    path.write_text(json.dumps(record, ensure_ascii=False) + "\n", encoding="utf-8")
    (guide,) = load_guides(str(path), pairs, tokenizer)
    source_map = pieces_to_words(piece_spans(tokenizer.source_spm, "cat sat"), [(0, 3), (4, 7)])
    target_map = pieces_to_words(piece_spans(tokenizer.target_spm, "猫坐"), [(0, 1), (1, 2)])
    eos = (len(source_map), len(target_map))
    assert guide[-1] == eos  # </s> ↔ </s>
    assert words_from_pieces(guide[:-1], source_map, target_map) == {(0, 0), (1, 1)}
    # the zh→en direction reads the same record transposed
    (reverse,) = load_guides(str(path), [("猫坐", "cat sat")], tokenizer)
    assert len(reverse) == len(guide)
    with pytest.raises(ValueError, match="not the training file's pair"):
        load_guides(str(path), [("dog", "狗")], tokenizer)


def test_items_score_links_in_the_models_direction():
    item = AlignmentItem("a b", "x", [(0, 1), (2, 3)], [(0, 1)], GoldLinks({(1, 0)}, {(1, 0)}))
    assert alignment_error_rate([{(1, 0)}], [item.reference]).aer == 0.0


def test_encoder_similarity_tells_a_collapsed_encoder_from_a_working_one(model_dir):
    """Identical position vectors measure 1.0; a random encoder's distinct positions measure well below."""
    from model.evaluate_alignment import encoder_position_similarity
    from model.translator import Translator

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
