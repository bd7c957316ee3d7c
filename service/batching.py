"""A queue whose worker takes whatever has arrived as its next batch once the previous one is done: the work after
the decode loop (service.finishing) runs on what finished meanwhile, never waiting for company.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

logger = logging.getLogger("ray.serve")

Item = TypeVar("Item")


class BatchQueue(Generic[Item]):
    """submit(item) → the handler's result for that item, handled with up to max_batch_size - 1 others, oldest first.

    handler(items) returns one result per item, in order; a result that is an exception is raised to that item's
    caller only. If the handler itself raises, every item of the batch gets the exception. Items cancelled by their
    callers while queued are dropped.
    """

    def __init__(self, handler: Callable[[list[Item]], Awaitable[list[Any]]], max_batch_size: int) -> None:
        if max_batch_size < 1:
            raise ValueError("max_batch_size must be at least 1")
        self.handler = handler
        self.max_batch_size = max_batch_size
        self._entries: deque[tuple[Item, asyncio.Future]] = deque()
        self._arrived: asyncio.Event | None = None
        self._worker: asyncio.Task | None = None

    async def submit(self, item: Item) -> Any:
        loop = asyncio.get_running_loop()
        if self._arrived is None:
            self._arrived = asyncio.Event()
        if self._worker is None or self._worker.done():
            self._worker = loop.create_task(self._work())
        future = loop.create_future()
        self._entries.append((item, future))
        self._arrived.set()
        return await future

    async def _work(self) -> None:
        assert self._arrived is not None
        while True:
            batch = []
            while self._entries and len(batch) < self.max_batch_size:
                entry = self._entries.popleft()
                if not entry[1].done():  # not cancelled while queued
                    batch.append(entry)
            if not batch:
                self._arrived.clear()
                await self._arrived.wait()
                continue
            outcomes = self.handler([item for item, _ in batch])
            await deliver([future for _, future in batch], outcomes, f"batch of {len(batch)}", log_failure=True)


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
