"""Labelled translations for the trust score, made without annotators (for calibrate_trust and bench.trust).

A model translates held-out development sources (the recipe's Tatoeba and HSK development pairs), perturbed sources
(rare pieces prepended, the sentence doubled, characters dropped: Lee et al. 2018's induced pathologies) and longer
texts (three consecutive sources joined); each translation is labelled good or bad by sentence chrF against its
reference(s), and bad whatever its chrF if it oscillates (a word or character 4-gram repeated at least twice more
than in the reference: Raunak et al. 2021's filter). Sources split by position: even ones fit the calibration,
odd ones test it, so bench.trust scores translations the fit never saw.
"""

from __future__ import annotations

import random
import statistics
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from model.errors import InputTooLongError
from model.options import DecodingOptions
from model.tokenizer import is_cjk
from model.training.recipe import development_pairs
from model.translator import Translator

# Sentence chrF at or above which a translation counts as adequate, by target language: chrF's character 6-grams
# score a Chinese paraphrase lower than an English one of the same quality (a sentence of ten characters has few).
GOOD_CHRF = {"zh": 40.0, "en": 50.0}
CATEGORIES = ("clean", "perturbed", "long")


@dataclass
class Item:
    source: str
    references: list[str]
    category: str  # "clean", "perturbed" (with `perturbation`), "long"
    perturbation: str = ""
    translation: str = ""
    chrf: float = 0.0
    oscillates: bool = False
    good: int = 0
    signals: dict | None = None  # the "full" signals of the translation
    flags: list | None = None
    ids: tuple[list[int], list[int]] | None = None  # (source ids, target ids) of the translation
    set: str = ""  # held_out_sets: which set ("tatoeba", "hsk", "long", "tico19")
    group: int = -1  # held_out_sets: items made from the same source(s) share a group
    token_logprobs: list[float] | None = None  # the translation's, one per target token (</s> included)


def good_chrf(language: str) -> float:
    return GOOD_CHRF.get(language, 50.0)


def _joiner(language: str) -> str:
    return "" if language == "zh" else " "


def _grams(text: str, language: str) -> Counter:
    units = [c for c in text if not c.isspace()] if language == "zh" else text.split()
    return Counter(tuple(units[i : i + 4]) for i in range(len(units) - 3))


def oscillates(translation: str, references: list[str], language: str) -> bool:
    hypothesis = _grams(translation, language)
    if not hypothesis:
        return False
    reference = max((_grams(r, language) for r in references), key=lambda c: sum(c.values()), default=Counter())
    return any(count - reference.get(gram, 0) >= 2 for gram, count in hypothesis.items() if count >= 3)


def rare_words(translator: Translator, count: int = 200) -> list[str]:
    """Source pieces the tokenizer scores least likely that are whole words of letters (for prepending)."""
    processor = translator.tokenizer.source_spm
    pieces = [processor.IdToPiece(i) for i in range(processor.GetPieceSize())]
    scored = sorted(range(len(pieces)), key=processor.GetScore)
    words = []
    for index in scored:
        core = pieces[index].replace("\u2581", "")
        if core and all(c.isalpha() for c in core) and (len(core) >= 3 or any(is_cjk(c) for c in core)):
            words.append(core)
        if len(words) >= count:
            break
    return words


def labelled_sources(
    data: str, source_language: str, target_language: str, translator: Translator, part: str, seed: int = 7
) -> list[Item]:
    """The items of `part` ("fit": even positions, "test": odd) before translation."""
    parts = development_pairs(data)
    pairs: dict[str, list[str]] = {}
    for pair in (*parts["tatoeba"], *parts["hsk"]):
        source, target = (pair.english, pair.chinese) if source_language == "en" else (pair.chinese, pair.english)
        pairs.setdefault(source, []).append(target)
    sources = [s for i, s in enumerate(pairs) if i % 2 == (0 if part == "fit" else 1)]
    rng = random.Random(f"{seed}:{part}:{source_language}")
    items = [Item(s, pairs[s], "clean") for s in sources]
    rare = rare_words(translator)
    for index, source in enumerate(sources[::3]):
        items.append(_perturbed(source, pairs[source], index, rng, rare, source_language, target_language))
    join_source, join_target = _joiner(source_language), _joiner(target_language)
    for start in range(0, len(sources) - 2, 12):
        group = sources[start : start + 3]
        items.append(Item(join_source.join(group), [join_target.join(pairs[s][0] for s in group)], "long"))
    return items


