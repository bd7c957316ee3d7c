"""The Translator API and CLI as a user meets them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from model import InputTooLongError, InvalidInputError, Translator, UnknownModelError
from model.tokenizer import word_groups
from model.translator import token_alignment
from tests.tiny import make_model_dir


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("translator"), shared=False, seed=6)


@pytest.fixture(scope="module")
def translator(model_dir):
    return Translator.from_pretrained(model_dir, device="cpu")


def test_translation_carries_tokens_scores_alignment(translator):
    result = translator.translate(["The cat sat on the mat."], beam_size=2)[0]
    assert isinstance(result.text, str)
    assert result.source_tokens[-1] == "</s>"
    assert len(result.token_logprobs) == len(result.target_tokens) == len(result.target_ids)
    assert [t for _, t in result.alignment] == list(range(len(result.target_tokens)))
    assert all(0 <= s < len(result.source_tokens) for s, _ in result.alignment)
    assert result.cross_attention is None  # only when asked for


def test_alignment_follows_the_penultimate_layer_head_average(translator):
    result = translator.translate(["We like tea and coffee today."], beam_size=1, return_attention=True)[0]
    layer = max(0, translator.config.decoder_layers - 2)
    expected = result.cross_attention[layer].mean(0).argmax(-1).tolist()
    assert [s for s, _ in result.alignment] == expected
    assert token_alignment(result.cross_attention, layer) == result.alignment


def test_word_alignment_covers_every_target_word(translator):
    result = translator.translate(["The quick brown fox jumps over the lazy dog."], beam_size=1)[0]
    assert [t for _, t in result.word_alignment] == list(range(len(result.target_words)))
    assert all(0 <= s < len(result.source_words) for s, _ in result.word_alignment)
    assert "quick" in result.source_words


def test_word_groups_merge_pieces_and_split_chinese():
    assert word_groups(["▁The", "▁qu", "ick", "▁fox", ".", "</s>"]) == [[0], [1, 2], [3, 4], [5]]
    assert word_groups(["▁我", "喜欢", "猫", "。", "</s>"]) == [[0], [1], [2], [3], [4]]


def test_n_best_alternatives_are_returned(translator):
    result = translator.translate(["I love my family."], beam_size=4, num_return_sequences=3)[0]
    assert len(result.alternatives) == 2


def test_bad_input_is_refused_clearly(translator):
    with pytest.raises(InvalidInputError):
        translator.translate("not a list")
    with pytest.raises(InvalidInputError):
        translator.translate([3])
    with pytest.raises(InvalidInputError, match="num_return_sequences"):
        translator.translate(["Hi"], beam_size=2, num_return_sequences=3)
    with pytest.raises(InputTooLongError):
        translator.translate(["word " * 400])


def test_unknown_model_lists_what_is_available():
    with pytest.raises(UnknownModelError, match="shipped models"):
        Translator.from_pretrained("xx-yy")


def test_dtype_and_device_are_honoured(model_dir):
    translator = Translator.from_pretrained(model_dir, device="cpu", dtype=torch.bfloat16)
    assert translator.device.type == "cpu"
    assert translator.translate(["The cat."], beam_size=1)[0].target_tokens


def test_cli_prints_json_with_attention(model_dir):
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "model",
            "translate",
            "--model",
            str(model_dir),
            "--json",
            "--beam-size",
            "2",
            "The cat sat.",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    [result] = json.loads(completed.stdout)
    assert set(result) >= {
        "text",
        "source_tokens",
        "target_tokens",
        "score",
        "token_scores",
        "alignment",
        "cross_attention",
    }


def test_cli_reports_a_missing_model_without_a_traceback(tmp_path):
    completed = subprocess.run(
        [sys.executable, "-m", "model", "translate", "--model", str(tmp_path / "missing"), "Hello"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 2
    assert "error:" in completed.stderr and "Traceback" not in completed.stderr
