"""Trust on constructed cases with the shipped models: each flag kind where a translation has that fault, none where
it is right, the score ordering right above wrong, and the calibration's round trip (model.trust)."""

from __future__ import annotations

import json
import math
import random
import shutil

import pytest

from model import DecodingOptions, InvalidInputError, Translator
from model.trust import (
    CALIBRATION_NAME,
    FAST_SIGNALS,
    FULL_SIGNALS,
    Calibration,
    auc_gain_interval,
    fit_mode,
    roc_auc,
    tandem_repeats,
)


@pytest.fixture(scope="module")
def en_zh() -> Translator:
    return Translator.from_pretrained("en-zh")


@pytest.fixture(scope="module")
def zh_en() -> Translator:
    return Translator.from_pretrained("zh-en")


def assessed(model: Translator, reverse: Translator, source: str, target: str, mode: str):
    translation = model.force(source, target)
    model.assess([translation], mode, reverse)
    return translation


def flagged(translation, kind: str) -> set[str]:
    return {word for flag in translation.trust.flags if flag.kind == kind for word in flag.text}


@pytest.mark.parametrize("mode", ["fast", "full"])
def test_a_dropped_clause_is_an_omission(en_zh, zh_en, mode):
    translation = assessed(en_zh, zh_en, "I forgot my umbrella at the restaurant.", "我忘了。", mode)
    assert "umbrella" in flagged(translation, "omission")
    kept = assessed(en_zh, zh_en, "I forgot my umbrella at the restaurant.", "我把我的伞忘在餐馆里了。", mode)
    assert not kept.trust.flags
    assert kept.trust.score > translation.trust.score


def test_the_reverse_model_confirms_an_omission_into_english(zh_en, en_zh):
    """请把窗户关上，外面太冷了。 → "Please close the window." drops the cold outside."""
    translation = assessed(zh_en, en_zh, "请把窗户关上，外面太冷了。", "Please close the window.", "full")
    source = "请把窗户关上，外面太冷了。"
    omitted = "".join(flagged(translation, "omission"))  # words: characters for a char-level model
    assert "冷" in omitted and ("外" in omitted or "面" in omitted)
    whole = assessed(zh_en, en_zh, source, "Please close the window, it's too cold outside.", "full")
    assert "冷" not in "".join(flagged(whole, "omission"))


def test_a_repeating_translation_is_flagged_and_scored_down(en_zh, zh_en):
    translation = assessed(en_zh, zh_en, "I am very happy today.", "我今天很高兴很高兴很高兴很高兴。", "fast")
    assert flagged(translation, "repetition")
    assert translation.trust.signals["repetition"] > 0.3
    clean = assessed(en_zh, zh_en, "I am very happy today.", "我今天很高兴。", "fast")
    assert not flagged(clean, "repetition") and clean.trust.signals["repetition"] == 0


def test_a_source_copied_through_is_untranslated(en_zh, zh_en):
    source = "The meeting starts at nine tomorrow."
    translation = assessed(en_zh, zh_en, source, source, "fast")
    assert {"meeting", "starts"} <= {w.lower() for w in flagged(translation, "untranslated")}
    assert translation.trust.signals["untranslated"] >= 0.5


def test_a_translation_cut_by_the_length_budget_is_truncated(en_zh, zh_en):
    (translation,) = en_zh.translate(["I forgot my umbrella at the restaurant."], DecodingOptions(max_new_tokens=3))
    en_zh.assess([translation], "fast", zh_en, DecodingOptions(max_new_tokens=3))
    assert translation.trust.signals["truncated"] == 1
    assert [flag.kind for flag in translation.trust.flags if flag.kind == "truncated"] == ["truncated"]


def test_modes_and_their_refusal(en_zh, zh_en):
    (translation,) = en_zh.translate(["Good morning."])
    en_zh.assess([translation], "off", zh_en)
    assert translation.trust is None
    en_zh.assess([translation], "full")  # no reverse model: the decode's own signals
    assert translation.trust.mode == "fast" and "reverse_logprob" not in translation.trust.signals
    en_zh.assess([translation], "full", zh_en)
    assert translation.trust.mode == "full" and set(translation.trust.signals) == set(FULL_SIGNALS)
    assert 0 <= translation.trust.score <= 1
    with pytest.raises(InvalidInputError):
        en_zh.assess([translation], "deep", zh_en)


