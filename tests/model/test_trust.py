"""Trust on constructed cases with the shipped models: each flag kind where a translation has that fault, none where
it is right, the score ordering right above wrong, and the calibration's round trip (model.trust)."""

from __future__ import annotations

import json
import math
import random
import shutil
from pathlib import Path

import pytest

from model import DecodingOptions, InvalidInputError, Translator
from model.calibration import (
    CALIBRATION_NAME,
    SCORE_SIGNALS,
    Calibration,
    auc_gain_interval,
    fit_mode,
    reliability,
    roc_auc,
)
from model.training.flag_cases import KEEP_PRECISION, constructed_cases, measure
from model.training.trust_data import labelled_sources, translate_and_label
from model.trust import FAST_SIGNALS, FULL_SIGNALS, tandem_repeats


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
    fitted.reliability = reliability([fitted.probability(r) for r in rows], labels)
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
    held = translation.trust.held_out  # the bin of the stored reliability the score falls in
    assert held in fitted.reliability and held["low"] <= translation.trust.score + 1e-4
    assert loaded.trust_info["reliability"]["fast"] == fitted.reliability
    stored = json.loads((directory / CALIBRATION_NAME).read_text())
    stored["fitted_on"]["weights_digest"] = "0" * 16
    (directory / CALIBRATION_NAME).write_text(json.dumps(stored))
    stale = Translator.from_pretrained(directory)
    assert stale.trust_info["calibrated"] is False and "refit" in stale.trust_info["note"]
    (translation,) = stale.translate(["Good morning."])
    stale.assess([translation], "fast")
    assert not translation.trust.calibrated and translation.trust.held_out is None
    assert translation.trust.score == pytest.approx(math.exp(translation.trust.signals["forward_logprob"]), abs=1e-4)


def test_reliability_bins_count_and_share_as_by_hand():
    """Equal-count bins of sorted scores, each with its range, count and share of good; ties never split."""
    scores = [0.9, 0.1, 0.5, 0.5, 0.3, 0.7, 0.2, 0.8]
    labels = [1, 0, 1, 0, 0, 1, 0, 1]
    # sorted: 0.1 0.2 | 0.3 0.5 0.5 (the edge's tie joins) | 0.7 | 0.8 0.9
    assert reliability(scores, labels, bins=4) == [
        {"low": 0.1, "high": 0.2, "answers": 2, "adequate": 0.0},
        {"low": 0.3, "high": 0.5, "answers": 3, "adequate": 0.3333},
        {"low": 0.7, "high": 0.7, "answers": 1, "adequate": 1.0},
        {"low": 0.8, "high": 0.9, "answers": 2, "adequate": 1.0},
    ]
    assert reliability([0.4] * 5, [1, 0, 1, 0, 1], bins=3) == [{"low": 0.4, "high": 0.4, "answers": 5, "adequate": 0.6}]


DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
_HELD_OUT: dict[str, list] = {}


def held_out(name: str, en_zh: Translator, zh_en: Translator) -> tuple[Translator, Translator, list]:
    """The model of `name`, its reverse, and the held-out ("test") half of the development sources translated and
    labelled against their references (once per session)."""
    model, reverse = (en_zh, zh_en) if name == "en-zh" else (zh_en, en_zh)
    if name not in _HELD_OUT:
        source, target = name.split("-")
        items = labelled_sources(str(DATA), source, target, model, "test")
        translate_and_label(items, model, reverse, target)
        _HELD_OUT[name] = items
    return model, reverse, _HELD_OUT[name]


