"""Attributions: how much each source token and each earlier target token made each output token.

Attention weights say where a head looked, not what the prediction used (Jain & Wallace 2019). These
methods answer the second question, per target token t, as a row over the source tokens (T, S) and a
row over the decoder inputs 0..t (T, T) that together sum to 1; the source row's sum is the token's
source share, low when a token came from the target prefix rather than the source (a hallucination
signal: Dale et al. 2023).

- saliency, input_x_gradient, integrated_gradients: the gradient of p(y_t | y_<t, x) with respect to the
  token embeddings (× √d_model, before positions), reduced per token by its L2 norm, as inseq does.
- value_zeroing (Mohebbi et al. 2023): zero one token's value vectors in one layer's attention, measure
  how far that layer's output turns (1 − cosine), normalise per layer, average the layers.
- alti_plus (Ferrando et al. 2022): every attention block, residual and layer norm included, split
  into one vector per input token; a token's contribution is how close its vector lies to the block's
  output (L1); contributions roll out through the encoder, then through the decoder's layers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from model.choices import ATTRIBUTION_DEFAULT_STEPS, ATTRIBUTION_MAX_STEPS, ATTRIBUTION_METHODS
from model.errors import InputTooLongError, InvalidInputError
from model.explanations.explain import check_ids, teacher_forcing_inputs
from model.transformer import DecoderLayer, EncoderOutput, MultiHeadAttention, Transformer

METHODS = ATTRIBUTION_METHODS
DEFAULT_STEPS = ATTRIBUTION_DEFAULT_STEPS  # Gauss-Legendre points on the path, captum's (and so inseq's) default
MAX_STEPS = ATTRIBUTION_MAX_STEPS
MAX_TOKENS = 160  # source + target tokens one attribution may cover: integrated gradients runs T × steps rows
ROWS_PER_PASS = 64  # rows of one forward-and-backward pass: bounds the memory of integrated gradients
# Integrated gradients runs target tokens × steps rows of source + target tokens through the model and back: a
# 40-token pair at 50 steps (about 30,000 token-rows) takes 3.6 s on one core (bench/experiments/attributions.py).
MAX_GRADIENT_WORK = 40_000


@dataclass
class Attributions:
    """Per target token t: `source[t]` over the source tokens and `target[t]` over the decoder inputs
    (column 0 the start token, column j the target token j − 1; zero after t); each row pair sums to 1."""

    method: str
    source: Tensor  # (T, S)
    target: Tensor  # (T, T)

    @property
    def source_share(self) -> Tensor:
        """How much of each target token came from the source rather than the target prefix: (T,)."""
        return self.source.sum(-1)


@dataclass
class _Pair:
    """One (source, target) pair as tensors: source ids (1, S), decoder inputs (1, T), predicted ids (T,)."""

    source: Tensor
    decoder_input: Tensor
    target: Tensor

    @property
    def mask(self) -> Tensor:
        return torch.ones_like(self.source, dtype=torch.bool)


def attribute(
    model: Transformer,
    source_ids: list[int],
    target_ids: list[int],
    method: str,
    unknown_ids: tuple[int, int],
    steps: int | None = None,
) -> Attributions:
    """Attributions of `method` for target_ids (eos included) given source_ids.

    unknown_ids: the <unk> ids of the source and target vocabularies, the integrated-gradients
    baseline (inseq's default: <unk> everywhere except </s> and the decoder start token).
    """
    check_ids(model, source_ids, target_ids)
    if method not in METHODS:
        raise InvalidInputError(f"method must be one of {', '.join(METHODS)}")
    if len(source_ids) + len(target_ids) > MAX_TOKENS:
        raise InputTooLongError(
            f"attributions cover at most {MAX_TOKENS} source and target tokens together; "
            f"this pair has {len(source_ids) + len(target_ids)}"
        )
    if steps is not None and (method != "integrated_gradients" or not 1 <= steps <= MAX_STEPS):
        raise InvalidInputError(f"steps applies to integrated_gradients only, between 1 and {MAX_STEPS}")
    if method == "integrated_gradients":
        steps = steps or DEFAULT_STEPS
        tokens = len(source_ids) + len(target_ids)
        if len(target_ids) * steps * tokens > MAX_GRADIENT_WORK:
            fitting = MAX_GRADIENT_WORK // (len(target_ids) * tokens)
            raise InputTooLongError(
                f"integrated gradients with {steps} steps over {tokens} tokens is {len(target_ids) * steps * tokens} "
                f"token-rows of work, more than the {MAX_GRADIENT_WORK} allowed: "
                + (f"ask at most {fitting} steps for this pair" if fitting else "this pair is too long for it")
            )
    source_tensor, _, decoder_input = teacher_forcing_inputs(model, source_ids, target_ids)
    pair = _Pair(source_tensor, decoder_input, torch.tensor(target_ids, device=source_tensor.device))
    if method == "alti_plus":
        source, target = alti_plus(model, pair)
    elif method == "value_zeroing":
        source, target = _joint_normalized(*value_zeroing(model, pair))
    else:
        source, target = _gradient_attributions(model, pair, method, unknown_ids, steps or DEFAULT_STEPS)
    return Attributions(method, source.float().cpu(), target.float().cpu())


def _joint_normalized(source: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
    """Scale each row pair (source[t], target[t]) to sum to 1 together (rows of zeros stay zero)."""
    total = source.sum(-1, keepdim=True) + target.sum(-1, keepdim=True)
    total = torch.where(total == 0, torch.ones_like(total), total)
    return source / total, target / total


# ---- gradients ------------------------------------------------------------------------------------------


def _target_probabilities(model: Transformer, source: Tensor, target: Tensor, predicted: Tensor) -> Tensor:
    """p(predicted[t] | inputs) at every position t, from token embeddings source (B, S, d) and target (B, T, d)."""
    mask = torch.ones(source.shape[:2], dtype=torch.bool, device=source.device)
    hidden, _ = model.decode_embedded(target, model.encode_embedded(source, mask))  # (B, T, d)
    probabilities = model.logits(hidden).float().softmax(-1)  # (B, T, V)
    return probabilities.gather(-1, predicted.expand(source.size(0), -1)[..., None])[..., 0]  # (B, T)


def _gradients(model: Transformer, source: Tensor, target: Tensor, predicted: Tensor, steps: Tensor):
    """d p(y_steps[r]) / d inputs of row r, for rows of token embeddings source (R, S, d) and target (R, T, d).

    Rows are independent (the decoder is causal, nothing mixes rows), so one backward pass of the sum
    gives every row its own step's gradient.
    """
    source_gradients, target_gradients = [], []
    for chunk in range(0, source.size(0), ROWS_PER_PASS):
        rows = slice(chunk, chunk + ROWS_PER_PASS)
        with torch.enable_grad():
            x_source = source[rows].detach().requires_grad_(True)
            x_target = target[rows].detach().requires_grad_(True)
            probabilities = _target_probabilities(model, x_source, x_target, predicted)  # (r, T)
            chosen = probabilities.gather(1, steps[rows, None]).sum()
            grad_source, grad_target = torch.autograd.grad(chosen, (x_source, x_target))
        source_gradients.append(grad_source)
        target_gradients.append(grad_target)
    return torch.cat(source_gradients), torch.cat(target_gradients)  # (R, S, d), (R, T, d)


def gauss_legendre(steps: int) -> tuple[Tensor, Tensor]:
    """Points α on [0, 1] and their weights for integrating along the path baseline → input (captum's
    default rule): n-point Gauss–Legendre mapped from [−1, 1]."""
    nodes, weights = np.polynomial.legendre.leggauss(steps)
    return torch.tensor(0.5 * (nodes + 1)), torch.tensor(0.5 * weights)


def _gradient_attributions(
    model: Transformer, pair: _Pair, method: str, unknown_ids: tuple[int, int], steps: int
) -> tuple[Tensor, Tensor]:
    with torch.no_grad():
        source = model.token_embeddings(model.encoder_embed_tokens, pair.source)  # (1, S, d)
        target = model.token_embeddings(model.decoder_embed_tokens, pair.decoder_input)  # (1, T, d)
    length = pair.target.numel()
    step_of_row = torch.arange(length, device=source.device)  # row t explains target token t
    if method in ("saliency", "input_x_gradient"):
        grad_source, grad_target = _gradients(
            model, source.expand(length, -1, -1), target.expand(length, -1, -1), pair.target, step_of_row
        )
        if method == "input_x_gradient":
            grad_source, grad_target = grad_source * source, grad_target * target
    else:  # integrated gradients: (x − x') · ∫₀¹ ∇p(x' + α(x − x')) dα
        base_source, base_target = _baseline(model, pair, unknown_ids)
        alphas, weights = (t.to(source) for t in gauss_legendre(steps))
        path = alphas[:, None, None, None]  # (n, 1, 1, 1)
        path_source = (base_source + path * (source - base_source)).repeat(length, 1, 1, 1)  # (T·n, 1, S, d)
        path_target = (base_target + path * (target - base_target)).repeat(length, 1, 1, 1)
        grad_source, grad_target = _gradients(
            model, path_source[:, 0], path_target[:, 0], pair.target, step_of_row.repeat_interleave(steps)
        )
        weight = weights.repeat(length)[:, None, None]  # (T·n, 1, 1)
        grad_source = (grad_source * weight).view(length, steps, *source.shape[1:]).sum(1) * (source - base_source)
        grad_target = (grad_target * weight).view(length, steps, *target.shape[1:]).sum(1) * (target - base_target)
    source_scores = grad_source.norm(dim=-1)  # (T, S): one number per token, the L2 norm over d_model
    target_scores = grad_target.norm(dim=-1).tril()  # (T, T): nothing after the step (its gradient is 0)
    return _joint_normalized(source_scores, target_scores)


def _baseline(model: Transformer, pair: _Pair, unknown_ids: tuple[int, int]) -> tuple[Tensor, Tensor]:
    """inseq's default baseline: <unk> for every token but </s> (source) and the decoder start token."""
    eos = model.config.eos_token_id
    source = torch.where(pair.source == eos, pair.source, torch.full_like(pair.source, unknown_ids[0]))
    target = torch.full_like(pair.decoder_input, unknown_ids[1])
    target[:, 0] = pair.decoder_input[:, 0]
    with torch.no_grad():
        return (
            model.token_embeddings(model.encoder_embed_tokens, source),
            model.token_embeddings(model.decoder_embed_tokens, target),
        )


# ---- value zeroing --------------------------------------------------------------------------------------

ZEROING_THRESHOLD = 1e-5  # distances below this count as no change (inseq's min_score_threshold)


@torch.inference_mode()
def value_zeroing(model: Transformer, pair: _Pair) -> tuple[Tensor, Tensor]:
    """Per decoder layer, the change (1 − cosine) of the layer's output at each target position when one
    source token's cross-attention values, or one earlier target position's self-attention values, are
    zeroed in that layer alone; each layer's rows normalised to sum 1, then averaged over layers.
    Returns (source (T, S), target (T, T)), each row summing to 1 (before the joint normalisation)."""
    encoder = model.encode(pair.source, pair.mask)
    x = model.embed(model.decoder_embed_tokens, pair.decoder_input)  # (1, T, d)
    length = x.size(1)
    causal = torch.ones(length, length, dtype=torch.bool, device=x.device).tril()
    source_mask = encoder.mask[:, None, None, :]
    source_layers, target_layers = [], []
    for layer in model.decoder_layers:
        x, source_scores, target_scores = _zeroing_layer(layer, x, encoder.hidden, causal, source_mask)
        source_layers.append(source_scores)
        target_layers.append(target_scores)
    return torch.stack(source_layers).mean(0), torch.stack(target_layers).mean(0)


def _zeroing_layer(
    layer: DecoderLayer, x: Tensor, encoder_hidden: Tensor, causal: Tensor, source_mask: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """One decoder layer with clean input x (1, T, d): its clean output and the (T, S) and (T, T) scores."""
    self_key, self_value = layer.self_attn.project_key_value(x)  # (1, h, T, d_k)
    cross_key, cross_value = layer.encoder_attn.project_key_value(encoder_hidden)  # (1, h, S, d_k)

    def run(self_value: Tensor, cross_value: Tensor) -> Tensor:
        rows = max(self_value.size(0), cross_value.size(0))
        out, _ = layer(
            x.expand(rows, -1, -1), self_key.expand(rows, -1, -1, -1), self_value.expand(rows, -1, -1, -1), causal,
            cross_key.expand(rows, -1, -1, -1), cross_value.expand(rows, -1, -1, -1), source_mask, False,
        )
        return out  # (rows, T, d)

    clean = run(self_value, cross_value)
    source_scores = _zeroing_scores(clean, run(self_value, _zero_each_position(cross_value)))  # (T, S)
    target_scores = _zeroing_scores(clean, run(_zero_each_position(self_value), cross_value))  # (T, T)
    return clean, source_scores, target_scores.tril()  # target position j only matters from t = j on


def _zero_each_position(value: Tensor) -> Tensor:
    """value (1, h, N, d_k) → (N, h, N, d_k): copy j has position j's value vectors (every head) zeroed."""
    positions = value.size(2)
    keep = 1 - torch.eye(positions, dtype=value.dtype, device=value.device)  # (N, N)
    return value * keep[:, None, :, None]


def _zeroing_scores(clean: Tensor, corrupted: Tensor) -> Tensor:
    """clean (1, T, d), corrupted (N, T, d), row j zeroed at token j → (T, N) distances, each row summing to 1."""
    distance = 1 - F.cosine_similarity(clean.float(), corrupted.float(), dim=-1).T  # (T, N)
    distance = torch.where(distance < ZEROING_THRESHOLD, torch.zeros_like(distance), distance)
    return _rows_summing_to_one(distance)


def _rows_summing_to_one(scores: Tensor) -> Tensor:
    total = scores.sum(-1, keepdim=True)
    return scores / torch.where(total == 0, torch.ones_like(total), total)


# ---- ALTI+ ----------------------------------------------------------------------------------------------


def block_contributions(
    attention: MultiHeadAttention,
    norm: torch.nn.LayerNorm,
    weights: Tensor,
    values_from: Tensor,
    residual: Tensor,
    self_attention: bool,
) -> Tensor:
    """ALTI's contributions of one attention block, residual and post-norm included (Ferrando et al. 2022).

    weights (h, T, N) the block's attention; values_from (N, d) the vectors keys and values are made
    from; residual (T, d) the block's input at the query positions. The block's output before the norm
    is y_i = Σ_j T_i(x_j) + b_O with T_i(x_j) = Σ_h A_h[i, j] (x_j W_V^h + b_V^h) W_O^h, plus the residual:
    added to T_i(x_i) in self-attention, a further input (column N) in cross-attention. The layer norm
    is linear once its scale 1/σ(y_i) is fixed: T'_i(x_j) = γ ⊙ (T_i(x_j) − mean T_i(x_j)) / σ(y_i), and
    the block's output LN(y_i) = Σ_j T'_i(x_j) + γ ⊙ (b_O − mean b_O) / σ(y_i) + β. Contribution of
    x_j to output i: max(0, ‖LN(y_i)‖₁ − ‖LN(y_i) − T'_i(x_j)‖₁), normalised over j.
    Returns (T, N) for self-attention, (T, N + 1) for cross-attention (last column: the residual).
    """
    heads, d_k = attention.heads, attention.d_k
    value = attention.v_proj(values_from).view(-1, heads, d_k).transpose(0, 1)  # (h, N, d_k)
    w_out = attention.out_proj.weight.view(-1, heads, d_k).permute(1, 2, 0)  # (h, d_k, d)
    value_out = value @ w_out  # (h, N, d): each position's value vector through W_O, per head
    parts = torch.einsum("htn,hnd->tnd", weights, value_out)  # (T, N, d): T_i(x_j)
    if self_attention:
        parts = parts + torch.diag_embed(residual.T).permute(1, 2, 0)  # residual joins T_i(x_i)
    else:
        parts = torch.cat([parts, residual[:, None, :]], dim=1)  # residual as one more input
    bias = attention.out_proj.bias
    output = parts.sum(1) + bias  # (T, d): y_i
    scale = (output.var(-1, unbiased=False, keepdim=True) + norm.eps).rsqrt()  # (T, 1): 1/σ(y_i)
    transformed = norm.weight * (parts - parts.mean(-1, keepdim=True)) * scale[:, None]  # (T, N, d)
    resultant = transformed.sum(1) + norm.weight * (bias - bias.mean()) * scale + norm.bias  # (T, d) = LN(y_i)
    distance = (resultant[:, None, :] - transformed).abs().sum(-1)  # (T, N)
    closeness = (resultant.abs().sum(-1, keepdim=True) - distance).clamp(min=0)
    return _rows_summing_to_one(closeness)


@torch.inference_mode()
def alti_plus(model: Transformer, pair: _Pair) -> tuple[Tensor, Tensor]:
    """ALTI+ (Ferrando et al. 2022): the encoder's contributions rolled out over its layers, then the
    decoder's, where a layer's cross-attention brings in the encoder's rollout and its residual carries
    the self-attention's mixing of the target prefix. Returns (source (T, S), target (T, T)), rows summing to 1."""
    x = model.embed(model.encoder_embed_tokens, pair.source)  # (1, S, d)
    attend = pair.mask[:, None, None, :]
    encoder_rollout = None
    for layer in model.encoder_layers:
        layer_input = x[0].float()
        x, weights = layer(x, attend, True)  # the layer's output and the self-attention weights it used
        contributions = block_contributions(
            layer.self_attn, layer.self_attn_layer_norm, weights[0].float(), layer_input, layer_input, True
        )  # (S, S)
        encoder_rollout = contributions if encoder_rollout is None else contributions @ encoder_rollout
    encoder = EncoderOutput(x, pair.mask)

    y = model.embed(model.decoder_embed_tokens, pair.decoder_input)  # (1, T, d)
    length, source_length = y.size(1), x.size(1)
    causal = torch.ones(length, length, dtype=torch.bool, device=y.device).tril()
    source_mask = encoder.mask[:, None, None, :]
    rollout = None  # (T, S + T): [source | target prefix]
    for layer in model.decoder_layers:
        self_key, self_value = layer.self_attn.project_key_value(y)
        attended, self_weights = layer.self_attn(y, self_key, self_value, causal, need_weights=True)
        mixed = layer.self_attn_layer_norm(y + attended)  # the cross-attention's queries and residual
        self_contributions = block_contributions(
            layer.self_attn, layer.self_attn_layer_norm, self_weights[0].float(), y[0].float(), y[0].float(), True
        )  # (T, T)
        cross_key, cross_value = layer.encoder_attn.project_key_value(x)
        _, cross_weights = layer.encoder_attn(mixed, cross_key, cross_value, source_mask, need_weights=True)
        cross_contributions = block_contributions(
            layer.encoder_attn, layer.encoder_attn_layer_norm, cross_weights[0].float(), x[0].float(),
            mixed[0].float(), False,
        )  # (T, S + 1)
        from_source = cross_contributions[:, :source_length] @ encoder_rollout  # (T, S)
        from_prefix = cross_contributions[:, source_length:] * self_contributions  # (T, T): via the residual
        if rollout is None:
            rollout = torch.cat([from_source, from_prefix], dim=-1)
        else:
            rollout = torch.cat(
                [from_source + from_prefix @ rollout[:, :source_length], from_prefix @ rollout[:, source_length:]],
                dim=-1,
            )
            rollout = _rows_summing_to_one(rollout)
        y, _ = layer(y, self_key, self_value, causal, cross_key, cross_value, source_mask, False)
    return rollout[:, :source_length], rollout[:, source_length:]
