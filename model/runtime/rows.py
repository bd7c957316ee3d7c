"""The Python decode loops' decoder K/V (the compiled loop keeps its own, ragged, in C++): fixed buffers in bucketed
shapes, which grow keeping the rows in use, so that a step's shapes change only when rows cross a bucket (and on a
GPU each shape's step is one CUDA graph). Masked positions hold finite numbers, so their weight is exactly 0."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from model.transformer import Transformer

ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)  # rows storage (and a graph) is made for; beyond: multiples
LENGTH_BUCKETS = (16, 32, 64, 128, 256)  # decode capacities and source lengths; beyond: multiples of the last


def bucket(count: int, buckets: tuple[int, ...]) -> int:
    """The smallest bucket that holds `count`; past the largest, `count` rounded up to a multiple of it."""
    for size in buckets:
        if count <= size:
            return size
    last = buckets[-1]
    return -(-count // last) * last


@dataclass(frozen=True)
class Shape:
    rows: int  # decoder rows (inputs × beams), padded
    capacity: int  # decoding steps the self-attention K/V hold
    source: int  # source positions of the cross-attention K/V, padded

    @classmethod
    def holding(cls, rows: int, capacity: int, source: int) -> Shape:
        return cls(bucket(rows, ROW_BUCKETS), bucket(capacity, LENGTH_BUCKETS), bucket(source, LENGTH_BUCKETS))

    def covers(self, other: Shape) -> bool:
        return self.rows >= other.rows and self.capacity >= other.capacity and self.source >= other.source

    def union(self, other: Shape) -> Shape:
        return Shape(max(self.rows, other.rows), max(self.capacity, other.capacity), max(self.source, other.source))


class StaticRows:
    """Rows of a decode: per layer self- and cross-attention K/V, the source mask and each row's next position, in
    buffers `shape` holds (rows, capacity, source: each a bucket). Rows join at position 0 and leave or move by
    `keep`; self-attention K/V move inside the next step (`parents`, `pending`: rows_step does it, in the graph).
    Padding rows decode finite numbers nobody reads."""

    def __init__(self, model: Transformer) -> None:
        self.model = model
        layer = model.decoder_layers[0].self_attn
        self.layers, self.heads, self.d_k = len(model.decoder_layers), layer.heads, layer.d_k
        self.device = model.final_logits_bias.device
        self.dtype = model.positions.dtype
        self.vocabulary = model.output_weight.size(0)
        self.shape = Shape(0, 0, 0)
        self.self_key: list[Tensor] = []
        self.self_value: list[Tensor] = []
        self.cross_key: list[Tensor] = []
        self.cross_value: list[Tensor] = []
        self.source_mask: Tensor | None = None  # (R, 1, 1, S) additive
        self.positions = torch.zeros(0, dtype=torch.long, device=self.device)  # each row's next position
        self.graphs: dict = {}  # this storage's CUDA graphs, by (row bucket, variant): graphs.GraphSteps's
        self.pending = "none"  # "self": self-attention K/V still to move to `parents` (the next step does)
        self._rows = 0
        self.lengths: list[int] = []  # per row in use: its source length (host)
        self._allocate(self.shape)

    @property
    def rows(self) -> int:
        return self._rows

    def clear(self) -> None:
        """No rows (storage is kept)."""
        self._rows = 0
        self.lengths = []
        self.pending = "none"

    def _allocate(self, shape: Shape) -> None:
        """Buffers at `shape`, with what the rows in use hold copied over (zeros elsewhere)."""
        old, used = self.shape, self._rows
        if used and self.pending == "self":  # moves `keep` left for the next step, done on the old storage
            for buffer in (*self.self_key, *self.self_value):
                buffer[:used] = buffer.index_select(0, self.parents[:used])
            self.pending = "none"
        rows, device, dtype = shape.rows, self.device, self.dtype

        def fresh(width: int, previous: list[Tensor], length: int) -> list[Tensor]:
            made = []
            for i in range(self.layers):
                buffer = torch.zeros(rows, self.heads, width, self.d_k, device=device, dtype=dtype)
                if previous and used:
                    buffer[:used, :, :length] = previous[i][:used, :, :length]
                made.append(buffer)
            return made

        self.self_key = fresh(shape.capacity, self.self_key, old.capacity)
        self.self_value = fresh(shape.capacity, self.self_value, old.capacity)
        self.cross_key = fresh(shape.source, self.cross_key, old.source)
        self.cross_value = fresh(shape.source, self.cross_value, old.source)
        mask = torch.zeros(rows, 1, 1, shape.source, device=device, dtype=dtype)
        positions = torch.zeros(rows, dtype=torch.long, device=device)
        if used:
            mask[:used, :, :, : old.source] = self.source_mask[:used]
            mask[:used, :, :, old.source :] = torch.finfo(dtype).min
            positions[:used] = self.positions[:used]
        self.source_mask, self.positions = mask, positions
        self.shape = shape
        self.ids = torch.zeros(rows, dtype=torch.long, device=device)
        self.identity = torch.arange(rows, device=device)
        self.parents = self.identity.clone()  # row r continues old row parents[r] (the next step moves its K/V)
        self.steps = torch.arange(shape.capacity, device=device)
        self.spare_self = torch.empty(rows, self.heads, shape.capacity, self.d_k, device=device, dtype=dtype)
        self.logits = torch.zeros(rows, self.vocabulary, device=device, dtype=dtype)
        self.weights = torch.zeros(self.layers, rows, self.heads, shape.source, device=device, dtype=dtype)
        self.last_position = min(shape.capacity, self.model.positions.size(0)) - 1  # where padding rows stop
        self.graphs = {}

    @torch.inference_mode()
    def join(
        self, cross_keys: list[Tensor], cross_values: list[Tensor], source_mask: Tensor, capacity: int,
        lengths: list[int], reserve: int = 0,
    ) -> None:
        """Rows join at position 0 (cross K/V per layer (n, h, S', d_k), bool mask (n, S')), with room for `reserve`
        rows in all."""
        added, _, source, _ = cross_keys[0].shape
        needed = Shape.holding(max(self._rows + added, reserve), capacity, source)
        if not self.shape.covers(needed):
            self._allocate(self.shape.union(needed))
        new = slice(self._rows, self._rows + added)
        for buffers, parts in ((self.cross_key, cross_keys), (self.cross_value, cross_values)):
            for buffer, part in zip(buffers, parts, strict=True):
                buffer[new, :, :source] = part
        lowest = torch.finfo(self.dtype).min
        self.source_mask[new] = lowest
        self.source_mask[new, 0, 0, :source] = torch.zeros_like(source_mask, dtype=self.dtype).masked_fill_(
            ~source_mask, lowest)
        self.positions[new] = 0
        self._rows += added
        self.lengths.extend(lengths)

    @torch.inference_mode()
    def keep(self, index: Tensor, same_sources: bool = False) -> None:
        """Row r becomes old row index[r]; same_sources: only self-attention K/V move."""
        count = index.numel()
        if count == 0:
            self.clear()
            return
        if count > self.shape.rows:
            self._allocate(self.shape.union(Shape.holding(count, self.shape.capacity, self.shape.source)))
        # row r continues old row index[r], whose K/V may themselves still wait to move: the moves compose
        self.parents[:count].copy_(self.parents.index_select(0, index) if self.pending == "self" else index)
        self.pending = "self"
        if not (same_sources and count == self._rows):
            source = max(self.lengths)
            for buffer in (*self.cross_key, *self.cross_value):
                buffer[:count, :, :source] = buffer[: self._rows, :, :source].index_select(0, index)
            self.source_mask[:count] = self.source_mask[: self._rows].index_select(0, index)
            self.positions[:count] = self.positions[: self._rows].index_select(0, index)
            self.lengths = [self.lengths[r] for r in index.tolist()]
            self._rows = count


__all__ = ["LENGTH_BUCKETS", "ROW_BUCKETS", "Shape", "StaticRows", "bucket"]
