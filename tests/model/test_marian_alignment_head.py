"""Marian checkpoints that declare no alignment head: the head Marian's guided alignment trains, as CTranslate2
serves it (`return_attention` on the converted model: the last decoder layer's head 0, at the predicting step)."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest
import torch

from model import Translator
from model.explanations.alignment import alignment_matrix
from model.explanations.explain import forced_decode
from model.loading import PRETRAINED_DIR
from tests.harness.tiny import make_hf_model_dir, synthetic_corpus

ctranslate2 = pytest.importorskip("ctranslate2")

SHIPPED_SOURCES = {
    "en-zh": ["I tried to go home.", "Where is the station?", "Tom likes to read books.", "It is very cold today."],
    "zh-en": ["我没什么可说的。", "车站在哪里？", "汤姆喜欢看书。", "今天很冷。"],
}
BUDGET = 16  # new tokens: random models babble to the budget
# Ours and CTranslate2's row, two float32 engines: CTranslate2's own rows lie up to 1.2e-4 from the float64 forced
# decode on the shipped zh-en (ours within 5e-7 of it; checked below as EXACT_TOLERANCE), so the bound between the
# two is CTranslate2's error with a factor of two.
ROW_TOLERANCE = 2.5e-4
EXACT_TOLERANCE = 1e-5  # ours against the same checkpoint's forced decode in float64


def undeclared(directory: Path, out: Path) -> Path:
    """A copy of a model directory with its alignment declaration (layer, head, shift) taken out of config.json."""
    shutil.copytree(directory, out)
    config = json.loads((out / "config.json").read_text())
    for key in ("alignment_layer", "alignment_head", "alignment_shift"):
        config.pop(key, None)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


# Random checkpoints in transformers' own initialisation (two shapes), and the shipped models undeclared. Not the
# harness's `randomize`d checkpoints (random layer norms, positions and all), nor unequal encoder and decoder head
# counts: CTranslate2's converted model does not decode those as transformers does, so it is no oracle there.
RANDOM_SHAPES = {
    "random-small": {"seed": 21},
    "random-wider": {
        "seed": 22,
        "d_model": 64,
        "encoder_layers": 3,
        "decoder_layers": 3,
        "encoder_attention_heads": 8,
        "decoder_attention_heads": 8,
    },
}


@pytest.fixture(scope="module", params=[*RANDOM_SHAPES, "shipped-en-zh", "shipped-zh-en"])
def checkpoint(request, tmp_path_factory) -> tuple[Translator, object, list[str]]:
    root = tmp_path_factory.mktemp(request.param)
    if request.param in RANDOM_SHAPES:
        directory = make_hf_model_dir(root / "model", shared=True, init_std=0.2, **RANDOM_SHAPES[request.param])
    else:
        directory = undeclared(PRETRAINED_DIR / request.param.removeprefix("shipped-"), root / "model")
    translator = Translator.from_pretrained(directory, device="cpu")
    ctranslate2.converters.TransformersConverter(str(directory)).convert(str(root / "ct2"), force=True)
    engine = ctranslate2.Translator(str(root / "ct2"), device="cpu", compute_type="float32", intra_threads=1)
    texts = SHIPPED_SOURCES.get(request.param.removeprefix("shipped-")) or [
        english for english, _ in synthetic_corpus(count=6, seed=13)
    ]
    return translator, engine, texts


@pytest.mark.parametrize("beam_size", [1, 4])
def test_the_alignment_reads_the_row_ctranslate2_returns_as_attention(checkpoint, beam_size):
    translator, engine, texts = checkpoint
    last = translator.config.decoder_layers - 1
    assert translator.alignment_head == (last, 0) and not translator.alignment_shift
    assert translator.alignment.reason == "marian default"
    ours = translator.translate(
        texts,
        beam_size=beam_size,
        max_new_tokens=BUDGET,
        return_attention=True,
    )
    results = engine.translate_batch(
        [translator.tokenizer.source_tokens(ids) for ids in translator.encode_source(texts)],
        beam_size=beam_size,
        max_decoding_length=BUDGET,
        return_attention=True,
        return_end_token=True,
    )
    double = copy.deepcopy(translator.exact_model).double()
    compared = 0
    for translation, result in zip(ours, results, strict=True):
        theirs = result.hypotheses[0]
        # the rows of the tokens both engines chose (a random model's last token may be our forced </s>)
        same = 0
        while (
            same < min(len(theirs), len(translation.target_tokens)) and theirs[same] == translation.target_tokens[same]
        ):
            same += 1
        assert same >= min(len(theirs), len(translation.target_tokens)) - 1, (theirs, translation.target_tokens)
        # CTranslate2's beam search returns another row for the first step (a row of the search before its beams
        # spread); every later step is compared, and greedy's every step
        start = 1 if beam_size > 1 else 0
        rows = alignment_matrix(translation.cross_attention, *translator.alignment_head)[start:same]
        reference = torch.tensor(result.attention[0][start:same])
        assert rows.shape == reference.shape
        assert torch.allclose(rows, reference, atol=ROW_TOLERANCE), (rows - reference).abs().max()
        exact = forced_decode(double, translation.source_ids, translation.target_ids, encoder_attention=False)
        exact_rows = alignment_matrix(exact.cross_attention, *translator.alignment_head)[start:same].float()
        assert torch.allclose(rows, exact_rows, atol=EXACT_TOLERANCE), (rows - exact_rows).abs().max()
        # the alignment is the argmax of CTranslate2's row over the source tokens but </s>
        expected = [(int(s), start + t) for t, s in enumerate(reference[:, :-1].argmax(dim=-1))]
        assert translation.alignment[start:same] == expected
        compared += same
    assert compared >= len(texts) * 3
