"""A small HTTP client for the service, sync and async, with timeouts and retries on 503 (honouring Retry-After);
errors come back as ServiceError(status, code, message).

    with TranslationClient("http://localhost:8000") as client:
        result = client.translate(["The cat sat."], source_lang="en", target_lang="zh")
        maps = client.explanation(result["translations"][0]["explanation_id"])
"""

from __future__ import annotations

import asyncio
import itertools
import json as json_module
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx

DEFAULT_TIMEOUT = httpx.Timeout(60.0, connect=5.0)
RETRY_STATUSES = (503,)


class ServiceError(Exception):
    """An error answer of the service: HTTP status plus the body's error code and message."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code, self.message = status, code, message


def _error_of(response: httpx.Response) -> ServiceError:
    try:
        error = response.json()["error"]
        return ServiceError(response.status_code, str(error["code"]), str(error["message"]))
    except (ValueError, KeyError, TypeError):
        return ServiceError(response.status_code, "http_error", response.text[:200])


def _stream_body(text: str, source_lang, target_lang, model, options: dict) -> dict:
    body = {"texts": [text], "source_lang": source_lang, "target_lang": target_lang, "model": model, **options}
    return {k: v for k, v in body.items() if v is not None}


class _EventParser:
    """Server-Sent Events, line by line: `feed` returns an event's JSON data at the blank line ending it."""

    def __init__(self) -> None:
        self.data: list[str] = []

    def feed(self, line: str) -> dict | None:
        if line:
            if line.startswith("data:"):
                self.data.append(line[5:].lstrip())
            return None
        data, self.data = "\n".join(self.data), []
        return json_module.loads(data) if data else None


def _delay(response: httpx.Response | None, attempt: int, backoff_s: float) -> float:
    retry_after = response.headers.get("retry-after") if response is not None else None
    if retry_after is not None and retry_after.isdigit():
        return min(float(retry_after), 30.0)
    return backoff_s * 2**attempt


class _Client:
    """What both clients share: the routes, the retry policy and the error handling.

    Route methods return `self.request(...)`: a value for TranslationClient, an awaitable
    for AsyncTranslationClient.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        timeout: httpx.Timeout | float = DEFAULT_TIMEOUT,
        max_retries: int = 3,
        backoff_s: float = 0.5,
    ) -> None:
        self.max_retries, self.backoff_s = max_retries, backoff_s
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http_options: dict[str, Any] = {"base_url": base_url, "timeout": timeout, "headers": headers}

    def request(self, method: str, path: str, json: Any = None) -> Any:
        raise NotImplementedError

    def _retry_delay(self, response: httpx.Response | None, attempt: int) -> float | None:
        """Seconds to wait before the next attempt, or None to stop and answer with `response`."""
        if attempt >= self.max_retries or (response is not None and response.status_code not in RETRY_STATUSES):
            return None
        return _delay(response, attempt, self.backoff_s)

    def _stream_retry_delay(
        self, outcome: httpx.Response | httpx.TransportError, attempt: int, answered: bool
    ) -> float:
        """Seconds before a stream is sent again after an error answer or a failed connection; raises the
        service's error (or the connection's) instead when it may not be: it had answered (events may have been
        seen), or retries are spent."""
        response = outcome if isinstance(outcome, httpx.Response) else None
        delay = None if answered else self._retry_delay(response, attempt)
        if delay is None:
            raise outcome if response is None else _error_of(response)
        return delay

    @staticmethod
    def _result(response: httpx.Response | None) -> Any:
        if response is None:
            raise ServiceError(503, "unreachable", "the service could not be reached")
        if response.is_success:
            return response.json() if "json" in response.headers.get("content-type", "") else response.text
        raise _error_of(response)

    def translate(
        self,
        texts: list[str],
        source_lang: str | None = None,
        target_lang: str | None = None,
        model: str | None = None,
        **options: Any,
    ) -> Any:
        """POST /v1/translate; options: beam_size, n_best, max_length, attention."""
        body = {"texts": list(texts), "source_lang": source_lang, "target_lang": target_lang, "model": model, **options}
        return self.request("POST", "/v1/translate", {k: v for k, v in body.items() if v is not None})

    def explanation(self, explanation_id: str) -> Any:
        """GET /v1/explanations/{explanation_id}."""
        return self.request("GET", f"/v1/explanations/{explanation_id}")

    def explain(
        self,
        source: str | None = None,
        target: str | None = None,
        *,
        explanation_id: str | None = None,
        **options: Any,
    ) -> Any:
        """POST /v1/explain of an explanation_id, or of a source (and target); options: source_lang, target_lang,
        model, kind, layer, head, position, beam_size."""
        body = {"explanation_id": explanation_id, "source": source, "target": target, **options}
        return self.request("POST", "/v1/explain", {k: v for k, v in body.items() if v is not None})

    def models(self) -> Any:
        """GET /v1/models: {"models": [...]}."""
        return self.request("GET", "/v1/models")


class TranslationClient(_Client):
    """Synchronous client."""

    def __init__(
        self, base_url: str = "http://localhost:8000", transport: httpx.BaseTransport | None = None, **settings: Any
    ):
        """settings: api_key, timeout (seconds or httpx.Timeout), max_retries, backoff_s."""
        super().__init__(base_url, **settings)
        self.http = httpx.Client(transport=transport, **self.http_options)

    def __enter__(self) -> TranslationClient:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.http.close()

    def request(self, method: str, path: str, json: Any = None) -> Any:
        for attempt in itertools.count():
            try:
                response = self.http.request(method, path, json=json)
            except httpx.TransportError:
                if attempt >= self.max_retries:
                    raise
                response = None
            delay = self._retry_delay(response, attempt)
            if delay is None:
                return self._result(response)
            time.sleep(delay)

    def translate_stream(
        self,
        text: str,
        source_lang: str | None = None,
        target_lang: str | None = None,
        model: str | None = None,
        **options: Any,
    ) -> Iterator[dict]:
        """POST /v1/translate/stream: the events as they arrive ("start", "token"s, "sentence"s, "result"); options as
        translate. Breaking out of the loop closes the connection, and the service stops decoding. A 503 or a
        failed connection is retried as translate's are, only before the stream has answered."""
        body = _stream_body(text, source_lang, target_lang, model, options)
        for attempt in itertools.count():
            answered = False  # once the stream has answered, nothing is sent again (events may have been seen)
            try:
                with self.http.stream("POST", "/v1/translate/stream", json=body) as response:
                    if response.is_success:
                        answered = True
                        parser = _EventParser()
                        for line in response.iter_lines():
                            if (event := parser.feed(line)) is not None:
                                yield event
                        return
                    response.read()
                time.sleep(self._stream_retry_delay(response, attempt, answered))
            except httpx.TransportError as error:
                time.sleep(self._stream_retry_delay(error, attempt, answered))

    def ready(self) -> bool:
        try:
            return self.http.get("/readyz").status_code == 200
        except httpx.TransportError:
            return False


