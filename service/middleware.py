"""One ASGI middleware in front of the routes: metrics, CORS, the body size limit and API keys (from the headers,
or on LibreTranslate's routes from `api_key` in the query or the body), with settings read from the ingress replica.
"""

from __future__ import annotations

import hmac
import json
import time
from email.parser import BytesParser
from email.policy import default as email_policy
from typing import Any
from urllib.parse import parse_qs

from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.routing import Match, Mount
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.errors import (
    BodyTooLargeError,
    InvalidApiKeyError,
    MissingApiKeyError,
    exception_response,
    route_family,
)

OPERATIONAL_PATHS = ("/healthz", "/readyz", "/metrics", "/health")
# LibreTranslate's /languages and /frontend/settings need no key there either.
PUBLIC_PATHS = ("/", "/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json", "/languages", "/frontend/settings")
PUBLIC_PREFIXES = ("/static/", "/download_file/")  # a download link holds its file's random key: it is its own key
# Routes that take a file: their bodies may be as large as documents.max_file_bytes, and the form around it.
UPLOAD_PATHS = ("/v2/document", "/translate_file")
UPLOAD_OVERHEAD_BYTES = 64 * 1024


class BodyLimitReached(StarletteHTTPException):
    """Raised while reading a body past the limit; an HTTPException so FastAPI passes it through."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request bodies are limited to {limit} bytes")
        self.limit = limit


def route_path(scope: Scope) -> str:
    """The path below the application's route prefix (Serve sets root_path to the prefix)."""
    path, root = scope["path"], scope.get("root_path", "")
    return path[len(root) :] or "/" if root and path.startswith(root) else path


def route_template(routes: list, scope: Scope) -> str:
    """The route template ("/v1/explanations/{explanation_id}") a request matches: a low-cardinality label."""
    for route in routes:
        nested = getattr(getattr(route, "original_router", None), "routes", None)  # FastAPI's included routers
        if nested is not None:
            found = route_template(nested, scope)
            if found != "unmatched":
                return found
            continue
        path = getattr(route, "path", None)
        if path is not None and route.matches(scope)[0] != Match.NONE:
            return path + "/" if isinstance(route, Mount) else path
    return "unmatched"


def presented_key(headers: dict[bytes, bytes]) -> str | None:
    """The API key from `Authorization: Bearer <key>`, `Authorization: DeepL-Auth-Key <key>` or `X-API-Key`."""
    authorization = headers.get(b"authorization", b"").decode("latin-1")
    for scheme in ("bearer ", "deepl-auth-key "):
        if authorization[: len(scheme)].lower() == scheme:
            return authorization[len(scheme) :].strip()
    key = headers.get(b"x-api-key")
    return key.decode("latin-1").strip() if key is not None else None


def query_key(query_string: bytes) -> str | None:
    """LibreTranslate's `api_key` query parameter."""
    values = parse_qs(query_string.decode("latin-1")).get("api_key")
    return values[0] if values else None


def body_key(content_type: str, body: bytes) -> str | None:
    """LibreTranslate's `api_key` in a JSON object or a form-encoded body (None when absent or unreadable)."""
    media_type = content_type.split(";")[0].strip().lower()
    try:
        if media_type == "application/json" or media_type.endswith("+json"):
            fields = json.loads(body)
            key = fields.get("api_key") if isinstance(fields, dict) else None
            return key if isinstance(key, str) else None
        if media_type == "application/x-www-form-urlencoded":
            values = parse_qs(body.decode("utf-8")).get("api_key")
            return values[0] if values else None
        if media_type == "multipart/form-data":  # POST /translate_file
            header = b"Content-Type: " + content_type.encode("latin-1") + b"\r\n\r\n"
            message = BytesParser(policy=email_policy).parsebytes(header + body)
            for part in message.iter_parts():
                if part.get_param("name", header="content-disposition") == "api_key" and not part.get_filename():
                    key = part.get_content()
                    return key.strip("\r\n") if isinstance(key, str) else None
    except (ValueError, UnicodeDecodeError, LookupError):
        return None
    return None


def key_is_valid(presented: str | None, accepted: list[str]) -> bool:
    """Constant-time comparison against every accepted key (no early exit on a match)."""
    presented_bytes = (presented or "").encode("utf-8")
    valid = False
    for key in accepted:
        valid |= hmac.compare_digest(presented_bytes, key.encode("utf-8"))
    return valid and bool(presented)


