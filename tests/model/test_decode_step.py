"""The incremental decoding step (Transformer.decode_step, the reference the compiled runtime is tested against)
against the whole-sequence forward pass on the live parameters: equal logits and cross-attention, also after weights
change in place."""

from __future__ import annotations

import copy

import pytest
import torch

from model import Translator
from model.runtime.eager import RESCORED_CANDIDATES, cast_weights, decode_step, encode, logits, start_cache

SOURCES = ["The cat sat on the mat.", "We walk to school together every morning."]


@pytest.fixture(scope="module")
def en_zh() -> Translator:
    """The shipped en-zh model on the CPU."""
    return Translator.from_pretrained("en-zh", device="cpu")


def stepwise(translator: Translator, source_ids: torch.Tensor, mask: torch.Tensor, inputs: torch.Tensor):
    """Logits (B, T, V) and cross-attention per layer (B, T, h, S), one decode_step per position."""
    model = translator.model
    with torch.inference_mode():
        cache = start_cache(model, model.encode(source_ids, mask), capacity=inputs.size(1))
        logits, attention = [], []
        for position in range(inputs.size(1)):
            step_logits, cross = decode_step(model, inputs[:, position], cache, need_weights=True)
            logits.append(step_logits)
            attention.append(torch.stack(cross, dim=1))  # (B, L, h, S)
    return torch.stack(logits, dim=1), torch.stack(attention, dim=2)  # (B, T, V), (B, L, T, h, S)


def whole_sequence(translator: Translator, source_ids: torch.Tensor, mask: torch.Tensor, inputs: torch.Tensor):
    """The same through forward with gradients on: F.linear on the parameters themselves."""
    model = translator.model
    with torch.enable_grad():
        encoder = model.encode(source_ids, mask)
        hidden, cross = model.decode(inputs, encoder, need_weights=True)
        logits = model.logits(hidden)
    return logits.detach(), torch.stack([layer.detach().transpose(1, 2) for layer in cross], dim=1)


def batch(translator: Translator):
    ids = translator.encode_source(SOURCES)
    width = max(map(len, ids))
    source = torch.full((len(ids), width), translator.config.pad_token_id)
    for row, tokens in enumerate(ids):
        source[row, : len(tokens)] = torch.tensor(tokens)
    mask = source != translator.config.pad_token_id
    targets = [nbest[0].token_ids for nbest in translator.generate(ids, beam_size=1)]
    length = min(map(len, targets))
    start = torch.full((len(ids), 1), translator.config.decoder_start_token_id)
    inputs = torch.cat([start, torch.tensor([t[: length - 1] for t in targets])], dim=1)  # teacher-forced inputs
    return source, mask, inputs


def assert_steps_match_forward(translator: Translator) -> torch.Tensor:
    source, mask, inputs = batch(translator)
    logits, attention = stepwise(translator, source, mask, inputs)
    expected_logits, expected_attention = whole_sequence(translator, source, mask, inputs)
    torch.testing.assert_close(logits, expected_logits, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(attention, expected_attention, atol=1e-5, rtol=1e-4)
    return logits


def test_decode_step_equals_the_whole_sequence_forward_pass(en_zh):
    assert_steps_match_forward(en_zh)


def test_weights_changed_in_place_are_used_by_the_next_decode():
    translator = Translator.from_pretrained("en-zh", device="cpu")  # its own: the weights are changed below
    before = assert_steps_match_forward(translator)
    layer = translator.model.decoder_layers[1]
    with torch.no_grad():  # in-place updates, as an optimizer step or load_state_dict makes them
        layer.self_attn.k_proj.weight.mul_(1.5)
        layer.encoder_attn.out_proj.weight.add_(0.01)
        layer.feed_forward.fc2.weight.mul_(0.5)
    after = assert_steps_match_forward(translator)
    assert (after - before).abs().max() > 1e-2  # the change reached the logits


def test_the_eager_encoder_equals_the_lectures_encoder(en_zh):
    """eager.encode (torch's fused attention kernel, padded batch) against the lecture's encoder, which computes each
    attention as QKᵀ → ÷√d_k → softmax → Σ weights·V and returns the weights."""
    source, mask, _ = batch(en_zh)
    with torch.inference_mode():
        fused = encode(en_zh.model, source, mask)
        lecture = en_zh.model.encode(source, mask, need_weights=True)
    assert lecture.self_attention is not None  # the lecture's path, weights and all
    torch.testing.assert_close(fused[mask], lecture.hidden[mask], atol=1e-5, rtol=1e-5)


def test_bf16_matrices_keep_fp32_activations_and_rescore_the_best_logits(en_zh):
    """cast_weights stores the matrices in bf16 under the same names; the step's logits then equal the fp32 model's
    at each row's best candidates (recomputed from the fp32 hidden state) and are close elsewhere."""
    model = copy.deepcopy(en_zh.model)
    cast_weights(model, torch.bfloat16)
    assert model.state_dict().keys() == en_zh.model.state_dict().keys()
    assert model.decoder_layers[0].feed_forward.fc1.weight.dtype == torch.bfloat16
    assert model.final_logits_bias.dtype == torch.float32 and model.positions.dtype == torch.float32
    hidden = torch.randn(3, model.config.d_model)
    with torch.inference_mode():
        rescored = logits(model, hidden)
        rounded = torch.nn.functional.linear(hidden.bfloat16(), model.output_weight).float() + model.final_logits_bias
        best = rounded.topk(RESCORED_CANDIDATES, dim=-1).indices
        exact = hidden @ model.output_weight.float().T + model.final_logits_bias  # the bf16 weights, in fp32
    assert rescored.dtype == torch.float32
    torch.testing.assert_close(rescored.gather(-1, best), exact.gather(-1, best), atol=1e-4, rtol=1e-5)
    elsewhere = torch.ones_like(rescored, dtype=torch.bool).scatter_(-1, best, False)
    torch.testing.assert_close(rescored[elsewhere], rounded[elsewhere])  # the rest: the bf16 matmul's logits
    assert (rescored.gather(-1, best) - rounded.gather(-1, best)).abs().max() > 1e-4  # the rescoring changed them
