"""Search behaviour: the KV cache changes nothing, batching changes nothing, attention is well formed."""

from __future__ import annotations

import pytest
import torch

from model import Translator
from model.runtime.extension import compiled_extension
from tests.harness.tiny import DEVICE, make_model_dir, synthetic_corpus

SENTENCES = [english for english, _ in synthetic_corpus(count=40, seed=3)]


@pytest.fixture(scope="module", params=["shared_model_dir", "model_dir"], ids=["shared", "separate"])
def translator(request):
    """The conftest's translator, once for each vocabulary layout (one shared vocabulary, and two)."""
    return Translator.from_pretrained(request.getfixturevalue(request.param), device=DEVICE)


def greedy_without_cache(translator: Translator, source: list[int], steps: int):
    """Reference greedy decoding that recomputes the whole prefix at every step (no KV cache)."""
    model, config = translator.model, translator.config
    device = translator.device
    encoder = model.encode(
        torch.tensor([source], device=device), torch.ones(1, len(source), dtype=torch.bool, device=device)
    )
    prefix = [config.decoder_start_token_id]
    rows = []
    with torch.no_grad():
        for step in range(steps):
            hidden, cross = model.decode(torch.tensor([prefix], device=device), encoder, need_weights=True)
            logits = model.logits(hidden[0, -1])
            logits[config.pad_token_id] = float("-inf")
            if step == steps - 1:
                token = config.eos_token_id  # the budget's last step forces </s>
            else:
                token = int(logits.argmax())
            rows.append(torch.stack([layer[0, :, -1] for layer in cross], dim=0))  # (L, h, S)
            prefix.append(token)
            if token == config.eos_token_id:
                break
    return prefix[1:], torch.stack(rows, dim=2).cpu()  # (L, h, T, S)


def test_cached_decoding_equals_recomputing_the_prefix(translator):
    for source in translator.encode_source(SENTENCES[:6]):
        hypothesis = translator.generate([source], beam_size=1, max_new_tokens=15, return_attention=True)[0][0]
        ids, attention = greedy_without_cache(translator, source, 15)
        assert hypothesis.token_ids == ids
        assert torch.allclose(hypothesis.cross_attention, attention, atol=1e-5)


@pytest.mark.parametrize("beam_size", [1, 4])
def test_mixed_length_batch_decodes_as_each_input_alone(translator, beam_size):
    ids = translator.encode_source(SENTENCES[:8])
    assert len({len(row) for row in ids}) > 2, "inputs must have mixed lengths"
    batched = translator.generate(ids, beam_size=beam_size, max_new_tokens=20, return_attention=True)
    for source, together in zip(ids, batched, strict=True):
        alone = translator.generate([source], beam_size=beam_size, max_new_tokens=20, return_attention=True)[0]
        assert together[0].token_ids == alone[0].token_ids
        assert together[0].score == pytest.approx(alone[0].score, abs=1e-4)
        assert torch.allclose(together[0].cross_attention, alone[0].cross_attention, atol=1e-5)


def test_cross_attention_is_a_distribution_over_real_source_tokens(translator):
    ids = translator.encode_source(SENTENCES[:5])
    for source, hypotheses in zip(
        ids, translator.generate(ids, beam_size=3, max_new_tokens=12, return_attention=True), strict=True
    ):
        attention = hypotheses[0].cross_attention
        config = translator.config
        assert attention.shape == (
            config.decoder_layers,
            config.decoder_attention_heads,
            len(hypotheses[0].token_ids),
            len(source),
        )
        assert torch.allclose(attention.sum(dim=-1), torch.ones(attention.shape[:-1]), atol=1e-5)


def test_n_best_is_sorted_and_distinct(translator):
    ids = translator.encode_source(SENTENCES[:4])
    for hypotheses in translator.generate(ids, beam_size=5, num_return_sequences=3, max_new_tokens=12):
        assert len(hypotheses) == 3
        scores = [h.normalized_score for h in hypotheses]
        assert scores == sorted(scores, reverse=True)
        assert len({tuple(h.token_ids) for h in hypotheses}) == 3


