"""The lecture model's decoder step at static shapes, replayed as CUDA graphs on a GPU, where a small model's step is
bound by its hundred kernel launches. Off a GPU, or where capture fails, the same static step runs eagerly."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch import Tensor

from model.runtime import eager
from model.runtime.rows import ROW_BUCKETS, DecoderRows, Shape, bucket
from model.transformer import Transformer

logger = logging.getLogger("model.runtime")

@dataclass(frozen=True)
class Variant:
    """What one replay does besides the step: move self-attention K/V first (gather "self"), keep the weights."""

    gather: str
    weights: bool


class GraphSteps:
    """One model's static step graphs, captured on first use per row bucket and variant."""

    def __init__(self, model: Transformer, capture: bool) -> None:
        self.model = model
        self.capture = capture
        self.pool = torch.cuda.graph_pool_handle() if capture else None
        self.captured = 0
        self.failure: str | None = None

    def run_rows(self, cache: StaticRows, weights: bool) -> None:
        """One step: the replay of the rows' bucket's graph, captured now if it has none."""
        rows = bucket(cache.rows, ROW_BUCKETS)
        variant = Variant(cache.pending, weights)
        cache.pending = "none"
        if not self.capture:
            rows_step(self.model, cache, rows, variant)
            return
        graph = cache.graphs.get((rows, variant))
        if graph is None:
            shape = Shape(rows, cache.shape.capacity, cache.shape.source)
            graph = self._captured(lambda: rows_step(self.model, cache, rows, variant), shape)
            if graph is None:
                rows_step(self.model, cache, rows, variant)
                return
            cache.graphs[(rows, variant)] = graph
        graph.replay()

    def _captured(self, step, shape: Shape) -> torch.cuda.CUDAGraph | None:
        """`step` captured without running it (the buffers are the loop's), the libraries warmed first on scratch
        rows; None when capture fails, and every later step runs eagerly."""
        try:
            if self.captured == 0:
                scratch = StaticRows(self.model)
                scratch._allocate(shape)
                stream = torch.cuda.Stream()
                stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(stream):
                    for _ in range(2):
                        rows_step(self.model, scratch, shape.rows, Variant("self", True))
                torch.cuda.current_stream().wait_stream(stream)
                del scratch
            graph = torch.cuda.CUDAGraph()
            # thread_local: another replica thread's allocations during this capture are not errors
            with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
                step()
            self.captured += 1
            return graph
        except Exception as error:  # noqa: BLE001 - an uncapturable op: the eager static step still decodes
            self.capture = False
            self.failure = f"{type(error).__name__}: {error}"[:300]
            logger.warning("decoding runtime: CUDA graph capture failed, the static step runs eagerly (%s)",
                           self.failure)
            return None


