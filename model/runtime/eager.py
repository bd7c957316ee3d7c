"""The lecture model's decoding step, one new position per row over a KV cache: the reference the compiled runtime
is tested against, and the step where it cannot be built."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from model.transformer import DecoderLayer, MultiHeadAttention, Transformer

# Where a fast mode computes logits inexactly (int8 in the compiled runtime, bf16 weights here), each row's this many
# best candidates are recomputed in fp32: the 2k candidates of beams up to 8.
RESCORED_CANDIDATES = 16


def layer_norm(norm: nn.LayerNorm, x: Tensor) -> Tensor:
    """The module's layer norm without the module call's overhead (3 per layer and step)."""
    return F.layer_norm(x, norm.normalized_shape, norm.weight, norm.bias, norm.eps)


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


def layer_step(layer: DecoderLayer, x: Tensor, cache, index: int, need_weights: bool) -> tuple[Tensor, Tensor | None]:
    """DecoderLayer.forward for one new position x (N, 1, d_model) over the rows of a decode loop."""
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


def step_layers(model: Transformer, x: Tensor, cache, need_weights: bool) -> tuple[Tensor, list[Tensor] | None]:
    """Every decoder layer's `layer_step`: the last hidden state and, when asked, each layer's cross-attention."""
    cross_attention = [] if need_weights else None
    for i, layer in enumerate(model.decoder_layers):
        x, weights = layer_step(layer, x, cache, i, need_weights)
        if need_weights:
            cross_attention.append(weights[:, :, 0])  # (N, h, S)
    return x, cross_attention
