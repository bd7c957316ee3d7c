"""The Transformer encoder-decoder of "Attention Is All You Need", shaped as Marian.

One small module per idea: attention, feed-forward, encoder layer, decoder layer,
encoder, decoder, and the whole model. Parameter names follow transformers' Marian
so checkpoints map one-to-one (see model/checkpoint.py). Post-norm ("Add & Norm")
layers, static sinusoidal positions, output projection plus `final_logits_bias`.

Attention weights fall out of the computation (the Annotated Transformer's
`attention` returns `p_attn`): when asked for, every attention module returns the
softmax weights it actually used, so explanations are the model's own numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from model.config import ModelConfig

_ACTIVATIONS = {
    "swish": F.silu,
    "silu": F.silu,
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_fast": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
}


def sinusoidal_positions(num_positions: int, dim: int) -> Tensor:
    """Static positional encodings, Marian layout: sin in the first half, cos in the second.

    PE(pos, k) = sin(pos / 10000^(2k/d)) for k < d/2 and cos(...) for the second half,
    computed in float64 like transformers' Marian so the two agree to the last bit.
    """
    position = torch.arange(num_positions, dtype=torch.float64).unsqueeze(1)  # (P, 1)
    even = torch.arange(0, dim, 2, dtype=torch.float64)  # 2k for k = 0, 1, ...
    odd = torch.arange(1, dim, 2, dtype=torch.float64) - 1  # 2k for the cos features
    table = torch.empty(num_positions, dim, dtype=torch.float64)
    sentinel = (dim + 1) // 2
    table[:, :sentinel] = torch.sin(position / torch.pow(10000.0, even / dim))
    table[:, sentinel:] = torch.cos(position / torch.pow(10000.0, odd / dim))
    return table.float()


def attention(
    query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None, dropout: float = 0.0
) -> tuple[Tensor, Tensor]:
    """Scaled dot-product attention: softmax(Q Kᵀ / √d_k) V, returning the weights too.

    query (B, h, T, d_k), key and value (B, h, S, d_k); mask broadcastable to (B, h, T, S),
    True where attending is allowed. dropout (training): drops weights before they average V;
    the weights returned are the softmax's.
    """
    d_k = query.size(-1)
    scores = torch.matmul(query, key.transpose(-2, -1)) * (d_k**-0.5)  # (B, h, T, S)
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = scores.softmax(dim=-1)  # (B, h, T, S)
    dropped = F.dropout(weights, dropout) if dropout > 0.0 else weights
    return torch.matmul(dropped, value), weights  # (B, h, T, d_k), (B, h, T, S)



class MultiHeadAttention(nn.Module):
    """Multi-head attention with the projections named as in transformers (q/k/v/out_proj)."""

    def __init__(self, d_model: int, heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.heads = heads
        self.d_k = d_model // heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        self.dropout = dropout

    def split_heads(self, x: Tensor) -> Tensor:
        batch, length, _ = x.shape
        return x.view(batch, length, self.heads, self.d_k).transpose(1, 2)  # (B, h, T, d_k)

    def project_key_value(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """K and V for every position of x (B, S, d_model) → two (B, h, S, d_k)."""
        return self.split_heads(self.k_proj(x)), self.split_heads(self.v_proj(x))

    def forward(
        self,
        x: Tensor,
        key: Tensor,
        value: Tensor,
        mask: Tensor | None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from x (B, T, d_model) over precomputed key/value (B, h, S, d_k)."""
        return self.attend(self.split_heads(self.q_proj(x)), key, value, mask, need_weights)

    def attend(
        self, query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None, need_weights: bool = False
    ) -> tuple[Tensor, Tensor | None]:
        """Heads already split: query (B, h, T, d_k) over key/value (B, h, S, d_k) → (B, T, d_model), weights."""
        batch, _, length, _ = query.shape
        context, weights = attention(query, key, value, mask, self.dropout if self.training else 0.0)
        context = context.transpose(1, 2).reshape(batch, length, self.heads * self.d_k)  # concatenate heads
        return self.out_proj(context), weights if need_weights else None


class FeedForward(nn.Module):
    """Position-wise FFN: fc2(activation(fc1(x)))."""

    def __init__(self, d_model: int, ffn_dim: int, activation: str, dropout: float) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_model, ffn_dim)
        self.fc2 = nn.Linear(ffn_dim, d_model)
        self.activation = _ACTIVATIONS[activation]
        self.activation_dropout = dropout

    def forward(self, x: Tensor) -> Tensor:
        hidden = self.activation(self.fc1(x))
        if self.training:
            hidden = F.dropout(hidden, self.activation_dropout, True)
        return self.fc2(hidden)


