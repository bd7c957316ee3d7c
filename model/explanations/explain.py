"""Explanations from the real model: forced decoding and one head's attention, step by step.

`forced_decode` runs the decoder over a given target (teacher forcing) and returns the
same cross-attention maps and token log-probabilities the search produced for it.
`attention_steps` opens one head of one layer at one query position and lays out the
arithmetic of the seed paper: X → Q, K, V → Q·Kᵀ → ÷√d_k → softmax → Σ weights·V,
with every number taken from the model's own weights and activations.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor

from model.errors import InvalidInputError
from model.host import to_host
from model.transformer import MultiHeadAttention, Transformer

KINDS = ("cross", "encoder_self")


@dataclass
class ForcedDecode:
    source_ids: list[int]
    target_ids: list[int]
    token_logprobs: list[float]  # log-probability of each target id given its prefix
    cross_attention: Tensor  # (decoder_layers, heads, T, S)
    encoder_self_attention: Tensor | None  # (encoder_layers, heads, S, S) when asked for


@dataclass
class AttentionSteps:
    """One head's attention for one query, as a classroom walk-through with real numbers."""

    kind: str
    layer: int
    head: int
    position: int  # query position (target index for cross, source index for encoder_self)
    d_k: int
    x_query: Tensor  # (d_model,) the input vector the query is projected from
    x: Tensor  # (S, d_model) the input vectors keys and values are projected from
    q: Tensor  # (d_k,)
    k: Tensor  # (S, d_k)
    v: Tensor  # (S, d_k)
    scores: Tensor  # (S,) q · kᵀ
    scaled_scores: Tensor  # (S,) scores / √d_k
    weights: Tensor  # (S,) softmax(scaled_scores)
    output: Tensor  # (d_k,) Σ weights · v


@contextmanager
def _capture_inputs(module: torch.nn.Module, store: list):
    handle = module.register_forward_pre_hook(lambda _module, args: store.append(args[0].detach()))
    try:
        yield
    finally:
        handle.remove()


def check_ids(model: Transformer, source_ids: list[int], target_ids: list[int]) -> None:
    """Reject a source or target that is empty, longer than the model's positions, or outside its vocabulary."""
    config = model.config
    if not source_ids or not target_ids:
        raise InvalidInputError("source and target must each have at least one token")
    if max(len(source_ids), len(target_ids)) > config.max_position_embeddings:
        raise InvalidInputError(f"sequences are limited to {config.max_position_embeddings} tokens")
    if any(not 0 <= i < config.vocab_size for i in source_ids) or any(
        not 0 <= i < config.target_vocab_size for i in target_ids
    ):
        raise InvalidInputError("token id outside the vocabulary")


def teacher_forcing_inputs(model: Transformer, source_ids: list[int], target_ids: list[int]) -> tuple[Tensor, ...]:
    """What a forced decode feeds the model, on its device: the source ids (1, S), their mask (1, S) and the
    decoder inputs (1, T), the start token followed by every target id but the last."""
    device = model.final_logits_bias.device
    source = torch.tensor([source_ids], device=device)
    decoder_input = torch.tensor([[model.config.decoder_start_token_id, *target_ids[:-1]]], device=device)
    return source, torch.ones_like(source, dtype=torch.bool), decoder_input


def teacher_forcing_batch(
    pairs: list[tuple[list[int], list[int]]], indices: list[int], config
) -> tuple[Tensor, Tensor, Tensor]:
    """What a batch of forced decodes (or a training step) feeds the model, on the CPU, for `pairs[i]` (source ids,
    target ids) with i in `indices`: the source ids right-padded (B, S), their mask (B, S), and the decoder inputs
    (B, T), the start token followed by every target id but the last, padded. `teacher_forcing_inputs` for many."""
    pad = config.pad_token_id
    sources = [pairs[i][0] for i in indices]
    targets = [pairs[i][1] for i in indices]
    source_width = max(map(len, sources))
    target_width = max(map(len, targets))
    source_ids = torch.full((len(indices), source_width), pad, dtype=torch.long)
    decoder_input = torch.full((len(indices), target_width), pad, dtype=torch.long)
    for row, (source, target) in enumerate(zip(sources, targets)):
        source_ids[row, : len(source)] = torch.tensor(source)
        decoder_input[row, 0] = config.decoder_start_token_id
        decoder_input[row, 1 : len(target)] = torch.tensor(target[:-1])
    source_mask = torch.arange(source_width)[None, :] < torch.tensor([len(s) for s in sources])[:, None]
    return source_ids, source_mask, decoder_input


