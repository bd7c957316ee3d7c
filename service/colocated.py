"""The "colocated" layout: every model's translator lives in each ingress replica, so a request crosses one Ray hop
(the proxy to the ingress) instead of two. The ingress calls them through handles shaped as Ray Serve's, so its
routes, limits and timeouts are the same in both layouts.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any


class LocalCall:
    """A started call to an in-process translator, as a DeploymentResponse: awaitable once, `cancel()`."""

    def __init__(self, outcome: Any) -> None:
        if inspect.iscoroutine(outcome):
            self._future = asyncio.get_running_loop().create_task(outcome)
        else:
            self._future = asyncio.get_running_loop().create_future()
            self._future.set_result(outcome)

    def __await__(self):
        return self._future.__await__()

    def cancel(self) -> None:
        self._future.cancel()


class LocalStream:
    """A started streaming call (an async generator of the translator's), as a DeploymentResponseGenerator."""

    def __init__(self, events) -> None:
        self._events = events
        self._closing: asyncio.Task | None = None

    def __aiter__(self) -> LocalStream:
        return self

    async def __anext__(self) -> Any:
        return await self._events.__anext__()

    def cancel(self) -> None:
        """Close the generator (the translator then cancels its decode); a no-op once it has ended."""
        if self._closing is None:
            self._closing = asyncio.get_running_loop().create_task(self._close())

    async def _close(self) -> None:
        try:
            await self._events.aclose()
        except RuntimeError:  # still running in another task: its own cancellation closes it
            pass


class LocalMethod:
    def __init__(self, method, stream: bool) -> None:
        self._method, self._stream = method, stream

    def remote(self, *args: Any, **kwargs: Any) -> LocalCall | LocalStream:
        outcome = self._method(*args, **kwargs)
        return LocalStream(outcome) if self._stream else LocalCall(outcome)


class LocalHandle:
    """`handle.method.remote(...)` and `handle.options(stream=True)` over a translator object in this process."""

    def __init__(self, translator: Any, stream: bool = False) -> None:
        self._translator, self._stream = translator, stream

    def options(self, *, stream: bool = False) -> LocalHandle:
        return LocalHandle(self._translator, stream)

    def __getattr__(self, name: str) -> LocalMethod:
        if name.startswith("_"):
            raise AttributeError(name)
        return LocalMethod(getattr(self._translator, name), self._stream)


def colocated_translators(translator_arguments: dict[str, dict]) -> dict[str, LocalHandle]:
    """Every model's translator loaded here, by model id (arguments as the translator deployments are bound with)."""
    from service.deployments import TranslatorDeployment  # torch: imported only where a translator loads

    translator_class = TranslatorDeployment.func_or_class
    return {model: LocalHandle(translator_class(**arguments)) for model, arguments in translator_arguments.items()}