class AsyncTranslationClient(_Client):
    """Asynchronous client: the same methods, awaitable."""

    def __init__(
        self,
        base_url: str = "http://localhost:8000",
        transport: httpx.AsyncBaseTransport | None = None,
        **settings: Any,
    ):
        """settings: api_key, timeout (seconds or httpx.Timeout), max_retries, backoff_s."""
        super().__init__(base_url, **settings)
        self.http = httpx.AsyncClient(transport=transport, **self.http_options)

    async def __aenter__(self) -> AsyncTranslationClient:
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.http.aclose()

    async def request(self, method: str, path: str, json: Any = None) -> Any:
        for attempt in itertools.count():
            try:
                response = await self.http.request(method, path, json=json)
            except httpx.TransportError:
                if attempt >= self.max_retries:
                    raise
                response = None
            delay = self._retry_delay(response, attempt)
            if delay is None:
                return self._result(response)
            await asyncio.sleep(delay)

    async def translate_stream(
        self,
        text: str,
        source_lang: str | None = None,
        target_lang: str | None = None,
        model: str | None = None,
        **options: Any,
    ) -> AsyncIterator[dict]:
        """POST /v1/translate/stream, as TranslationClient.translate_stream: `async for event in ...`."""
        body = _stream_body(text, source_lang, target_lang, model, options)
        for attempt in itertools.count():
            answered = False
            try:
                async with self.http.stream("POST", "/v1/translate/stream", json=body) as response:
                    if response.is_success:
                        answered = True
                        parser = _EventParser()
                        async for line in response.aiter_lines():
                            if (event := parser.feed(line)) is not None:
                                yield event
                        return
                    await response.aread()
                await asyncio.sleep(self._stream_retry_delay(response, attempt, answered))
            except httpx.TransportError as error:
                await asyncio.sleep(self._stream_retry_delay(error, attempt, answered))

    async def ready(self) -> bool:
        try:
            return (await self.http.get("/readyz")).status_code == 200
        except httpx.TransportError:
            return False