def _perturbed(
    source: str, references: list[str], index: int, rng: random.Random, rare: list[str], source_language: str,
    target_language: str,
) -> Item:
    """The perturbed copy of a source: two rare words prepended, the sentence doubled or characters dropped, in
    turn by `index`."""
    join_source, join_target = _joiner(source_language), _joiner(target_language)
    kind = ("rare", "doubled", "dropped")[index % 3]
    if kind == "rare":
        perturbed = join_source.join(rng.sample(rare, 2)) + join_source + source
    elif kind == "doubled":
        perturbed = source + join_source + source
        references = [r + join_target + r for r in references]
    else:
        positions = [i for i, c in enumerate(source) if not c.isspace()]
        drop = set(rng.sample(positions, max(1, len(positions) // 6)))
        perturbed = "".join(c for i, c in enumerate(source) if i not in drop)
    return Item(perturbed, references, "perturbed", kind)


HELD_OUT_SETS = ("tatoeba", "hsk", "long", "tico19")  # tico19: tested on only, never fitted on
# Sets out of the models' domain, labelled against their own median chrF rather than GOOD_CHRF: at the everyday
# threshold 1 to 6 of TICO-19's ~2,790 translations are adequate, so good against bad there says nothing; against
# its own median it asks whether a score ranks the better half of a domain's translations above the worse half.
OWN_THRESHOLD_SETS = ("tico19",)


def label_by_own_median(items: list[Item], sets: tuple[str, ...] = OWN_THRESHOLD_SETS) -> dict[str, float]:
    """Relabel the items of `sets`: good where chrF is at least the set's median chrF and the translation does
    not oscillate. Returns each relabelled set's threshold."""
    thresholds = {}
    for name in sets:
        members = [item for item in items if item.set == name]
        if not members:
            continue
        thresholds[name] = statistics.median(item.chrf for item in members)
        for item in members:
            item.good = int(item.chrf >= thresholds[name] and not item.oscillates)
    return thresholds


def held_out_sets(
    data: str, source_language: str, target_language: str, translator: Translator, seed: int = 7,
    limit: int | None = None,
) -> list[Item]:
    """Every labelled item by set and group, for fitting on some sets and testing on another (bench.trust_heldout).

    tatoeba, hsk: the recipe's development sources (both halves) and a perturbed copy of every third; long: three
    consecutive sources joined, from the fourth of the Tatoeba and HSK sources set aside for it (so none of its
    sources is in another set); tico19: TICO-19's test sentences (out of domain; test only) and a perturbed copy of
    every third. A source and its perturbed copy share a group. Items longer than the model accepts are left
    out (with their copies).
    `limit`: the first N sources per set.
    """
    parts = development_pairs(data)
    by_set: dict[str, dict[str, list[str]]] = {}
    for name in ("tatoeba", "hsk"):
        pairs = by_set.setdefault(name, {})
        for pair in parts[name]:
            source, target = (pair.english, pair.chinese) if source_language == "en" else (pair.chinese, pair.english)
            pairs.setdefault(source, []).append(target)
    root = Path(data) / "tico19-en-zh"
    english, chinese = ((root / f"test.{lang}").read_text(encoding="utf-8").splitlines() for lang in ("en", "zh"))
    pairs = by_set.setdefault("tico19", {})
    for en, zh in zip(english, chinese, strict=True):
        source, target = (en, zh) if source_language == "en" else (zh, en)
        if source.strip() and target.strip():
            pairs.setdefault(source, []).append(target)
    rng = random.Random(f"{seed}:held-out:{source_language}")
    rare = rare_words(translator)
    join_source, join_target = _joiner(source_language), _joiner(target_language)
    items: list[Item] = []
    for name, pairs in by_set.items():
        sources = list(pairs)[:limit]
        singles = sources if name == "tico19" else [s for i, s in enumerate(sources) if i % 4 != 3]
        for index, source in enumerate(singles):
            group = len(items)
            items.append(Item(source, pairs[source], "clean", set=name, group=group))
            if index % 3 == 0:
                copy = _perturbed(source, pairs[source], index // 3, rng, rare, source_language, target_language)
                copy.set, copy.group = name, group
                items.append(copy)
        if name != "tico19":
            joined = [s for i, s in enumerate(sources) if i % 4 == 3]
            for start in range(0, len(joined) - 2, 3):
                chosen = joined[start : start + 3]
                references = [join_target.join(pairs[s][0] for s in chosen)]
                items.append(Item(join_source.join(chosen), references, "long", set="long", group=len(items)))
    kept = [item for item in items if _fits(translator, item.source)]
    whole = {item.group for item in kept if item.category != "perturbed"}  # a copy without its source goes too
    return [item for item in kept if item.group in whole]


def _fits(translator: Translator, text: str) -> bool:
    """Whether the model accepts `text` whole (a long TICO-19 sentence doubled may not)."""
    try:
        translator.encode_source([text])
    except InputTooLongError:
        return False
    return True


def translate_and_label(
    items: list[Item],
    translator: Translator,
    reverse: Translator,
    target_language: str,
    beam_size: int = 4,
    batch_size: int = 32,
) -> dict:
    """Translate every item (beam `beam_size`), read its full trust signals, label it. Returns timing facts."""
    import sacrebleu  # a training-time dependency only

    started = time.monotonic()
    options = DecodingOptions(beam_size=beam_size)
    order = sorted(range(len(items)), key=lambda i: len(items[i].source))
    for first in range(0, len(order), batch_size):
        chunk = order[first : first + batch_size]
        translations = translator.translate([items[i].source for i in chunk], options)
        translator.assess(translations, "full", reverse)
        for index, translation in zip(chunk, translations, strict=True):
            item = items[index]
            item.translation = translation.text
            item.ids = (list(translation.source_ids), list(translation.target_ids))
            item.token_logprobs = [float(x) for x in translation.token_logprobs]
            item.signals = dict(translation.trust.signals) if translation.trust else None
            item.flags = [flag.kind for flag in translation.trust.flags] if translation.trust else []
            item.chrf = sacrebleu.sentence_chrf(translation.text, item.references).score
            item.oscillates = oscillates(translation.text, item.references, target_language)
            item.good = int(item.chrf >= good_chrf(target_language) and not item.oscillates)
    return {"items": len(items), "seconds": round(time.monotonic() - started, 1)}
