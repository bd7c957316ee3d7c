"""DeepL's API v2 shape on the served models, what Mastodon, Weblate and the deepl SDK call: POST /v2/translate,
GET or POST /v2/languages, GET /v2/usage.
"""

# No `from __future__ import annotations`: serve.ingress pickles the routes, and the nested route functions must
# carry their annotations as objects (Request), not as names FastAPI would look up in a pickled copy's globals.
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from service.compat.backend import BackendProvider
from service.compat.deepl_glossaries import glossary_for_pair
from service.compat.translation import (
    request_fields,
    served_languages,
    text_list,
    translate_texts,
    trust_headers,
    trust_mode,
)
from service.errors import InvalidParameterError, MissingParameterError, json_response
from service.text.languages import name_of
from service.text.markup import TagRules

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


def _tags(fields: dict[str, Any], name: str) -> frozenset[str]:
    """A tag list option: a comma-separated string, or a list of them (the SDK sends a list)."""
    value = fields.get(name)
    if value is None:
        return frozenset()
    values = value if isinstance(value, list) else [value]
    if not all(isinstance(item, str) for item in values):
        raise InvalidParameterError(f"Value for '{name}' not supported.")
    return frozenset(tag.strip().lower() for item in values for tag in item.split(",") if tag.strip())


def router(backend: BackendProvider) -> APIRouter:
    """DeepL's v2 routes, translating through the TranslationBackend that `backend(request)` returns.

    /v2/translate takes JSON or a form: `text` a list (repeated keys in forms); `source_lang` optional (detection
    per text among the served languages); `target_lang` like ZH, ZH-HANS, EN-US, EN-GB; `tag_handling` "html" or
    "xml" keeps the tags, with `ignore_tags` (content left as written), `non_splitting_tags` (read inside a
    sentence) and `splitting_tags` (read as block breaks), each a list or a comma-separated string;
    `glossary_id` a glossary of the pair (with `source_lang`); `split_sentences` "0" translates each text whole.
    /v2/languages reads `type` from the query or a form body (as the deepl SDK sends it). Keys: `Authorization:
    DeepL-Auth-Key KEY`. Errors: {"message": "…"} with DeepL's statuses. No quota is kept: 456 is never answered.
    Left out of /openapi.json: the contract is DeepL's.
    """
    routes = APIRouter(prefix="/v2", include_in_schema=False)

    @routes.post("/translate")
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
        trust = trust_mode(request)
        source = _single(fields, "source_lang")
        glossary = None
        if (glossary_id := _single(fields, "glossary_id")) is not None:
            glossary = await glossary_for_pair(backend(request), request, glossary_id, source, target)
        results = await translate_texts(
            backend(request),
            texts,
            source,
            target,
            glossary=glossary,
            tag_rules=TagRules(
                _tags(fields, "ignore_tags"), _tags(fields, "non_splitting_tags"), _tags(fields, "splitting_tags")
            ),
            html=bool(tag_handling),
            split_sentences=(_single(fields, "split_sentences") or "1") != "0",
            trust=trust,
        )
        translations = [
            {
                "detected_source_language": result.source_lang.upper(),
                "text": result.text,
                "billed_characters": len(text),
            }
            for result, text in zip(results, texts)
        ]
        return json_response({"translations": translations}, headers=trust_headers(results, trust))

    @routes.api_route("/languages", methods=["GET", "POST"])
    async def languages(request: Request) -> Response:
        fields = await request_fields(request)
        kind = (_single(fields, "type") or "source").lower()
        if kind not in ("source", "target"):
            raise InvalidParameterError("Value for 'type' not supported.")
        sources, targets = served_languages(backend(request))
        if kind == "source":
            return json_response([{"language": code.upper(), "name": name_of(code)} for code in sorted(sources)])
        listed = []
        for code in sorted(targets):
            for variant, name in TARGET_VARIANTS.get(code, [(code.upper(), name_of(code))]):
                listed.append({"language": variant, "name": name, "supports_formality": False})
        return json_response(listed)

    @routes.api_route("/usage", methods=["GET", "POST"])
    async def usage() -> Response:
        return json_response({"character_count": 0, "character_limit": USAGE_LIMIT})

    return routes


__all__ = ["router"]
