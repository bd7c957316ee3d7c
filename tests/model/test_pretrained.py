"""The shipped default models: they load by name, translate into the right script, and agree with transformers."""

from __future__ import annotations

import json
import re
import unicodedata
from pathlib import Path

import pytest
import torch

from model import Translator
from model.loading import PRETRAINED_DIR, pretrained_names
from model.tokenizer import is_cjk
from tests.harness.tiny import DEVICE

transformers = pytest.importorskip("transformers")

SOURCES = {
    "en-zh": ["I have nothing to say.", "Where is the station?", "Tom likes to read books.", "It is very cold today."],
    "zh-en": ["我没什么可说的。", "车站在哪里？", "汤姆喜欢看书。", "今天很冷。"],
}
SCRIPT = {"en-zh": re.compile(r"[\u4e00-\u9fff]"), "zh-en": re.compile(r"[A-Za-z]{2,}")}


def test_both_directions_are_shipped():
    assert {"en-zh", "zh-en"} <= set(pretrained_names())


@pytest.fixture(scope="module", params=["en-zh", "zh-en"])
def shipped(request):
    return request.param, Translator.from_pretrained(request.param, device=DEVICE)


def test_each_model_is_small_and_has_a_model_card(shipped):
    name, _ = shipped
    directory = PRETRAINED_DIR / name
    size = sum(p.stat().st_size for p in directory.iterdir() if p.is_file())
    assert size <= 25 * 1024 * 1024
    card = (directory / "README.md").read_text(encoding="utf-8")
    assert "Tatoeba" in card and "CC-BY 2.0" in card and "BLEU" in card
    assert "HSK" in card and "CC-CEDICT" in card and "CC-BY-SA 4.0" in card and "share-alike" in card


def test_translations_are_non_empty_and_in_the_target_script(shipped):
    name, translator = shipped
    for translation in translator.translate(SOURCES[name], beam_size=4):
        assert translation.text.strip()
        assert SCRIPT[name].search(translation.text), translation.text


def test_greedy_output_equals_transformers(shipped):
    name, translator = shipped
    reference = transformers.MarianMTModel.from_pretrained(PRETRAINED_DIR / name, torch_dtype=torch.float32).eval()
    tokenizer = transformers.MarianTokenizer.from_pretrained(PRETRAINED_DIR / name)
    ids = translator.encode_source(SOURCES[name])
    assert ids == [tokenizer(text)["input_ids"] for text in SOURCES[name]]
    for source, hypotheses in zip(ids, translator.generate(ids, beam_size=1, max_new_tokens=40)):
        expected = reference.generate(torch.tensor([source]), num_beams=1, do_sample=False, max_new_tokens=40)
        assert hypotheses[0].token_ids == expected[0, 1:].tolist()
        assert translator.tokenizer.decode(hypotheses[0].token_ids) == tokenizer.decode(
            expected[0], skip_special_tokens=True
        )


def test_chinese_output_writes_chinese_punctuation():
    """The target sentencepiece model folds ？！， to ASCII (NFKC); the text users get has them back."""
    translator = Translator.from_pretrained("en-zh", device=DEVICE)
    questions = translator.translate(["Where is the station?", "Are you hungry?", "Do you like tea?"], beam_size=4)
    for translation in questions:
        assert translation.text.endswith("？"), translation.text
        assert "?" not in translation.text
    # English output and numbers keep ASCII punctuation
    from model.tokenizer import restore_full_width

    assert restore_full_width("OK, 1,000 cats?") == "OK, 1,000 cats?"
    assert restore_full_width("你好,我有1,000元!") == "你好，我有1,000元！"


def test_chinese_source_text_does_not_start_with_a_lone_word_boundary_piece():
    translator = Translator.from_pretrained("zh-en", device=DEVICE)
    for text in ["到了你该去睡觉的时候了。", "我也是这么想的。", "今天很冷。"]:
        assert translator.tokenizer.source_tokens(translator.encode_source([text])[0])[0] != "\u2581"


def test_chinese_output_is_one_piece_per_character_and_never_starts_with_a_lone_word_boundary():
    """The shipped en-zh writes Chinese one character per piece (a piece never spans two words), with no dummy
    "▁" prefix: no output begins with a lone "▁", each character is its own word, and the words cover the text."""
    translator = Translator.from_pretrained("en-zh", device=DEVICE)
    texts = [
        "The meat has gone bad.",
        "Edison invented many useful things.",
        "Can you please shut up?",
        "French isn't Tom's native language.",
        "I like tea.",
        "Where is the station?",
    ]
    for translation in translator.translate(texts, beam_size=4):
        assert translation.target_tokens[0] != "\u2581", translation.target_tokens
        pieces = [t for t in translation.target_tokens if t != "</s>"]
        assert all(len(piece.replace("\u2581", "")) == 1 for piece in pieces if is_cjk(piece[-1])), pieces
        assert all(word.strip() for word in translation.target_words), translation.target_words
        assert [t for _, t in translation.word_alignment] == list(range(len(translation.target_words)))
        words = "".join(w for w in translation.target_words if w != "</s>")
        assert unicodedata.normalize("NFKC", words) == unicodedata.normalize("NFKC", translation.text.replace(" ", ""))


def test_the_cards_hand_judged_sentences_are_what_the_model_says(shipped):
    """scripts/everyday_judged.json holds each model's translations of everyday sentences with a person's verdict,
    shown in the model card: the verdicts must be about what the shipped weights translate now."""
    name, translator = shipped
    judged = json.loads((Path(__file__).resolve().parents[2] / "scripts" / "everyday_judged.json").read_text())
    rows = judged[name]
    translations = translator.translate([row[0] for row in rows], beam_size=4)
    assert [t.text for t in translations] == [row[1] for row in rows]
    card = (PRETRAINED_DIR / name / "README.md").read_text(encoding="utf-8")
    assert all(row[1] in card for row in rows)
