"""Decoder K/V for rows at different positions, over sources of different lengths: the storage model/decoding/loop.py's
Loop keeps its rows in on the eager step (on a GPU the graph step's fixed buffers, model/runtime/graphs.py StaticRows,
take its place with the same join/keep/clear/rows)."""

from __future__ import annotations

import torch
from torch import Tensor

from model.transformer import Transformer

Moves = list[tuple[int, int, int]]  # blocks of rows that move: (old first row, new first row, rows) each


def _grown(needed: int, have: int, least: int) -> int:
    """A buffer dimension's new size: `have` if it suffices, else at least double it (and at least `least`)."""
    return have if needed <= have else max(needed, 2 * have, least)


class RaggedCache:
    """Decoder K/V for rows at different positions, over sources of different lengths.

    Storage is preallocated and grows (doubling) only when rows, source length or decoding budget
    outgrow it, so joining and leaving copy nothing but the rows that move:
    self-attention K/V (row capacity, h, position capacity, d_k) per layer, row r's next position
    `positions[r]`, `self_mask` hiding every position a row has not reached; cross-attention K/V
    (row capacity, h, source capacity, d_k), `source_mask` hiding each row's padding. The first
    `rows` rows are in use, exposed as views (`cross_key`, `cross_value`, `source_mask`,
    `positions`) cut to the longest source in use; `prepare` sets `self_mask` before each step.
    The mask value is the dtype's lowest: a hidden position's weight is exactly 0, and what it hides
    is always a finite number (zeros, or K/V a row left behind), never garbage.
    """

    def __init__(self, model: Transformer) -> None:
        self.model = model
        self.device = model.final_logits_bias.device
        self._self_key: list[Tensor] = []  # storage, allocated by `_grow`
        self._self_value: list[Tensor] = []
        self._cross_key: list[Tensor] = []
        self._cross_value: list[Tensor] = []
        self._spare: dict[str, list[Tensor]] = {}
        self._source_mask: Tensor | None = None  # (R, 1, 1, S_cap) additive
        self._positions = torch.zeros(0, dtype=torch.long, device=self.device)
        self.clear()

    def clear(self) -> None:
        """No rows (storage is kept)."""
        self._rows = 0
        self._lengths: list[int] = []  # per row in use: its source length (host)
        self.self_mask: Tensor | None = None  # (rows, 1, 1, width) additive, set by `prepare`; None: rows level
        self.width = 0  # positions written by the furthest row + 1, after `prepare`
        self._views()

    @property
    def rows(self) -> int:
        return self._rows

    @property
    def key_buffers(self) -> list[Tensor]:
        """Each layer's self-attention K storage (row capacity, h, position capacity, d_k): what `append` writes."""
        return self._self_key

    @property
    def value_buffers(self) -> list[Tensor]:
        return self._self_value

    def _views(self) -> None:
        """The rows in use, cut to the longest source among them: what a decoding step reads."""
        rows, source = self._rows, max(self._lengths, default=0)
        self.cross_key = [b[:rows, :, :source] for b in self._cross_key]
        self.cross_value = [b[:rows, :, :source] for b in self._cross_value]
        self.source_mask = self._source_mask[:rows, :, :, :source] if self._source_mask is not None else None
        self.positions = self._positions[:rows]

    def _grow(self, rows: int, source: int, capacity: int, dtype: torch.dtype, heads: int, d_k: int) -> None:
        """Make room for `rows` rows, sources of `source` tokens and `capacity` positions (copying what is kept)."""
        have_rows = self._positions.numel()
        have_source = self._cross_key[0].size(2) if self._cross_key else 0
        have_capacity = self._self_key[0].size(2) if self._self_key else 0
        if rows <= have_rows and source <= have_source and capacity <= have_capacity:
            return
        # Every dimension grows geometrically: a request with a longer source or budget than any before would
        # otherwise reallocate (and zero) every buffer and its spare again, which under a mixed load of new
        # lengths took a third of the decode loop's time (py-spy on a replica, bench.continuous's mixed load).
        new_rows = _grown(rows, have_rows, 8)
        new_source = _grown(source, have_source, 16)
        new_capacity = _grown(capacity, have_capacity, 16)
        layers = len(self.model.decoder_layers)
        used = self._rows

        def moved(old: list[Tensor], width: int, length: int) -> list[Tensor]:
            fresh = []
            for i in range(layers):
                buffer = torch.zeros(new_rows, heads, width, d_k, dtype=dtype, device=self.device)
                if old:
                    buffer[:used, :, :length] = old[i][:used, :, :length]
                fresh.append(buffer)
            return fresh

        self._self_key = moved(self._self_key, new_capacity, have_capacity)
        self._self_value = moved(self._self_value, new_capacity, have_capacity)
        self._cross_key = moved(self._cross_key, new_source, have_source)
        self._cross_value = moved(self._cross_value, new_source, have_source)
        mask = torch.full((new_rows, 1, 1, new_source), torch.finfo(dtype).min, dtype=dtype, device=self.device)
        if self._source_mask is not None:
            mask[:used, :, :, :have_source] = self._source_mask[:used]
        self._source_mask = mask
        positions = torch.zeros(new_rows, dtype=torch.long, device=self.device)
        positions[:used] = self._positions[:used]
        self._positions = positions
        self._spare = {}  # spares follow the storage's shapes

    def join(
        self, cross_keys: list[Tensor], cross_values: list[Tensor], source_mask: Tensor, capacity: int,
        lengths: list[int],
    ) -> None:
        """Add rows (their cross K/V per layer (n, h, S', d_k), bool mask (n, S'), source lengths) at position 0."""
        added, heads, source, d_k = cross_keys[0].shape
        self._grow(self._rows + added, source, capacity, cross_keys[0].dtype, heads, d_k)
        new = slice(self._rows, self._rows + added)
        for i, (key, value) in enumerate(zip(cross_keys, cross_values, strict=True)):
            self._cross_key[i][new, :, :source] = key
            self._cross_value[i][new, :, :source] = value
        lowest = torch.finfo(self._source_mask.dtype).min
        self._source_mask[new] = lowest
        hidden = torch.zeros_like(source_mask, dtype=self._source_mask.dtype).masked_fill_(~source_mask, lowest)
        self._source_mask[new, 0, 0, :source] = hidden
        self._positions[new] = 0
        self._rows += added
        self._lengths.extend(lengths)
        self._views()

    def _spares(self, name: str, buffers: list[Tensor]) -> list[Tensor]:
        spares = self._spare.get(name)
        if spares is None:
            # zeros: a position no row has written must hold finite numbers (masked, weight 0)
            spares = self._spare[name] = [torch.zeros_like(b) for b in buffers]
        return spares

    def _gather(self, name: str, buffers: list[Tensor], index: Tensor, length: int) -> None:
        """buffers[i][:m, :, :length] = buffers[i][index, :, :length], through a spare (nothing allocated)."""
        rows = index.numel()
        spares = self._spares(name, buffers)
        for i, buffer in enumerate(buffers):
            torch.index_select(buffer[: self._rows, :, :length], 0, index, out=spares[i][:rows, :, :length])
            buffers[i], spares[i] = spares[i], buffer

    def keep(self, index: Tensor, same_sources: bool = False, moves: Moves | None = None) -> None:
        """Row r becomes old row index[r] (beam reordering; rows of finished requests leave).

        same_sources: every row keeps a row of its own request (no request left), so the cross-attention
        K/V, the source mask and the positions stay as they are and only self-attention K/V move.
        moves: what changed instead, as blocks of rows whose source state (identical across a request's beams)
        moves, (old first row, new first row, rows) each, to below the kept row count from above it; every
        other kept row's source state stays where it is. None: gather every row's.
        """
        if index.numel() == 0:
            self.clear()
            return
        written = self.width
        self._gather("self_key", self._self_key, index, written)
        self._gather("self_value", self._self_value, index, written)
        if same_sources and index.numel() == self._rows:
            pass  # every row stays with its own source: only self-attention K/V moved
        elif moves is not None:
            source = max(self._lengths)
            for old, new, rows in moves:
                for buffer in (*self._cross_key, *self._cross_value):
                    buffer[new : new + rows, :, :source] = buffer[old : old + rows, :, :source]
                self._source_mask[new : new + rows] = self._source_mask[old : old + rows]
                self._positions[new : new + rows] = self._positions[old : old + rows]
                self._lengths[new : new + rows] = self._lengths[old : old + rows]
            self._rows = index.numel()
            del self._lengths[self._rows :]
        else:
            source = max(self._lengths)
            self._gather("cross_key", self._cross_key, index, source)
            self._gather("cross_value", self._cross_value, index, source)
            kept = index.numel()
            self._source_mask[:kept] = self._source_mask[: self._rows].index_select(0, index)
            self._positions[:kept] = self._positions[: self._rows].index_select(0, index)
            order = index.tolist()
            self._lengths = [self._lengths[r] for r in order]
            self._rows = kept
        self._views()

    def prepare(self) -> None:
        """Before a step: the self-attention mask for positions 0..max(positions), and where `append` writes.

        When every row is at the same position (one request alone, or requests that joined together) nothing
        is hidden: no mask, and `append` writes one slice, as the static search's cache does (the same values
        as the masked, indexed path: adding a mask of zeros changes no score)."""
        low, high = torch.stack(torch.aminmax(self.positions)).tolist()  # one read of the device
        self.width = high + 1
        if low == high:
            self.self_mask = None
            return
        reached = torch.arange(self.width, device=self.device)[None, :] <= self.positions[:, None]
        mask = torch.zeros(reached.shape, dtype=self._source_mask.dtype, device=self.device)
        self.self_mask = mask.masked_fill_(~reached, torch.finfo(mask.dtype).min)[:, None, None, :]

    def advance(self) -> None:
        """After a step: every row moves one position on."""
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
