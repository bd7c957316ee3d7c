"""LibreTranslate's HTTP API (as LibreTranslate 1.9.6 answers it) on the served models: /translate, /detect,
/languages, /frontend/settings, /health, /translate_file and the /download_file/{id} links it answers with.
"""

# No `from __future__ import annotations`: serve.ingress pickles the routes, and the nested route functions must
# carry their annotations as objects (Request), not as names FastAPI would look up in a pickled copy's globals.
from pathlib import PurePath
from typing import Any

from fastapi import APIRouter, Request
from starlette.datastructures import UploadFile
from starlette.responses import Response

from service.compat.backend import BackendProvider
from service.compat.deepl_documents import attachment, read_upload
from service.compat.deepl_glossaries import glossary_for, stored
from service.compat.translation import (
    COMPAT_MAX_TEXT_CHARS,
    detect_texts,
    request_fields,
    resolve_source,
    resolve_target,
    served_languages,
    targets_of,
    text_list,
    translate_texts,
    trust_headers,
    trust_mode,
)
from service.documents.formats import FORMATS
from service.documents.worker import detect_language, translate_document
from service.errors import (
    DocumentNotFoundError,
    FileLinkError,
    InvalidParameterError,
    MissingParameterError,
    json_response,
)
from service.text.languages import name_of

FILE_FORMATS = list(FORMATS)  # what /translate_file accepts (LibreTranslate's supportedFilesFormat)


def _required(fields: dict[str, Any], name: str) -> Any:
    value = fields.get(name)
    if value is None or (isinstance(value, (str, list)) and not value and name != "q"):
        raise MissingParameterError(name)
    return value


def _alternatives(fields: dict[str, Any]) -> int:
    value = fields.get("alternatives", 0)
    try:
        return max(0, int(value))
    except (TypeError, ValueError):
        raise InvalidParameterError("Invalid request: alternatives parameter is not a number") from None


def _single(value: Any, name: str) -> str:
    if isinstance(value, list):
        value = value[0] if value else ""
    if not isinstance(value, str):
        raise InvalidParameterError(f"Invalid request: {name} must be a string")
    return value


