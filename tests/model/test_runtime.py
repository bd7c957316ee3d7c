"""The compiled decoding runtime (model/runtime) against the lecture model's eager step, its reference.

Random Marian-shaped models of several shapes decode the same ids through both, greedy and beam, n-best, length
penalties, minimum and maximum lengths, static batches and the continuous scheduler's ragged rows; scores and
attention agree to float32 rounding (1e-5: the two run the same operations, the matmuls on kernels that may sum in
another order). The eager step is itself checked against transformers in test_transformers_parity.py, which runs
through the compiled step too (Translator decodes with it by default).
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from model.config import ModelConfig
from model.decoding.scheduler import Scheduler
from model.decoding.search import beam_search
from model.options import DecodingOptions
from model.runtime import RUNTIME_ENV, CompiledStep, EagerStep, compiled_extension, load_step
from model.runtime.extension import KERNELS, QUANTIZED
from model.runtime.step import reduce_range
from model.transformer import Transformer
from tests.harness.processes import held_to, python_output

ROOT = Path(__file__).resolve().parents[2]
EOS = 0
SHAPES = {
    "tiny": dict(d_model=32, decoder_layers=2, heads=4, ffn=64, vocab=50, activation="swish"),
    "relu-odd": dict(d_model=48, decoder_layers=3, heads=6, ffn=80, vocab=97, activation="relu"),
    "gelu-wide": dict(d_model=64, decoder_layers=1, heads=2, ffn=256, vocab=300, activation="gelu"),
    # at beam 4 fewer tokens than the 2k candidates once pad and eos are banned: the banned ones fill in at -inf
    "nine-tokens": dict(d_model=32, decoder_layers=2, heads=4, ffn=64, vocab=9, activation="swish"),
}

pytestmark = pytest.mark.skipif(os.environ.get(RUNTIME_ENV) == "eager", reason="the eager run checks the fallback")


@pytest.fixture(scope="module")
def extension():
    built = compiled_extension()
    assert built is not None, "the compiled step did not build here (see the log line); CI builds it"
    return built


def random_model(shape: str, seed: int = 0) -> Transformer:
    s = SHAPES[shape]
    pad = s["vocab"] - 1
    config = ModelConfig(
        vocab_size=s["vocab"],
        d_model=s["d_model"],
        encoder_layers=2,
        decoder_layers=s["decoder_layers"],
        encoder_attention_heads=s["heads"],
        decoder_attention_heads=s["heads"],
        encoder_ffn_dim=s["ffn"],
        decoder_ffn_dim=s["ffn"],
        activation_function=s["activation"],
        max_position_embeddings=64,
        pad_token_id=pad,
        eos_token_id=EOS,
        decoder_start_token_id=pad,
        dropout=0.0,
    )
    torch.manual_seed(seed)
    model = Transformer(config)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "layer_norm" in name:
                parameter.copy_((1.0 if name.endswith("weight") else 0.0) + 0.3 * torch.randn(parameter.shape))
            else:
                parameter.normal_(0.0, 0.3)
        model.final_logits_bias.normal_(0.0, 0.5)
        model.final_logits_bias[EOS] = 1.5  # hypotheses end at varied lengths, not only at the budget
    return model.eval()


def random_sources(rng: random.Random, model: Transformer, count: int) -> list[list[int]]:
    pad = model.config.pad_token_id
    return [[rng.randrange(1, pad) for _ in range(rng.randint(1, 14))] + [EOS] for _ in range(count)]


def assert_same(got, expected, context) -> None:
    assert len(got) == len(expected), context
    for hypothesis, reference in zip(got, expected, strict=True):
        assert hypothesis.token_ids == reference.token_ids, context
        # a score sums a hypothesis's log-probabilities, each within 1e-5: the sum within 1e-5 of its size
        assert hypothesis.score == pytest.approx(reference.score, rel=1e-5, abs=1e-5), context
        assert hypothesis.token_logprobs == pytest.approx(reference.token_logprobs, abs=1e-5), context
        for name in ("cross_attention", "alignment_attention"):
            theirs = getattr(reference, name)
            if theirs is not None:
                torch.testing.assert_close(getattr(hypothesis, name), theirs, atol=1e-5, rtol=0)



def assert_decodes_as_the_reference(model, compiled, sources, options, context, **attention) -> None:
    """The compiled step's hypotheses equal the model's own step's (beam_search without `step`)."""
    expected = beam_search(model, sources, options, **attention, reference=True)
    got = beam_search(model, sources, options, step=compiled, **attention)
    for index, (hypotheses, reference) in enumerate(zip(got, expected, strict=True)):
        assert_same(hypotheses, reference, (context, index))

