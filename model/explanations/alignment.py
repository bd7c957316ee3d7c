"""Word alignment as every response shows it: from the alignment head's cross-attention to links.

A link is `(source_index, target_index)`. Gold links, AER and training guides live in model.training.gold.
"""

from __future__ import annotations

import torch
from torch import Tensor

Link = tuple[int, int]


def attention_links(matrix: Tensor | list[list[float]]) -> list[Link]:
    """Per target token, the source token with the highest weight, never the final source </s>.

    matrix (T, S): attention rows while predicting each target token (or `shift_rows` of them), the
    source's last position being its </s>.
    """
    rows = matrix.float().tolist() if isinstance(matrix, Tensor) else matrix  # or the rows as host lists already
    width = len(rows[0]) if rows else 0
    if width <= 1:
        return [(0, t) for t in range(len(rows))]
    # the first of equal maxima, as torch.argmax
    best = [max(range(width - 1), key=row.__getitem__) for row in rows]
    return [(source, target) for target, source in enumerate(best)]


def shift_rows(matrix: Tensor) -> Tensor:
    """Row t becomes row t + 1, the step where target token t is the decoder's input (Chen et al. 2020);
    the last row stays. The one place the alignment shift is applied."""
    if matrix.size(-2) <= 1:
        return matrix
    return torch.cat([matrix[..., 1:, :], matrix[..., -1:, :]], dim=-2)


def alignment_matrix(cross_attention: Tensor, layer: int, head: int | None) -> Tensor:
    """The (T, S) map an alignment is read from: one head, or the layer's head average (head None)."""
    layer_maps = cross_attention[layer].float()
    return layer_maps.mean(dim=0) if head is None else layer_maps[head]
