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
import time
from collections import Counter
from dataclasses import dataclass

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
    join_source, join_target = _joiner(source_language), _joiner(target_language)
    for index, source in enumerate(sources[::3]):
        kind = ("rare", "doubled", "dropped")[index % 3]
        if kind == "rare":
            prefix = join_source.join(rng.sample(rare, 2))
            perturbed = prefix + join_source + source
            references = pairs[source]
        elif kind == "doubled":
            perturbed = source + join_source + source
            references = [r + join_target + r for r in pairs[source]]
        else:
            positions = [i for i, c in enumerate(source) if not c.isspace()]
            drop = set(rng.sample(positions, max(1, len(positions) // 6)))
            perturbed = "".join(c for i, c in enumerate(source) if i not in drop)
            references = pairs[source]
        items.append(Item(perturbed, references, "perturbed", kind))
    for start in range(0, len(sources) - 2, 12):
        group = sources[start : start + 3]
        items.append(Item(join_source.join(group), [join_target.join(pairs[s][0] for s in group)], "long"))
    return items


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
            item.signals = dict(translation.trust.signals) if translation.trust else None
            item.flags = [flag.kind for flag in translation.trust.flags] if translation.trust else []
            item.chrf = sacrebleu.sentence_chrf(translation.text, item.references).score
            item.oscillates = oscillates(translation.text, item.references, target_language)
            item.good = int(item.chrf >= good_chrf(target_language) and not item.oscillates)
    return {"items": len(items), "seconds": round(time.monotonic() - started, 1)}
