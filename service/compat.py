"""What LibreTranslate's and DeepL's routes share: reading their bodies, and translating texts through the ingress.

Both APIs take a list of texts, a source language or none ("auto"), a target language and a format.
`translate_texts` resolves the languages (service/languages.py), detects each text's language when
asked, cuts every text into sentences (service/sentences.py; HTML is reduced to its text first,
service/markup.py), sends all sentences for one model as one TranslateCall through the same
coalescer, in-flight limit and timeout as /v1/translate (so attention and explanations stay per
sentence), and joins the translations back. The routes themselves live in service/libretranslate.py
and service/deepl_v2.py; both are mounted on the ingress's FastAPI app.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from starlette.datastructures import UploadFile
from starlette.requests import Request

from model import DecodingOptions
from service.deployments import TranslateCall
from service.errors import InvalidParameterError, UnsupportedLanguageError
from service.languages import Detection, detect, name_of, resolve
from service.markup import Markup, parse_markup
from service.schemas import MAX_BEAM_SIZE
from service.sentences import Piece, join, split

MAX_TEXTS = 128  # texts per request
MAX_TEXT_CHARS = 20_000  # characters per text (LibreTranslate's charLimit); each sentence also within the model's
MAX_TOTAL_CHARS = 100_000  # characters per request
MAX_ALTERNATIVES = MAX_BEAM_SIZE - 1
BEAM_SIZE = 4  # /v1/translate's default, so that the same sentence gets the same translation on both


@dataclass
class TextTranslation:
    """One client text, translated."""

    text: str
    source_lang: str  # the served code it was translated from (given, or detected)
    detection: Detection | None = None  # with source "auto"
    alternatives: list[str] = field(default_factory=list)


async def request_fields(request: Request) -> dict[str, Any]:
    """Query parameters and the body's fields (JSON object or form); a repeated form key becomes a list."""
    fields: dict[str, Any] = {}
    for key in request.query_params:
        values = request.query_params.getlist(key)
        fields[key] = values[0] if len(values) == 1 else values
    media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media_type in ("application/x-www-form-urlencoded", "multipart/form-data"):
        form = await request.form()
        for key in form:
            values = [value for value in form.getlist(key) if not isinstance(value, UploadFile)]
            values = [value.replace("\r\n", "\n") for value in values]  # browsers' form line endings
            if values:
                fields[key] = values[0] if len(values) == 1 else values
        return fields
    body = await request.body()
    if media_type == "application/json" or media_type.endswith("+json") or (not media_type and body.strip()):
        try:
            content = json.loads(body) if body.strip() else {}
        except ValueError:
            raise InvalidParameterError("Invalid JSON format") from None
        if not isinstance(content, dict):
            raise InvalidParameterError("Invalid JSON format")
        fields.update(content)
    return fields


def text_list(value: Any, name: str) -> tuple[list[str], bool]:
    """(texts, whether the client sent a list) from a string or a list of strings, within the limits."""
    texts = value if isinstance(value, list) else [value]
    if not all(isinstance(text, str) for text in texts):
        raise InvalidParameterError(f"Invalid request: {name} must be a string or a list of strings")
    if len(texts) > MAX_TEXTS:
        raise InvalidParameterError(f"Invalid request: request ({len(texts)}) exceeds text limit ({MAX_TEXTS})")
    for text in texts:
        if len(text) > MAX_TEXT_CHARS:
            raise InvalidParameterError(f"Invalid request: request ({len(text)}) exceeds text limit ({MAX_TEXT_CHARS})")
    total = sum(len(text) for text in texts)
    if total > MAX_TOTAL_CHARS:
        raise InvalidParameterError(f"Invalid request: request ({total}) exceeds character limit ({MAX_TOTAL_CHARS})")
    return texts, isinstance(value, list)


def served_languages(ingress: Any) -> tuple[frozenset[str], frozenset[str]]:
    """(source languages, target languages) of the served models."""
    specs = ingress.specs.values()
    return frozenset(s.source_lang for s in specs), frozenset(s.target_lang for s in specs)


def pairs_text(ingress: Any) -> str:
    return ", ".join(f"{s.source_lang}→{s.target_lang}" for s in ingress.specs.values())


def targets_of(ingress: Any, source: str) -> list[str]:
    return sorted({s.target_lang for s in ingress.specs.values() if s.source_lang == source})


def resolve_target(ingress: Any, target: str) -> str:
    code = resolve(target, served_languages(ingress)[1])
    if code is None:
        raise UnsupportedLanguageError(f"{target} is not supported (served: {pairs_text(ingress)})")
    return code


def resolve_source(ingress: Any, source: str) -> str:
    code = resolve(source, served_languages(ingress)[0])
    if code is None:
        raise UnsupportedLanguageError(f"{source} is not supported (served: {pairs_text(ingress)})")
    return code


async def detect_texts(ingress: Any, texts: list[str]) -> list[list[Detection]]:
    """Each text's candidates among the served source languages, most confident first."""
    sources = served_languages(ingress)[0]
    return await asyncio.to_thread(lambda: [detect(text, sources) for text in texts])


