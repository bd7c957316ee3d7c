"""The HTTP load generator shared by the reliability tests and the service benchmarks: `run_load` POSTs N bodies
at concurrency C and counts statuses, latencies, texts, and every request that got no clean answer.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx


def is_error_body(payload: Any) -> bool:
    """True for the service's error shape {"error": {"code": str, "message": str}}."""
    error = payload.get("error") if isinstance(payload, dict) else None
    return isinstance(error, dict) and isinstance(error.get("code"), str) and isinstance(error.get("message"), str)


def exception_kind(error: BaseException) -> str:
    """A short name for a failed exchange: resets and protocol errors are what 'nothing lost' forbids."""
    if isinstance(error, httpx.TimeoutException):
        return "client_timeout"
    if isinstance(error, httpx.ConnectError):
        return "connect_error"
    if isinstance(error, (httpx.ReadError, httpx.WriteError)):
        return "connection_reset"
    if isinstance(error, httpx.RemoteProtocolError):
        return "protocol_error"
    return type(error).__name__


@dataclass
class LoadResult:
    """What N requests at concurrency C got back."""

    name: str
    requests: int
    concurrency: int
    wall_s: float = 0.0
    statuses: Counter = field(default_factory=Counter)  # HTTP status → count
    exceptions: Counter = field(default_factory=Counter)  # exception_kind → count (no HTTP answer at all)
    bad_error_bodies: int = 0  # non-200 answers whose body is not the JSON error shape
    latencies_s: list[float] = field(default_factory=list)  # of 200 answers
    texts: int = 0  # texts translated in 200 answers
    target_tokens: int = 0
    # every request: (sent, done) as time.perf_counter() readings, and its outcome (the status, or exception_kind)
    timeline: list[tuple[float, float, str]] = field(default_factory=list)

    @property
    def answered(self) -> int:
        return sum(self.statuses.values())

    @property
    def lost(self) -> int:
        """Requests without a clean answer: no HTTP answer, a 5xx other than 503/504, or a malformed error."""
        unclean = sum(n for status, n in self.statuses.items() if status >= 500 and status not in (503, 504))
        return sum(self.exceptions.values()) + unclean + self.bad_error_bodies

    def percentile_ms(self, q: float) -> float | None:
        if not self.latencies_s:
            return None
        ordered = sorted(self.latencies_s)
        return 1000 * ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]

    def summary(self) -> dict[str, Any]:
        ok = self.statuses.get(200, 0)
        return {
            "name": self.name,
            "requests": self.requests,
            "concurrency": self.concurrency,
            "wall_s": round(self.wall_s, 3),
            "requests_per_s": round(ok / self.wall_s, 2) if self.wall_s else None,
            "texts_per_s": round(self.texts / self.wall_s, 2) if self.wall_s else None,
            "tokens_per_s": round(self.target_tokens / self.wall_s, 1) if self.wall_s else None,
            "p50_ms": _round(self.percentile_ms(50)),
            "p95_ms": _round(self.percentile_ms(95)),
            "p99_ms": _round(self.percentile_ms(99)),
            "statuses": {str(k): v for k, v in sorted(self.statuses.items())},
            "exceptions": dict(self.exceptions),
            "bad_error_bodies": self.bad_error_bodies,
            "lost": self.lost,
        }


def _round(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)


async def run_load(
    url: str,
    body_for: Callable[[int], dict],
    requests: int,
    concurrency: int,
    *,
    name: str = "load",
    timeout_s: float = 60.0,
    deadline_s: float | None = None,
    headers: dict[str, str] | None = None,
    stop: threading.Event | None = None,
) -> LoadResult:
    """POST body_for(i) to url for i in range(requests), `concurrency` at a time; stop issuing at deadline_s or stop."""
    result = LoadResult(name, requests, concurrency)
    counter = iter(range(requests))
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    started = time.perf_counter()
    stop_at = started + deadline_s if deadline_s else float("inf")

    async def worker(client: httpx.AsyncClient) -> None:
        for index in counter:
            if time.perf_counter() > stop_at or (stop is not None and stop.is_set()):
                return
            sent = time.perf_counter()
            try:
                response = await client.post(url, json=body_for(index))
            except httpx.HTTPError as error:
                kind = exception_kind(error)
                result.exceptions[kind] += 1
                result.timeline.append((sent, time.perf_counter(), kind))
                continue
            result.timeline.append((sent, time.perf_counter(), str(response.status_code)))
            result.statuses[response.status_code] += 1
            try:
                payload = response.json()
            except ValueError:
                payload = None
            if response.status_code == 200:
                result.latencies_s.append(time.perf_counter() - sent)
                translations = payload.get("translations", []) if isinstance(payload, dict) else []
                result.texts += len(translations)
                result.target_tokens += sum(len(t.get("target_tokens", [])) for t in translations)
            elif not is_error_body(payload):
                result.bad_error_bodies += 1

    async with httpx.AsyncClient(timeout=timeout_s, limits=limits, headers=headers) as client:
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
    result.wall_s = time.perf_counter() - started
    result.requests = result.answered + sum(result.exceptions.values())
    return result


def translate_bodies(sentences: list[str], texts_per_request: int, **options: Any) -> Callable[[int], dict]:
    """Request i carries sentences i*k .. i*k+k-1 (cycling), with the given decoding options."""

    def body_for(index: int) -> dict:
        start = index * texts_per_request
        texts = [sentences[(start + j) % len(sentences)] for j in range(texts_per_request)]
        return {"texts": texts, "source_lang": "en", "target_lang": "zh", **options}

    return body_for