def test_scores_are_sums_of_token_logprobs(translator):
    hypothesis = translator.generate(translator.encode_source(SENTENCES[:1]), beam_size=4, max_new_tokens=12)[0][0]
    assert len(hypothesis.token_logprobs) == len(hypothesis.token_ids)
    assert hypothesis.score == pytest.approx(sum(hypothesis.token_logprobs), abs=1e-5)


def test_pad_is_never_generated_and_every_output_ends_with_eos(translator):
    config = translator.config
    ids = translator.encode_source(SENTENCES)
    for hypotheses in translator.generate(ids, beam_size=2, num_return_sequences=2, max_new_tokens=10):
        for hypothesis in hypotheses:
            assert config.pad_token_id not in hypothesis.token_ids
            assert hypothesis.token_ids[-1] == config.eos_token_id
            assert len(hypothesis.token_ids) <= 10


def never_ending_translator(directory) -> Translator:
    """A random model whose </s> logit is pushed far down: every output runs until its length budget ends it."""
    from safetensors.torch import load_file, save_file

    path = directory / "model.safetensors"
    weights = load_file(path)
    eos = Translator.from_pretrained(directory, device="cpu").config.eos_token_id
    weights["final_logits_bias"][..., eos] = -1e4
    save_file(weights, path, metadata={"format": "pt"})
    return Translator.from_pretrained(directory, device=DEVICE)


def test_default_length_budget_grows_with_the_source(tmp_path):
    translator = never_ending_translator(make_model_dir(tmp_path, seed=5))
    texts = ["The cat.", "The big red dog sat on the mat.", " ".join(["the big red dog"] * 6)]
    sources = translator.encode_source(texts)
    assert [len(ids) for ids in sources] == sorted({len(ids) for ids in sources}), "sources must grow"
    lengths = [len(hypotheses[0].token_ids) for hypotheses in translator.generate(sources, beam_size=1)]
    assert lengths == [2 * len(source) + 10 for source in sources]  # the documented default budget, exactly
    # min_new_tokens beyond that budget raises it (a translation asked to run that long may), within the positions
    longer = translator.generate(sources, beam_size=1, min_new_tokens=lengths[0] + 7)
    assert [len(h[0].token_ids) for h in longer] == [max(n, lengths[0] + 7) for n in lengths]
    limit = translator.config.max_position_embeddings
    capped = translator.generate(sources[:1], beam_size=2, min_new_tokens=10 * limit)
    assert len(capped[0][0].token_ids) == limit and capped[0][0].token_ids[-1] == translator.config.eos_token_id
    # an explicit max_new_tokens still ends it first, as in transformers
    ended = translator.generate(sources[:1], beam_size=1, min_new_tokens=40, max_new_tokens=12)
    assert len(ended[0][0].token_ids) == 12


@pytest.mark.skipif(compiled_extension() is None, reason="the compiled runtime is not built here")
@pytest.mark.parametrize("rows, width, m", [(3, 8935, 8), (16, 8935, 8), (64, 8935, 8), (20, 32000, 16), (16, 300, 4),
                                            (33, 1000, 2)])
def test_row_topk_ranks_as_torch_topk(rows, width, m):
    """The runtime's top-k (each row's 64-wide block maxima first) returns torch.topk's values and columns, including
    rows that are -inf but for one token (a forced </s>) and a banned column, at widths no multiple of a block."""
    row_topk = compiled_extension().row_topk
    generator = torch.Generator().manual_seed(rows * width + m)
    scores = torch.randn(rows, width, generator=generator).log_softmax(-1)
    scores[:, 3] = float("-inf")  # a banned token (pad)
    scores[1] = float("-inf")
    scores[1, 0] = 0.0  # a row forced to end
    scores[2, -1] = 5.0  # the best token in the tail past the last whole chunk
    values, columns = row_topk(scores, m)
    expected = torch.topk(scores, m, dim=1)
    assert torch.equal(values, expected.values)
    assert torch.equal(scores.gather(1, columns), values)
    finite = torch.isfinite(expected.values)  # the order of tied -inf columns is unspecified
    assert torch.equal(columns[finite], expected.indices[finite])