OPTIONS = [
    DecodingOptions(beam_size=1),
    DecodingOptions(beam_size=1, min_new_tokens=4, max_new_tokens=9),
    DecodingOptions(beam_size=4),
    DecodingOptions(beam_size=4, n_best=3, length_penalty=0.6),
    DecodingOptions(beam_size=3, n_best=2, length_penalty=1.4, min_new_tokens=3, max_new_tokens=11),
]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: f"k{o.beam_size}-n{o.n_best}-lp{o.length_penalty}")
@pytest.mark.parametrize("kernel", ["linear", "transposed", "onednn"])
def test_the_compiled_step_decodes_the_references_ids_scores_and_attention(extension, shape, options, kernel):
    # every fp32 kernel in turn, not the ones timed fastest: which those are depends on the machine's load, and a
    # run's mix decides how rounding adds up (these random weights' large activations take a token's
    # log-probability to within 1e-5 of the reference's, 9e-6 on gelu-wide through oneDNN)
    model = random_model(shape)
    sources = random_sources(random.Random(1), model, 7)
    compiled = CompiledStep(model, extension, "float32", choose=False)
    compiled.force(kernel)
    for attention in ({"return_attention": True}, {"alignment_head": (0, 1)}, {"alignment_head": (0, None)}):
        assert_decodes_as_the_reference(model, compiled, sources, options, (shape, options, attention), **attention)


def test_a_vocabulary_smaller_than_the_beams_candidates_decodes_as_the_reference(extension):
    # nine tokens, pad always banned and eos before min_new_tokens: 7 allowed against the beam's 2k = 8
    model = random_model("nine-tokens")
    sources = random_sources(random.Random(4), model, 6)
    compiled = CompiledStep(model, extension, "float32")
    for options in (DecodingOptions(beam_size=4, min_new_tokens=3), DecodingOptions(beam_size=4, n_best=4)):
        assert_decodes_as_the_reference(model, compiled, sources, options, options, return_attention=True)