class EncoderLayer(nn.Module):
    """Self-attention → Add & Norm → FFN → Add & Norm."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        d = config.d_model
        self.self_attn = MultiHeadAttention(d, config.encoder_attention_heads, config.attention_dropout)
        self.self_attn_layer_norm = nn.LayerNorm(d)
        self.feed_forward = FeedForward(
            d, config.encoder_ffn_dim, config.activation_function, config.activation_dropout
        )
        self.final_layer_norm = nn.LayerNorm(d)
        self.dropout = config.dropout

    def forward(self, x: Tensor, mask: Tensor, need_weights: bool) -> tuple[Tensor, Tensor | None]:
        key, value = self.self_attn.project_key_value(x)
        attended, weights = self.self_attn(x, key, value, mask, need_weights)
        x = self.self_attn_layer_norm(x + F.dropout(attended, self.dropout, self.training))
        x = self.final_layer_norm(x + F.dropout(self.feed_forward(x), self.dropout, self.training))
        return x, weights


class DecoderLayer(nn.Module):
    """Masked self-attention → Add & Norm → cross-attention → Add & Norm → FFN → Add & Norm."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        d = config.d_model
        heads = config.decoder_attention_heads
        self.self_attn = MultiHeadAttention(d, heads, config.attention_dropout)
        self.self_attn_layer_norm = nn.LayerNorm(d)
        self.encoder_attn = MultiHeadAttention(d, heads, config.attention_dropout)
        self.encoder_attn_layer_norm = nn.LayerNorm(d)
        self.feed_forward = FeedForward(
            d, config.decoder_ffn_dim, config.activation_function, config.activation_dropout
        )
        self.final_layer_norm = nn.LayerNorm(d)
        self.dropout = config.dropout

    def forward(
        self,
        x: Tensor,
        self_key: Tensor,
        self_value: Tensor,
        self_mask: Tensor | None,
        cross_key: Tensor,
        cross_value: Tensor,
        source_mask: Tensor,
        need_weights: bool,
    ) -> tuple[Tensor, Tensor | None]:
        attended, _ = self.self_attn(x, self_key, self_value, self_mask, need_weights=False)
        x = self.self_attn_layer_norm(x + F.dropout(attended, self.dropout, self.training))
        attended, cross_weights = self.encoder_attn(x, cross_key, cross_value, source_mask, need_weights)
        x = self.encoder_attn_layer_norm(x + F.dropout(attended, self.dropout, self.training))
        x = self.final_layer_norm(x + F.dropout(self.feed_forward(x), self.dropout, self.training))
        return x, cross_weights


@dataclass
class EncoderOutput:
    hidden: Tensor  # (B, S, d_model)
    mask: Tensor  # (B, S) bool, True at real tokens
    self_attention: list[Tensor] | None = None  # per layer (B, h, S, S)


