"""Every HTTP error the service answers is made here: exception → status, code, message, in /v1's shape
{"error": {"code", "message"}} or a compatibility route family's own (LibreTranslate's, DeepL's). Messages name
the problem, never a stack trace; unexpected exceptions are logged and answered 500.
"""

from __future__ import annotations

import json
import logging
import math
from typing import Any

import grpc
from fastapi.exceptions import RequestValidationError
from ray.exceptions import (
    ActorUnavailableError,
    NodeDiedError,
    ObjectLostError,
    RayActorError,
    TaskCancelledError,
    WorkerCrashedError,
)
from ray.serve.exceptions import (
    BackPressureError,
    DeploymentUnavailableError,
    RayServeException,
    ReplicaUnavailableError,
    RequestCancelledError,
)
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from model import CheckpointError, DecoderBusyError, InputTooLongError, InvalidInputError, UnknownModelError
from service.explanations import ExplanationIdError, ExplanationNotFoundError

logger = logging.getLogger("ray.serve")


class ServiceError(Exception):
    """A refusal the service makes on purpose; `describe` gives it its status."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ModelNotServedError(ServiceError):
    """No served model matches the request's model id or language pair."""


class InvalidRequestError(ServiceError):
    """A request whose fields are individually valid but do not fit together."""


class RouteNotFoundError(ServiceError):
    """Something the service could serve but does not have (e.g. the viewer's files)."""


class UnauthorizedError(ServiceError):
    """No valid API key on a route that needs one."""


class MissingApiKeyError(UnauthorizedError):
    """API keys are on and the request presented none."""


class InvalidApiKeyError(UnauthorizedError):
    """The request presented a key that is not one of the service's keys."""


class MissingParameterError(ServiceError):
    """A compatibility route's required parameter is absent or empty (LibreTranslate's wording)."""

    def __init__(self, name: str) -> None:
        super().__init__(f"Invalid request: missing {name} parameter")


class InvalidParameterError(ServiceError):
    """A compatibility route's parameter has the wrong type or value, or the body is not a JSON object."""


class FileLinkError(ServiceError):
    """A /download_file/ link that names no kept file: malformed, altered, or expired."""


class InvalidGlossaryError(ServiceError):
    """Glossary entries malformed (TSV or CSV), empty, too long, or with a source term twice."""


class GlossaryNotFoundError(ServiceError):
    """No glossary with that id belongs to the request's key."""


class GlossaryTooLargeError(ServiceError):
    """A glossary past the entry limit, or a key past its number of glossaries."""


class DocumentNotFoundError(ServiceError):
    """No document with that id and key belongs to the request's key (never made, downloaded, or expired)."""


class DocumentNotReadyError(ServiceError):
    """A document's result asked for before its translation is done."""

    def __init__(self, message: str, retry_after_s: int = 5) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class InvalidDocumentError(ServiceError):
    """A file of an unsupported format, empty, corrupt, encrypted, or without text."""


class DocumentTooLargeError(ServiceError):
    """A file past the size or character limits of service.config's DocumentsConfig."""


class StoreUnavailableError(ServiceError):
    """The shared store (SQLite file or PostgreSQL) cannot be reached."""


class UnsupportedLanguageError(ModelNotServedError):
    """A language code, given or detected, that no served model translates from or into."""


