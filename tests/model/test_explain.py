"""Explanations are the model's own numbers: forced decoding reproduces the search, and every step
of one head's attention equals what transformers' MarianMTModel (the independent oracle) computes."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch

from model import InvalidInputError
from model.explanations.explain import attention_steps, forced_alignment_rows, forced_decode, forced_logprobs

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def translation(translator):
    return translator.translate(["The quick brown fox sat on the mat."], beam_size=3, return_attention=True)[0]


@pytest.fixture(scope="module")
def reference(model_dir):
    return transformers.MarianMTModel.from_pretrained(model_dir, attn_implementation="eager").eval()


def run_reference(reference, translation):
    """The oracle teacher-forced on the translation (batch of one)."""
    decoder_input = [reference.config.decoder_start_token_id, *translation.target_ids[:-1]]
    return reference(
        input_ids=torch.tensor([translation.source_ids]),
        decoder_input_ids=torch.tensor([decoder_input]),
        output_attentions=True,
        use_cache=False,
    )


@dataclass
class ReferenceLayer:
    """One attention layer of the oracle: what its projections received and returned, and its weights."""

    query_input: torch.Tensor  # (queries, d_model) the vectors queries are projected from
    key_input: torch.Tensor  # (S, d_model) the vectors keys and values are projected from
    q: torch.Tensor  # (queries, d_model) every head's query, side by side
    k: torch.Tensor  # (S, d_model)
    v: torch.Tensor  # (S, d_model)
    heads_output: torch.Tensor  # (queries, d_model) every head's Σ weights·V, before the output projection
    weights: torch.Tensor  # (heads, queries, S)


def reference_layer(reference, translation, kind: str, layer: int) -> ReferenceLayer:
    if kind == "cross":
        attention = reference.model.decoder.layers[layer].encoder_attn
    else:
        attention = reference.model.encoder.layers[layer].self_attn
    seen: dict[str, torch.Tensor] = {}

    def record(name: str, tensor: torch.Tensor) -> None:  # returns None: the oracle's computation is left as is
        seen[name] = tensor[0].detach().clone()  # batch row 0

    hooks = [attention.out_proj.register_forward_pre_hook(lambda _module, inputs: record("heads_output", inputs[0]))]
    for name in ("q", "k", "v"):
        projection = getattr(attention, f"{name}_proj")
        hooks.append(
            projection.register_forward_pre_hook(lambda _m, inputs, name=name: record(name + "_in", inputs[0]))
        )
        hooks.append(projection.register_forward_hook(lambda _m, _inputs, output, name=name: record(name, output)))
    try:
        with torch.no_grad():
            output = run_reference(reference, translation)
    finally:
        for hook in hooks:
            hook.remove()
    weights = (output.cross_attentions if kind == "cross" else output.encoder_attentions)[layer][0]
    return ReferenceLayer(seen["q_in"], seen["k_in"], seen["q"], seen["k"], seen["v"], seen["heads_output"], weights)


def test_forced_decoding_reproduces_the_search(translator, translation):
    forced = forced_decode(translator.model, translation.source_ids, translation.target_ids)
    assert torch.allclose(forced.cross_attention, translation.cross_attention, atol=1e-5)
    # the search closed this output at its length budget with a forced </s> (log-probability 0);
    # every earlier token is the model's own choice, with the log-probability teacher forcing gives it
    assert translation.target_ids[-1] == translator.config.eos_token_id and translation.token_logprobs[-1] == 0.0
    assert len(forced.token_logprobs) == len(translation.token_logprobs)
    assert forced.token_logprobs[:-1] == pytest.approx(translation.token_logprobs[:-1], abs=1e-4)


def test_forced_decoding_gives_the_oracles_maps_and_log_probabilities(translator, translation, reference):
    forced = forced_decode(translator.model, translation.source_ids, translation.target_ids)
    with torch.no_grad():
        expected = run_reference(reference, translation)
    logprobs = torch.log_softmax(expected.logits[0], dim=-1)
    target = torch.tensor(translation.target_ids)
    assert forced.token_logprobs == pytest.approx(logprobs[torch.arange(len(target)), target].tolist(), abs=1e-4)
    assert torch.allclose(forced.cross_attention, torch.stack([a[0] for a in expected.cross_attentions]), atol=1e-5)
    assert torch.allclose(
        forced.encoder_self_attention, torch.stack([a[0] for a in expected.encoder_attentions]), atol=1e-5
    )


def test_batched_forced_log_probabilities_are_the_oracles_of_each_pair(translator, reference):
    """The reverse-model reading trust "full" uses: each target token's log-probability, pairs of different
    lengths sharing padded batches, as transformers gives it for that pair alone."""
    texts = ["The quick brown fox sat on the mat.", "Hi.", "A much longer sentence with many more words in it."]
    pairs = [(t.source_ids, t.target_ids) for t in translator.translate(texts, beam_size=2)]
    pairs.append((pairs[0][0], pairs[2][1]))  # a target that is not the source's translation
    for batch_size in (32, 2):
        for (source_ids, target_ids), got in zip(pairs, forced_logprobs(translator.exact_model, pairs, batch_size)):
            decoder_input = [reference.config.decoder_start_token_id, *target_ids[:-1]]
            with torch.no_grad():
                logits = reference(
                    input_ids=torch.tensor([source_ids]), decoder_input_ids=torch.tensor([decoder_input])
                ).logits[0]
            expected = torch.log_softmax(logits.float(), dim=-1)[torch.arange(len(target_ids)), target_ids]
            assert got == pytest.approx(expected.tolist(), abs=1e-4)


@pytest.mark.parametrize("head", [1, None])
def test_batched_alignment_rows_are_the_oracles_rows_of_each_pair(translator, reference, head):
    """Pairs of different lengths share padded batches (and a batch of their own); each pair's rows are the
    oracle's teacher-forced rows of the head (or the layer's head average) over that pair alone."""
    texts = ["The quick brown fox sat on the mat.", "Hi.", "A much longer sentence with many more words in it.", "No"]
    pairs = []
    for translation in translator.translate(texts, beam_size=2, n_best=2):
        pairs += [(h.source_ids, h.target_ids) for h in (translation, *translation.alternatives)]
    pairs.append((pairs[0][0], pairs[2][1]))  # a source with another text's target: forcing need not be likely
    layer = translator.config.decoder_layers - 1
    for batch_size in (32, 3):
        rows = forced_alignment_rows(translator.exact_model, pairs, layer, head, batch_size=batch_size)
        for (source_ids, target_ids), got in zip(pairs, rows, strict=True):
            decoder_input = [reference.config.decoder_start_token_id, *target_ids[:-1]]
            with torch.no_grad():
                maps = reference(
                    input_ids=torch.tensor([source_ids]), decoder_input_ids=torch.tensor([decoder_input]),
                    output_attentions=True, use_cache=False,
                ).cross_attentions[layer][0]  # fmt: skip
            expected = maps.mean(dim=0) if head is None else maps[head]
            assert got.shape == (len(target_ids), len(source_ids))
            assert torch.allclose(got, expected, atol=1e-5)


def test_encoder_self_attention_rows_are_distributions(translator, translation):
    forced = forced_decode(translator.model, translation.source_ids, translation.target_ids)
    source_length = len(translation.source_ids)
    assert forced.encoder_self_attention.shape[-2:] == (source_length, source_length)
    assert torch.allclose(
        forced.encoder_self_attention.sum(-1), torch.ones(forced.encoder_self_attention.shape[:-1]), atol=1e-5
    )


@pytest.mark.parametrize("kind", ["cross", "encoder_self"])
def test_every_step_is_the_oracles_number(translator, translation, reference, kind):
    layer, head, position = 1, 2, 1
    steps = attention_steps(
        translator.model,
        translation.source_ids,
        translation.target_ids,
        kind,
        layer=layer,
        head=head,
        position=position,
    )
    expected = reference_layer(reference, translation, kind, layer)
    heads = expected.weights.shape[0]
    d_k = translator.config.d_model // heads
    columns = slice(head * d_k, (head + 1) * d_k)  # this head's share of every projection

    def close(ours: torch.Tensor, theirs: torch.Tensor) -> bool:
        return ours.shape == theirs.shape and torch.allclose(ours, theirs, rtol=1e-4, atol=1e-4)

    assert steps.d_k == d_k
    assert close(steps.x_query, expected.query_input[position])
    assert close(steps.x, expected.key_input)
    assert close(steps.q, expected.q[position, columns])
    assert close(steps.k, expected.k[:, columns])
    assert close(steps.v, expected.v[:, columns])
    scores = expected.k[:, columns] @ expected.q[position, columns]  # Q·Kᵀ on the oracle's own Q and K
    assert close(steps.scores, scores)
    assert close(steps.scaled_scores, scores / math.sqrt(d_k))
    assert close(steps.weights, expected.weights[head, position])
    assert close(steps.output, expected.heads_output[position, columns])


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
