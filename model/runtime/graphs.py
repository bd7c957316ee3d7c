"""The lecture model's decoder step at static shapes, replayed as CUDA graphs on a GPU, where a small model's step is
bound by its hundred kernel launches. Off a GPU, or where capture fails, the same static step runs eagerly."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch import Tensor

from model.runtime import eager
from model.runtime.rows import ROW_BUCKETS, Shape, StaticRows, bucket
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


class _RowsView:
    """The first `rows` rows of a StaticRows as eager.step_layers reads a cache: whole buffers (static shapes), or
    `trimmed` to the positions written and the longest source (the eager step: host reads allowed)."""

    def __init__(self, cache: StaticRows, rows: int, trimmed: bool) -> None:
        self.cache, self.count = cache, rows
        self.positions = cache.positions[:rows]
        width, source = cache.shape.capacity, cache.shape.source
        same = False
        if trimmed:
            low, high = torch.stack(torch.aminmax(self.positions)).tolist()  # one read of the device
            width, source, same = high + 1, max(cache.lengths), low == high
        self.width = width
        self.cross_key = [b[:rows, :, :source] for b in cache.cross_key]
        self.cross_value = [b[:rows, :, :source] for b in cache.cross_value]
        self.source_mask = cache.source_mask[:rows, :, :, :source]
        self.self_mask = None  # every row at one position: nothing to hide
        if not same:
            written = cache.steps[None, :width] <= self.positions[:, None]  # (rows, T) positions with K/V
            self.self_mask = torch.zeros(written.shape, device=written.device, dtype=cache.dtype).masked_fill_(
                ~written, torch.finfo(cache.dtype).min)[:, None, None, :]
        self.at = self.positions.view(rows, 1, 1, 1).expand(rows, cache.heads, 1, cache.d_k)

    def append(self, layer: int, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        rows, width = self.count, self.width
        keys = self.cache.self_key[layer][:rows, :, :width]
        values = self.cache.self_value[layer][:rows, :, :width]
        keys.scatter_(2, self.at, key)
        values.scatter_(2, self.at, value)
        return keys, values


def rows_step(
    model: Transformer, cache: StaticRows, rows: int, variant: Variant, trimmed: bool = False
) -> tuple[Tensor, list[Tensor] | None] | None:
    """One step of `rows` rows, the pending moves first: logits (rows, V) and, under variant.weights, each layer's
    cross-attention (rows, h, S). `trimmed` returns them; static (not `trimmed`) writes them into the cache's
    `logits` and `weights` buffers, with no host reads, so that a CUDA graph can hold it."""
    view = _RowsView(cache, rows, trimmed)
    if variant.gather != "none":
        width = view.width
        spare = cache.spare_self[:rows, :, :width]
        for buffer in (*cache.self_key, *cache.self_value):
            torch.index_select(buffer[:, :, :width], 0, cache.parents[:rows], out=spare)  # parents may lie past rows
            buffer[:rows, :, :width].copy_(spare)
        cache.parents[:rows].copy_(cache.identity[:rows])
    embedded = model.decoder_embed_tokens(cache.ids[:rows, None]).to(cache.dtype) * model.embed_scale  # (R, 1, d)
    x = embedded + model.positions.index_select(0, view.positions)[:, None, :]
    x, cross_attention = eager.step_layers(model, x, view, variant.weights)
    logits = eager.logits(model, x[:, 0])
    view.positions.add_(1).clamp_(max=cache.last_position)
    if trimmed:
        return logits, cross_attention
    cache.logits[:rows].copy_(logits)
    if variant.weights:
        for layer, weights in enumerate(cross_attention):
            cache.weights[layer, :rows].copy_(weights)  # (R, h, S)
    return None
