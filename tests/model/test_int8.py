"""The int8 mode (Translator.from_pretrained(dtype="int8")): the compiled runtime's int8 weights quantized at load
time from the fp32 safetensors, rescored logits, explanations through the int8 step, one head step by step from
the fp32 weights; checked against our fp32
engine and against CTranslate2's own int8 mode on the shipped models and dev sentences."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from model import Translator
from model.errors import InvalidInputError
from model.runtime import compiled_extension
from model.runtime.eager import RESCORED_CANDIDATES
from model.runtime.extension import ACTIVATIONS, KERNELS
from model.runtime.quantize import quantize_per_channel
from model.runtime.step import _prepack, reduce_range

DEV = Path(__file__).resolve().parents[3] / "shared" / "data" / "tatoeba-en-zh" / "dev.tsv"
COLUMN = {"en-zh": 0, "zh-en": 1}
SENTENCES = 48

pytestmark = [
    pytest.mark.skipif(not DEV.is_file(), reason="the Tatoeba dev set is not here"),
    pytest.mark.skipif(compiled_extension() is None, reason="int8 runs in the compiled runtime only"),
]


def dev_sources(name: str) -> list[str]:
    rows = [line.split("\t") for line in DEV.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [row[COLUMN[name]] for row in rows[:SENTENCES]]


@pytest.fixture(scope="module", params=["en-zh", "zh-en"])
def pair(request):
    """(name, fp32 translator, int8 translator) on the CPU."""
    name = request.param
    return (
        name,
        Translator.from_pretrained(name, device="cpu"),
        Translator.from_pretrained(name, device="cpu", dtype="int8"),
    )


def decode(translator: Translator, source_ids: list[list[int]]) -> list[list[int]]:
    return [
        nbest[0].token_ids
        for begin in range(0, len(source_ids), 16)
        for nbest in translator.generate(source_ids[begin : begin + 16], beam_size=4)
    ]


def ctranslate2_outputs(name: str, translator: Translator, source_ids, quantization: str | None, directory: Path):
    ctranslate2 = pytest.importorskip("ctranslate2")
    from model.loading import resolve_model_path

    ctranslate2.converters.TransformersConverter(str(resolve_model_path(name))).convert(
        str(directory), quantization=quantization, force=True
    )
    engine = ctranslate2.Translator(
        str(directory), device="cpu", compute_type=quantization or "float32", intra_threads=1
    )
    tokens = [translator.tokenizer.source_tokens(ids) for ids in source_ids]
    vocab = translator.tokenizer.target_vocab
    results = engine.translate_batch(tokens, beam_size=4, max_batch_size=16, return_end_token=True)
    return [[vocab[piece] for piece in result.hypotheses[0]] for result in results]


def share_equal(a: list[list[int]], b: list[list[int]]) -> float:
    return sum(x == y for x, y in zip(a, b, strict=True)) / len(a)


def test_int8_translations_mostly_equal_fp32_as_ctranslate2_int8s_do(pair, tmp_path):
    name, exact, fast = pair
    source_ids = exact.encode_source(dev_sources(name))
    reference = decode(exact, source_ids)
    ours = decode(fast, source_ids)
    oracle_fp32 = ctranslate2_outputs(name, exact, source_ids, None, tmp_path / "fp32")
    oracle_int8 = ctranslate2_outputs(name, exact, source_ids, "int8", tmp_path / "int8")
    # The oracle is trustworthy here: CTranslate2 fp32 decodes these weights as our fp32 does.
    assert share_equal(oracle_fp32, reference) >= 0.95
    # int8 costs some identical outputs in both engines (about one in ten on these models); ours loses
    # no more than CTranslate2's int8 does, give or take a few sentences of this sample.
    ours_equal, oracle_equal = share_equal(ours, reference), share_equal(oracle_int8, reference)
    assert ours_equal >= 0.75
    assert ours_equal >= oracle_equal - 0.1, (ours_equal, oracle_equal)
    # Two int8 approximations of one model each keep most outputs identical to fp32, not the same ones.
    assert share_equal(ours, oracle_int8) >= 0.55


def test_rescoring_keeps_the_exact_top_choice(pair):
    name, exact, fast = pair
    source_ids = exact.encode_source(dev_sources(name)[:8])
    rows = []
    for ids, target in zip(source_ids, decode(exact, source_ids), strict=True):
        decoded_input = torch.tensor([[exact.config.decoder_start_token_id, *target[:-1]]])
        with torch.inference_mode():
            encoder = exact.model.encode(torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.bool))
            hidden, _ = exact.model.decode(decoded_input, encoder)
        rows.append(hidden[0])
    hidden = torch.cat(rows)  # (T, d_model): real decoder states
    with torch.inference_mode():
        reference = exact.model.logits(hidden)
        rescored = fast.step.logits(hidden)
        int8 = {name: code for code, name in KERNELS.items()}["int8"]
        raw = fast.step._runtime.output(hidden.contiguous(), int8)  # the int8 projection with its bias, alone
    assert not torch.allclose(raw, reference, atol=1e-3)  # the int8 projection alone is approximate
    best = reference.topk(4, dim=-1).indices
    # the best tokens come back with their fp32 logits, so near-ties between them are decided exactly
    torch.testing.assert_close(rescored.gather(1, best), reference.gather(1, best), rtol=0, atol=1e-4)
    assert torch.equal(rescored.argmax(dim=-1), reference.argmax(dim=-1))
    assert RESCORED_CANDIDATES >= 2 * 4  # the 2k candidates of beam 4


def test_int8_explanations_are_the_int8_steps_and_one_heads_arithmetic_the_fp32_models(pair):
    name, exact, fast = pair
    translation = fast.translate(dev_sources(name)[:1], beam_size=4, return_attention=True)[0]
    ids, target = translation.source_ids, translation.target_ids
    assert (fast.precision, fast.explanation_precision, fast.steps_precision) == ("int8", "int8", "float32")
    assert fast.runtime_info["precision"] == "int8" and fast.exact_model is fast.model  # fp32 weights beside
    ours, reference = fast.explain(ids, target), exact.explain(ids, target)
    # the explanation is the int8 step's forced over the answer's tokens: the answer's own numbers
    assert torch.equal(ours.cross_attention, translation.cross_attention)
    assert ours.token_logprobs == pytest.approx(translation.token_logprobs, abs=1e-5)
    # ... which differ slightly from the fp32 model's over the same tokens
    assert ours.token_logprobs != pytest.approx(reference.token_logprobs, abs=1e-7)
    assert ours.token_logprobs == pytest.approx(reference.token_logprobs, abs=0.5)
    # one head step by step runs the fp32 weights, as the fp32 translator's does
    steps, expected = (t.attention_steps(ids, target, "cross", None, 0, 0) for t in (fast, exact))
    assert torch.equal(steps.q, expected.q) and torch.equal(steps.weights, expected.weights)


def test_per_row_scales_shield_a_row_from_an_outlier_neighbour():
    torch.manual_seed(0)
    weight, bias = torch.randn(64, 256) / 16, torch.randn(64)
    rows = torch.randn(4, 256)
    batch = torch.cat([rows, 100 * torch.randn(1, 256)])  # one row a hundred times larger
    exact = rows @ weight.T + bias

    extension = compiled_extension()
    packed = _prepack(extension, weight)

    def error(per_row: bool) -> float:
        alone = extension.int8_linear(rows, packed, bias, per_row, reduce_range(extension))
        beside = extension.int8_linear(batch, packed, bias, per_row, reduce_range(extension))[:4]
        assert (alone - exact).norm() / exact.norm() < 0.02  # alone, either way within 2%
        return float((beside - exact).norm() / exact.norm())

    assert error(per_row=True) < 0.02
    assert error(per_row=False) > 0.1  # one scale per call: the outlier coarsens every row


def _tiles_here(tiles: str) -> bool:
    extension = compiled_extension()
    if extension is None:
        return False
    return extension.has_vnni() if tiles == "vnni" else extension.cpu_isa() >= 2  # csrc/common.h: kIsaAvx2


def _tile_params() -> list:
    marks = {t: pytest.mark.skipif(not _tiles_here(t), reason=f"this CPU has no {t} tiles") for t in ("vnni", "avx2")}
    return [pytest.param(tiles, marks=marks[tiles]) for tiles in ("vnni", "avx2")]


@pytest.mark.parametrize("tiles", ["", *_tile_params()], ids=["fbgemm", "vnni", "avx2"])
def test_fused_silu_is_torchs_silu_of_the_int8_matmul(tiles):
    # the int8 fc1 applies bias, per-row scale and SiLU in one pass with its own exp (fbgemm's kernel: in the
    # scale pass; the int8 tiles: in registers): torch's SiLU of the same matmul is the oracle, over the range a
    # layer's pre-activations take and far past it (where e^-x overflows)
    torch.manual_seed(1)
    weight, bias = torch.randn(1024, 256) / 16, torch.randn(1024)
    rows = torch.cat([torch.randn(12, 256), 40 * torch.randn(4, 256)])
    extension = compiled_extension()
    packed = _prepack(extension, weight)
    plain = extension.int8_linear(rows, packed, bias, True, reduce_range(extension), tiles=tiles)
    fused = extension.int8_linear(rows, packed, bias, True, reduce_range(extension), ACTIVATIONS["silu"], tiles=tiles)
    assert plain.abs().max() > 80  # both tails of SiLU reached
    torch.testing.assert_close(fused, torch.nn.functional.silu(plain), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("tiles", _tile_params())
@pytest.mark.parametrize("rows, inputs, outputs", [(1, 256, 768), (3, 256, 8935), (4, 1024, 256), (9, 250, 37),
                                                   (64, 256, 1024), (5, 100, 24)])
def test_the_int8_tiles_multiply_as_torch_does_with_the_same_integers(tiles, rows, inputs, outputs):
    # the oracle: torch in float64 on the integers both sides agree on (W per channel as the runtime quantizes it;
    # each row of x as 255 steps (VNNI) or 127 (AVX2: vpmaddubsw's int16 pairs) over its own range with 0 in it,
    # the codes rounded in float32 as the kernel does): int32 sums are exact, so only float32's rounding of the
    # scales, the bias and SiLU may differ; shapes with ragged tiles, columns and inputs, a row of outliers and a
    # row of positives only (as after SiLU)
    torch.manual_seed(rows)
    weight, bias, x = torch.randn(outputs, inputs) / 16, torch.randn(outputs), torch.randn(rows, inputs)
    x[0, :7] *= 30
    x[-1] = x[-1].abs() + 0.5
    levels = 255 if tiles == "vnni" else 127
    integers, scales = quantize_per_channel(weight)
    low, high = x.amin(1, keepdim=True).clamp(max=0), x.amax(1, keepdim=True).clamp(min=0)
    inverse, step = levels / (high - low), (high - low) / levels  # float32, as the kernel
    zero = torch.round(-low * inverse)
    codes = (torch.round(x * inverse) + zero).clamp(0, levels)
    dequantized = (codes.double() - zero.double()) * step.double()
    expected = dequantized @ (integers.double() * scales.double()[:, None]).T + bias.double()
    assert (dequantized - x.double()).abs().max() <= step.max() / 2 + 1e-6  # within half a step of x
    extension = compiled_extension()
    packed = _prepack(extension, weight)
    got = extension.int8_linear(x, packed, bias, True, False, tiles=tiles)
    torch.testing.assert_close(got.double(), expected, rtol=1e-6, atol=1e-5)
    fused = extension.int8_linear(x, packed, bias, True, False, ACTIVATIONS["silu"], tiles=tiles)
    torch.testing.assert_close(fused.double(), torch.nn.functional.silu(expected), rtol=1e-6, atol=1e-5)
    zeros = extension.int8_linear(torch.zeros(2, inputs), packed, bias, True, False, tiles=tiles)
    assert torch.equal(zeros, bias.expand(2, -1))  # a row of zeros has step 0: the bias alone
    # the tiles' rows do not depend on the rows beside them (batch invariance)
    alone = [extension.int8_linear(x[i : i + 1], packed, bias, True, False, tiles=tiles) for i in range(rows)]
    assert torch.equal(torch.cat(alone), got)


def test_gradients_run_the_fp32_weights():
    exact = Translator.from_pretrained("en-zh", device="cpu")
    fast = Translator.from_pretrained("en-zh", device="cpu", dtype=torch.int8)
    ids = exact.encode_source(["The cat sat."])[0]
    source, mask = torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.bool)
    target = torch.tensor([[exact.config.decoder_start_token_id, 5, 6]])
    outputs = [t.model(source, mask, target) for t in (exact, fast)]
    assert torch.equal(outputs[0], outputs[1])


def test_int8_is_a_cpu_mode():
    with pytest.raises(InvalidInputError, match="CPU only"):
        Translator.from_pretrained("en-zh", device="cuda", dtype="int8")
    with pytest.raises(InvalidInputError, match="int8"):
        Translator.from_pretrained("en-zh", device="cpu", dtype="int4")