def test_roc_auc_counts_pairs():
    """Against the definition: the share of (good, bad) pairs ordered right, ties half."""
    rng = random.Random(3)
    scores = [rng.choice([0.1, 0.2, 0.3, 0.5, 0.8]) for _ in range(60)]
    labels = [int(rng.random() < 0.3 + 0.5 * s) for s in scores]
    pairs = [(g, b) for g, lg in zip(scores, labels) if lg for b, lb in zip(scores, labels) if not lb]
    expected = sum(1.0 if g > b else 0.5 if g == b else 0.0 for g, b in pairs) / len(pairs)
    assert roc_auc(scores, labels) == pytest.approx(expected)


def test_the_auc_gain_interval_is_zero_for_the_same_scores_and_covers_a_real_gain():
    rng = random.Random(3)
    labels = [rng.random() < 0.6 for _ in range(400)]
    labels = [int(label) for label in labels]
    groups = [i // 2 for i in range(400)]  # pairs drawn together
    baseline = [rng.random() for _ in labels]  # chance: AUC near 0.5
    perfect = [label + rng.random() * 0.1 for label in labels]  # AUC 1
    assert auc_gain_interval(groups, labels, baseline, baseline, rounds=200) == (0.0, 0.0)
    low, high = auc_gain_interval(groups, labels, perfect, baseline, rounds=400)
    gain = roc_auc(perfect, labels) - roc_auc(baseline, labels)
    assert low < gain < high and 0.3 < low and high < 0.7  # 1 − (a chance AUC), give or take its sampling spread


def test_tandem_repeats_need_the_back_to_back_stretch():
    assert tandem_repeats(["a", "b", "a", "b", "c"]) == [(2, 4)]
    assert tandem_repeats(["x", "x", "y"]) == []  # one piece twice is language ("很很" is not, but "谢谢" is)
    assert tandem_repeats(["x", "x", "x", "y"]) == [(1, 3)]


def test_calibration_round_trip(tmp_path, en_zh, zh_en):
    """A fit on separable rows separates them, survives save/load, and is ignored for other weights."""
    rng = random.Random(5)
    rows, labels = [], []
    for _ in range(200):
        good = rng.random() < 0.5
        row = {name: rng.gauss(0, 1) for name in FULL_SIGNALS}
        row["forward_logprob"] = rng.gauss(-0.3 if good else -1.5, 0.3)
        rows.append(row)
        labels.append(int(good))
    fitted = fit_mode(rows, labels, FAST_SIGNALS)
    assert roc_auc([fitted.probability(r) for r in rows], labels) > 0.95
    directory = tmp_path / "en-zh"
    shutil.copytree(en_zh_dir(), directory)
    Calibration({"fast": fitted}, {"weights_digest": en_zh.weights_digest}).save(directory)
    loaded = Translator.from_pretrained(directory)
    assert loaded.trust_info["calibrated"] is True
    assert loaded.calibration.modes["fast"].probability(rows[0]) == pytest.approx(fitted.probability(rows[0]))
    (translation,) = loaded.translate(["Good morning."])
    loaded.assess([translation], "fast", zh_en)
    assert translation.trust.calibrated
    assert translation.trust.score == pytest.approx(fitted.probability(translation.trust.signals), abs=1e-4)
    stored = json.loads((directory / CALIBRATION_NAME).read_text())
    stored["fitted_on"]["weights_digest"] = "0" * 16
    (directory / CALIBRATION_NAME).write_text(json.dumps(stored))
    stale = Translator.from_pretrained(directory)
    assert stale.trust_info["calibrated"] is False and "refit" in stale.trust_info["note"]
    (translation,) = stale.translate(["Good morning."])
    stale.assess([translation], "fast")
    assert not translation.trust.calibrated
    assert translation.trust.score == pytest.approx(math.exp(translation.trust.signals["forward_logprob"]), abs=1e-4)


def en_zh_dir():
    from model.translator import resolve_model_path

    return resolve_model_path("en-zh")
