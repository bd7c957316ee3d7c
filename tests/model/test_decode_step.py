"""The eager decoding step (the reference the compiled runtime is tested against), teacher-forced through the decode
loop, against the whole-sequence forward pass on the live parameters: equal log-probabilities and cross-attention,
also after weights change in place."""

from __future__ import annotations

import copy

import pytest
import torch

from model import Translator
from model.decoding.search import forced_pass
from model.runtime import EagerStep
from model.runtime.eager import RESCORED_CANDIDATES, cast_weights, encode, logits

SOURCES = ["The cat sat on the mat.", "We walk to school together every morning."]


@pytest.fixture(scope="module")
def en_zh() -> Translator:
    """The shipped en-zh model on the CPU."""
    return Translator.from_pretrained("en-zh", device="cpu")


def stepwise(translator: Translator, source_ids: list[int], target_ids: list[int]):
    """Each target token's log-probability (T,) and the cross-attention (L, h, T, S): one eager step per position,
    teacher-forced through the decode loop."""
    decoded = forced_pass(EagerStep(translator.model), source_ids, target_ids)
    return torch.tensor(decoded.token_logprobs), decoded.cross_attention


def whole_sequence(translator: Translator, source_ids: list[int], target_ids: list[int]):
    """The same through forward with gradients on: F.linear on the parameters themselves."""
    model = translator.model
    source = torch.tensor([source_ids])
    inputs = torch.tensor([[translator.config.decoder_start_token_id, *target_ids[:-1]]])
    with torch.enable_grad():
        encoder = model.encode(source, torch.ones_like(source, dtype=torch.bool))
        hidden, cross = model.decode(inputs, encoder, need_weights=True)
        logprobs = torch.log_softmax(model.logits(hidden)[0], dim=-1)
    chosen = logprobs.gather(1, torch.tensor(target_ids)[:, None])[:, 0]
    return chosen.detach(), torch.stack([layer[0].detach() for layer in cross])  # (T,), (L, h, T, S)


def pairs(translator: Translator) -> list[tuple[list[int], list[int]]]:
    ids = translator.encode_source(SOURCES)
    return [(source, nbest[0].token_ids) for source, nbest in zip(ids, translator.generate(ids, beam_size=1))]


def assert_steps_match_forward(translator: Translator) -> torch.Tensor:
    found = []
    for source_ids, target_ids in pairs(translator):
        logprobs, attention = stepwise(translator, source_ids, target_ids)
        expected_logprobs, expected_attention = whole_sequence(translator, source_ids, target_ids)
        torch.testing.assert_close(logprobs, expected_logprobs, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(attention, expected_attention, atol=1e-5, rtol=1e-4)
        found.append(logprobs)
    return torch.cat(found)


def test_decode_step_equals_the_whole_sequence_forward_pass(en_zh):
    assert_steps_match_forward(en_zh)


def test_weights_changed_in_place_are_used_by_the_next_decode():
    translator = Translator.from_pretrained("en-zh", device="cpu")  # its own: the weights are changed below
    before_pairs = pairs(translator)
    before = assert_steps_match_forward(translator)
    layer = translator.model.decoder_layers[1]
    with torch.no_grad():  # in-place updates, as an optimizer step or load_state_dict makes them
        layer.self_attn.k_proj.weight.mul_(1.5)
        layer.encoder_attn.out_proj.weight.add_(0.01)
        layer.feed_forward.fc2.weight.mul_(0.5)
    assert_steps_match_forward(translator)
    after = torch.cat([stepwise(translator, *pair)[0] for pair in before_pairs])  # the same targets as before
    assert (after - before).abs().max() > 1e-2  # the change reached the log-probabilities


def test_the_eager_encoder_equals_the_lectures_encoder(en_zh):
    """eager.encode (torch's fused attention kernel, padded batch) against the lecture's encoder, which computes each
    attention as QKᵀ → ÷√d_k → softmax → Σ weights·V and returns the weights."""
    ids = en_zh.encode_source(SOURCES)
    source = torch.full((len(ids), max(map(len, ids))), en_zh.config.pad_token_id)
    for row, tokens in enumerate(ids):
        source[row, : len(tokens)] = torch.tensor(tokens)
    mask = source != en_zh.config.pad_token_id
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