@torch.inference_mode()
def forced_decode(
    model: Transformer, source_ids: list[int], target_ids: list[int], encoder_attention: bool = True
) -> ForcedDecode:
    """Teacher-force `target_ids` (the generated ids, eos included) and return maps and log-probs
    (and, with encoder_attention, the encoder's self-attention; it is not computed otherwise)."""
    check_ids(model, source_ids, target_ids)
    device = model.final_logits_bias.device
    source, mask, decoder_input = teacher_forcing_inputs(model, source_ids, target_ids)
    encoder = model.encode(source, mask, need_weights=encoder_attention)
    hidden, cross = model.decode(decoder_input, encoder, need_weights=True)
    logprobs = torch.log_softmax(model.logits(hidden).float(), dim=-1)[0]  # (T, V)
    chosen = logprobs.gather(1, torch.tensor(target_ids, device=device)[:, None])[:, 0]
    encoder_maps = _first_row_maps(encoder.self_attention) if encoder_attention else None
    cross_maps = _first_row_maps(cross)
    logprobs_host, cross_host, encoder_host = to_host([chosen, cross_maps, encoder_maps])  # (T,), (L, h, T, S), …
    return ForcedDecode(list(source_ids), list(target_ids), logprobs_host.tolist(), cross_host, encoder_host)


@torch.inference_mode()
def encoder_self_attention(model: Transformer, source_ids: list[int]) -> Tensor:
    """The encoder's self-attention maps (layers, heads, S, S) of one source, on the host: `forced_decode`'s
    encoder_self_attention without the decoder's pass."""
    device = model.final_logits_bias.device
    source = torch.tensor([list(source_ids)], device=device)
    encoder = model.encode(source, torch.ones_like(source, dtype=torch.bool), need_weights=True)
    (maps,) = to_host([_first_row_maps(encoder.self_attention)])
    return maps


def _first_row_maps(per_layer: list[Tensor]) -> Tensor:
    """Per-layer attention (1, h, T, S) of a batch of one → (L, h, T, S) float32."""
    return torch.stack([maps[0] for maps in per_layer]).float()


def forced_batches(model: Transformer, pairs: list[tuple[list[int], list[int]]], batch_size: int):
    """The padded teacher-forcing batches of `pairs` (checked), pairs of similar lengths together: per batch the
    pairs' indices and the source ids, their mask and the decoder inputs on the model's device."""
    for source_ids, target_ids in pairs:
        check_ids(model, source_ids, target_ids)
    device = model.final_logits_bias.device
    order = sorted(range(len(pairs)), key=lambda i: (len(pairs[i][0]), len(pairs[i][1])))
    for first in range(0, len(order), batch_size):
        chunk = order[first : first + batch_size]
        yield (chunk, *(t.to(device) for t in teacher_forcing_batch(pairs, chunk, model.config)))


@dataclass
class ForcedReading:
    """What one forced pair gives `forced_readings`: one head's cross-attention rows (T, S), each target token's
    log-probability; None where not asked for."""

    rows: Tensor | None
    logprobs: list[float] | None


@torch.inference_mode()
def forced_readings(
    model: Transformer,
    pairs: list[tuple[list[int], list[int]]],
    rows_of: tuple[int, int | None] | None,
    logprobs: bool,
    batch_size: int = 32,
) -> list[ForcedReading]:
    """Each (source ids, target ids) pair teacher-forced, pairs of similar lengths sharing a padded batch, as
    `forced_decode` gives it up to float rounding: `rows_of` (layer, head), that head's cross-attention rows (T, S)
    (head None: the layer's head average); `logprobs`, each target token's log-probability. One pass reads both;
    rows alone stop the decoder at their layer (no later layer, no output projection). All of a batch's reads come to
    the host together."""
    device = model.final_logits_bias.device
    last = len(model.decoder_layers) - 1 if logprobs else rows_of[0]
    readings: list[ForcedReading | None] = [None] * len(pairs)
    for chunk, source, mask, decoder_input in forced_batches(model, pairs, batch_size):
        length = decoder_input.size(1)
        encoder = model.encode(source, mask)
        x = model.add_positions(model.token_embeddings(model.decoder_embed_tokens, decoder_input))
        causal = torch.ones(length, length, dtype=torch.bool, device=device).tril()  # padding comes last: unseen
        for index, decoder_layer in enumerate(model.decoder_layers[: last + 1]):
            self_key, self_value = decoder_layer.self_attn.project_key_value(x)
            cross_key, cross_value = decoder_layer.encoder_attn.project_key_value(encoder.hidden)
            wanted = rows_of is not None and index == rows_of[0]
            x, weights = decoder_layer(
                x, self_key, self_value, causal, cross_key, cross_value, encoder.mask[:, None, None, :], wanted
            )
            if wanted:
                head = rows_of[1]
                rows = weights.float().mean(dim=1) if head is None else weights[:, head].float()  # (B, T, S)
        chosen = None
        if logprobs:
            targets = torch.zeros(decoder_input.shape, dtype=torch.long)
            for row, index in enumerate(chunk):
                target_ids = pairs[index][1]
                targets[row, : len(target_ids)] = torch.tensor(target_ids)
            scores = torch.log_softmax(model.logits(x).float(), dim=-1)  # (B, T, V)
            chosen = scores.gather(2, targets.to(device)[..., None])[..., 0]
        rows_host, chosen_host = to_host([rows if rows_of is not None else None, chosen])
        for row, index in enumerate(chunk):
            source_ids, target_ids = pairs[index]
            readings[index] = ForcedReading(
                rows_host[row, : len(target_ids), : len(source_ids)] if rows_host is not None else None,
                chosen_host[row, : len(target_ids)].tolist() if chosen_host is not None else None,
            )
    return readings