class BodyTooLargeError(ServiceError):
    """A request body past the configured limit."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"request bodies are limited to {limit} bytes")


class OverloadedError(ServiceError):
    """The ingress is at its in-flight limit."""

    def __init__(self, retry_after_s: int) -> None:
        super().__init__("the service is at capacity; retry after a moment")
        self.retry_after_s = retry_after_s


class RequestTimeoutError(ServiceError):
    """The model did not answer within the request timeout."""

    def __init__(self, timeout_s: float) -> None:
        super().__init__(f"the model did not answer within {timeout_s:g} s")


class NotReadyError(ServiceError):
    """The models are still loading."""

    def __init__(self, retry_after_s: int = 5) -> None:
        super().__init__("models are still loading")
        self.retry_after_s = retry_after_s


# Each refusal's status and code; the first matching class wins (subclasses before their bases).
STATUS = (
    (ExplanationIdError, 400, "invalid_explanation_id"),
    (UnauthorizedError, 401, "unauthorized"),
    (ExplanationNotFoundError, 404, "explanation_not_found"),
    (GlossaryNotFoundError, 404, "glossary_not_found"),
    (DocumentNotFoundError, 404, "document_not_found"),
    (FileLinkError, 404, "file_not_found"),
    (ModelNotServedError, 404, "model_not_found"),
    (UnknownModelError, 404, "model_not_found"),
    (RouteNotFoundError, 404, "not_found"),
    (BodyTooLargeError, 413, "body_too_large"),
    (InputTooLongError, 413, "input_too_long"),
    (GlossaryTooLargeError, 413, "glossary_too_large"),
    (DocumentTooLargeError, 413, "document_too_large"),
    (InvalidDocumentError, 400, "invalid_document"),
    (InvalidGlossaryError, 400, "invalid_glossary"),
    (InvalidRequestError, 422, "invalid_request"),
    (MissingParameterError, 422, "missing_parameter"),
    (InvalidParameterError, 422, "invalid_parameter"),
    (InvalidInputError, 422, "invalid_input"),
    (OverloadedError, 503, "overloaded"),
    (DecoderBusyError, 503, "overloaded"),  # the continuous scheduler's queue is full
    (NotReadyError, 503, "not_ready"),
    (RequestTimeoutError, 504, "timeout"),
    (StoreUnavailableError, 503, "store_unavailable"),
    (DocumentNotReadyError, 503, "document_not_ready"),
)
HEADERS = {UnauthorizedError: {"WWW-Authenticate": "Bearer"}}
# Ray's ways of saying a replica or actor is gone or its call was cancelled: the model is unavailable.
UNAVAILABLE = (
    DeploymentUnavailableError,
    ReplicaUnavailableError,
    RequestCancelledError,
    RayActorError,  # ActorDiedError is one
    ActorUnavailableError,
    TaskCancelledError,
    grpc.aio.AioRpcError,  # a direct gRPC call to a replica (Serve's throughput-optimized mode) that broke off
    WorkerCrashedError,
    NodeDiedError,
    ObjectLostError,  # a result whose owner or node went away
    RayServeException,
)
# A model call whose replica went away (its process or node lost) or could not be reached. Translate and explain
# are pure functions of their input, so the ingress sends such a call once more and Serve's router picks another
# replica (Ingress.call); cancellations are not among them: those are the caller's own.
REPLICA_LOST = (  # RayActorError: ActorDiedError and ActorUnavailableError too
    RayActorError,
    ReplicaUnavailableError,
    grpc.aio.AioRpcError,
    WorkerCrashedError,
    NodeDiedError,
    ObjectLostError,
)



def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, list):
        return [_finite(v) for v in value]
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    return value


def json_response(content: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """Compact JSON; a non-finite float (a -inf log-probability) becomes null instead of invalid JSON."""
    try:
        body = json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except ValueError:
        body = json.dumps(_finite(content), ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return Response(body.encode("utf-8"), status_code=status, headers=headers, media_type="application/json")


def error_response(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> Response:
    return json_response({"error": {"code": code, "message": message}}, status, headers)


def _cause(error: BaseException) -> BaseException:
    """The user-level exception inside a Ray RayTaskError (whose str() carries a traceback)."""
    cause = getattr(error, "cause", None)
    return cause if isinstance(cause, BaseException) else error


def replica_lost(error: BaseException) -> bool:
    """True when `error` says the replica serving a call was lost, so the same call may go to another one."""
    cause = _cause(error)
    return isinstance(cause, REPLICA_LOST) and not isinstance(cause, TaskCancelledError)


def _validation_message(error: RequestValidationError) -> tuple[int, str, str]:
    problems = error.errors()
    if any(problem.get("type") == "json_invalid" for problem in problems):
        return 400, "invalid_json", "the request body is not valid JSON"
    # FastAPI reads the body as JSON only when its content type says so; otherwise the model gets raw bytes
    # (curl's -d without -H sends application/x-www-form-urlencoded)
    if any(problem.get("loc") == ("body",) and isinstance(problem.get("input"), bytes) for problem in problems):
        return 415, "unsupported_media_type", "send the request body as JSON, with content-type: application/json"
    parts = []
    for problem in problems[:5]:
        location = ".".join(str(part) for part in problem.get("loc", ()) if part != "body") or "body"
        parts.append(f"{location}: {problem.get('msg', 'invalid')}")
    more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
    return 422, "invalid_request", "; ".join(parts) + more


def describe(error: BaseException, retry_after_s: int = 1) -> tuple[int, str, str, dict[str, str]]:
    """(status, code, message, headers) for any exception: the service's one error mapping."""
    retry = {"Retry-After": str(retry_after_s)}
    if isinstance(error, RequestValidationError):
        return (*_validation_message(error), {})
    if isinstance(error, StarletteHTTPException):
        codes = {404: "not_found", 405: "method_not_allowed", 413: "body_too_large"}
        message = {404: "no such route", 405: "method not allowed on this route"}.get(
            error.status_code, str(error.detail)
        )
        return (
            error.status_code,
            codes.get(error.status_code, f"http_{error.status_code}"),
            message,
            dict(error.headers or {}),
        )
    cause = _cause(error)
    for kind, status, code in STATUS:
        if isinstance(cause, kind):
            headers = dict(HEADERS.get(kind, {}))
            if status == 503:
                headers["Retry-After"] = str(getattr(cause, "retry_after_s", retry_after_s))
            return status, code, str(cause), headers
    if isinstance(cause, CheckpointError):
        logger.error("model unavailable: %s", cause)
        return 503, "model_unavailable", "the model could not be loaded; try again later", retry
    if isinstance(cause, BackPressureError):
        return 503, "overloaded", "the service is at capacity; retry after a moment", retry
    if isinstance(cause, TimeoutError):
        return 504, "timeout", "the model did not answer in time", {}
    if isinstance(cause, UNAVAILABLE):
        logger.warning("translator unavailable: %s", type(cause).__name__)
        return 503, "unavailable", "the model is temporarily unavailable; retry after a moment", retry
    logger.exception("unexpected error", exc_info=error)
    return 500, "internal_error", "internal error", {}