def test_weights_changed_or_replaced_after_loading_are_decoded_with(extension):
    model = random_model("tiny")
    sources = random_sources(random.Random(3), model, 5)
    compiled = CompiledStep(model, extension, "float32")
    with torch.no_grad():
        model.decoder_layers[0].feed_forward.fc2.weight.mul_(1.5)  # in place, as an optimizer step makes it
    model.decoder_layers[1].self_attn.k_proj.weight = torch.nn.Parameter(torch.randn(32, 32) * 0.3)  # a new tensor
    assert_decodes_as_the_reference(model, compiled, sources, DecodingOptions(beam_size=4), "after the change")


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_the_compiled_encoder_gives_the_references_hidden_states_under_padding(extension, shape):
    # texts of different lengths padded into one batch: each position attends over its own text's real tokens
    model = random_model(shape, seed=5)
    sources = random_sources(random.Random(5), model, 6)
    width = max(map(len, sources))
    ids = torch.tensor([s + [model.config.pad_token_id] * (width - len(s)) for s in sources])
    mask = torch.tensor([[True] * len(s) + [False] * (width - len(s)) for s in sources])
    compiled = CompiledStep(model, extension, "float32")
    with torch.inference_mode():
        expected = model.encode(ids, mask).hidden
    got = compiled.encode(ids, mask)
    torch.testing.assert_close(got[mask], expected[mask], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kernel", ["linear", "transposed", "onednn"])
def test_every_fp32_kernel_gives_the_references_numbers(extension, kernel):
    model = random_model("relu-odd", seed=3)
    sources = random_sources(random.Random(3), model, 5)
    compiled = CompiledStep(model, extension, "float32", choose=False)
    compiled.force(kernel)
    assert set(compiled.info.kernels.values()) == {f"{kernel}/{kernel}"}
    assert_decodes_as_the_reference(
        model, compiled, sources, DecodingOptions(beam_size=4, n_best=2), kernel, return_attention=True
    )


def test_the_kernel_chosen_for_each_matmul_is_the_fastest_it_timed(extension):
    model = random_model("gelu-wide")
    compiled = CompiledStep(model, extension, "int8")
    assert set(compiled.timings) == set(compiled.info.kernels) and len(compiled.names) == 4 * 2 + 7 * 1 + 1
    for name, chosen in compiled.info.kernels.items():
        small, large = chosen.split("/")
        for label, kernel in (("small", small), ("large", large)):
            timed = compiled.timings[name][label]
            # in the encoder only the feed-forward has int8 candidates, and only with 8-bit activations (VNNI);
            # the int8 tiles are a candidate wherever int8 is, on a CPU that has some (VNNI or AVX2)
            quantizable = not name.startswith("encoder.") or (
                name.endswith((".fc1", ".fc2")) and not reduce_range(compiled_extension())
            )
            assert set(timed) <= set(KERNELS.values()) and ("int8" in timed) == quantizable
            assert ("tiles" in timed) == (quantizable and extension.int8_tiles() != "")
            exact = min(v for k, v in timed.items() if k not in QUANTIZED)
            fastest_quantized = min((v for k, v in timed.items() if k in QUANTIZED), default=None)
            if fastest_quantized is None:
                assert timed[kernel] == exact, (name, label, timed)
            elif kernel in QUANTIZED:  # int8 only where it pays: at least 10 % faster than every fp32 kernel
                assert timed[kernel] == fastest_quantized <= 0.9 * exact, (name, label, timed)
            else:
                assert timed[kernel] == exact and fastest_quantized > 0.9 * exact, (name, label, timed)
    info = compiled.info.as_dict()
    assert info["runtime"] == "compiled" and info["precision"] == "int8" and info["cpu"]
    assert "timed at 4 and 64 rows" in info["reason"]


@pytest.mark.parametrize("seed", range(3))
def test_ragged_rows_of_the_continuous_scheduler_decode_as_if_alone(extension, seed):
    """Requests joining and leaving a running decode (rows at different positions) through the compiled step
    equal each request decoded alone by the reference."""
    rng = random.Random(seed)
    model = random_model("tiny", seed)
    compiled = CompiledStep(model, extension, "float32")
    scheduler = Scheduler(model, max_rows=rng.choice([6, 12, 64]), step=compiled)
    requests = []
    for _ in range(10):
        beam = rng.choice((1, 1, 2, 4))
        options = DecodingOptions(
            beam_size=beam,
            n_best=rng.randint(1, beam),
            length_penalty=rng.choice([1.0, 0.6]),
            min_new_tokens=rng.choice([0, 3]),
            max_new_tokens=rng.choice([None, 8]),
        )
        requests.append((rng.randint(0, 10), random_sources(rng, model, 1)[0], options))
    alone = [beam_search(model, [source], options, return_attention=True, reference=True)[0]
             for _, source, options in requests]
    pending = sorted(range(len(requests)), key=lambda i: requests[i][0])
    submitted, step = {}, 0
    while pending or not scheduler.idle:
        while pending and requests[pending[0]][0] <= step:
            index = pending.pop(0)
            submitted[index] = scheduler.submit(requests[index][1], requests[index][2], return_attention=True)
        scheduler.step()
        step += 1
        assert step < 2_000
    for index, request in submitted.items():
        assert_same(request.hypotheses, alone[index], (seed, index))


def test_a_translator_decodes_with_the_compiled_step_by_default(extension):
    from model import Translator
    from model.loading import resolve_model_path
    from model.tokenizer import MarianTokenizer

    directory = resolve_model_path("en-zh")
    translator = Translator.from_pretrained(directory, device="cpu")
    assert isinstance(translator.step, CompiledStep)
    info = translator.runtime_info
    assert info["runtime"] == "compiled" and info["precision"] == "float32" and info["threads"] >= 1
    # the level the loops run at is this CPU's, as ATen detects it on its own
    aten = torch.backends.cpu.get_cpu_capability()
    assert info["cpu_isa"] == {"AVX512": "avx512", "AVX2": "avx2"}.get(aten, "x86-64")
    tokenizer = MarianTokenizer.from_directory(directory)
    reference = Translator(translator.model, tokenizer, step=EagerStep(translator.model))
    texts = ["I will call you later.", "They work together.", "Where is the station?"]
    assert [t.text for t in translator.translate(texts)] == [t.text for t in reference.translate(texts)]


def test_eager_when_asked(monkeypatch):
    monkeypatch.setenv(RUNTIME_ENV, "eager")
    step = load_step(random_model("tiny"), "float32")
    assert isinstance(step, EagerStep) and step.info.runtime == "eager" and RUNTIME_ENV in step.info.reason


def test_without_a_compiler_the_service_decodes_eagerly_and_says_why(tmp_path):
    """A machine with no C++ compiler: the build fails, one warning names why, and decoding goes on eagerly."""
    script = (
        "import logging, random; logging.basicConfig(level=logging.WARNING)\n"
        "from model.runtime import load_step\n"
        "from tests.model.test_runtime import random_model\n"
        "from model.decoding.search import beam_search\n"
        "model = random_model('tiny'); step = load_step(model, 'float32')\n"
        "print('RUNTIME', step.info.runtime, '|', step.info.reason)\n"
        "print('IDS', beam_search(model, [[3, 4, 0]], step=step)[0][0].token_ids)\n"
        "print('REFERENCE', beam_search(model, [[3, 4, 0]], reference=True)[0][0].token_ids)\n"
    )
    env = {**os.environ, "CXX": "/bin/false", "TRANSLATE_RUNTIME_BUILD_DIR": str(tmp_path / "build")}
    env.pop(RUNTIME_ENV, None)
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines())
    assert lines["RUNTIME"].startswith("eager | the compiled step could not be built")
    assert lines["IDS"] == lines["REFERENCE"]
    warnings = [line for line in result.stderr.splitlines() if "decoding runtime" in line]
    assert len(warnings) == 1 and "decoding eagerly" in warnings[0]


