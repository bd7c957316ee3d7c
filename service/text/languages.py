"""Language codes as clients spell them ("zh-Hans", "ZH", "EN-US") resolved to the served codes, and language
detection (lingua) restricted to the languages some model translates from.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from lingua import IsoCode639_1, LanguageDetectorBuilder

# English names for the codes /languages and /v2/languages list; a code missing here is listed by its code.
NAMES = {
    "ar": "Arabic",
    "cs": "Czech",
    "de": "German",
    "en": "English",
    "es": "Spanish",
    "fr": "French",
    "it": "Italian",
    "ja": "Japanese",
    "ko": "Korean",
    "nl": "Dutch",
    "pl": "Polish",
    "pt": "Portuguese",
    "ru": "Russian",
    "tr": "Turkish",
    "uk": "Ukrainian",
    "zh": "Chinese",
}
# Spellings that name the same language as a served code (LibreTranslate 1.9 says zh-Hans, DeepL ZH-HANS).
ALIASES = {"zh-hans": "zh", "zh-cn": "zh", "zh-sg": "zh", "zh-hans-cn": "zh", "iw": "he", "nb": "no"}
# Variants that must not fall back to their primary subtag: traditional Chinese is not simplified Chinese.
DISTINCT_VARIANTS = {"zh-hant", "zh-tw", "zh-hk", "zh-mo", "zh-hant-tw", "zt"}
# Languages written without spaces between sentences.
UNSPACED = {"zh", "ja", "th", "lo", "km", "my"}


def resolve(code: str | None, served: set[str] | frozenset[str]) -> str | None:
    """The served code a client's code names (case, "_" and region or script subtags ignored), or None."""
    if not code:
        return None
    normalized = code.strip().lower().replace("_", "-")
    normalized = ALIASES.get(normalized, normalized)
    if normalized in served:
        return normalized
    if normalized in DISTINCT_VARIANTS:
        return None
    primary = normalized.split("-")[0]
    return primary if primary in served else None


def name_of(code: str) -> str:
    return NAMES.get(code, code)


@dataclass(frozen=True)
class Detection:
    language: str
    confidence: float  # 0–100, as LibreTranslate reports it

    def as_json(self) -> dict:
        return {"confidence": self.confidence, "language": self.language}


@lru_cache(maxsize=8)
def _detector(codes: tuple[str, ...]):
    isos = [getattr(IsoCode639_1, code.upper()) for code in codes]
    return LanguageDetectorBuilder.from_iso_codes_639_1(*isos).build()


def detectable(served: set[str] | frozenset[str]) -> tuple[str, ...]:
    """The served languages lingua knows, sorted (the detector's cache key)."""
    return tuple(sorted(code for code in served if hasattr(IsoCode639_1, code.upper())))


def detect(text: str, served: set[str] | frozenset[str]) -> list[Detection]:
    """Candidates among the served source languages, most confident first (at least one).

    A text without letters gets the first served language at confidence 0, as LibreTranslate
    answers "en" at 0. With one detectable language there is nothing to choose: it is that one.
    """
    codes = detectable(served)
    if not codes:
        return [Detection(sorted(served)[0], 0.0)]
    if len(codes) == 1:
        confident = any(character.isalpha() for character in text)
        return [Detection(codes[0], 100.0 if confident else 0.0)]
    values = _detector(codes).compute_language_confidence_values(text)
    candidates = [
        Detection(value.language.iso_code_639_1.name.lower(), round(value.value * 100, 1)) for value in values
    ]
    if not candidates or candidates[0].confidence == 0:
        return [Detection(codes[0], 0.0)]
    return [candidate for candidate in candidates if candidate.confidence > 0]


__all__ = ["Detection", "detect", "detectable", "name_of", "resolve", "UNSPACED"]
