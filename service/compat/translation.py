"""The translation path LibreTranslate's and DeepL's routes share: reading their bodies, their limits, and
translating client texts (languages resolved or detected, texts cut into sentences, HTML tags placed back)
through the service's TranslationBackend.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field, replace
from html import escape
from typing import Any

from starlette.datastructures import UploadFile
from starlette.requests import Request

from model import DEFAULT_ALIGNMENT, TRUST_MODES, AlignmentMethod, DecodingOptions
from service.compat.backend import TranslationBackend
from service.errors import InvalidParameterError, UnsupportedLanguageError
from service.glossaries import Glossary
from service.messages import TranslateCall
from service.records import TranslationRecord
from service.schemas import DEFAULT_BEAM_SIZE, MAX_BEAM_SIZE
from service.text.inline_tags import place
from service.text.languages import Detection, detect, name_of, resolve
from service.text.markup import Block, InlineElement, Markup, TagRules, parse_markup
from service.text.protected import Protected, find_spans, model_protections, protect, restore
from service.text.sentences import Piece, join
from service.text.split_texts import text_pieces

# The compatibility routes' limits (LibreTranslate's and DeepL's clients send long texts; /v1's own limits are
# schemas.V1_MAX_TEXTS and V1_MAX_TEXT_CHARS). Each text is cut into sentences within the model's length.
COMPAT_MAX_TEXTS = 128  # texts per request
COMPAT_MAX_TEXT_CHARS = 20_000  # characters per text (LibreTranslate's charLimit)
COMPAT_MAX_TOTAL_CHARS = 100_000  # characters per request
MAX_ALTERNATIVES = MAX_BEAM_SIZE - 1


@dataclass
class TextTranslation:
    """One client text, translated."""

    text: str
    source_lang: str  # the served code it was translated from (given, or detected)
    detection: Detection | None = None  # with source "auto"
    alternatives: list[str] = field(default_factory=list)
    trust: float | None = None  # with a trust mode asked (TRUST_HEADER): its least trusted sentence's score


# The compatibility routes' opt-in to trust: a request header naming the mode ("fast" or "full"), answered with a
# response header of one score per text (comma-separated, empty for a blank or HTML text). Their bodies stay as
# their clients expect.
TRUST_HEADER = "X-Trust"
TRUST_SCORE_HEADER = "X-Trust-Score"


def trust_mode(request: Request) -> str:
    """The mode the request's X-Trust header asks for ("off" without one); another value is refused."""
    mode = request.headers.get(TRUST_HEADER, "off").strip().lower() or "off"
    if mode not in TRUST_MODES:
        raise InvalidParameterError(f"{TRUST_HEADER} must be fast, full or off")
    return mode


def trust_headers(results: list[TextTranslation], mode: str) -> dict[str, str]:
    if mode == "off":
        return {}
    return {TRUST_SCORE_HEADER: ",".join("" if r.trust is None else f"{r.trust:.4f}" for r in results)}


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
    if len(texts) > COMPAT_MAX_TEXTS:
        raise InvalidParameterError(f"Invalid request: request ({len(texts)}) exceeds text limit ({COMPAT_MAX_TEXTS})")
    for text in texts:
        if len(text) > COMPAT_MAX_TEXT_CHARS:
            raise InvalidParameterError(
                f"Invalid request: request ({len(text)}) exceeds text limit ({COMPAT_MAX_TEXT_CHARS})"
            )
    total = sum(len(text) for text in texts)
    if total > COMPAT_MAX_TOTAL_CHARS:
        raise InvalidParameterError(
            f"Invalid request: request ({total}) exceeds character limit ({COMPAT_MAX_TOTAL_CHARS})"
        )
    return texts, isinstance(value, list)


def served_languages(backend: TranslationBackend) -> tuple[frozenset[str], frozenset[str]]:
    """(source languages, target languages) of the served models."""
    pairs = backend.language_pairs()
    return frozenset(p.source_lang for p in pairs), frozenset(p.target_lang for p in pairs)


def pairs_text(backend: TranslationBackend) -> str:
    return ", ".join(f"{p.source_lang}→{p.target_lang}" for p in backend.language_pairs())


