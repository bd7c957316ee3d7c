"""Alignments as responses show them: the most attended source token per target token, never </s>."""

from __future__ import annotations

import torch

from model.explanations.alignment import alignment_matrix, attention_links, shift_rows


def test_alignment_never_points_at_the_source_end_token_and_shift_reads_the_next_row():
    matrix = torch.tensor(
        [
            [0.1, 0.2, 0.7],  # </s> is the largest: must not be chosen
            [0.6, 0.3, 0.1],
            [0.2, 0.5, 0.3],
        ]
    )
    assert attention_links(matrix) == [(1, 0), (0, 1), (1, 2)]
    assert attention_links(shift_rows(matrix)) == [(0, 0), (1, 1), (1, 2)]


def test_the_alignment_matrix_is_one_head_or_the_layers_head_average():
    cross_attention = torch.rand(2, 3, 4, 5).softmax(dim=-1)  # (layers, heads, T, S)
    assert torch.equal(alignment_matrix(cross_attention, 1, 2), cross_attention[1, 2])
    assert torch.allclose(alignment_matrix(cross_attention, 0, None), cross_attention[0].mean(dim=0))
