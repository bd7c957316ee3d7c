"""LibreTranslate's HTTP API (as LibreTranslate 1.9.6 answers it), on the same models, keys, limits and metrics.

POST /translate, POST /detect, GET /languages, GET /frontend/settings, GET /health, POST /translate_file
(multipart: a UTF-8 .txt `file`, `source`, `target`, `api_key`; answers {"translatedFileUrl"}) and the
GET /download_file/{id} it links to (service/file_links.py: the link carries the file). Bodies are JSON
or forms; `q` is a string or a list (in forms also repeated keys, q=a&q=b, which LibreTranslate
itself reads as "a" only); `source` a code or "auto" (detection per text, among the served
languages); `format` "text" or "html"; `alternatives` n-best; `api_key` in the body or the query
(checked by service/middleware.py). Errors are {"error": "message"} with LibreTranslate's statuses,
decided in service/errors.py. The routes are left out of /openapi.json: their contract is LibreTranslate's.
"""

from __future__ import annotations

from pathlib import PurePath
from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, Request
from starlette.datastructures import UploadFile
from starlette.responses import Response

from service.compat import (
    MAX_TEXT_CHARS,
    detect_texts,
    request_fields,
    resolve_target,
    served_languages,
    targets_of,
    text_list,
    translate_texts,
)
from service.errors import InvalidParameterError, MissingParameterError, json_response
from service.file_links import decode_file_link, encode_file_link
from service.languages import name_of

router = APIRouter(include_in_schema=False)
FILE_FORMATS = [".txt"]  # what /translate_file accepts (LibreTranslate's supportedFilesFormat)


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


@router.post("/translate")
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
    results = await translate_texts(
        request.app.state.ingress,
        texts,
        None if auto else source,
        target,
        alternatives=alternatives,
        html=text_format == "html",
    )
    body: dict[str, Any] = {"translatedText": [r.text for r in results] if is_list else results[0].text}
    if auto:
        detected = [r.detection.as_json() for r in results if r.detection is not None]
        body["detectedLanguage"] = detected if is_list else detected[0]
    if alternatives > 0:
        body["alternatives"] = [r.alternatives for r in results] if is_list else results[0].alternatives
    return json_response(body)


@router.post("/detect")
async def detect(request: Request) -> Response:
    """Candidates for a text, most confident first; for a list of texts, one such list per text."""
    fields = await request_fields(request)
    value = fields.get("q")
    if not value:
        raise MissingParameterError("q")
    texts, is_list = text_list(value, "q")
    candidates = await detect_texts(request.app.state.ingress, texts)
    lists = [[detection.as_json() for detection in text_candidates] for text_candidates in candidates]
    return json_response(lists if is_list else lists[0])


@router.get("/languages")
async def languages(request: Request) -> Response:
    ingress = request.app.state.ingress
    sources, targets = served_languages(ingress)
    codes = sorted(sources | targets)
    return json_response([{"code": c, "name": name_of(c), "targets": targets_of(ingress, c)} for c in codes])


@router.get("/frontend/settings")
async def frontend_settings(request: Request) -> Response:
    ingress = request.app.state.ingress
    targets = sorted(served_languages(ingress)[1])
    keys = bool(ingress.api_keys)
    return json_response(
        {
            "charLimit": MAX_TEXT_CHARS,
            "frontendTimeout": int(ingress.config.request_timeout_s * 1000),
            "apiKeys": keys,
            "keyRequired": keys,
            "suggestions": False,
            "filesTranslation": True,
            "supportedFilesFormat": FILE_FORMATS,
            "language": {
                "source": {"code": "auto", "name": "Auto Detect"},
                "target": {"code": targets[0], "name": name_of(targets[0])},
            },
        }
    )


@router.post("/translate_file")
async def translate_file(request: Request) -> Response:
    """A UTF-8 .txt file translated as one text; the answer links to the translated file."""
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
    try:
        text = (await upload.read()).decode("utf-8-sig")
    except UnicodeDecodeError:
        raise InvalidParameterError("Invalid request: the file is not UTF-8 text") from None
    text_list(text, "file")  # LibreTranslate's character limit
    ingress = request.app.state.ingress
    (result,) = await translate_texts(ingress, [text], None if source.lower() == "auto" else source, target)
    stem = PurePath(name).stem
    link = encode_file_link(f"{stem}_{resolve_target(ingress, target)}.txt", result.text, ingress.secret)
    return json_response({"translatedFileUrl": f"{str(request.base_url).rstrip('/')}/download_file/{link}"})


@router.get("/download_file/{file_id}")
async def download_file(request: Request, file_id: str) -> Response:
    """The translated file a /translate_file link names, as an attachment."""
    filename, text = decode_file_link(file_id, request.app.state.ingress.secret)
    fallback = filename.encode("ascii", "replace").decode("ascii").replace("?", "_").replace('"', "_")
    disposition = f"attachment; filename=\"{fallback}\"; filename*=UTF-8''{quote(filename)}"
    return Response(
        text.encode("utf-8"), media_type="text/plain; charset=utf-8", headers={"Content-Disposition": disposition}
    )


@router.get("/health")
async def health() -> Response:
    return json_response({"status": "ok"})


__all__ = ["router"]
