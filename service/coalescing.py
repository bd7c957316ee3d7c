"""Coalescing at the ingress: translate requests for one model that arrive together leave in one call to the
translator, so that the per-call cost of Ray Serve is paid once per call rather than once per request.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from service.batching import deliver

Request = TypeVar("Request")


class Call(Protocol):
    """What `send` returns: Ray Serve's DeploymentResponse has this shape."""

    def __await__(self): ...

    def cancel(self) -> None: ...


@dataclass
class _Waiting(Generic[Request]):
    request: Request
    size: int
    future: asyncio.Future


class Coalescer(Generic[Request]):
    """submit(request) → its outcome, from a call shared with the requests that waited alongside it.

    At most `max_calls` calls are out at a time; requests arriving meanwhile wait and leave together in the
    next call, when a call returns, or at once when the waiting requests hold `max_items` items (a full
    batch). Under light load nothing waits. With max_calls=2 one call decodes while the next is queued at
    the replica. max_calls=0 lifts the limit: every request leaves at once in a call of its own.

    send(requests) starts one call and must resolve to one outcome per request, in order.
    If the call itself fails, every request in it gets that exception. A request whose caller gave up
    is dropped before sending; a sent call is cancelled only once all of its requests were given up.
    """

    def __init__(
        self,
        send: Callable[[list[Request]], Call],
        size: Callable[[Request], int],
        max_calls: int,
        max_items: int,
    ) -> None:
        if max_calls < 0 or max_items < 1:
            raise ValueError("max_calls must be at least 0 (0: no limit) and max_items at least 1")
        self.send = send
        self.size = size
        self.max_calls = max_calls
        self.max_items = max_items
        self.outstanding = 0
        self._waiting: deque[_Waiting[Request]] = deque()
        self._waiting_items = 0
        self._tasks: set[asyncio.Task] = set()

    @property
    def waiting(self) -> int:
        """Requests held at the ingress, not sent yet (given-up ones included until the next send)."""
        return len(self._waiting)

    async def submit(self, request: Request) -> Any:
        waiting = _Waiting(request, self.size(request), asyncio.get_running_loop().create_future())
        self._waiting.append(waiting)
        self._waiting_items += waiting.size
        self._dispatch()
        return await waiting.future

    def _dispatch(self) -> None:
        while self._waiting and (
            not self.max_calls or self.outstanding < self.max_calls or self._waiting_items >= self.max_items
        ):
            group = self._take()
            if group:
                self._start(group)

    def _take(self) -> list[_Waiting[Request]]:
        """Live waiting requests, oldest first, up to max_items texts (at least one request)."""
        group: list[_Waiting[Request]] = []
        items = 0
        while self._waiting:
            head = self._waiting[0]
            if group and items + head.size > self.max_items:
                break
            self._waiting.popleft()
            self._waiting_items -= head.size
            if head.future.done():  # its caller gave up while it waited
                continue
            group.append(head)
            items += head.size
        return group

    def _start(self, group: list[_Waiting[Request]]) -> None:
        try:
            call = self.send([waiting.request for waiting in group])
        except Exception as error:  # e.g. the handle refused the call: the requests learn why
            for waiting in group:
                if not waiting.future.done():
                    waiting.future.set_exception(error)
            return
        self.outstanding += 1

        def given_up(_: asyncio.Future) -> None:
            if all(waiting.future.cancelled() for waiting in group):
                call.cancel()

        for waiting in group:
            waiting.future.add_done_callback(given_up)
        task = asyncio.get_running_loop().create_task(self._finish(call, group))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _finish(self, call: Call, group: list[_Waiting[Request]]) -> None:
        try:  # a failed call (e.g. its replica died) is answered by the ingress's error mapping, not logged here
            await deliver([waiting.future for waiting in group], call, f"a call of {len(group)} requests", False)
        finally:
            self.outstanding -= 1
            self._dispatch()