# The compatibility routes: which paths belong to which family (paths below the app's route prefix).
LIBRETRANSLATE_PATHS = ("/translate", "/detect", "/languages", "/frontend/settings", "/health", "/translate_file")
LIBRETRANSLATE_PREFIX = "/download_file/"
DEEPL_PREFIX = "/v2/"


def route_family(path: str) -> str:
    """The route family of a path ("libretranslate", "deepl" or "v1"): whose error shapes and statuses it gets."""
    if path in LIBRETRANSLATE_PATHS or path.startswith(LIBRETRANSLATE_PREFIX):
        return "libretranslate"
    if path.startswith(DEEPL_PREFIX):
        return "deepl"
    return "v1"


def _family_status(family: str, status: int, code: str) -> int:
    """The status LibreTranslate or DeepL answers for what /v1 answers `status` with `code`."""
    route_errors = ("not_found", "method_not_allowed")
    if family == "libretranslate":  # LibreTranslate 1.9 answers 400, 403, 429 and 500 only
        if code == "missing_api_key":
            return 400  # as LibreTranslate does when a key is required and none is given
        if status == 401:
            return 403
        if code == "overloaded":
            return 429
        if status >= 500:
            return 500
        if 400 <= status < 500 and code not in route_errors:
            return 400
    if family == "deepl":  # DeepL: 400 bad request, 403 authorization, 413 too large, 429 too many requests
        if status == 401:
            return 403
        if code == "overloaded":
            return 429
        if status in (404, 422) and code not in (*route_errors, "glossary_not_found", "document_not_found"):
            return 400
    return status


def exception_response(error: BaseException, retry_after_s: int = 1, family: str = "v1") -> Response:
    status, code, message, headers = describe(error, retry_after_s)
    if family == "v1":
        return error_response(status, code, message, headers)
    if isinstance(_cause(error), MissingApiKeyError):
        code = "missing_api_key"
    status = _family_status(family, status, code)
    headers.pop("WWW-Authenticate", None)
    body = {"error": message} if family == "libretranslate" else {"message": message}
    return json_response(body, status, headers)