class StaticRows(DecoderRows):
    """The graph step's storage: bucketed buffers, positions on the device, self-attention K/V moved inside the next
    step, so shapes change only when rows cross a bucket. Padding rows decode finite numbers nobody reads."""

    def __init__(self, model: Transformer) -> None:
        super().__init__(model, model.positions.dtype)
        self.vocabulary = model.output_weight.size(0)
        self.graphs: dict[tuple[int, Variant], torch.cuda.CUDAGraph] = {}  # this storage's, by (row bucket, variant)
        self.pending = "none"
        self._allocate(Shape(0, 0, 0))

    # What a step reads: the whole storage.
    self_key = property(lambda self: self._self_key)
    self_value = property(lambda self: self._self_value)
    cross_key = property(lambda self: self._cross_key)
    cross_value = property(lambda self: self._cross_value)
    source_mask = property(lambda self: self._source_mask)  # additive (rows, 1, 1, S)
    positions = property(lambda self: self._positions)  # each row's next position

    def clear(self) -> None:
        super().clear()
        self.pending = "none"

    def _allocate(self, shape: Shape) -> None:
        if self._rows and self.pending == "self":  # moves `keep` left for the next step, done on the old storage
            for buffer in (*self._self_key, *self._self_value):
                buffer[: self._rows] = buffer.index_select(0, self.parents[: self._rows])
            self.pending = "none"
        super()._allocate(shape)
        rows, capacity, source, device, dtype = shape.rows, shape.capacity, shape.source, self.device, self.dtype
        self.ids = torch.zeros(rows, dtype=torch.long, device=device)
        self.identity = torch.arange(rows, device=device)
        self.parents = self.identity.clone()  # row r continues old row parents[r] (the next step moves its K/V)
        self.steps = torch.arange(capacity, device=device)
        self.spare_self = torch.empty(rows, self.heads, capacity, self.d_k, device=device, dtype=dtype)
        self.logits = torch.zeros(rows, self.vocabulary, device=device, dtype=dtype)
        self.weights = torch.zeros(self.layers, rows, self.heads, source, device=device, dtype=dtype)
        self.last_position = min(capacity, self.model.positions.size(0)) - 1  # where padding rows stop advancing
        self.graphs = {}

    def _keep_self(self, index: Tensor) -> None:
        self.parents[: index.numel()].copy_(index)
        self.pending = "self"

    @torch.inference_mode()
    def join(
        self, cross_keys: list[Tensor], cross_values: list[Tensor], source_mask: Tensor, capacity: int,
        lengths: list[int], reserve: int = 0,
    ) -> None:
        super().join(cross_keys, cross_values, source_mask, capacity, lengths, reserve)

    @torch.inference_mode()
    def keep(self, index: Tensor, same_sources: bool = False) -> None:
        super().keep(index, same_sources)


class _RowsView:
    """The first `rows` rows of a StaticRows, as eager.step_layers reads a cache."""

    def __init__(self, cache: StaticRows, rows: int) -> None:
        self.cache, self.count = cache, rows
        self.cross_key = [b[:rows] for b in cache.cross_key]
        self.cross_value = [b[:rows] for b in cache.cross_value]
        self.source_mask = cache.source_mask[:rows]
        self.positions = cache.positions[:rows]
        written = cache.steps[None, :] <= self.positions[:, None]  # (rows, T) the positions each row has K/V at
        self.self_mask = torch.zeros(written.shape, device=written.device, dtype=cache.dtype).masked_fill_(
            ~written, torch.finfo(cache.dtype).min)[:, None, None, :]
        self.at = self.positions.view(rows, 1, 1, 1).expand(rows, cache.heads, 1, cache.d_k)

    def append(self, layer: int, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        rows = self.count
        keys, values = self.cache.self_key[layer][:rows], self.cache.self_value[layer][:rows]
        keys.scatter_(2, self.at, key)
        values.scatter_(2, self.at, value)
        return keys, values


def rows_step(model: Transformer, cache: StaticRows, rows: int, variant: Variant) -> None:
    """One step of a row bucket into `cache.logits` (and `weights`), the pending moves first; no host reads, so a
    CUDA graph can hold it."""
    if variant.gather != "none":
        spare = cache.spare_self[:rows]
        for buffer in (*cache.self_key, *cache.self_value):
            torch.index_select(buffer, 0, cache.parents[:rows], out=spare)  # parents may lie past the bucket
            buffer[:rows].copy_(spare)
        cache.parents[:rows].copy_(cache.identity[:rows])
    view = _RowsView(cache, rows)
    embedded = model.decoder_embed_tokens(cache.ids[:rows, None]).to(cache.dtype) * model.embed_scale  # (R, 1, d)
    x = embedded + model.positions.index_select(0, view.positions)[:, None, :]
    x, cross_attention = eager.step_layers(model, x, view, variant.weights)
    cache.logits[:rows].copy_(eager.logits(model, x[:, 0]))
    if variant.weights:
        for layer, weights in enumerate(cross_attention):
            cache.weights[layer, :rows].copy_(weights)  # (R, h, S)
    view.positions.add_(1).clamp_(max=cache.last_position)
