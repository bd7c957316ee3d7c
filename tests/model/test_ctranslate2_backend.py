"""CTranslate2 as a decoding backend (Translator.from_pretrained(engine="ctranslate2")): our checkpoint converted
by model/ctranslate2_backend.py, checked in float32 against our own engine, the oracle: the same tokens, the
same alignment-head attention (which proves the head permutation), the same token log-probabilities."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from model import Translator
from model.errors import CheckpointError, InvalidInputError
from model.explain import forced_decode
from model.options import DecodingOptions
from model.transformer import MultiHeadAttention
from tests.tiny import make_model_dir

pytest.importorskip("ctranslate2")

DEV = Path(__file__).resolve().parents[3] / "shared" / "data" / "tatoeba-en-zh" / "dev.tsv"
COLUMN = {"en-zh": 0, "zh-en": 1}
SENTENCES = 48
ATTENTION_TOLERANCE = 1e-4
LOGPROB_TOLERANCE = 1e-4


def decode_both(ours: Translator, fast: Translator, source_ids: list[list[int]], options: DecodingOptions):
    """(our hypotheses, CTranslate2's) per source, both in batches of 16."""
    pairs = []
    for begin in range(0, len(source_ids), 16):
        batch = source_ids[begin : begin + 16]
        exact = ours.generate(batch, options, alignment_attention=True)
        pairs += zip(exact, fast.generate(batch, options), strict=True)
    return pairs


def assert_same_numbers(ours: Translator, pairs, source_ids) -> float:
    """For every output both engines chose: alignment-head rows and token log-probabilities equal (to float
    rounding), those also our forced decode's. Returns the share of identical outputs."""
    same = 0
    for ids, (exact, fast) in zip(source_ids, pairs, strict=True):
        exact, fast = exact[0], fast[0]
        if exact.token_ids != fast.token_ids:
            continue
        same += 1
        assert fast.alignment_attention.shape == exact.alignment_attention.shape
        # the rows alignments read: a model that reads them shifted never reads the first step's row, which
        # the backend leaves as CTranslate2's batched beam search returns it (see CTranslate2Decoder.generate)
        rows = slice(1, None) if ours.alignment_shift else slice(None)
        assert torch.allclose(fast.alignment_attention[rows], exact.alignment_attention[rows], atol=ATTENTION_TOLERANCE)
        # the search's own numbers: a </s> that closes a full length budget is forced, at log-probability 0
        assert fast.token_logprobs == pytest.approx(exact.token_logprobs, abs=LOGPROB_TOLERANCE)
        assert fast.score == pytest.approx(exact.score, abs=10 * LOGPROB_TOLERANCE)
        forced = forced_decode(ours.model, ids, fast.token_ids).token_logprobs
        assert fast.token_logprobs[:-1] == pytest.approx(forced[:-1], abs=LOGPROB_TOLERANCE)
    return same / len(source_ids)


@pytest.mark.skipif(not DEV.is_file(), reason="the Tatoeba dev set is not here")
@pytest.mark.parametrize("name", ["en-zh", "zh-en"])
def test_float32_backend_matches_our_engine_on_dev_sentences(name, tmp_path):
    rows = [line.split("\t") for line in DEV.read_text(encoding="utf-8").splitlines() if line.strip()]
    ours = Translator.from_pretrained(name, device="cpu")
    fast = Translator.from_pretrained(name, engine="ctranslate2", compute_type="float32", threads=1, cache_dir=tmp_path)
    source_ids = [ours.tokenizer.encode_source(row[COLUMN[name]]) for row in rows[:SENTENCES]]
    pairs = decode_both(ours, fast, source_ids, DecodingOptions(beam_size=4))
    # measured: 200 of the first 200 dev sentences identical in each direction
    assert assert_same_numbers(ours, pairs, source_ids) >= 0.95


@pytest.mark.parametrize(
    ("shared", "alignment"),
    [(True, {"alignment_layer": 1, "alignment_head": 2}), (False, {"alignment_layer": 0, "alignment_head": None})],
    ids=["declared-head", "layer-average"],
)
@pytest.mark.parametrize("beam_size", [1, 4])
def test_float32_backend_matches_our_engine_on_a_random_model(shared, alignment, beam_size, tmp_path):
    """Random weights (a non-zero start-token embedding, every tensor exercised, outputs that run to their
    length budget), alignments read at the predicting step, so the first step's attention row counts."""
    directory = make_model_dir(tmp_path / "model", shared=shared, seed=7, **alignment)
    ours = Translator.from_pretrained(directory, device="cpu")
    fast = Translator.from_pretrained(directory, engine="ctranslate2", compute_type="float32", cache_dir=tmp_path)
    texts = ["the cat sat on the mat", "we like tea", "a big red house by the river today", "I see you"]
    source_ids = ours.encode_source(texts)
    pairs = decode_both(ours, fast, source_ids, DecodingOptions(beam_size=beam_size, max_new_tokens=12))
    assert assert_same_numbers(ours, pairs, source_ids) == 1.0


def test_the_head_permutation_leaves_the_layer_unchanged():
    torch.manual_seed(0)
    from model.ctranslate2_backend import head_order, permuted_heads

    attention = MultiHeadAttention(32, 4).eval()
    query, memory = torch.randn(2, 3, 32), torch.randn(2, 5, 32)
    permuted = MultiHeadAttention(32, 4).eval()
    permuted.load_state_dict(permuted_heads(attention, head_order(4, 2)))
    with torch.no_grad():
        expected, weights = attention(query, *attention.project_key_value(memory), None, need_weights=True)
        actual, moved = permuted(query, *permuted.project_key_value(memory), None, need_weights=True)
    assert torch.allclose(actual, expected, atol=1e-6)
    assert torch.allclose(moved[:, 0], weights[:, 2], atol=1e-6)


def test_translations_carry_alignments_and_explanations_run_the_exact_model(tmp_path):
    fast = Translator.from_pretrained("en-zh", engine="ctranslate2", compute_type="int8", cache_dir=tmp_path)
    assert (fast.engine, fast.precision, fast.explanation_precision) == ("ctranslate2", "int8", "float32")
    (result,) = fast.translate(["The weather is nice today."], beam_size=4, n_best=2)
    assert result.word_alignment and len(result.alignment) == len(result.target_ids)
    assert len(result.alternatives) == 1
    explained = fast.explain(result.source_ids, result.target_ids)
    exact = Translator.from_pretrained("en-zh", device="cpu").explain(result.source_ids, result.target_ids)
    assert explained.token_logprobs == pytest.approx(exact.token_logprobs, abs=1e-5)
    assert torch.allclose(explained.cross_attention, exact.cross_attention, atol=1e-5)
    assert result.token_logprobs == pytest.approx(exact.token_logprobs, abs=0.1)  # int8's own numbers
    (full,) = fast.translate(["The weather is nice today."], beam_size=4, return_attention=True)
    maps = forced_decode(fast.exact_model, full.source_ids, full.target_ids).cross_attention
    assert torch.allclose(full.cross_attention, maps, atol=1e-5)  # every map: the exact model's over these tokens


def test_unsupported_settings_fail_clearly(tmp_path):
    with pytest.raises(InvalidInputError, match="compute_type"):
        Translator.from_pretrained("en-zh", engine="ctranslate2", compute_type="int4", cache_dir=tmp_path)
    with pytest.raises(InvalidInputError, match="engine"):
        Translator.from_pretrained("en-zh", engine="onnx")
    with pytest.raises(InvalidInputError, match="compute_type"):
        Translator.from_pretrained("en-zh", compute_type="int8")
    fast = Translator.from_pretrained("en-zh", engine="ctranslate2", cache_dir=tmp_path)
    with pytest.raises(InvalidInputError, match="continuous"):
        fast.start_continuous()


def test_a_conversion_is_made_once_per_weights_and_compute_type(tmp_path):
    for compute_type in ("int8", "int8_float32", "float32"):  # int8_float32 reads the int8 conversion
        Translator.from_pretrained("en-zh", engine="ctranslate2", compute_type=compute_type, cache_dir=tmp_path)
    converted = sorted(p.name for p in tmp_path.iterdir())
    assert len(converted) == 2 and all((tmp_path / name / "model.bin").is_file() for name in converted)


def test_a_cache_others_may_write_in_is_refused(tmp_path):
    """A conversion found in the cache is served as the model: a cache directory another user could write a
    model.bin into is refused, and a new one is made for this user alone."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(CheckpointError, match="writable by it alone"):
        Translator.from_pretrained("en-zh", engine="ctranslate2", cache_dir=shared)
    assert not any(shared.iterdir())  # refused before anything was converted or read
    fresh = tmp_path / "fresh" / "cache"
    Translator.from_pretrained("en-zh", engine="ctranslate2", cache_dir=fresh)
    assert fresh.stat().st_mode & 0o777 == 0o700
