"""A batch queue that forms the next batch only when the engine is free, so that whatever arrived while one
batch decoded is decoded together (Ray Serve's @serve.batch forms batches as items arrive).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

logger = logging.getLogger("ray.serve")

Item = TypeVar("Item")


@dataclass
class _Entry(Generic[Item]):
    item: Item
    group: Hashable
    future: asyncio.Future
    enqueued_at: float = field(default_factory=time.monotonic)


class BatchQueue(Generic[Item]):
    """submit(item, group) → the handler's result for that item, decoded with up to max_batch_size others.

    One worker takes the next batch only after the previous one is done, and never waits for company: what
    arrived meanwhile is the batch. A batch holds items with equal `group` keys (decoding options), oldest
    first: one handler call per batch. (The decode loop's admission is where texts are gathered for the
    engine; this queue only batches the work after it.)

    handler(items) returns one result per item, in order; a result that is an exception is
    raised to that item's caller only. If the handler itself raises, every item of the batch
    gets the exception. Items cancelled by their callers while queued are dropped before decoding.
    """

    def __init__(
        self,
        handler: Callable[[list[Item], list[float]], Awaitable[list[Any]]],
        max_batch_size: int,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError("max_batch_size must be at least 1")
        self.handler = handler
        self.max_batch_size = max_batch_size
        self._entries: deque[_Entry[Item]] = deque()
        self._arrived: asyncio.Event | None = None
        self._worker: asyncio.Task | None = None

    async def submit(self, item: Item, group: Hashable = None) -> Any:
        loop = asyncio.get_running_loop()
        if self._arrived is None:
            self._arrived = asyncio.Event()
        if self._worker is None or self._worker.done():
            self._worker = loop.create_task(self._work())
        entry = _Entry(item, group, loop.create_future())
        entry.future.add_done_callback(self._on_done)
        self._entries.append(entry)
        self._arrived.set()
        return await entry.future

    def _on_done(self, future: asyncio.Future) -> None:
        if future.cancelled() and self._arrived is not None:  # the worker may be waiting on this item's batch
            self._arrived.set()

    def _take(self) -> list[_Entry[Item]]:
        """The oldest entry (live: see _work) and up to max_batch_size - 1 more of its group, in arrival order."""
        group = self._entries[0].group
        batch, rest = [], deque()
        while self._entries:
            entry = self._entries.popleft()
            if entry.future.done():
                continue
            if entry.group == group and len(batch) < self.max_batch_size:
                batch.append(entry)
            else:
                rest.append(entry)
        self._entries = rest
        return batch

    async def _work(self) -> None:
        assert self._arrived is not None
        while True:
            while self._entries and self._entries[0].future.done():  # cancelled while queued
                self._entries.popleft()
            if not self._entries:
                self._arrived.clear()
                await self._arrived.wait()
                continue
            await self._run(self._take())

    async def _run(self, batch: list[_Entry[Item]]) -> None:
        started = time.monotonic()
        waits = [started - e.enqueued_at for e in batch]
        outcomes = self.handler([e.item for e in batch], waits)
        await deliver([e.future for e in batch], outcomes, f"batch of {len(batch)}", log_failure=True)


async def deliver(futures: list[asyncio.Future], outcomes: Awaitable[list[Any]], what: str, log_failure: bool) -> None:
    """Await one outcome per future and resolve each future still waiting with its own.

    An outcome that is an exception is raised to that future's awaiter only. If `outcomes` itself
    fails, every future gets the exception; if it is cancelled (shutdown), every future is cancelled.
    """
    try:
        results = await outcomes
        if len(results) != len(futures):
            raise RuntimeError(f"{what} returned {len(results)} results for {len(futures)} items")
    except asyncio.CancelledError:
        for future in futures:
            future.cancel()
        raise
    except Exception as error:  # every awaiter learns of it; the caller lives on
        if log_failure:
            logger.exception("%s failed", what)
        results = [error] * len(futures)
    for future, result in zip(futures, results, strict=True):
        if future.done():
            continue
        if isinstance(result, BaseException):
            future.set_exception(result)
        else:
            future.set_result(result)
