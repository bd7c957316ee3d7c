"""DeepL's document API, as the deepl SDK's translate_document calls it: POST /v2/document (upload, answered with
an id and a key), POST /v2/document/{id} (status) and POST /v2/document/{id}/result (the file, once), on the jobs
of service/documents.
"""

# No `from __future__ import annotations`: serve.ingress pickles the routes (see deepl_v2.py).
import asyncio
from urllib.parse import quote

from fastapi import APIRouter, Request
from starlette.datastructures import UploadFile
from starlette.responses import Response

from service.compat.backend import BackendProvider
from service.compat.deepl_glossaries import glossary_for_pair, stored
from service.compat.translation import request_fields, resolve_source, resolve_target
from service.documents.formats import Document, DocumentError, extension_of, read_document
from service.errors import (
    DocumentTooLargeError,
    InvalidDocumentError,
    InvalidParameterError,
    MissingParameterError,
    json_response,
)

MEDIA_TYPES = {
    ".txt": "text/plain; charset=utf-8",
    ".srt": "application/x-subrip; charset=utf-8",
    ".html": "text/html; charset=utf-8",
    ".htm": "text/html; charset=utf-8",
    ".docx": "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
    ".pptx": "application/vnd.openxmlformats-officedocument.presentationml.presentation",
    ".xlsx": "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
    ".odt": "application/vnd.oasis.opendocument.text",
    ".odp": "application/vnd.oasis.opendocument.presentation",
    ".epub": "application/epub+zip",
    ".po": "text/x-gettext-translation; charset=utf-8",
    ".xliff": "application/xliff+xml",
    ".xlf": "application/xliff+xml",
}


def attachment(filename: str, data: bytes, extension: str) -> Response:
    """A file as a download, its name kept (RFC 5987 for names beyond ASCII)."""
    fallback = filename.encode("ascii", "replace").decode("ascii").replace("?", "_").replace('"', "_")
    disposition = f"attachment; filename=\"{fallback}\"; filename*=UTF-8''{quote(filename)}"
    media_type = MEDIA_TYPES.get(extension, "application/octet-stream")
    return Response(data, media_type=media_type, headers={"Content-Disposition": disposition})


async def read_upload(upload: UploadFile, filename: str, max_bytes: int, max_characters: int) -> tuple[Document, bytes]:
    """The uploaded file read as its extension says: 400 for what cannot be read, 413 past the limits."""
    data = await upload.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise DocumentTooLargeError(f"the file is over the {max_bytes} byte limit")
    try:
        document = await asyncio.to_thread(read_document, data, extension_of(filename))
    except DocumentError as error:
        raise InvalidDocumentError(str(error)) from None
    if document.characters > max_characters:
        raise DocumentTooLargeError(
            f"the document holds {document.characters} characters of text; the limit is {max_characters}"
        )
    return document, data


def router(backend: BackendProvider) -> APIRouter:
    """Upload: multipart `file`, `target_lang`, optional `source_lang` (else detected), `glossary_id` (with
    source_lang), `filename`, `output_format` (only the input's own format). Status and result: `document_key`
    in a JSON or form body. A wrong key and an unknown id both answer 404, a result asked for early 503, a
    second download 404 (the document is deleted as it is handed over, as at DeepL)."""
    routes = APIRouter(prefix="/v2", include_in_schema=False)

    @routes.post("/document")
    async def upload(request: Request) -> Response:
        service = backend(request)
        jobs = service.documents
        form = await request.form()
        upload = form.get("file")
        if not isinstance(upload, UploadFile):
            raise MissingParameterError("file")
        fields = {key: value for key, value in form.items() if isinstance(value, str)}
        target = fields.get("target_lang", "").strip()
        if not target:
            raise MissingParameterError("target_lang")
        filename = (fields.get("filename") or upload.filename or "").replace("\\", "/").rsplit("/", 1)[-1]
        extension = extension_of(filename)
        wanted = fields.get("output_format", "").strip().lower().lstrip(".")
        if wanted and f".{wanted}" != extension:
            raise InvalidParameterError(f"output_format {wanted} is not supported for {extension or 'this'} files")
        target_code = resolve_target(service, target)
        source = fields.get("source_lang", "").strip() or None
        source_code = resolve_source(service, source) if source else None
        glossary_id = fields.get("glossary_id", "").strip() or None
        owner = service.owner(request)
        if glossary_id is not None:
            await glossary_for_pair(service, request, glossary_id, source_code, target_code)
        document, data = await read_upload(upload, filename, jobs.max_file_bytes, jobs.max_characters)
        document_id, key = await stored(lambda: jobs.create(
            owner, filename, extension, data, source_code, target_code, glossary_id, len(document.segments),
            document.characters,
        ))
        service.wake_documents()
        return json_response({"document_id": document_id, "document_key": key})

    async def key_of(request: Request) -> str:
        fields = await request_fields(request)
        key = fields.get("document_key")
        if not isinstance(key, str) or not key:
            raise MissingParameterError("document_key")
        return key

    @routes.post("/document/{document_id}")
    async def status(request: Request, document_id: str) -> Response:
        service, key = backend(request), await key_of(request)
        owner = service.owner(request)
        job = await stored(lambda: service.documents.get(document_id, key, owner))
        return json_response(job.status_body())

    @routes.post("/document/{document_id}/result")
    async def result(request: Request, document_id: str) -> Response:
        service, key = backend(request), await key_of(request)
        owner = service.owner(request)
        job, data = await stored(lambda: service.documents.take_result(document_id, key, owner))
        return attachment(job.filename, data, job.extension)

    return routes


__all__ = ["MEDIA_TYPES", "attachment", "read_upload", "router"]