class ServiceMiddleware:
    """Counts and times every response, then applies CORS, the body limit and the API keys.

    Its settings come from the ingress replica (`app.state.ingress`), so the routes stay a module-level FastAPI
    app while the knobs come from deploy/serve.yaml."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._cors: ASGIApp | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        ingress = scope["app"].state.ingress
        started = time.perf_counter()
        counted = False

        def count(status: int) -> None:
            nonlocal counted
            if counted:
                return
            counted = True
            matched = getattr(scope.get("route"), "path", None)  # set by FastAPI once a route matched
            route = matched or route_template(scope["app"].routes, scope)
            ingress.metrics.requests.labels(route, scope["method"], str(status)).inc()
            ingress.metrics.request_duration.labels(route).observe(time.perf_counter() - started)

        async def send_counting(message: Message) -> None:
            if message["type"] == "http.response.start":
                count(message["status"])  # before the client can see the answer, so a scrape after it counts it
            await send(message)

        try:
            await self._cors_app(ingress)(scope, receive, send_counting)
        except Exception as error:  # anything the routes did not turn into a response: still our error shape
            if counted:
                raise
            family = route_family(route_path(scope))
            await exception_response(error, ingress.config.retry_after_s, family)(scope, receive, send_counting)
        finally:
            count(499)  # the client went away before any answer

    def _cors_app(self, ingress: Any) -> ASGIApp:
        if self._cors is None:
            origins = ingress.config.cors_origins
            guarded = self._guarded
            self._cors = (
                CORSMiddleware(
                    guarded,
                    allow_origins=origins,
                    allow_methods=["GET", "POST", "OPTIONS"],
                    allow_headers=["Authorization", "Content-Type", "X-API-Key"],
                    expose_headers=["Retry-After"],
                    max_age=600,
                )
                if origins
                else guarded
            )
        return self._cors

    async def _guarded(self, scope: Scope, receive: Receive, send: Send) -> None:
        ingress = scope["app"].state.ingress
        config = ingress.config
        path = route_path(scope)
        family = route_family(path)
        limit = config.max_body_bytes
        if path in UPLOAD_PATHS:  # a file and its form fields
            limit = max(limit, config.documents.max_file_bytes + UPLOAD_OVERHEAD_BYTES)
        headers = dict(scope["headers"])
        declared = headers.get(b"content-length")
        if ingress.api_keys and self._needs_key(path, config.protect_operational_routes):
            presented = presented_key(headers)
            if presented is None and family == "libretranslate":
                presented = query_key(scope.get("query_string", b""))
                if presented is None and scope["method"] == "POST":
                    if declared is not None and (not declared.isdigit() or int(declared) > limit):
                        await exception_response(BodyTooLargeError(limit), family=family)(scope, receive, send)
                        return
                    try:
                        body, receive = await _buffered(receive, limit)
                    except BodyLimitReached:
                        await exception_response(BodyTooLargeError(limit), family=family)(scope, receive, send)
                        return
                    presented = body_key(headers.get(b"content-type", b"").decode("latin-1"), body)
            if not key_is_valid(presented, ingress.api_keys):
                error = (
                    InvalidApiKeyError("Invalid API key")
                    if presented
                    else MissingApiKeyError(
                        "a valid API key is required (Authorization: Bearer <key>, X-API-Key, "
                        "Authorization: DeepL-Auth-Key <key>, or api_key on LibreTranslate's routes)"
                    )
                )
                await exception_response(error, family=family)(scope, receive, send)
                return
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            await exception_response(BodyTooLargeError(limit), family=family)(scope, receive, send)
            return
        received = 0
        response_started = False

        async def receive_limited() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise BodyLimitReached(limit)
            return message

        async def send_tracking(message: Message) -> None:
            nonlocal response_started
            response_started = response_started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive_limited, send_tracking)
        except BodyLimitReached:
            if not response_started:
                await exception_response(BodyTooLargeError(limit), family=family)(scope, receive, send)

    @staticmethod
    def _needs_key(path: str, protect_operational_routes: bool) -> bool:
        if path in OPERATIONAL_PATHS:
            return protect_operational_routes
        return not (path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES))


async def _buffered(receive: Receive, limit: int) -> tuple[bytes, Receive]:
    """Read the whole body (at most `limit` bytes), and a receive that hands it to the route again."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyLimitReached(limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    body = b"".join(chunks)
    replayed = False

    async def replay() -> Message:
        nonlocal replayed
        if not replayed:
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return body, replay


__all__ = ["ServiceMiddleware", "body_key", "key_is_valid", "presented_key", "query_key", "route_template"]
