"""The lecture model's own decoding step: one new position per row over a KV cache, through model.transformer's
layers (inference: no dropout). It is the reference the compiled runtime (csrc/) is tested against and the step
EagerStep runs where the runtime cannot be built; the lecture network itself (model/transformer.py) knows only
whole sequences.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from model.transformer import DecoderLayer, EncoderOutput, MultiHeadAttention, Transformer, _layer_norm, additive_mask


def attend_one(
    attention: MultiHeadAttention, query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None, need_weights: bool
) -> tuple[Tensor, Tensor | None]:
    """model.transformer's `attention` for one query position per row (a decoding step), as three batched matmuls.

    query (N, h, 1, d_k) or (N, 1, h·d_k); key/value (N, h, t, d_k) whose first two dimensions
    merge into one (a slice of the cache); mask an additive (N, 1, 1, t) or None. The same
    kernels and the same arithmetic as `attention` on 4-D tensors, without the expand/reshape
    round trips, then the attention's `out_proj`. Returns (N, 1, d_model) and the weights (N, h, 1, t).
    """
    context, weights = context_one(query, key, value, mask, need_weights)
    return attention.out_proj(context.view(context.size(0), 1, -1)), weights


def context_one(
    query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None, need_weights: bool
) -> tuple[Tensor, Tensor | None]:
    """`attend_one` before `out_proj`: the heads' contexts side by side (N, h·d_k), the weights (N, h, 1, t)."""
    rows, heads, length, d_k = key.shape
    scores = torch.bmm(query.reshape(rows * heads, 1, d_k), key.view(rows * heads, length, d_k).transpose(1, 2))
    scores.mul_(d_k**-0.5)  # (N·h, 1, t)
    if mask is not None:
        scores.view(rows, heads, 1, length).add_(mask)
    weights = scores.softmax(dim=-1)
    context = torch.bmm(weights, value.view(rows * heads, length, d_k))  # (N·h, 1, d_k) = heads side by side
    return context.view(rows, heads * d_k), weights.view(rows, heads, 1, length) if need_weights else None


