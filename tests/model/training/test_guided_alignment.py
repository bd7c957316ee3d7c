"""Guided alignment training (model.training.train): the loss pulls one head onto word links, and the
guides are built from the statistical aligner's word links."""

from __future__ import annotations

import json
import random

import pytest
import torch

from model.config import ModelConfig
from model.explanations.alignment import alignment_matrix, attention_links, shift_rows
from model.tokenizer import MarianTokenizer
from model.training.gold import piece_spans, pieces_to_words, words_from_pieces
from model.training.guided_alignment import guide_tensor, guided_alignment_loss, load_guides
from model.transformer import Transformer


@pytest.mark.parametrize("shift", [False, True])
def test_guided_loss_pulls_the_head_toward_the_links(shift):
    """A few optimizer steps on the guided loss alone move the head's weights onto the given links, and the
    alignment read the same way (at the predicting step, or with `shift` where the token is the decoder's
    input) gives back exactly those links."""
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
        matrix = alignment_matrix(torch.stack(cross, dim=1)[row], layer, head)
        matrix = shift_rows(matrix) if shift else matrix
        # the source's last position stands for </s>; the guide's links never use it
        read_back += [link in guides[row] for link in attention_links(matrix)[: length - 1]]
    # chance is 1 in 5; a row or two may still be split between two positions after so few steps
    assert sum(read_back) >= 0.9 * len(read_back), read_back


def test_a_shifted_guide_moves_each_token_to_the_step_where_it_is_the_decoders_input():
    guides = [[(2, 0), (0, 1), (1, 2)]]
    plain, shifted = guide_tensor(guides, 4, 4), guide_tensor(guides, 4, 4, shift=True)
    assert torch.equal(shifted[0, 1:], plain[0, :-1]) and shifted[0, 0].sum() == 0
    # shift_rows reads row t + 1 for token t, so the shifted guide reads back as the links
    assert attention_links(shift_rows(alignment_matrix(shifted[None], 0, 0)))[:3] == guides[0]


def test_guides_are_built_from_word_links_of_the_training_file(tmp_path, model_dir):
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