def _model_for(ingress: Any, source: str, target: str, detection: Detection | None) -> str:
    for spec in ingress.specs.values():
        if spec.source_lang == source and spec.target_lang == target:
            return spec.id
    found = (
        f"the text was detected as {name_of(source)} ({source}, confidence {detection.confidence:g}); "
        if detection is not None
        else ""
    )
    raise UnsupportedLanguageError(f"{found}no model translates {source}→{target} here (served: {pairs_text(ingress)})")


@dataclass
class _Job:
    """One unit of text on its way (a text, or one text node of an HTML text): its sentences and their translations."""

    model: str
    pieces: list[Piece]
    translations: list[list[str]] = field(default_factory=list)  # per piece: best first, then alternatives

    def joined(self, rank: int, target: str) -> str:
        """The unit's translation from each sentence's `rank`-th hypothesis (or its last one)."""
        return join(self.pieces, [options[min(rank, len(options) - 1)] for options in self.translations], target)


def _pieces(text: str, source: str, split_sentences: bool) -> list[Piece]:
    if split_sentences:
        return split(text, source)
    stripped = text.strip()
    start = text.index(stripped) if stripped else len(text)
    return [Piece(text[:start], stripped, text[start + len(stripped) :])]


async def translate_texts(
    ingress: Any,
    texts: list[str],
    source: str | None,
    target: str,
    *,
    alternatives: int = 0,
    html: bool = False,
    split_sentences: bool = True,
) -> list[TextTranslation]:
    """Translate client texts: source None detects each text's language among the served ones."""
    if not 0 <= alternatives <= MAX_ALTERNATIVES:
        raise InvalidParameterError(f"Invalid request: alternatives parameter must be <= {MAX_ALTERNATIVES}")
    target_code = resolve_target(ingress, target)
    markups: list[Markup | None] = [parse_markup(text) if html else None for text in texts]
    units = [markup.units if markup is not None else [text] for markup, text in zip(markups, texts)]
    detections: list[Detection | None]
    if source is None:
        plain = [markup.text if markup is not None else text for markup, text in zip(markups, texts)]
        detections = [candidates[0] for candidates in await detect_texts(ingress, plain)]
        sources = [detection.language for detection in detections]
    else:
        code = resolve_source(ingress, source)
        detections = [None] * len(texts)
        sources = [code] * len(texts)
    jobs: list[list[_Job]] = []
    for text_units, language, detection in zip(units, sources, detections):
        text_jobs = []
        for unit in text_units:
            pieces = _pieces(unit, language, split_sentences)
            needs_model = any(piece.sentence for piece in pieces)
            text_jobs.append(_Job(_model_for(ingress, language, target_code, detection) if needs_model else "", pieces))
        jobs.append(text_jobs)
    await _translate_jobs(ingress, [job for text_jobs in jobs for job in text_jobs], alternatives + 1)
    results = []
    for text_jobs, markup, language, detection in zip(jobs, markups, sources, detections):
        if markup is not None:  # as LibreTranslate: no alternatives for HTML
            rendered = markup.render([job.joined(0, target_code) for job in text_jobs])
            results.append(TextTranslation(rendered, language, detection))
            continue
        (job,) = text_jobs
        best = job.joined(0, target_code)
        others: list[str] = []
        for rank in range(1, alternatives + 1):
            candidate = job.joined(rank, target_code)
            if candidate != best and candidate not in others:
                others.append(candidate)
        results.append(TextTranslation(best, language, detection, others))
    return results


async def _translate_jobs(ingress: Any, jobs: list[_Job], n_best: int) -> None:
    """All sentences for one model leave as one TranslateCall; the models' calls run concurrently."""
    options = DecodingOptions(beam_size=max(BEAM_SIZE, n_best), n_best=n_best)
    by_model: dict[str, list[tuple[_Job, int]]] = {}
    for job in jobs:
        job.translations = [[""] for _ in job.pieces]
        for index, piece in enumerate(job.pieces):
            if piece.sentence:
                by_model.setdefault(job.model, []).append((job, index))

    async def run(model: str, places: list[tuple[_Job, int]]) -> None:
        call = TranslateCall(texts=[job.pieces[index].sentence for job, index in places], options=options)
        outcomes = await ingress.call(partial(ingress.coalescers[model].submit, call))
        for (job, index), outcome in zip(places, outcomes, strict=True):
            job.translations[index] = [outcome["text"]] + [other["text"] for other in outcome.get("alternatives") or []]

    await asyncio.gather(*(run(model, places) for model, places in by_model.items()))


__all__ = [
    "MAX_ALTERNATIVES",
    "MAX_TEXT_CHARS",
    "MAX_TEXTS",
    "TextTranslation",
    "detect_texts",
    "request_fields",
    "resolve_source",
    "resolve_target",
    "served_languages",
    "targets_of",
    "text_list",
    "translate_texts",
]