class Transformer(nn.Module):
    """Encoder-decoder with Marian's parameter layout.

    `model.shared` holds the embeddings when source and target share a vocabulary;
    otherwise `model.encoder.embed_tokens` and `model.decoder.embed_tokens`.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        d = config.d_model
        self.embed_scale = math.sqrt(d) if config.scale_embedding else 1.0
        if config.share_encoder_decoder_embeddings:
            self.shared = nn.Embedding(config.vocab_size, d)
            self.encoder_embed_tokens = self.shared
            self.decoder_embed_tokens = self.shared
        else:
            self.encoder_embed_tokens = nn.Embedding(config.vocab_size, d)
            self.decoder_embed_tokens = nn.Embedding(config.target_vocab_size, d)
        self.register_buffer(
            "positions", sinusoidal_positions(config.max_position_embeddings, d), persistent=False
        )
        self.encoder_layers = nn.ModuleList(EncoderLayer(config) for _ in range(config.encoder_layers))
        self.decoder_layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.decoder_layers))
        if config.tie_word_embeddings:
            self.lm_head = None
        else:
            self.lm_head = nn.Linear(d, config.target_vocab_size, bias=False)
        self.register_buffer("final_logits_bias", torch.zeros(config.target_vocab_size))

    def untie_embeddings(self) -> None:
        """Give encoder and decoder their own embedding tables (checkpoints that store them apart)."""
        if self.encoder_embed_tokens is not self.decoder_embed_tokens:
            return
        shared = self.encoder_embed_tokens
        self.encoder_embed_tokens = nn.Embedding.from_pretrained(shared.weight.detach().clone(), freeze=False)
        self.decoder_embed_tokens = nn.Embedding.from_pretrained(shared.weight.detach().clone(), freeze=False)
        if hasattr(self, "shared"):
            del self.shared

    # ---- embeddings -------------------------------------------------------------------
    def embed(self, table: nn.Embedding, token_ids: Tensor, start: int = 0) -> Tensor:
        """Token embedding × √d_model (when scale_embedding) + sinusoidal position."""
        return self.add_positions(self.token_embeddings(table, token_ids), start)

    def token_embeddings(self, table: nn.Embedding, token_ids: Tensor) -> Tensor:
        """Token embedding × √d_model (when scale_embedding), before positions: what attributions differentiate."""
        return table(token_ids).to(self.positions.dtype) * self.embed_scale

    def add_positions(self, x: Tensor, start: int = 0) -> Tensor:
        """x (B, T, d_model) + the sinusoidal positions start … start + T - 1 (then dropout when training)."""
        length = x.size(1)
        if start + length > self.positions.size(0):
            raise ValueError(
                f"sequence of {start + length} positions exceeds max_position_embeddings={self.positions.size(0)}"
            )
        return F.dropout(x + self.positions[start : start + length], self.config.dropout, self.training)

    @property
    def output_weight(self) -> Tensor:
        return self.decoder_embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def logits(self, hidden: Tensor) -> Tensor:
        """Linear output projection + final_logits_bias (softmax is left to the caller)."""
        return F.linear(hidden, self.output_weight, self.final_logits_bias)

    # ---- encoder ----------------------------------------------------------------------
    def encode(self, source_ids: Tensor, source_mask: Tensor, need_weights: bool = False) -> EncoderOutput:
        """source_ids (B, S) and source_mask (B, S) bool → hidden states (B, S, d_model)."""
        embedded = self.token_embeddings(self.encoder_embed_tokens, source_ids)  # (B, S, d_model)
        return self.encode_embedded(embedded, source_mask, need_weights)

    def encode_embedded(self, embedded: Tensor, source_mask: Tensor, need_weights: bool = False) -> EncoderOutput:
        """`encode` from token embeddings (B, S, d_model) instead of ids (positions are added here)."""
        x = self.add_positions(embedded)
        attend = source_mask[:, None, None, :]  # (B, 1, 1, S)
        self_attention = [] if need_weights else None
        for layer in self.encoder_layers:
            x, weights = layer(x, attend, need_weights)
            if need_weights:
                self_attention.append(weights)
        return EncoderOutput(x, source_mask, self_attention)

    # ---- decoder, whole sequence (training, forced decoding) -------------------------
    def decode(
        self, target_ids: Tensor, encoder: EncoderOutput, need_weights: bool = False
    ) -> tuple[Tensor, list[Tensor] | None]:
        """Teacher-forced decoder over target_ids (B, T) → hidden (B, T, d), cross-attention per layer."""
        embedded = self.token_embeddings(self.decoder_embed_tokens, target_ids)  # (B, T, d_model)
        return self.decode_embedded(embedded, encoder, need_weights)

    def decode_embedded(
        self, embedded: Tensor, encoder: EncoderOutput, need_weights: bool = False
    ) -> tuple[Tensor, list[Tensor] | None]:
        """`decode` from token embeddings (B, T, d_model) instead of ids (positions are added here)."""
        x = self.add_positions(embedded)
        source_mask = encoder.mask[:, None, None, :]  # (B, 1, 1, S)
        length = x.size(1)
        causal = torch.ones(length, length, dtype=torch.bool, device=x.device).tril()  # (T, T)
        cross_attention = [] if need_weights else None
        for layer in self.decoder_layers:
            self_key, self_value = layer.self_attn.project_key_value(x)
            cross_key, cross_value = layer.encoder_attn.project_key_value(encoder.hidden)
            x, weights = layer(x, self_key, self_value, causal, cross_key, cross_value, source_mask, need_weights)
            if need_weights:
                cross_attention.append(weights)
        return x, cross_attention

    def forward(self, source_ids: Tensor, source_mask: Tensor, target_ids: Tensor) -> Tensor:
        """Training forward: logits (B, T, V) for every target position."""
        hidden, _ = self.decode(target_ids, self.encode(source_ids, source_mask))
        return self.logits(hidden)