@dataclass
class DecoderCache:
    """Per-layer K/V for incremental decoding.

    Self-attention K/V live in preallocated buffers (rows, h, capacity, d_k) written in
    place one step at a time; the first `rows` rows are in use. Cross-attention K/V are
    computed once per source. `reorder` selects batch rows (beam reordering, dropping
    finished sequences) by copying into a second set of buffers, so that decoding
    allocates nothing per step.
    """

    self_key: list[Tensor]
    self_value: list[Tensor]
    cross_key: list[Tensor]
    cross_value: list[Tensor]
    source_mask: Tensor | None  # (rows, 1, 1, S) additive float mask over padding; None without padding
    length: int = 0
    capacity: int = 0
    spare_key: list[Tensor] = field(default_factory=list)
    spare_value: list[Tensor] = field(default_factory=list)
    self_mask: Tensor | None = None  # every row is at position `length`: nothing to hide

    @property
    def rows(self) -> int:
        """Rows the cross-attention K/V (and so the cache) hold now."""
        return self.cross_key[0].size(0)

    def append(self, layer: int, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        """Write one step's K/V (rows, h, 1, d_k) of `layer` at position `length`; return K/V so far."""
        rows, end = key.size(0), self.length + 1
        self.self_key[layer][:rows, :, self.length : end] = key
        self.self_value[layer][:rows, :, self.length : end] = value
        return self.self_key[layer][:rows, :, :end], self.self_value[layer][:rows, :, :end]  # (rows, h, t, d_k)

    def reorder(self, index: Tensor, same_sources: bool = False) -> None:
        """Row r becomes old row index[r]. same_sources: every row keeps a row of its own source
        (beams of one input), so when the row count stays the cross-attention K/V stay as they are."""
        filled, rows = self.length, index.numel()
        if not self.spare_key:
            self.spare_key = [torch.empty_like(b) for b in self.self_key]
            self.spare_value = [torch.empty_like(b) for b in self.self_value]
        for buffers, spares in ((self.self_key, self.spare_key), (self.self_value, self.spare_value)):
            for i, buffer in enumerate(buffers):
                torch.index_select(buffer[:, :, :filled], 0, index, out=spares[i][:rows, :, :filled])
                buffers[i], spares[i] = spares[i], buffer
        if same_sources and rows == self.rows:
            return
        for buffers in (self.cross_key, self.cross_value):
            for i, buffer in enumerate(buffers):
                buffers[i] = buffer.index_select(0, index)
        if self.source_mask is not None:
            self.source_mask = self.source_mask.index_select(0, index)


def layer_step(
    layer: DecoderLayer, x: Tensor, cache: DecoderCache, index: int, need_weights: bool
) -> tuple[Tensor, Tensor | None]:
    """One new position x (N, 1, d_model): append its K/V to the cache, attend over all positions so far.

    The same operations as DecoderLayer.forward (inference: no dropout). model/runtime runs this step compiled and is
    tested against it.
    """
    own = layer.self_attn
    query = own.split_heads(own.q_proj(x))  # (N, h, 1, d_k)
    key, value = own.project_key_value(x)  # (N, h, 1, d_k) each
    self_key, self_value = cache.append(index, key, value)  # (N, h, t, d_k)
    # cache.self_mask: None when every row is at the same position (model.decoding.rows.RaggedCache sets it)
    attended, _ = attend_one(own, query, self_key, self_value, cache.self_mask, False)
    x = _layer_norm(layer.self_attn_layer_norm, x + attended)
    cross = layer.encoder_attn
    query = cross.q_proj(x)  # (N, 1, d_model)
    attended, cross_weights = attend_one(
        cross, query, cache.cross_key[index], cache.cross_value[index], cache.source_mask, need_weights
    )
    x = _layer_norm(layer.encoder_attn_layer_norm, x + attended)
    x = _layer_norm(layer.final_layer_norm, x + layer.feed_forward(x))
    return x, cross_weights  # (N, 1, d_model), (N, h, 1, S) or None


def cross_key_values(model: Transformer, hidden: Tensor, beams: int | Tensor = 1) -> tuple[list[Tensor], list[Tensor]]:
    """Every decoder layer's cross-attention K and V of the sources' encoder output `hidden` (B, S, d_model),
    each (rows, h, S, d_k) and contiguous for the per-step matmuls: projected once per source and copied to
    its `beams` rows (beam search's k: an int, or one count per source)."""
    keys, values = [], []
    for layer in model.decoder_layers:
        key, value = layer.encoder_attn.project_key_value(hidden)
        keys.append(key.repeat_interleave(beams, dim=0))
        values.append(value.repeat_interleave(beams, dim=0))
    return keys, values


def start_cache(
    model: Transformer, encoder: EncoderOutput, capacity: int, beams: int = 1,
    cross: tuple[list[Tensor], list[Tensor]] | None = None,
) -> DecoderCache:
    """Compute cross-attention K/V once and allocate self-attention buffers for `capacity` steps.

    beams: rows per source (beam search's k): see `cross_key_values`. cross: the K/V already projected (by the
    compiled step's kernels), each source's on its `beams` rows.
    """
    batch = encoder.hidden.size(0) * beams
    self_key, self_value = [], []
    for layer in model.decoder_layers:
        attn = layer.self_attn
        shape = (batch, attn.heads, capacity, attn.d_k)
        self_key.append(encoder.hidden.new_empty(shape))
        self_value.append(encoder.hidden.new_empty(shape))
    cross_key, cross_value = cross if cross is not None else cross_key_values(model, encoder.hidden, beams)
    source_mask = encoder.mask.repeat_interleave(beams, dim=0)[:, None, None, :]
    mask = additive_mask(source_mask, encoder.hidden.dtype)  # None when nothing is padded
    return DecoderCache(self_key, self_value, cross_key, cross_value, mask, 0, capacity)


def check_room(model: Transformer, step: int, capacity: int) -> None:
    """Raise ValueError when decoding step `step` does not fit a cache of `capacity` steps or the model's positions
    (every step's decode_step asks this first)."""
    if step >= capacity:
        raise ValueError(f"decoder cache holds {capacity} steps; step {step} does not fit")
    if step >= model.positions.size(0):
        raise ValueError(f"position {step} exceeds max_position_embeddings={model.positions.size(0)}")


def decode_step(
    model: Transformer, last_ids: Tensor, cache: DecoderCache, need_weights: bool = False
) -> tuple[Tensor, list[Tensor] | None]:
    """One decoding step: last_ids (N,) → logits (N, V) and cross-attention per layer (N, h, S).

    The output projection runs for the new position only; N may be below the cache's
    row count (the search dropped finished rows).
    """
    step = cache.length
    check_room(model, step, cache.capacity)
    x = model.embed(model.decoder_embed_tokens, last_ids[:, None], start=step)  # (N, 1, d)
    x, cross_attention = step_layers(model, x, cache, need_weights)
    cache.length = step + 1
    return model.logits(x[:, 0]), cross_attention


def step_layers(
    model: Transformer, x: Tensor, cache: DecoderCache, need_weights: bool
) -> tuple[Tensor, list[Tensor] | None]:
    """Every decoder layer's `layer_step` on one new position per row x (N, 1, d_model): the last hidden state and,
    when asked, each layer's cross-attention (N, h, S).
    `decode_step` and the decode loop's ragged step (model.runtime's EagerStep.decode_rows) both run it."""
    cross_attention = [] if need_weights else None
    for i, layer in enumerate(model.decoder_layers):
        x, weights = layer_step(layer, x, cache, i, need_weights)
        if need_weights:
            cross_attention.append(weights[:, :, 0])  # (N, h, S)
    return x, cross_attention