def targets_of(backend: TranslationBackend, source: str) -> list[str]:
    return sorted({p.target_lang for p in backend.language_pairs() if p.source_lang == source})


def resolve_target(backend: TranslationBackend, target: str) -> str:
    code = resolve(target, served_languages(backend)[1])
    if code is None:
        raise UnsupportedLanguageError(f"{target} is not supported (served: {pairs_text(backend)})")
    return code


def resolve_source(backend: TranslationBackend, source: str) -> str:
    code = resolve(source, served_languages(backend)[0])
    if code is None:
        raise UnsupportedLanguageError(f"{source} is not supported (served: {pairs_text(backend)})")
    return code


async def detect_texts(backend: TranslationBackend, texts: list[str]) -> list[list[Detection]]:
    """Each text's candidates among the served source languages, most confident first."""
    sources = served_languages(backend)[0]
    return await asyncio.to_thread(lambda: [detect(text, sources) for text in texts])


def _model_for(backend: TranslationBackend, source: str, target: str, detection: Detection | None) -> str:
    for pair in backend.language_pairs():
        if pair.source_lang == source and pair.target_lang == target:
            return pair.model
    found = (
        f"the text was detected as {name_of(source)} ({source}, confidence {detection.confidence:g}); "
        if detection is not None
        else ""
    )
    raise UnsupportedLanguageError(
        f"{found}no model translates {source}→{target} here (served: {pairs_text(backend)})"
    )


def _terms_for(glossary: Glossary | None, source: str, target: str) -> tuple[tuple[str, str], ...]:
    if glossary is None or (glossary.source_lang, glossary.target_lang) != (source, target):
        return ()
    return glossary.entries


@dataclass
class _Job:
    """One unit of text on its way (a text, a text node, or an HTML block's prose): its sentences and translations."""

    model: str
    pieces: list[Piece]
    protection: Protected | None = None  # the text's spans kept byte for byte; `pieces` cut its stand-in text
    target: str = ""  # the language translated into
    translations: list[list[str]] = field(default_factory=list)  # per piece: best first, then alternatives
    best: list[TranslationRecord | None] = field(default_factory=list)  # per piece: the best one (alignments)
    alignment_method: AlignmentMethod = DEFAULT_ALIGNMENT["translate"]  # AGREEMENT: a block whose tags go by it

    def trust_score(self) -> float | None:
        """The least trusted sentence's trust score (None without any: nothing decoded, or trust off)."""
        scores = [outcome.trust.score for outcome in self.best if outcome and outcome.trust]
        return min(scores) if scores else None

    def joined(self, rank: int, target: str) -> str:
        """The unit's translation from each sentence's `rank`-th hypothesis (or its last one)."""
        return join(self.pieces, [options[min(rank, len(options) - 1)] for options in self.translations], target)


@dataclass
class _HtmlText:
    """An HTML text on its way: text-node jobs (tags kept between them) and blocks whose tags go by alignment."""

    markup: Markup
    node_jobs: dict[int, _Job] = field(default_factory=dict)  # unit index → its job
    block_jobs: dict[int, tuple[_Job, list[list[InlineElement]]]] = field(default_factory=dict)  # per sentence

    placed_sentences: dict[int, list[str | None]] = field(default_factory=dict)  # block → per sentence HTML

    def place_tags(self) -> list[int]:
        """Place each block's tags by alignment; the blocks where some sentence could not take its tags."""
        failed = []
        for block, (job, elements) in self.block_jobs.items():
            sentences = [
                place(piece.sentence, sentence_elements, outcome) if sentence_elements and outcome else None
                for piece, sentence_elements, outcome in zip(job.pieces, elements, job.best, strict=True)
            ]
            if any(html is None and wanted for html, wanted in zip(sentences, elements, strict=True)):
                failed.append(block)
            self.placed_sentences[block] = sentences
        return failed

    def render(self, target: str) -> str:
        placed: dict[int, str] = {}
        for block, (job, _) in self.block_jobs.items():
            html_sentences = [
                placed_sentence if placed_sentence is not None else escape(options[0], quote=False)
                for placed_sentence, options in zip(self.placed_sentences[block], job.translations, strict=True)
            ]
            placed[block] = join(job.pieces, html_sentences, target)
        units = range(len(self.markup.units))
        nodes = [self.node_jobs[i].joined(0, target) if i in self.node_jobs else "" for i in units]
        return self.markup.render(nodes, placed)


