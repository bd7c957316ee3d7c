"""Constructed faults for measuring the trust flags (model.trust): each kind's precision and recall on translations
whose faults are known, beside the same translations without them.

The cases start from the model's own translations that were labelled adequate (model.training.trust_data: sentence
chrF against the references), on sources the calibration never fitted on (the "test" half):

- none: the translation as it is; every flag on it is a false alarm;
- omission: two adequate pairs joined, with the translation of the first only: the second source's words are what
  the translation leaves out;
- addition: a source with its translation followed by another source's translation: those target words are
  invented;
- repetition: the translation with its last two words (Chinese: characters) before the final punctuation written
  three times back to back;
- untranslated: the source given back as its own translation, where the target vocabulary can write it (an
  English vocabulary writes Chinese as <unk>: such a model cannot copy a Chinese source through, and no case is made);
- truncated: the source decoded with a length budget of half its translation's tokens.

Each case is forced through the model (Translator.force; truncated: decoded) and assessed in a mode. A flag of kind
K is counted per word it names (truncated: per flag): right on K's fault (omission and addition: words of the second
part; the other kinds: anywhere on a case of that kind), wrong on a translation without that fault (the unmodified
translations, and K's cases outside the fault). Flags of K on other kinds' cases are not counted: their truth is
ambiguous (a truncated translation does leave words out). Precision = right / (right + wrong), over as many faulty
cases of K as unmodified translations; recall = the share of K's cases with a right flag.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from model.choices import FLAG_KINDS
from model.options import DecodingOptions
from model.translator import Translator

KEEP_PRECISION = 0.6  # a flag kind is shown only where its precision on constructed faults reaches this


@dataclass
class Case:
    kind: str  # "none" or the fault: one of FLAG_KINDS
    source: str
    target: str
    boundary: int = 0  # omission: source words from here are missing; addition: target words from here are invented
    budget: int | None = None  # truncated: the length budget the source is decoded with


@dataclass
class Tally:
    right: int = 0
    wrong: int = 0
    cases: int = 0
    found: int = 0  # cases of the kind with a right flag

    @property
    def precision(self) -> float | None:
        flagged = self.right + self.wrong
        return round(self.right / flagged, 4) if flagged else None

    @property
    def recall(self) -> float | None:
        return round(self.found / self.cases, 4) if self.cases else None


@dataclass
class Measured:
    tallies: dict[str, Tally] = field(default_factory=lambda: {kind: Tally() for kind in FLAG_KINDS})
    unmodified: int = 0

    def as_dict(self) -> dict:
        return {
            "unmodified": self.unmodified,
            "kinds": {
                kind: {
                    "cases": t.cases, "right": t.right, "wrong": t.wrong, "precision": t.precision,
                    "recall": t.recall, "kept": None if t.precision is None else t.precision >= KEEP_PRECISION,
                }
                for kind, t in self.tallies.items()
            },
        }


def _repeated(text: str, language: str) -> str:
    """`text` with its last two words (Chinese: characters) before any final punctuation said three times."""
    end = len(text)
    while end and not text[end - 1].isalnum():
        end -= 1
    body, tail = text[:end], text[end:]
    if language == "zh":
        stretch = body[-2:]
        return body + stretch * 2 + tail
    words = body.split()
    stretch = " ".join(words[-2:])
    return " ".join([body, stretch, stretch]) + tail


def constructed_cases(
    model: Translator, pairs: list[tuple[str, str]], source_language: str, target_language: str
) -> list[Case]:
    """Every case of the module's docstring from adequate (source, translation) pairs: one unmodified and one of
    each fault per pair (omission and addition pair each with the next; untranslated only where it can be written)."""
    join_source = "" if source_language == "zh" else " "
    join_target = "" if target_language == "zh" else " "
    cases: list[Case] = []
    for index, (source, target) in enumerate(pairs):
        other_source, other_target = pairs[(index + 1) % len(pairs)]
        alone = model.force(source, target)
        cases.append(Case("none", source, target))
        cases.append(Case("omission", source + join_source + other_source, target, boundary=len(alone.source_words)))
        cases.append(Case("addition", source, target + join_target + other_target, boundary=len(alone.target_words)))
        cases.append(Case("repetition", source, _repeated(target, target_language)))
        if "<unk>" not in model.force(source, source).target_tokens:  # the target vocabulary can write the source
            cases.append(Case("untranslated", source, source))
        cases.append(Case("truncated", source, "", budget=max(1, (len(alone.target_ids) - 1) // 2)))
    return cases


def measure(model: Translator, reverse: Translator | None, cases: list[Case], mode: str) -> Measured:
    """Each flag kind's right and wrong flags over `cases` assessed in `mode` (see the module's docstring)."""
    measured = Measured()
    for case in cases:
        if case.kind == "truncated":
            (translation,) = model.translate([case.source], DecodingOptions(beam_size=4, max_new_tokens=case.budget))
            model.assess([translation], mode, reverse, DecodingOptions(beam_size=4, max_new_tokens=case.budget))
        else:
            translation = model.force(case.source, case.target)
            model.assess([translation], mode, reverse)
        if case.kind == "none":
            measured.unmodified += 1
        else:
            measured.tallies[case.kind].cases += 1
        found = False
        for flag in translation.trust.flags:
            tally = measured.tallies[flag.kind]
            size = max(1, len(flag.words))  # omission, addition, repetition, untranslated: counted per word
            if case.kind == "none":
                tally.wrong += size
            elif flag.kind != case.kind:
                continue  # another kind's fault: not counted
            elif case.kind in ("omission", "addition"):
                right = sum(word >= case.boundary for word in flag.words)
                tally.right += right
                tally.wrong += len(flag.words) - right
                found = found or right > 0
            else:
                tally.right += size
                found = True
        if case.kind != "none" and found:
            measured.tallies[case.kind].found += 1
    return measured
