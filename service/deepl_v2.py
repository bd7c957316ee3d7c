"""DeepL's API v2 shape, on the same models, keys, limits and metrics: what Mastodon, Weblate and the deepl SDK call.

POST /v2/translate (JSON or form; `text` a list, repeated keys in forms; `source_lang` optional:
detection per text among the served languages; `target_lang` like ZH, ZH-HANS, EN-US, EN-GB;
`tag_handling` "html" or "xml" translates text nodes and keeps the tags; `split_sentences` "0"
translates each text whole). GET or POST /v2/languages?type=source|target (the `type` also from a
form body, as the deepl SDK sends it), GET /v2/usage. Keys: `Authorization: DeepL-Auth-Key KEY`
(service/middleware.py). Errors: {"message": "…"} with DeepL's statuses (service/errors.py). No quota
is kept, so 456 is never answered and /v2/usage reports no characters counted against a limit no
one reaches. Left out of /openapi.json: the contract is DeepL's.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from service.compat import request_fields, served_languages, text_list, translate_texts
from service.errors import InvalidParameterError, MissingParameterError, json_response
from service.languages import name_of

router = APIRouter(prefix="/v2", include_in_schema=False)

# DeepL lists target variants rather than bare codes for these; every variant maps to the one served code.
TARGET_VARIANTS = {
    "en": [("EN-GB", "English (British)"), ("EN-US", "English (American)")],
    "zh": [("ZH", "Chinese (simplified)"), ("ZH-HANS", "Chinese (simplified)")],
    "pt": [("PT-BR", "Portuguese (Brazilian)"), ("PT-PT", "Portuguese (European)")],
}
USAGE_LIMIT = 1_000_000_000_000  # no quota is kept


def _single(fields: dict[str, Any], name: str) -> str | None:
    value = fields.get(name)
    if isinstance(value, list):
        value = value[0] if value else None
    if value is not None and not isinstance(value, str):
        raise InvalidParameterError(f"Value for '{name}' not supported.")
    return value or None


@router.post("/translate")
async def translate(request: Request) -> Response:
    fields = await request_fields(request)
    if fields.get("text") is None:
        raise MissingParameterError("text")
    texts, _ = text_list(fields["text"], "text")
    target = _single(fields, "target_lang")
    if target is None:
        raise MissingParameterError("target_lang")
    tag_handling = (_single(fields, "tag_handling") or "").lower()
    if tag_handling not in ("", "html", "xml"):
        raise InvalidParameterError(f"Value for 'tag_handling' not supported: {tag_handling}")
    results = await translate_texts(
        request.app.state.ingress,
        texts,
        _single(fields, "source_lang"),
        target,
        html=bool(tag_handling),
        split_sentences=(_single(fields, "split_sentences") or "1") != "0",
    )
    return json_response(
        {
            "translations": [
                {
                    "detected_source_language": result.source_lang.upper(),
                    "text": result.text,
                    "billed_characters": len(text),
                }
                for result, text in zip(results, texts)
            ]
        }
    )


@router.api_route("/languages", methods=["GET", "POST"])
async def languages(request: Request) -> Response:
    fields = await request_fields(request)
    kind = (_single(fields, "type") or "source").lower()
    if kind not in ("source", "target"):
        raise InvalidParameterError("Value for 'type' not supported.")
    sources, targets = served_languages(request.app.state.ingress)
    if kind == "source":
        return json_response([{"language": code.upper(), "name": name_of(code)} for code in sorted(sources)])
    listed = []
    for code in sorted(targets):
        for variant, name in TARGET_VARIANTS.get(code, [(code.upper(), name_of(code))]):
            listed.append({"language": variant, "name": name, "supports_formality": False})
    return json_response(listed)


@router.api_route("/usage", methods=["GET", "POST"])
async def usage() -> Response:
    return json_response({"character_count": 0, "character_limit": USAGE_LIMIT})


__all__ = ["router"]
