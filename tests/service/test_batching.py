"""The translator's batch queue (service/batching.py), driven by a real asyncio loop."""

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

    async def __call__(self, items: list, waits: list[float]) -> list:
        assert len(waits) == len(items) and all(w >= 0 for w in waits)
        self.batches.append(list(items))
        self.started.set()
        await self.release.wait()
        return [ValueError(f"bad {item}") if str(item).startswith("bad") else f"done {item}" for item in items]


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, 10))


async def busy_queue(handler: Recorder, first, group=None) -> tuple[BatchQueue, asyncio.Task]:
    """A queue (batches of up to 16, no wait) whose engine is busy with `first` until handler.release is set."""
    queue = BatchQueue(handler, max_batch_size=16, wait_s=0.0)
    handler.release.clear()
    task = asyncio.create_task(queue.submit(first, group=group))
    await handler.started.wait()
    return queue, task


def test_the_next_batch_takes_everything_that_arrived_while_the_engine_was_busy():
    async def scenario():
        handler = Recorder()
        queue, first = await busy_queue(handler, 0)
        rest = [asyncio.create_task(queue.submit(i)) for i in range(1, 21)]
        await asyncio.sleep(0.05)  # the engine is busy: nothing new may start
        assert len(handler.batches) == 1
        handler.release.set()
        results = await asyncio.gather(first, *rest)
        assert results == [f"done {i}" for i in range(21)]
        assert [len(b) for b in handler.batches] == [1, 16, 4]
        assert [i for b in handler.batches for i in b] == list(range(21))  # oldest first

    run(scenario())


def test_items_submitted_together_share_one_batch_within_the_wait():
    async def scenario():
        handler = Recorder()
        queue = BatchQueue(handler, max_batch_size=8, wait_s=0.2)
        results = await asyncio.gather(*(queue.submit(i) for i in range(5)))
        assert results == [f"done {i}" for i in range(5)]
        assert handler.batches == [[0, 1, 2, 3, 4]]

    run(scenario())


def test_a_batch_holds_one_group_and_the_oldest_item_goes_first():
    async def scenario():
        handler = Recorder()
        queue, blocker = await busy_queue(handler, "first", group="beam4")
        tasks = [
            asyncio.create_task(queue.submit(name, group=group))
            for name, group in [("a", "greedy"), ("b", "beam4"), ("c", "greedy"), ("d", "beam4")]
        ]
        await asyncio.sleep(0.01)
        handler.release.set()
        await asyncio.gather(blocker, *tasks)
        assert handler.batches == [["first"], ["a", "c"], ["b", "d"]]

    run(scenario())


def test_an_item_whose_result_is_an_error_fails_alone():
    async def scenario():
        handler = Recorder()
        queue = BatchQueue(handler, max_batch_size=4, wait_s=0.1)
        results = await asyncio.gather(queue.submit("ok"), queue.submit("bad one"), return_exceptions=True)
        assert results[0] == "done ok"
        assert isinstance(results[1], ValueError) and str(results[1]) == "bad bad one"

    run(scenario())


def test_a_failing_handler_fails_its_batch_and_the_queue_keeps_serving():
    async def scenario():
        calls = []

        async def handler(items, waits):
            calls.append(items)
            if len(calls) == 1:
                raise RuntimeError("engine fell over")
            return [item * 2 for item in items]

        queue = BatchQueue(handler, max_batch_size=4, wait_s=0.05)
        first = await asyncio.gather(queue.submit(1), queue.submit(2), return_exceptions=True)
        assert all(isinstance(r, RuntimeError) for r in first)
        assert await queue.submit(21) == 42

    run(scenario())


def test_an_item_cancelled_while_queued_never_reaches_the_engine():
    async def scenario():
        handler = Recorder()
        queue, blocker = await busy_queue(handler, "first")
        gone = asyncio.create_task(queue.submit("gone"))
        kept = asyncio.create_task(queue.submit("kept"))
        await asyncio.sleep(0.01)
        gone.cancel()
        handler.release.set()
        assert await kept == "done kept" and await blocker == "done first"
        with pytest.raises(asyncio.CancelledError):
            await gone
        assert handler.batches == [["first"], ["kept"]]

    run(scenario())


def test_a_handler_returning_the_wrong_number_of_results_fails_the_batch_loudly():
    async def scenario():
        async def handler(items, waits):
            return items[:-1]

        queue = BatchQueue(handler, max_batch_size=4, wait_s=0.05)
        results = await asyncio.gather(queue.submit(1), queue.submit(2), return_exceptions=True)
        assert all(isinstance(r, RuntimeError) and "2 items" in str(r) for r in results)

    run(scenario())


def test_when_the_oldest_item_is_cancelled_the_wait_restarts_from_the_next_one():
    async def scenario():
        handler = Recorder()
        queue = BatchQueue(handler, max_batch_size=8, wait_s=0.3)
        loop = asyncio.get_running_loop()
        gone = asyncio.create_task(queue.submit("gone"))
        await asyncio.sleep(0.2)
        gone.cancel()
        arrived = loop.time()
        kept = await queue.submit("kept")
        # "kept" waited its own 0.3 s for company, not the 0.1 s left of the cancelled item's wait
        assert kept == "done kept" and loop.time() - arrived >= 0.28
        assert handler.batches == [["kept"]]

    run(scenario())