def _sentence_elements(block: Block, pieces: list[Piece]) -> list[list[InlineElement]] | None:
    """Each sentence's inline elements, with offsets into the sentence; None when one spans two sentences."""
    by_sentence: list[list[InlineElement]] = [[] for _ in pieces]
    ranges = []
    position = 0
    for piece in pieces:
        start = position + len(piece.before)
        ranges.append((start, start + len(piece.sentence)))
        position = start + len(piece.sentence) + len(piece.after)
    spoken = [(i, start, end) for i, (start, end) in enumerate(ranges) if pieces[i].sentence]
    for element in block.elements:
        owner = next((i for i, start, end in spoken if start <= element.start and element.end <= end), None)
        if owner is None:
            return None
        start = ranges[owner][0]
        by_sentence[owner].append(replace(element, start=element.start - start, end=element.end - start))
    return by_sentence


async def translate_texts(
    backend: TranslationBackend,
    texts: list[str],
    source: str | None,
    target: str,
    *,
    alternatives: int = 0,
    html: bool = False,
    split_sentences: bool = True,
    trust: str = "off",
    protect_spans: bool = True,
    glossary: Glossary | None = None,
    tag_rules: TagRules | None = None,
) -> list[TextTranslation]:
    """Translate client texts: source None detects each text's language among the served ones; protect_spans
    keeps placeholders, URLs, e-mail addresses and long numbers byte for byte; a glossary's terms apply to the
    texts in its source language."""
    if not 0 <= alternatives <= MAX_ALTERNATIVES:
        raise InvalidParameterError(f"Invalid request: alternatives parameter must be <= {MAX_ALTERNATIVES}")
    target_code = resolve_target(backend, target)
    markups: list[Markup | None] = [parse_markup(text, tag_rules) if html else None for text in texts]
    detections: list[Detection | None]
    if source is None:
        plain = [markup.text if markup is not None else text for markup, text in zip(markups, texts)]
        detections = [candidates[0] for candidates in await detect_texts(backend, plain)]
        sources = [detection.language for detection in detections]
    else:
        code = resolve_source(backend, source)
        detections = [None] * len(texts)
        sources = [code] * len(texts)

    def job(text: str, language: str, detection: Detection | None) -> _Job:
        # texts up to COMPAT_MAX_TEXT_CHARS: a sentence too long for the model is cut further rather than refused
        terms = _terms_for(glossary, language, target_code)
        protection = protect(text, language, target_code, terms, protect_spans) if protect_spans or terms else None
        pieces = text_pieces(protection.text if protection else text, language, split_sentences, cut_long=True)
        needs_model = any(piece.sentence for piece in pieces)
        model = _model_for(backend, language, target_code, detection) if needs_model else ""
        return _Job(model, pieces, protection, target_code)

    def node_jobs(entry: _HtmlText, block: int, language: str, detection: Detection | None) -> list[_Job]:
        units = [part for part in entry.markup.blocks[block].parts if isinstance(part, int)]
        entry.node_jobs.update({unit: job(entry.markup.units[unit], language, detection) for unit in units})
        return [entry.node_jobs[unit] for unit in units]

    plain_jobs: list[_Job | None] = []
    html_texts: list[_HtmlText | None] = []
    pending: list[_Job] = []
    for text, markup, language, detection in zip(texts, markups, sources, detections):
        if markup is None:
            plain_jobs.append(job(text, language, detection))
            html_texts.append(None)
            pending.append(plain_jobs[-1])
            continue
        entry = _HtmlText(markup)
        for index, block in enumerate(markup.blocks):
            # a block's tags go by the alignment unless it holds spans to keep: then its text nodes go apart
            kept = protect_spans and find_spans(block.text)
            tagged = block.elements and block.flat and not kept
            block_job = job(block.text, language, detection) if tagged else None
            if block_job is not None:  # its tags are placed by the alignment: the better one, where served
                block_job.alignment_method = AlignmentMethod.AGREEMENT
            elements = _sentence_elements(block, block_job.pieces) if block_job is not None else None
            if block_job is not None and elements is not None:
                entry.block_jobs[index] = (block_job, elements)
                pending.append(block_job)
            else:
                pending.extend(node_jobs(entry, index, language, detection))
        plain_jobs.append(None)
        html_texts.append(entry)
    await _translate_jobs(backend, pending, alternatives + 1, trust)
    retry: list[_Job] = []  # blocks whose tags could not be placed: their text nodes, translated apart
    for entry, language, detection in zip(html_texts, sources, detections):
        if entry is not None:
            for block in entry.place_tags():
                del entry.block_jobs[block]
                retry.extend(node_jobs(entry, block, language, detection))
    if retry:
        await _translate_jobs(backend, retry, alternatives + 1, trust)
    results = []
    for plain_job, entry, language, detection in zip(plain_jobs, html_texts, sources, detections):
        if entry is not None:  # as LibreTranslate: no alternatives for HTML
            results.append(TextTranslation(entry.render(target_code), language, detection))
            continue
        assert plain_job is not None
        best = plain_job.joined(0, target_code)
        others: list[str] = []
        for rank in range(1, alternatives + 1):
            candidate = plain_job.joined(rank, target_code)
            if candidate != best and candidate not in others:
                others.append(candidate)
        results.append(TextTranslation(best, language, detection, others, plain_job.trust_score()))
    return results