@pytest.mark.skipif(not torch.backends.cpu.get_cpu_capability().startswith("AVX"), reason="needs an AVX2 CPU")
def test_the_avx2_path_asked_for_on_any_x86_cpu_runs_at_avx2_and_decodes_as_the_reference():
    """TRANSLATE_CPU_ISA=avx2 (model/cpu_isa.py): the runtime's loops, ATen, oneDNN and fbgemm at AVX2, the AVX2
    int8 tiles in place of the VNNI ones, every fp32 kernel decoding as the lecture model does (the reference's own
    step, in the same process), and int8 on the AVX2 tiles decoding each source in a batch to the ids it gets alone
    (batch invariance; scores may differ where a code's rounding flips under the encoder's float32 differences)."""
    script = (
        "import random, torch\n"
        "from model.decoding.search import beam_search\n"
        "from model.runtime import CompiledStep, compiled_extension\n"
        "from tests.model.test_runtime import OPTIONS, SHAPES, assert_decodes_as_the_reference, random_model, "
        "random_sources\n"
        "ext = compiled_extension()\n"
        "print('ISA', ext.cpu_isa(), torch.backends.cpu.get_cpu_capability())\n"
        "for shape in SHAPES:\n"
        "    model = random_model(shape); sources = random_sources(random.Random(1), model, 5)\n"
        "    for kernel in ('linear', 'transposed', 'onednn'):\n"
        "        step = CompiledStep(model, ext, 'float32', choose=False); step.force(kernel)\n"
        "        for options in OPTIONS:\n"
        "            assert_decodes_as_the_reference(model, step, sources, options, (shape, kernel), "
        "return_attention=True)\n"
        "from model.runtime.step import _prepack\n"
        "ones = torch.ones(4, 256); ones[:, 0] = -1.0\n"
        "summed = ext.int8_linear(ones, _prepack(ext, torch.ones(64, 256)), torch.zeros(64), False, False)\n"
        "print('FBGEMM', summed[0, 0].item())\n"
        "model = random_model('gelu-wide'); sources = random_sources(random.Random(2), model, 6)\n"
        "int8 = CompiledStep(model, ext, 'int8')\n"
        "print('INFO', int8.info.cpu_isa, int8.info.int8_tiles, sorted(set(int8.info.kernels.values())))\n"
        "int8.force('tiles')\n"
        "kernels = int8.info.kernels.items()\n"
        "print('ENCODER', sorted({k.split('.')[-1] + '=' + v for k, v in kernels if k.startswith('encoder')}))\n"
        "for options in OPTIONS:\n"
        "    together = beam_search(model, sources, options, step=int8)\n"
        "    for source, batched in zip(sources, together, strict=True):\n"
        "        alone = beam_search(model, [source], options, step=int8)[0]\n"
        "        assert [h.token_ids for h in alone] == [h.token_ids for h in batched], options\n"
    )
    output = python_output(script, 600, held_to("avx2", ONEDNN_VERBOSE="1"))
    encoder = [line for line in output.splitlines() if line.startswith("ENCODER")]
    # 7-bit rows: of the encoder, only fc2 has an int8 copy (its fc1 too cost en-zh 0.38 BLEU; docs/decisions.md)
    assert encoder == ["ENCODER ['fc1=linear/linear', 'fc2=tiles/tiles', 'out=linear/linear', 'qkv=linear/linear']"]
    lines = [line for line in output.splitlines() if line.startswith(("ISA", "FBGEMM", "INFO"))]
    assert lines[0] == "ISA 2 AVX2", lines
    # fbgemm at AVX2 too: 8-bit activations (255) times weights of 127 summed in pairs overflow vpmaddubsw's int16
    # (AVX2), not vpdpbusd's int32 (VNNI): the exact 254 comes back only from a VNNI kernel
    assert float(lines.pop(1).split()[1]) < 100, lines
    assert lines[1].startswith("INFO avx2 avx2 "), lines  # the level, then the int8 tiles: AVX2's, not VNNI's
    assert "isa:Intel AVX2" in output.replace("onednn_verbose,v1,info,cpu,", "")  # oneDNN's own report


def test_an_unknown_cpu_isa_is_refused_by_name():
    env = {**os.environ, "TRANSLATE_CPU_ISA": "sse9"}
    result = subprocess.run(
        [sys.executable, "-c", "import model"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode != 0 and "TRANSLATE_CPU_ISA='sse9': expected one of auto, avx512, avx2, x86-64" in (
        result.stderr
    )
