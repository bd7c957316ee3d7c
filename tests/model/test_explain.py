"""Explanations are the model's own numbers: forced decoding reproduces the search, steps add up."""

from __future__ import annotations

import math

import pytest
import torch

from model import InvalidInputError, Translator
from model.explain import attention_steps, forced_decode
from tests.tiny import make_model_dir


@pytest.fixture(scope="module")
def translator(tmp_path_factory):
    return Translator.from_pretrained(
        make_model_dir(tmp_path_factory.mktemp("explain"), shared=False, seed=4), device="cpu"
    )


@pytest.fixture(scope="module")
def translation(translator):
    return translator.translate(["The quick brown fox sat on the mat."], beam_size=3, return_attention=True)[0]


def test_forced_decoding_reproduces_the_search_attention(translator, translation):
    forced = forced_decode(translator.model, translation.source_ids, translation.target_ids)
    assert torch.allclose(forced.cross_attention, translation.cross_attention, atol=1e-5)
    natural = [lp for lp, _ in zip(forced.token_logprobs, translation.token_logprobs)]
    assert natural[:-1] == pytest.approx(translation.token_logprobs[:-1], abs=1e-4)


def test_encoder_self_attention_rows_are_distributions(translator, translation):
    forced = forced_decode(translator.model, translation.source_ids, translation.target_ids)
    source_length = len(translation.source_ids)
    assert forced.encoder_self_attention.shape[-2:] == (source_length, source_length)
    assert torch.allclose(
        forced.encoder_self_attention.sum(-1), torch.ones(forced.encoder_self_attention.shape[:-1]), atol=1e-5
    )


@pytest.mark.parametrize("kind", ["cross", "encoder_self"])
def test_steps_are_consistent_with_each_other(translator, translation, kind):
    steps = attention_steps(
        translator.model, translation.source_ids, translation.target_ids, kind, layer=1, head=2, position=1
    )
    assert steps.d_k == translator.config.d_model // 4
    assert torch.allclose(steps.scores, steps.k @ steps.q, atol=1e-4)
    assert torch.allclose(steps.scaled_scores, steps.scores / math.sqrt(steps.d_k), atol=1e-4)
    assert torch.allclose(steps.weights, torch.softmax(steps.scaled_scores, -1), atol=1e-4)
    assert torch.allclose(steps.output, steps.weights @ steps.v, atol=1e-4)
    assert steps.x.shape == (len(translation.source_ids), translator.config.d_model)


def test_cross_steps_weights_equal_the_translation_map(translator, translation):
    for position in range(len(translation.target_ids)):
        steps = attention_steps(
            translator.model, translation.source_ids, translation.target_ids, "cross", 0, 3, position
        )
        assert torch.allclose(steps.weights, translation.cross_attention[0, 3, position], atol=1e-5)


def test_encoder_steps_weights_equal_the_encoder_map(translator, translation):
    forced = forced_decode(translator.model, translation.source_ids, translation.target_ids)
    steps = attention_steps(translator.model, translation.source_ids, translation.target_ids, "encoder_self", 1, 0, 2)
    assert torch.allclose(steps.weights, forced.encoder_self_attention[1, 0, 2], atol=1e-5)


@pytest.mark.parametrize(
    "arguments, message",
    [
        (dict(kind="decoder_self"), "kind"),
        (dict(layer=7), "layer"),
        (dict(head=-1), "head"),
        (dict(position=999), "position"),
    ],
)
def test_out_of_range_requests_are_refused(translator, translation, arguments, message):
    with pytest.raises(InvalidInputError, match=message):
        attention_steps(translator.model, translation.source_ids, translation.target_ids, **arguments)
