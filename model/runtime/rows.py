"""The decode loop's decoder K/V: one contract (`join`, `keep`, `clear`, `rows`) and one rule for moves and growth,
over two storages, RaggedCache (the eager step) and graphs.StaticRows (the graph step). Masked positions hold finite
numbers, so their weight is exactly 0."""

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


class DecoderRows:
    """Both storages' half: bucketed allocation that grows keeping the rows in use, joins, and the source state's
    moves. A storage says how self-attention K/V move (`_keep_self`) and what follows a change (`_changed`)."""

    def __init__(self, model: Transformer, dtype: torch.dtype | None) -> None:
        self.model = model
        layer = model.decoder_layers[0].self_attn
        self.layers, self.heads, self.d_k = len(model.decoder_layers), layer.heads, layer.d_k
        self.device = model.final_logits_bias.device
        self.dtype = dtype  # None: the first join's
        self.shape = Shape(0, 0, 0)
        self._self_key: list[Tensor] = []
        self._self_value: list[Tensor] = []
        self._cross_key: list[Tensor] = []
        self._cross_value: list[Tensor] = []
        self._source_mask: Tensor | None = None  # (R, 1, 1, S) additive
        self._positions = torch.zeros(0, dtype=torch.long, device=self.device)
        self._rows = 0
        self._lengths: list[int] = []  # per row in use: its source length (host)

    @property
    def rows(self) -> int:
        return self._rows

    def clear(self) -> None:
        """No rows (storage is kept)."""
        self._rows = 0
        self._lengths = []
        self._changed()

    def _allocate(self, shape: Shape) -> None:
        """Buffers at `shape`, with what the rows in use hold copied over (zeros elsewhere)."""
        old, used = self.shape, self._rows
        rows, device, dtype = shape.rows, self.device, self.dtype

        def fresh(width: int, previous: list[Tensor], length: int) -> list[Tensor]:
            made = []
            for i in range(self.layers):
                buffer = torch.zeros(rows, self.heads, width, self.d_k, device=device, dtype=dtype)
                if previous and used:
                    buffer[:used, :, :length] = previous[i][:used, :, :length]
                made.append(buffer)
            return made

        self._self_key = fresh(shape.capacity, self._self_key, old.capacity)
        self._self_value = fresh(shape.capacity, self._self_value, old.capacity)
        self._cross_key = fresh(shape.source, self._cross_key, old.source)
        self._cross_value = fresh(shape.source, self._cross_value, old.source)
        mask = torch.zeros(rows, 1, 1, shape.source, device=device, dtype=dtype)
        positions = torch.zeros(rows, dtype=torch.long, device=device)
        if used:
            mask[:used, :, :, : old.source] = self._source_mask[:used]
            mask[:used, :, :, old.source :] = torch.finfo(dtype).min
            positions[:used] = self._positions[:used]
        self._source_mask, self._positions = mask, positions
        self.shape = shape

    def join(
        self, cross_keys: list[Tensor], cross_values: list[Tensor], source_mask: Tensor, capacity: int,
        lengths: list[int], reserve: int = 0,
    ) -> None:
        """Rows join at position 0 (cross K/V per layer (n, h, S', d_k), bool mask (n, S')), with room for `reserve`
        rows in all."""
        added, _, source, _ = cross_keys[0].shape
        if self.dtype is None:
            self.dtype = cross_keys[0].dtype
        needed = Shape.holding(max(self._rows + added, reserve), capacity, source)
        if not self.shape.covers(needed):
            self._allocate(self.shape.union(needed))
        new = slice(self._rows, self._rows + added)
        for buffers, parts in ((self._cross_key, cross_keys), (self._cross_value, cross_values)):
            for buffer, part in zip(buffers, parts, strict=True):
                buffer[new, :, :source] = part
        lowest = torch.finfo(self.dtype).min
        self._source_mask[new] = lowest
        self._source_mask[new, 0, 0, :source] = torch.zeros_like(source_mask, dtype=self.dtype).masked_fill_(
            ~source_mask, lowest)
        self._positions[new] = 0
        self._rows += added
        self._lengths.extend(lengths)
        self._changed()

    def keep(self, index: Tensor, same_sources: bool = False) -> None:
        """Row r becomes old row index[r]; same_sources: only self-attention K/V move."""
        count = index.numel()
        if count == 0:
            self.clear()
            return
        if count > self.shape.rows:
            self._allocate(self.shape.union(Shape.holding(count, self.shape.capacity, self.shape.source)))
        self._keep_self(index)
        if not (same_sources and count == self._rows):
            source = max(self._lengths)
            for buffer in (*self._cross_key, *self._cross_value):
                buffer[:count, :, :source] = buffer[: self._rows, :, :source].index_select(0, index)
            self._source_mask[:count] = self._source_mask[: self._rows].index_select(0, index)
            self._positions[:count] = self._positions[: self._rows].index_select(0, index)
            self._lengths = [self._lengths[r] for r in index.tolist()]
            self._rows = count
        self._changed()

    def _keep_self(self, index: Tensor) -> None:
        raise NotImplementedError

    def _changed(self) -> None:
        """After rows joined, left or moved."""