def forced_alignment_rows(
    model: Transformer, pairs: list[tuple[list[int], list[int]]], layer: int, head: int | None, batch_size: int = 32
) -> list[Tensor]:
    """`forced_readings`' rows alone: for agreeing alignments after a decode (Translator.with_agreements)."""
    return [reading.rows for reading in forced_readings(model, pairs, (layer, head), False, batch_size)]


def forced_logprobs(
    model: Transformer, pairs: list[tuple[list[int], list[int]]], batch_size: int = 32
) -> list[list[float]]:
    """`forced_readings`' log-probabilities alone: the reverse model's reading of a translation (model.trust)."""
    return [reading.logprobs for reading in forced_readings(model, pairs, None, True, batch_size)]


def _head_projection(linear: torch.nn.Linear, x: Tensor, head: int, d_k: int) -> Tensor:
    """The slice of a projection that belongs to one head: x Wᵀ + b, columns head·d_k … (head+1)·d_k."""
    rows = slice(head * d_k, (head + 1) * d_k)
    return x @ linear.weight[rows].float().T + linear.bias[rows].float()


@torch.inference_mode()
def attention_steps(
    model: Transformer,
    source_ids: list[int],
    target_ids: list[int],
    kind: str = "cross",
    layer: int = 0,
    head: int = 0,
    position: int = 0,
) -> AttentionSteps:
    """Recompute one head's attention from the captured layer inputs, step by step, in float32."""
    check_ids(model, source_ids, target_ids)
    config = model.config
    if kind not in KINDS:
        raise InvalidInputError(f"kind must be one of {', '.join(KINDS)}")
    layers = config.decoder_layers if kind == "cross" else config.encoder_layers
    heads = config.decoder_attention_heads if kind == "cross" else config.encoder_attention_heads
    queries = len(target_ids) if kind == "cross" else len(source_ids)
    for name, value, limit in (("layer", layer, layers), ("head", head, heads), ("position", position, queries)):
        if not isinstance(value, int) or not 0 <= value < limit:
            raise InvalidInputError(f"{name} must be between 0 and {limit - 1}")

    source, mask, decoder_input = teacher_forcing_inputs(model, source_ids, target_ids)
    captured: list[Tensor] = []
    if kind == "cross":
        attention: MultiHeadAttention = model.decoder_layers[layer].encoder_attn
        with _capture_inputs(attention, captured):
            encoder = model.encode(source, mask)
            model.decode(decoder_input, encoder)
        x_query = captured[0][0, position].float()  # decoder state entering cross-attention
        x = encoder.hidden[0].float()  # encoder output: what keys and values are made from
    else:
        attention = model.encoder_layers[layer].self_attn
        with _capture_inputs(attention, captured):
            model.encode(source, mask)
        x = captured[0][0].float()  # the layer's input vectors
        x_query = x[position]

    d_k = attention.d_k
    q = _head_projection(attention.q_proj, x_query, head, d_k)  # (d_k,)
    k = _head_projection(attention.k_proj, x, head, d_k)  # (S, d_k)
    v = _head_projection(attention.v_proj, x, head, d_k)  # (S, d_k)
    scores = k @ q  # (S,)  q · kᵀ for every key
    scaled_scores = scores / math.sqrt(d_k)
    weights = torch.softmax(scaled_scores, dim=-1)
    output = weights @ v  # (d_k,)
    return AttentionSteps(
        kind,
        layer,
        head,
        position,
        d_k,
        x_query.cpu(),
        x.cpu(),
        q.cpu(),
        k.cpu(),
        v.cpu(),
        scores.cpu(),
        scaled_scores.cpu(),
        weights.cpu(),
        output.cpu(),
    )