async def _translate_jobs(backend: TranslationBackend, jobs: list[_Job], n_best: int, trust: str = "off") -> None:
    """All sentences for one model leave as one TranslateCall (two: those of blocks whose tags go by the agreed
    alignment, and the rest); the calls run concurrently."""
    # /v1/translate's default beam, so that a sentence gets the same translation on both APIs
    options = DecodingOptions(beam_size=max(DEFAULT_BEAM_SIZE, n_best), n_best=n_best)
    by_model: dict[tuple[str, str], list[tuple[_Job, int]]] = {}
    protections: dict[tuple[int, int], Protected] = {}  # (job, piece) → the sentence's spans
    for job in jobs:
        if job.protection is not None:
            parts = iter(model_protections([job.protection], [job.pieces]))
            for index, piece in enumerate(job.pieces):
                if piece.sentence:
                    protections[id(job), index] = next(parts)
        job.translations = [[""] for _ in job.pieces]
        job.best = [None for _ in job.pieces]
        for index, piece in enumerate(job.pieces):
            if piece.sentence:
                by_model.setdefault((job.model, job.alignment_method), []).append((job, index))

    async def run(model_and_method: tuple[str, str], places: list[tuple[_Job, int]]) -> None:
        model, method = model_and_method
        sentences = [job.pieces[index].sentence for job, index in places]
        terms = [protections[id(job), index].term_targets if (id(job), index) in protections else []
                 for job, index in places]
        call = TranslateCall(
            texts=sentences,
            options=options,
            max_text_chars=COMPAT_MAX_TEXT_CHARS,
            alignment_method=method,
            trust=trust,
            terms=terms if any(terms) else None,
        )
        outcomes = await backend.translate_call(model, call)
        for (job, index), outcome in zip(places, outcomes, strict=True):
            if (id(job), index) in protections:
                outcome = restore(protections[id(job), index], outcome, job.target)
            job.translations[index] = [outcome.text] + [other.text for other in outcome.alternatives]
            job.best[index] = outcome

    await asyncio.gather(*(run(model, places) for model, places in by_model.items()))


__all__ = [
    "COMPAT_MAX_TEXT_CHARS",
    "COMPAT_MAX_TEXTS",
    "COMPAT_MAX_TOTAL_CHARS",
    "MAX_ALTERNATIVES",
    "TRUST_HEADER",
    "TRUST_SCORE_HEADER",
    "TextTranslation",
    "detect_texts",
    "request_fields",
    "resolve_source",
    "resolve_target",
    "served_languages",
    "targets_of",
    "text_list",
    "translate_texts",
    "trust_headers",
    "trust_mode",
]
