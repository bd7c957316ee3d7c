"""The finisher's batch queue (service.batching), driven by a real asyncio loop.

Events are ordered with asyncio.Event, never with sleeps: `submitted` returns once the queue holds
an item; the Recorder tells when a batch reached the handler and holds it there until released.
"""

import asyncio

import pytest

from service.batching import BatchQueue


class Recorder:
    """A batch handler that records its batches and can be held until released."""

    def __init__(self) -> None:
        self.batches: list[list] = []
        self.release = asyncio.Event()
        self.release.set()
        self.started = asyncio.Event()

    async def __call__(self, items: list) -> list:
        self.batches.append(list(items))
        self.started.set()
        await self.release.wait()
        return [ValueError(f"bad {item}") if str(item).startswith("bad") else f"done {item}" for item in items]


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, 10))


async def submitted(queue: BatchQueue, item) -> asyncio.Task:
    """Submit `item` from a task of its own; return that task once the queue holds the item.

    submit() queues its item before it first suspends, so the event set just before the call
    wakes us only after the item is in the queue.
    """
    queued = asyncio.Event()

    async def submit():
        queued.set()
        return await queue.submit(item)

    task = asyncio.create_task(submit())
    await queued.wait()
    return task


async def busy_queue(handler: Recorder, first) -> tuple[BatchQueue, asyncio.Task]:
    """A queue (batches of up to 16) whose engine is busy with `first` until handler.release is set."""
    queue = BatchQueue(handler, max_batch_size=16)
    handler.release.clear()
    task = asyncio.create_task(queue.submit(first))
    await handler.started.wait()
    return queue, task


def test_the_next_batch_takes_everything_that_arrived_while_the_engine_was_busy():
    async def scenario():
        handler = Recorder()
        queue, first = await busy_queue(handler, 0)
        rest = [await submitted(queue, i) for i in range(1, 21)]
        assert len(handler.batches) == 1  # the engine is busy: nothing new may start
        handler.release.set()
        results = await asyncio.gather(first, *rest)
        assert results == [f"done {i}" for i in range(21)]
        assert [len(b) for b in handler.batches] == [1, 16, 4]
        assert [i for b in handler.batches for i in b] == list(range(21))  # oldest first

    run(scenario())


def test_an_item_whose_result_is_an_error_fails_alone():
    async def scenario():
        handler = Recorder()
        queue = BatchQueue(handler, max_batch_size=4)
        results = await asyncio.gather(queue.submit("ok"), queue.submit("bad one"), return_exceptions=True)
        assert results[0] == "done ok"
        assert isinstance(results[1], ValueError) and str(results[1]) == "bad bad one"

    run(scenario())


def test_a_failing_handler_fails_its_batch_and_the_queue_keeps_serving():
    async def scenario():
        calls = []

        async def handler(items):
            calls.append(items)
            if len(calls) == 1:
                raise RuntimeError("engine fell over")
            return [item * 2 for item in items]

        queue = BatchQueue(handler, max_batch_size=4)
        first = await asyncio.gather(queue.submit(1), queue.submit(2), return_exceptions=True)
        assert all(isinstance(r, RuntimeError) for r in first)
        assert await queue.submit(21) == 42

    run(scenario())


def test_an_item_cancelled_while_queued_never_reaches_the_engine():
    async def scenario():
        handler = Recorder()
        queue, blocker = await busy_queue(handler, "first")
        gone = await submitted(queue, "gone")
        kept = await submitted(queue, "kept")
        gone.cancel()
        handler.release.set()
        assert await kept == "done kept" and await blocker == "done first"
        with pytest.raises(asyncio.CancelledError):
            await gone
        assert handler.batches == [["first"], ["kept"]]

    run(scenario())


def test_a_handler_returning_the_wrong_number_of_results_fails_the_batch_loudly():
    async def scenario():
        async def handler(items):
            return items[:-1]

        queue = BatchQueue(handler, max_batch_size=4)
        results = await asyncio.gather(queue.submit(1), queue.submit(2), return_exceptions=True)
        assert all(isinstance(r, RuntimeError) and "2 items" in str(r) for r in results)

    run(scenario())


def test_an_item_alone_starts_at_once_and_items_queued_together_share_a_batch():
    async def scenario():
        handler = Recorder()
        queue = BatchQueue(handler, max_batch_size=8)
        assert await queue.submit("lone") == "done lone"
        assert await asyncio.gather(queue.submit("a"), queue.submit("b")) == ["done a", "done b"]
        assert handler.batches == [["lone"], ["a", "b"]]

    run(scenario())