def router(backend: BackendProvider) -> APIRouter:
    """LibreTranslate's routes, translating through the TranslationBackend that `backend(request)` returns.

    Bodies are JSON or forms; `q` a string or a list (in forms also repeated keys, q=a&q=b, which LibreTranslate
    itself reads as "a" only); `source` a code or "auto" (detection per text among the served languages); `format`
    "text" or "html"; `alternatives` n-best; `api_key` in the body or the query (checked by service/middleware.py).
    Errors are {"error": "message"} with LibreTranslate's statuses (service/errors.py). Left out of /openapi.json:
    the contract is LibreTranslate's.
    """
    routes = APIRouter(include_in_schema=False)

    @routes.post("/translate")
    async def translate(request: Request) -> Response:
        fields = await request_fields(request)
        texts, is_list = text_list(_required(fields, "q"), "q")
        source = _single(_required(fields, "source"), "source")
        target = _single(_required(fields, "target"), "target")
        text_format = _single(fields.get("format") or "text", "format")
        if text_format not in ("text", "html"):
            raise InvalidParameterError(f"{text_format} format is not supported")
        alternatives = _alternatives(fields)
        auto = source.lower() == "auto"
        html = text_format == "html"
        service = backend(request)
        trust = trust_mode(request)
        glossary_id = fields.get("glossary_id")  # an extension: a glossary made through /v2/glossaries
        glossary = await glossary_for(service, request, _single(glossary_id, "glossary_id")) if glossary_id else None
        results = await translate_texts(
            service,
            texts,
            None if auto else source,
            target,
            alternatives=alternatives,
            html=html,
            trust=trust,
            glossary=glossary,
        )
        body: dict[str, Any] = {"translatedText": [r.text for r in results] if is_list else results[0].text}
        if auto:
            detected = [r.detection.as_json() for r in results if r.detection is not None]
            body["detectedLanguage"] = detected if is_list else detected[0]
        if alternatives > 0:
            body["alternatives"] = [r.alternatives for r in results] if is_list else results[0].alternatives
        return json_response(body, headers=trust_headers(results, trust))

    @routes.post("/detect")
    async def detect(request: Request) -> Response:
        """Candidates for a text, most confident first; for a list of texts, one such list per text."""
        fields = await request_fields(request)
        value = fields.get("q")
        if not value:
            raise MissingParameterError("q")
        texts, is_list = text_list(value, "q")
        candidates = await detect_texts(backend(request), texts)
        lists = [[detection.as_json() for detection in text_candidates] for text_candidates in candidates]
        return json_response(lists if is_list else lists[0])

    @routes.get("/languages")
    async def languages(request: Request) -> Response:
        service = backend(request)
        sources, targets = served_languages(service)
        codes = sorted(sources | targets)
        return json_response([{"code": c, "name": name_of(c), "targets": targets_of(service, c)} for c in codes])

    @routes.get("/frontend/settings")
    async def frontend_settings(request: Request) -> Response:
        service = backend(request)
        targets = sorted(served_languages(service)[1])
        return json_response(
            {
                "charLimit": COMPAT_MAX_TEXT_CHARS,
                "frontendTimeout": int(service.request_timeout_s * 1000),
                "apiKeys": service.keys_required,
                "keyRequired": service.keys_required,
                "suggestions": False,
                "filesTranslation": True,
                "supportedFilesFormat": FILE_FORMATS,
                "language": {
                    "source": {"code": "auto", "name": "Auto Detect"},
                    "target": {"code": targets[0], "name": name_of(targets[0])},
                },
            }
        )

    @routes.post("/translate_file")
    async def translate_file(request: Request) -> Response:
        """A file of FILE_FORMATS translated in the request, its structure kept (service/documents); the answer
        links to the translated file, of the same type, kept for documents.retention_s."""
        form = await request.form()
        upload = form.get("file")
        if not isinstance(upload, UploadFile):
            raise MissingParameterError("file")
        source = form.get("source")
        target = form.get("target")
        if not isinstance(source, str) or not source:
            raise MissingParameterError("source")
        if not isinstance(target, str) or not target:
            raise MissingParameterError("target")
        name = PurePath((upload.filename or "").replace("\\", "/")).name
        if not name:
            raise InvalidParameterError("Invalid request: empty file")
        if PurePath(name).suffix.lower() not in FILE_FORMATS:
            raise InvalidParameterError("Invalid request: file format not supported")
        service = backend(request)
        jobs = service.documents
        target_code = resolve_target(service, target)
        document, _ = await read_upload(upload, name, jobs.max_file_bytes, jobs.max_characters)
        source_code = (
            await detect_language(service, document) if source.lower() == "auto" else resolve_source(service, source)
        )
        # as /translate does: a refusal or a timeout answers at once (the worker's jobs are the ones retried)
        translations = await translate_document(service, document.segments, source_code, target_code, None, retries=0)
        data = document.render(translations)
        path = PurePath(name)
        filename = f"{path.stem}_{target_code}{path.suffix}"
        document_id, key = await stored(lambda: jobs.store_result(
            service.owner(request), filename, path.suffix.lower(), data, document.characters
        ))
        link = f"{str(request.base_url).rstrip('/')}/download_file/{document_id}.{key}"
        return json_response({"translatedFileUrl": link})

    @routes.get("/download_file/{file_id}")
    async def download_file(request: Request, file_id: str) -> Response:
        """The translated file a /translate_file link names, as an attachment, until it expires."""
        document_id, _, key = file_id.partition(".")
        service = backend(request)
        try:
            job, data = await stored(lambda: service.documents.read_result(document_id, key))
        except DocumentNotFoundError:
            raise FileLinkError("Invalid filename") from None
        return attachment(job.filename, data, job.extension)

    @routes.get("/health")
    async def health() -> Response:
        return json_response({"status": "ok"})

    return routes


__all__ = ["FILE_FORMATS", "router"]
