"""The incremental decoding step (Transformer.decode_step, the reference the compiled runtime is tested against)
against the whole-sequence forward pass on the live parameters: equal logits and cross-attention, also after weights
change in place."""

from __future__ import annotations

import pytest
import torch

from model import Translator
from model.runtime.eager import decode_step, start_cache

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