@pytest.mark.skipif(not (DATA / "tatoeba-en-zh").is_dir(), reason=f"shared data missing at {DATA}")
@pytest.mark.parametrize("name", ["en-zh", "zh-en"])
def test_the_shipped_score_means_what_it_says_on_sentences_the_fit_never_saw(name, en_zh, zh_en):
    """The shipped score, against human references: on the held-out half of the development sources (the fit
    used the other half), labelled by sentence chrF against the references, the score separates adequate from not
    as Seq-Logprob does (it is Seq-Logprob calibrated, SCORE_SIGNALS), and its probabilities match what happened:
    within each tenth of the scores the share adequate lies within three binomial standard errors (+0.02) of the
    mean score, and the expected calibration error over the tenths is under 0.06 (measured 0.035 en-zh, 0.043
    zh-en). The meaning the viewer states is the bin of the stored reliability the score falls in."""
    model, _, items = held_out(name, en_zh, zh_en)
    assert SCORE_SIGNALS["fast"] == ("forward_logprob",)
    fit = model.trust_fit("fast")
    scores = [fit.probability(item.signals) for item in items]
    labels = [item.good for item in items]
    logprob = [item.signals["forward_logprob"] for item in items]
    assert roc_auc(scores, labels) == pytest.approx(roc_auc(logprob, labels), abs=0.002)
    ranked = sorted(zip(scores, labels, strict=True))
    tenth = len(ranked) // 10
    error = 0.0
    for start in range(0, tenth * 10, tenth):
        chunk = ranked[start : start + tenth]
        mean_score = sum(s for s, _ in chunk) / len(chunk)
        share = sum(label for _, label in chunk) / len(chunk)
        spread = math.sqrt(max(mean_score * (1 - mean_score), 1e-4) / len(chunk))
        assert abs(mean_score - share) <= 3 * spread + 0.02, (start, mean_score, share)
        error += abs(mean_score - share) / 10
    assert error < 0.06
    highs = [found["high"] for found in fit.reliability]
    for score in (min(scores), sorted(scores)[len(scores) // 2], max(scores)):
        held = fit.held_out(score)  # the first stored bin reaching up to the score, else the last
        expected = next((found for found in fit.reliability if score <= found["high"]), fit.reliability[-1])
        assert held == expected and (score <= held["high"] or held["high"] == max(highs))


def en_zh_dir():
    from model.loading import resolve_model_path

    return resolve_model_path("en-zh")


@pytest.mark.skipif(not (DATA / "tatoeba-en-zh").is_dir(), reason=f"shared data missing at {DATA}")
@pytest.mark.parametrize("name", ["en-zh", "zh-en"])
def test_each_flag_kind_earns_its_place_on_constructed_faults(name, en_zh, zh_en):
    """Flags on faults made on purpose (model/training/flag_cases.py: a dropped second sentence, an appended
    translation, a repeated stretch, the source copied through, a decode cut by its budget) beside the same
    adequate held-out translations unmodified, on up to 150 pairs as bench.trust_flags: every kind that could be
    constructed is right at least KEEP_PRECISION of the time and finds some of its faults (en-zh's addition is the
    closest: 0.61, recall 0.20, docs/explanations.md)."""
    model, reverse, items = held_out(name, en_zh, zh_en)
    source, target = name.split("-")
    pairs = [(item.source, item.translation) for item in items if item.category == "clean" and item.good][:150]
    measured = measure(model, reverse, constructed_cases(model, pairs, source, target), "fast").as_dict()
    assert measured["unmodified"] == len(pairs)
    for kind, found in measured["kinds"].items():
        if found["cases"] == 0:
            assert kind == "untranslated" and target == "en"  # an English vocabulary cannot write Chinese
            continue
        assert found["precision"] >= KEEP_PRECISION, (kind, found)
        assert found["recall"] > 0, (kind, found)


def test_agreement_and_full_trust_force_the_reverse_model_once_and_answer_as_each_alone(en_zh, zh_en):
    """With a shared ReverseReading, the agreement and trust "full" of the same translations force each pair
    through the reverse model once (its encoder runs half as often), and give what each gives alone."""
    texts = ["The cat sat on the mat.", "Where is the station?", "I would like a cup of tea, please.", ""]
    options = DecodingOptions(beam_size=4, n_best=2)
    encodes = []
    encode = zh_en.exact_model.encode

    def counted(*args, **kwargs):
        encodes.append(args[0].size(0))
        return encode(*args, **kwargs)

    zh_en.exact_model.encode = counted
    try:
        alone = en_zh.with_agreements(en_zh.translate(texts, options), zh_en)
        en_zh.assess(alone, "full", zh_en, options)
        apart = list(encodes)
        encodes.clear()
        reading = zh_en.reverse_reading()
        shared = en_zh.with_agreements(en_zh.translate(texts, options), zh_en, reading)
        en_zh.assess(shared, "full", zh_en, options, reading)
    finally:
        del zh_en.exact_model.encode
    hypotheses = [h for t in shared if t.target_ids for h in (t, *t.alternatives)]
    pairs = {(tuple(h.source_ids), h.text) for h in hypotheses}
    assert reading.forced == len(pairs) and sum(encodes) == len(pairs) and sum(apart) == 2 * len(pairs)
    for one, other in zip(alone, shared, strict=True):
        for a, b in zip((one, *one.alternatives), (other, *other.alternatives), strict=True):
            assert (a.alignment, a.word_alignment, a.alignment_method) == (b.alignment, b.word_alignment,
                                                                        b.alignment_method)
            assert (a.trust is None) == (b.trust is None)
            if a.trust is not None:
                assert a.trust.mode == b.trust.mode == "full" and a.trust.flags == b.trust.flags
                assert a.trust.score == pytest.approx(b.trust.score, abs=1e-6)
                for name, value in a.trust.signals.items():
                    assert b.trust.signals[name] == pytest.approx(value, abs=1e-6), name
