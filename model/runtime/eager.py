"""The lecture model's decoding step, one new position per row over a KV cache: the reference the compiled runtime
is tested against, and the step where it cannot be built."""

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
    """The module's layer norm without the module call's overhead (3 per layer and step)."""
    return F.layer_norm(x, norm.normalized_shape, norm.weight, norm.bias, norm.eps)


def additive_mask(mask: Tensor, dtype: torch.dtype) -> Tensor | None:
    """A bool mask (True = attend) as an additive one (0, or the dtype's lowest: weight exactly 0); None when
    nothing is masked."""
    if bool(mask.all()):
        return None
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)


class CastLinear(nn.Linear):
    """nn.Linear whose weights are in a lower precision than the activations: it runs in theirs, returns x's."""

    def forward(self, x: Tensor) -> Tensor:
        if x.dtype == self.weight.dtype:
            return F.linear(x, self.weight, self.bias)
        return F.linear(x.to(self.weight.dtype), self.weight, self.bias).to(x.dtype)


def cast_weights(model: Transformer, dtype: torch.dtype) -> Transformer:
    """The model's matrices in `dtype` (bf16 on a CPU: half the memory traffic), norms, positions and activations
    fp32, one rounding per matmul. In place; returns model."""
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
    """The output projection + final_logits_bias. Under `cast_weights` each row's RESCORED_CANDIDATES best are
    recomputed in fp32: bf16's 3 digits would otherwise decide the near-ties between the best tokens."""
    weight = model.output_weight
    if weight.dtype == hidden.dtype:
        return model.logits(hidden)
    bias = model.final_logits_bias
    scores = F.linear(hidden.to(weight.dtype), weight).to(hidden.dtype) + bias  # (..., V)
    candidates = scores.topk(min(RESCORED_CANDIDATES, scores.size(-1)), dim=-1).indices  # (..., m)
    exact = (weight[candidates].to(hidden.dtype) @ hidden.unsqueeze(-1)).squeeze(-1)  # (..., m)
    return scores.scatter_(-1, candidates, exact + bias[candidates])  # scores is ours: in place


def encode(model: Transformer, source_ids: Tensor, source_mask: Tensor) -> Tensor:
    """The encoder's hidden states (B, S, d_model): the lecture's arithmetic, its attention in torch's fused kernel
    (it keeps no weights, and is faster)."""
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
    """model.transformer's `attention` for one query per row, then `out_proj`: (N, 1, d_model), weights (N, h, 1, t).
    query (N, h, 1, d_k) or (N, 1, h·d_k); key/value (N, h, t, d_k); mask additive (N, 1, 1, t) or None."""
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
    """Per-layer K/V of a forced pass: every row at the same position, none moving."""

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
    """DecoderLayer.forward for one new position x (N, 1, d_model) over the cache."""
    own = layer.self_attn
    query = own.split_heads(own.q_proj(x))  # (N, h, 1, d_k)
    key, value = own.project_key_value(x)  # (N, h, 1, d_k) each
    self_key, self_value = cache.append(index, key, value)  # (N, h, t, d_k)
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
    """Every decoder layer's cross-attention K and V (rows, h, S, d_k) of `hidden` (B, S, d_model), each source's
    on its `beams` rows (an int, or one per source)."""
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
    """A forced pass's cache for `capacity` steps; cross: the K/V already projected, else projected here."""
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
    """ValueError when step `step` does not fit the cache or the model's positions."""
    if step >= capacity:
        raise ValueError(f"decoder cache holds {capacity} steps; step {step} does not fit")
    if step >= model.positions.size(0):
        raise ValueError(f"position {step} exceeds max_position_embeddings={model.positions.size(0)}")


def decode_step(
    model: Transformer, last_ids: Tensor, cache: DecoderCache, need_weights: bool = False
) -> tuple[Tensor, list[Tensor] | None]:
    """One forced step: last_ids (N,) → logits (N, V) and cross-attention per layer (N, h, S)."""
    step = cache.length
    check_room(model, step, cache.capacity)
    x = model.embed(model.decoder_embed_tokens, last_ids[:, None], start=step)  # (N, 1, d)
    x, cross_attention = step_layers(model, x, cache, need_weights)
    cache.length = step + 1
    return logits(model, x[:, 0]), cross_attention


def step_layers(
    model: Transformer, x: Tensor, cache: DecoderCache, need_weights: bool
) -> tuple[Tensor, list[Tensor] | None]:
    """Every decoder layer's `layer_step`: the last hidden state and, when asked, each layer's cross-attention."""
    cross_attention = [] if need_weights else None
    for i, layer in enumerate(model.decoder_layers):
        x, weights = layer_step(layer, x, cache, i, need_weights)
        if need_weights:
            cross_attention.append(weights[:, :, 0])  # (N, h, S)
    return x, cross_attention
