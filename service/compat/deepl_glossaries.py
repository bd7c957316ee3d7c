"""DeepL's v2 glossary API, as the deepl SDK's create_glossary, list_glossaries, get_glossary,
get_glossary_entries, delete_glossary and get_glossary_languages call it, on the shared glossary store.
"""

# No `from __future__ import annotations`: serve.ingress pickles the routes (see deepl_v2.py).
import asyncio
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from service.compat.backend import BackendProvider, TranslationBackend
from service.compat.translation import request_fields
from service.errors import (
    InvalidGlossaryError,
    InvalidParameterError,
    MissingParameterError,
    StoreUnavailableError,
    UnsupportedLanguageError,
    json_response,
)
from service.glossaries import Glossary, parse_entries
from service.store import StoreError

TSV_MEDIA_TYPE = "text/tab-separated-values"


async def stored(work: Callable[[], Any]) -> Any:
    """A store call, in a worker thread; an unreachable store answers 503."""
    try:
        return await asyncio.to_thread(work)
    except StoreError as error:
        raise StoreUnavailableError(str(error)) from None


def glossary_pair(backend: TranslationBackend, source: str, target: str) -> tuple[str, str]:
    """A glossary's (source, target) as served codes; DeepL's regional variants (EN-US, ZH-HANS) name the base."""
    wanted = (source.split("-")[0].lower(), target.split("-")[0].lower())
    if wanted not in {(p.source_lang, p.target_lang) for p in backend.language_pairs()}:
        served = ", ".join(f"{p.source_lang}→{p.target_lang}" for p in backend.language_pairs())
        raise UnsupportedLanguageError(f"Unsupported glossary source and target language pair (served: {served})")
    return wanted


async def glossary_for(backend: TranslationBackend, request: Request, glossary_id: str) -> Glossary:
    owner = backend.owner(request)
    return await stored(lambda: backend.glossaries.get(owner, glossary_id))


async def glossary_for_pair(
    backend: TranslationBackend, request: Request, glossary_id: str, source: str | None, target: str
) -> Glossary:
    """The glossary a DeepL translation names, as DeepL takes it: with `source_lang` set, and of the translation's
    own pair (codes or their regional variants)."""
    if source is None:
        raise InvalidParameterError("Use of a glossary requires the source_lang parameter to be set")
    glossary = await glossary_for(backend, request, glossary_id)
    wanted = (source.split("-")[0].lower(), target.split("-")[0].lower())
    if (glossary.source_lang, glossary.target_lang) != wanted:
        raise InvalidParameterError(
            f"The glossary is {glossary.source_lang.upper()}→{glossary.target_lang.upper()}, "
            f"the translation {wanted[0].upper()}→{wanted[1].upper()}"
        )
    return glossary


def router(backend: BackendProvider) -> APIRouter:
    """/v2/glossaries (POST, GET), /v2/glossaries/{id} (GET, DELETE), /v2/glossaries/{id}/entries (GET, as TSV)
    and /v2/glossary-language-pairs. Entries come as TSV or CSV (`entries_format`); a glossary is immutable, as
    at DeepL. Errors: DeepL's {"message": "…"} (400 bad entries or an unserved pair, 404 an unknown id, 413 past
    the limits in service/glossaries.py)."""
    routes = APIRouter(prefix="/v2", include_in_schema=False)

    @routes.post("/glossaries")
    async def create(request: Request) -> Response:
        service = backend(request)
        fields = await request_fields(request)
        for name in ("name", "source_lang", "target_lang", "entries"):
            if not isinstance(fields.get(name), str) or not fields[name]:
                raise MissingParameterError(name)
        entries_format = fields.get("entries_format") or "tsv"
        if not isinstance(entries_format, str):
            raise InvalidGlossaryError("entries_format must be tsv or csv")
        source, target = glossary_pair(service, fields["source_lang"], fields["target_lang"])
        entries = parse_entries(fields["entries"], entries_format.lower())
        owner = service.owner(request)
        glossary = await stored(lambda: service.glossaries.create(owner, fields["name"], source, target, entries))
        return json_response(glossary.info(), status=201)

    @routes.get("/glossaries")
    async def listed(request: Request) -> Response:
        service = backend(request)
        owner = service.owner(request)
        return json_response({"glossaries": await stored(lambda: service.glossaries.list(owner))})

    @routes.get("/glossaries/{glossary_id}")
    async def info(request: Request, glossary_id: str) -> Response:
        return json_response((await glossary_for(backend(request), request, glossary_id)).info())

    @routes.get("/glossaries/{glossary_id}/entries")
    async def entries(request: Request, glossary_id: str) -> Response:
        accept = request.headers.get("accept", TSV_MEDIA_TYPE)
        if not any(kind in accept for kind in (TSV_MEDIA_TYPE, "*/*")):
            return json_response({"message": f"Unsupported Accept header: only {TSV_MEDIA_TYPE}"}, status=415)
        glossary = await glossary_for(backend(request), request, glossary_id)
        return Response(glossary.tsv(), media_type=TSV_MEDIA_TYPE)

    @routes.delete("/glossaries/{glossary_id}")
    async def delete(request: Request, glossary_id: str) -> Response:
        service = backend(request)
        owner = service.owner(request)
        await stored(lambda: service.glossaries.delete(owner, glossary_id))
        return Response(status_code=204)

    @routes.get("/glossary-language-pairs")
    async def pairs(request: Request) -> Response:
        served = sorted({(p.source_lang, p.target_lang) for p in backend(request).language_pairs()})
        return json_response({"supported_languages": [{"source_lang": s, "target_lang": t} for s, t in served]})

    return routes


__all__ = ["glossary_for", "glossary_for_pair", "glossary_pair", "router", "stored"]
