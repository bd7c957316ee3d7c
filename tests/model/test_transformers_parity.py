"""Our engine against transformers' MarianMTModel (the independent oracle) on random tiny checkpoints.

Each configuration is written by transformers' own save_pretrained and loaded by us, and decoded through
the compiled runtime (the default), and two of them through the eager step it falls back to without a compiler.
"""

from __future__ import annotations

import pytest
import torch

from model import Translator
from model.runtime import EagerStep, compiled_extension
from tests.harness.tiny import DEVICE, make_hf_model_dir, synthetic_corpus

transformers = pytest.importorskip("transformers")

CONFIGS = {
    "swish-shared-tied": dict(shared=True, activation_function="swish"),
    "relu-unscaled-separate-untied": dict(
        shared=False, activation_function="relu", scale_embedding=False, tie_word_embeddings=False
    ),
    "gelu-asymmetric-1head": dict(
        shared=True,
        activation_function="gelu",
        encoder_layers=3,
        decoder_layers=1,
        encoder_attention_heads=1,
        decoder_attention_heads=1,
    ),
    "swish-separate-8heads": dict(
        shared=False, encoder_attention_heads=8, decoder_attention_heads=8, encoder_layers=1, decoder_layers=3
    ),
    "shared-untied-2heads": dict(
        shared=True, tie_word_embeddings=False, encoder_attention_heads=2, decoder_attention_heads=2
    ),
}
SENTENCES = [english for english, _ in synthetic_corpus(count=60, seed=7)]


# Every configuration through the compiled runtime (the default); the eager fallback on two of them, one per
# vocabulary layout, which keeps the suite's time while checking the fallback against the oracle too.
EAGER_CONFIGS = ("swish-shared-tied", "relu-unscaled-separate-untied")
RUNS = [(name, "compiled") for name in sorted(CONFIGS)] + [(name, "eager") for name in EAGER_CONFIGS]


@pytest.fixture(scope="module", params=RUNS, ids=lambda param: "-".join(param))
def pair(request, tmp_path_factory):
    """(our Translator, transformers model, transformers tokenizer) on one saved directory."""
    name, runtime = request.param
    options = dict(CONFIGS[name])
    shared = options.pop("shared")
    directory = make_hf_model_dir(tmp_path_factory.mktemp(name), shared=shared, seed=len(name), **options)
    reference = transformers.MarianMTModel.from_pretrained(directory, attn_implementation="eager").eval()
    tokenizer = transformers.MarianTokenizer.from_pretrained(directory)
    ours = Translator.from_pretrained(directory, device=DEVICE)
    if runtime == "eager":
        ours.step = EagerStep(ours.model)
    elif DEVICE == "cpu" and compiled_extension() is not None:
        assert ours.runtime_info["runtime"] == "compiled"
    return ours, reference, tokenizer


def _batch(translator: Translator, texts: list[str]):
    ids = translator.encode_source(texts)
    width = max(map(len, ids))
    pad = translator.config.pad_token_id
    input_ids = torch.tensor([row + [pad] * (width - len(row)) for row in ids])
    mask = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in ids])
    return ids, input_ids, mask


def test_tokenizer_ids_equal_marian_tokenizer(pair):
    translator, _, tokenizer = pair
    texts = SENTENCES[:20] + ["Zebra ☃ quantum 猫!", "", "  spaced   out  ", ">>zh<< the cat"]
    assert translator.encode_source(texts) == [tokenizer(t)["input_ids"] for t in texts]


def test_detokenization_equals_marian_tokenizer(pair):
    translator, _, tokenizer = pair
    target_ids = [translator.tokenizer.encode_target(t) for t in ("我喜欢猫。", "今天很冷！", "你好吗？")]
    for ids in target_ids:
        assert translator.tokenizer.decode(ids) == tokenizer.decode(ids, skip_special_tokens=True)


def test_encoder_outputs_and_logits_match(pair):
    translator, reference, _ = pair
    _, input_ids, mask = _batch(translator, SENTENCES[:6])
    decoder_input = torch.randint(3, translator.config.target_vocab_size - 1, (6, 9))
    decoder_input[:, 0] = translator.config.decoder_start_token_id
    with torch.no_grad():
        expected = reference(
            input_ids=input_ids, attention_mask=mask, decoder_input_ids=decoder_input, output_attentions=True
        )
        device = translator.device  # TRANSLATE_TEST_DEVICE; the reference stays on the CPU
        encoder = translator.model.encode(input_ids.to(device), mask.bool().to(device))
        hidden, cross = translator.model.decode(decoder_input.to(device), encoder, need_weights=True)
        logits = translator.model.logits(hidden).cpu()
        encoder.hidden, cross = encoder.hidden.cpu(), [c.cpu() for c in cross]
    real = mask.bool()
    assert torch.allclose(encoder.hidden[real], expected.encoder_last_hidden_state[real], atol=1e-4)
    assert torch.allclose(logits, expected.logits, atol=1e-4)
    for ours, theirs in zip(cross, expected.cross_attentions, strict=True):
        assert torch.allclose(ours, theirs, atol=1e-5)


def test_greedy_ids_identical(pair):
    translator, reference, _ = pair
    ids = translator.encode_source(SENTENCES[:12])
    ours = translator.generate(ids, beam_size=1, max_new_tokens=24)
    for source, hypotheses in zip(ids, ours):
        expected = reference.generate(
            torch.tensor([source]),
            num_beams=1,
            do_sample=False,
            max_new_tokens=24,
            bad_words_ids=[[translator.config.pad_token_id]],
        )
        assert hypotheses[0].token_ids == expected[0, 1:].tolist()


def test_cross_attention_equals_output_attentions(pair):
    translator, reference, _ = pair
    ids = translator.encode_source(SENTENCES[12:16])
    for source, hypotheses in zip(ids, translator.generate(ids, beam_size=1, max_new_tokens=16, return_attention=True)):
        hypothesis = hypotheses[0]
        decoder_input = torch.tensor([[translator.config.decoder_start_token_id, *hypothesis.token_ids[:-1]]])
        with torch.no_grad():
            expected = reference(
                input_ids=torch.tensor([source]), decoder_input_ids=decoder_input, output_attentions=True
            )
        theirs = torch.stack([layer[0] for layer in expected.cross_attentions])  # (L, h, T, S)
        assert hypothesis.cross_attention.shape == theirs.shape
        assert torch.allclose(hypothesis.cross_attention, theirs, atol=1e-5)


@pytest.mark.parametrize(
    "pair, length_penalty",
    [(run, 1.0) for run in RUNS] + [(("swish-separate-8heads", "compiled"), 0.6)],
    indirect=["pair"],
    ids=lambda param: "-".join(param) if isinstance(param, tuple) else str(param),
)
def test_beam4_best_hypothesis_identical(pair, length_penalty):
    translator, reference, _ = pair
    ids, input_ids, mask = _batch(translator, SENTENCES[:50])
    ours = translator.generate(ids, beam_size=4, max_new_tokens=20, length_penalty=length_penalty)
    expected = reference.generate(
        input_ids,
        attention_mask=mask,
        num_beams=4,
        do_sample=False,
        max_new_tokens=20,
        early_stopping=True,
        length_penalty=length_penalty,
        bad_words_ids=[[translator.config.pad_token_id]],
    )  # one padded batch: transformers' own batching, compared with ours
    pad = translator.config.pad_token_id
    same = sum(
        hypotheses[0].token_ids == [t for t in row[1:].tolist() if t != pad] for hypotheses, row in zip(ours, expected)
    )
    assert same >= 0.95 * len(ids)