class RaggedCache(DecoderRows):
    """The eager step's storage, cut to the rows in use and their longest source."""

    def __init__(self, model: Transformer) -> None:
        super().__init__(model, None)
        self._spare: tuple[list[Tensor], list[Tensor]] | None = None  # self K/V's second buffers, to gather into
        self.clear()

    def _allocate(self, shape: Shape) -> None:
        super()._allocate(shape)
        self._spare = None

    def _changed(self) -> None:
        rows, source = self._rows, max(self._lengths, default=0)
        self.cross_key = [b[:rows, :, :source] for b in self._cross_key]
        self.cross_value = [b[:rows, :, :source] for b in self._cross_value]
        self.source_mask = self._source_mask[:rows, :, :, :source] if self._source_mask is not None else None
        self.positions = self._positions[:rows]
        if not rows:
            self.self_mask: Tensor | None = None  # (rows, 1, 1, width) additive, set by `prepare`; None: rows level
            self.width = 0  # positions written by the furthest row + 1, after `prepare`

    def _keep_self(self, index: Tensor) -> None:
        """Self-attention K/V gathered now into spare buffers swapped in."""
        rows, written = index.numel(), self.width
        if self._spare is None:  # zeros: a position no row has written must hold finite numbers
            self._spare = tuple([torch.zeros_like(b) for b in side] for side in (self._self_key, self._self_value))
        for buffers, spares in zip((self._self_key, self._self_value), self._spare, strict=True):
            for i, buffer in enumerate(buffers):
                torch.index_select(buffer[: self._rows, :, :written], 0, index, out=spares[i][:rows, :, :written])
                buffers[i], spares[i] = spares[i], buffer

    def prepare(self) -> None:
        """Before a step: the self-attention mask, none when every row is at one position."""
        low, high = torch.stack(torch.aminmax(self.positions)).tolist()  # one read of the device
        self.width = high + 1
        if low == high:
            self.self_mask = None
            return
        reached = torch.arange(self.width, device=self.device)[None, :] <= self.positions[:, None]
        mask = torch.zeros(reached.shape, dtype=self.dtype, device=self.device)
        self.self_mask = mask.masked_fill_(~reached, torch.finfo(mask.dtype).min)[:, None, None, :]

    def advance(self) -> None:
        self._positions[: self._rows] += 1

    def append(self, layer: int, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        """Write one step's K/V (rows, h, 1, d_k) at each row's own position; return K/V up to `width`."""
        rows, width = self._rows, self.width
        if self.self_mask is None:  # every row at position width - 1 (see `prepare`)
            self._self_key[layer][:rows, :, width - 1] = key[:, :, 0]
            self._self_value[layer][:rows, :, width - 1] = value[:, :, 0]
        else:
            index = torch.arange(rows, device=key.device)
            self._self_key[layer][index, :, self.positions] = key[:, :, 0]
            self._self_value[layer][index, :, self.positions] = value[:, :, 0]
        return self._self_key[layer][:rows, :, :width], self._self_value[layer][:rows, :, :width]


__all__ = ["LENGTH_BUCKETS", "ROW_BUCKETS", "DecoderRows", "RaggedCache", "Shape", "bucket"]
