"""The lecture model's own decoding step: one new position per row over a KV cache, through model.transformer's
layers (inference: no dropout). It is the reference the compiled runtime (csrc/) is tested against and the step
EagerStep runs where the runtime cannot be built; the lecture network itself (model.transformer) knows only
whole sequences.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from model.transformer import DecoderLayer, EncoderOutput, MultiHeadAttention, Transformer

# Where a fast mode computes logits inexactly (int8 in the compiled runtime, bf16 weights here), each row's this many
# best candidates are recomputed in fp32: the 2k candidates of beams up to 8.
RESCORED_CANDIDATES = 16


def layer_norm(norm: nn.LayerNorm, x: Tensor) -> Tensor:
    """The module's layer norm without the module call's hooks (a step calls it 3 times per layer)."""
    return F.layer_norm(x, norm.normalized_shape, norm.weight, norm.bias, norm.eps)


def additive_mask(mask: Tensor, dtype: torch.dtype) -> Tensor | None:
    """A bool mask (True = attend) as a float mask to add to the scores; None when nothing is masked.

    Adding 0 leaves an allowed score exactly as it was and the dtype's lowest value gives a
    masked position weight 0, so the weights equal model.transformer's `attention` (masked_fill).
    """
    if bool(mask.all()):
        return None
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)


class CastLinear(nn.Linear):
    """nn.Linear (same parameters, same names) whose weights are stored in a lower precision than the activations
    (`cast_weights`): the matmul runs in the weights' dtype, the result comes back in x's."""

    def forward(self, x: Tensor) -> Tensor:
        if x.dtype == self.weight.dtype:
            return F.linear(x, self.weight, self.bias)
        return F.linear(x.to(self.weight.dtype), self.weight, self.bias).to(x.dtype)


def cast_weights(model: Transformer, dtype: torch.dtype) -> Transformer:
    """Store the model's matrices (linear layers, embeddings) in `dtype`, e.g. bf16 on a CPU: layer norms, positions
    and final_logits_bias stay fp32, and so do the activations, each matmul running in the weights' dtype and handing
    back fp32 (`CastLinear`). Half the memory traffic and the CPU's bf16 dot-product instructions, with one rounding
    per matmul instead of one per operation. The output projection goes through `logits`. In place; returns model."""
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child) is nn.Linear:
                cast = CastLinear(child.in_features, child.out_features, child.bias is not None, device="meta")
                cast.weight = nn.Parameter(child.weight.detach().to(dtype), requires_grad=False)
                if child.bias is not None:
                    cast.bias = nn.Parameter(child.bias.detach().to(dtype), requires_grad=False)
                setattr(module, name, cast)
            elif isinstance(child, nn.Embedding):
                child.to(dtype)
    return model


def logits(model: Transformer, hidden: Tensor) -> Tensor:
    """The model's output projection + final_logits_bias for a step's hidden states.

    With weights in a lower precision than the activations (`cast_weights`) the projection over the whole vocabulary
    runs in their dtype, then each row's RESCORED_CANDIDATES best logits are recomputed from the fp32 hidden state:
    rounding 30k-wide logits to bf16 (3 significant digits) would otherwise decide the near-ties between the best
    tokens.
    """
    weight = model.output_weight
    if weight.dtype == hidden.dtype:
        return model.logits(hidden)
    bias = model.final_logits_bias
    scores = F.linear(hidden.to(weight.dtype), weight).to(hidden.dtype) + bias  # (..., V)
    candidates = scores.topk(min(RESCORED_CANDIDATES, scores.size(-1)), dim=-1).indices  # (..., m)
    exact = (weight[candidates].to(hidden.dtype) @ hidden.unsqueeze(-1)).squeeze(-1)  # (..., m)
    return scores.scatter_(-1, candidates, exact + bias[candidates])  # scores is ours: in place


def encode(model: Transformer, source_ids: Tensor, source_mask: Tensor) -> Tensor:
    """The encoder's hidden states (B, S, d_model) of source_ids (B, S) under source_mask (B, S) bool: the lecture's
    EncoderLayer arithmetic (inference: no dropout) with each attention in torch's fused kernel
    (scaled_dot_product_attention), which keeps no weights and is faster than the lecture's three steps."""
    x = model.add_positions(model.token_embeddings(model.encoder_embed_tokens, source_ids))
    allowed = source_mask[:, None, None, :]  # (B, 1, 1, S)
    for layer in model.encoder_layers:
        own = layer.self_attn
        query = own.split_heads(own.q_proj(x))  # (B, h, S, d_k)
        key, value = own.project_key_value(x)
        context = F.scaled_dot_product_attention(query, key, value, attn_mask=allowed)  # (B, h, S, d_k)
        batch, _, length, _ = query.shape
        attended = own.out_proj(context.transpose(1, 2).reshape(batch, length, own.heads * own.d_k))
        x = layer_norm(layer.self_attn_layer_norm, x + attended)
        x = layer_norm(layer.final_layer_norm, x + layer.feed_forward(x))
    return x


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
    place one step at a time; cross-attention K/V are computed once per source. A forced
    pass runs on it: every row steps at the same position, and no row moves.
    """

    self_key: list[Tensor]
    self_value: list[Tensor]
    cross_key: list[Tensor]
    cross_value: list[Tensor]
    source_mask: Tensor | None  # (rows, 1, 1, S) additive float mask over padding; None without padding
    length: int = 0
    capacity: int = 0
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
    # cache.self_mask: None when every row is at the same position (model.runtime.rows.RaggedCache sets it)
    attended, _ = attend_one(own, query, self_key, self_value, cache.self_mask, False)
    x = layer_norm(layer.self_attn_layer_norm, x + attended)
    cross = layer.encoder_attn
    query = cross.q_proj(x)  # (N, 1, d_model)
    attended, cross_weights = attend_one(
        cross, query, cache.cross_key[index], cache.cross_value[index], cache.source_mask, need_weights
    )
    x = layer_norm(layer.encoder_attn_layer_norm, x + attended)
    x = layer_norm(layer.final_layer_norm, x + layer.feed_forward(x))
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
    return logits(model, x[:, 0]), cross_attention


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
