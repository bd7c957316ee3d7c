"""The ingress's request coalescing (service/coalescing.py), driven by a real asyncio loop.

The calls stand in for Ray Serve's DeploymentResponse (awaitable, cancel()); the whole path
through a real Ray Serve instance is covered by the API tests, which all go through it.
Events are ordered with asyncio.Event, never by counting event-loop turns: `submitted` returns
once the coalescer holds a request, `Translator.sent(n)` once n calls have left.
"""

import asyncio

import pytest

from service.coalescing import Coalescer


class Call:
    """One outgoing call: its requests, answered when the test says so."""

    def __init__(self, requests: list) -> None:
        self.requests = requests
        self.future = asyncio.get_running_loop().create_future()
        self.cancelled = asyncio.Event()

    def __await__(self):
        return self.future.__await__()

    def cancel(self) -> None:
        self.cancelled.set()
        self.future.cancel()

    def answer(self) -> None:
        """Each request (a list of texts) gets its texts upper-cased; a request ["bad"] gets a ValueError."""
        self.future.set_result([ValueError("bad") if r == ["bad"] else [t.upper() for t in r] for r in self.requests])


class Translator:
    def __init__(self) -> None:
        self.calls: list[Call] = []
        self._new_call = asyncio.Event()

    def send(self, requests: list) -> Call:
        self.calls.append(Call(list(requests)))
        self._new_call.set()
        return self.calls[-1]

    async def sent(self, count: int) -> list[Call]:
        """Wait until `count` calls have left; all calls so far."""
        while len(self.calls) < count:
            self._new_call.clear()
            await self._new_call.wait()
        return self.calls


def coalescer(translator: Translator, max_calls: int = 2, max_items: int = 16) -> Coalescer:
    return Coalescer(translator.send, size=len, max_calls=max_calls, max_items=max_items)


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, 10))


async def submitted(coalesce: Coalescer, request: list) -> asyncio.Task:
    """Submit `request` from a task of its own; return that task once the coalescer holds it.

    submit() queues its request, and sends what may leave, before it first suspends: the event set
    just before the call wakes us only after that.
    """
    held = asyncio.Event()

    async def submit():
        held.set()
        return await coalesce.submit(request)

    task = asyncio.create_task(submit())
    await held.wait()
    return task


def test_under_light_load_a_request_leaves_at_once_on_its_own():
    async def scenario():
        translator = Translator()
        coalesce = coalescer(translator)
        first = await submitted(coalesce, ["a"])
        second = await submitted(coalesce, ["b", "c"])
        assert [call.requests for call in translator.calls] == [[["a"]], [["b", "c"]]]
        for call in translator.calls:
            call.answer()
        assert await first == ["A"] and await second == ["B", "C"]
        assert coalesce.outstanding == 0

    run(scenario())


def test_requests_arriving_while_the_calls_are_out_leave_together_when_one_returns():
    async def scenario():
        translator = Translator()
        coalesce = coalescer(translator, max_calls=1)
        first = await submitted(coalesce, ["a"])
        waiting = [await submitted(coalesce, [text]) for text in "bcde"]
        assert len(translator.calls) == 1 and coalesce.waiting == 4
        translator.calls[0].answer()
        assert await first == ["A"]
        calls = await translator.sent(2)
        assert [call.requests for call in calls[1:]] == [[["b"], ["c"], ["d"], ["e"]]]  # oldest first
        calls[1].answer()
        assert await asyncio.gather(*waiting) == [["B"], ["C"], ["D"], ["E"]]

    run(scenario())


def test_a_full_batch_of_waiting_texts_leaves_without_waiting_for_a_call_slot():
    async def scenario():
        translator = Translator()
        coalesce = coalescer(translator, max_calls=1, max_items=4)
        tasks = [await submitted(coalesce, [str(i)]) for i in range(10)]
        # One call slot: "0" took it; then every 4 waiting texts left as a full call; "9" waits.
        assert [len(call.requests) for call in translator.calls] == [1, 4, 4]
        assert coalesce.waiting == 1
        for call in translator.calls[:3]:
            call.answer()
        last = (await translator.sent(4))[3]
        assert last.requests == [["9"]]
        last.answer()
        assert await asyncio.gather(*tasks) == [[str(i)] for i in range(10)]

    run(scenario())


def test_a_request_larger_than_a_batch_still_leaves_in_a_call_of_its_own():
    async def scenario():
        translator = Translator()
        coalesce = coalescer(translator, max_calls=1, max_items=2)
        blocker = await submitted(coalesce, ["x"])
        big = await submitted(coalesce, ["a", "b", "c"])
        small = await submitted(coalesce, ["d"])
        assert [call.requests for call in translator.calls] == [[["x"]], [["a", "b", "c"]]]
        for call in list(translator.calls):
            call.answer()
        last = (await translator.sent(3))[2]
        assert last.requests == [["d"]]
        last.answer()
        assert await asyncio.gather(blocker, big, small) == [["X"], ["A", "B", "C"], ["D"]]

    run(scenario())


def test_each_request_gets_its_own_outcome_and_a_failed_call_fails_all_of_its_requests():
    async def scenario():
        translator = Translator()
        coalesce = coalescer(translator, max_calls=1)
        first = await submitted(coalesce, ["a"])
        good, bad = await submitted(coalesce, ["b"]), await submitted(coalesce, ["bad"])
        translator.calls[0].answer()
        (await translator.sent(2))[1].answer()
        assert await first == ["A"] and await good == ["B"]
        with pytest.raises(ValueError, match="bad"):
            await bad

        one, two = await submitted(coalesce, ["c"]), await submitted(coalesce, ["d"])
        assert [call.requests for call in translator.calls[2:]] == [[["c"]]]
        translator.calls[2].future.set_exception(ConnectionError("replica died"))
        # "d" waited behind the failed call and leaves in the next one; "c" learns of the failure.
        with pytest.raises(ConnectionError, match="replica died"):
            await one
        retry = (await translator.sent(4))[3]
        assert retry.requests == [["d"]]
        retry.answer()
        assert await two == ["D"]
        assert coalesce.outstanding == 0

    run(scenario())


def test_given_up_requests_are_not_sent_and_a_call_everyone_gave_up_is_cancelled():
    async def scenario():
        translator = Translator()
        coalesce = coalescer(translator, max_calls=1)
        first = await submitted(coalesce, ["a"])
        gone = await submitted(coalesce, ["gone"])
        kept = await submitted(coalesce, ["kept"])
        gone.cancel()  # e.g. the request timed out at the ingress while it waited
        with pytest.raises(asyncio.CancelledError):
            await gone
        translator.calls[0].answer()
        await first
        calls = await translator.sent(2)
        assert calls[1].requests == [["kept"]]
        assert not calls[1].cancelled.is_set()

        kept.cancel()  # everyone in the sent call gave up: the call is cancelled
        await calls[1].cancelled.wait()
        later = await submitted(coalesce, ["later"])  # leaves only once the cancelled call freed the slot
        (await translator.sent(3))[2].answer()
        assert await later == ["LATER"]
        assert coalesce.outstanding == 0

    run(scenario())


def test_without_a_call_limit_every_request_is_its_own_call():
    async def scenario():
        translator = Translator()
        coalesce = coalescer(translator, max_calls=0)
        tasks = [await submitted(coalesce, [str(i)]) for i in range(5)]
        assert [call.requests for call in translator.calls] == [[[str(i)]] for i in range(5)]
        for call in translator.calls:
            call.answer()
        assert await asyncio.gather(*tasks) == [[str(i)] for i in range(5)]

    run(scenario())


def test_limits_are_validated():
    with pytest.raises(ValueError):
        Coalescer(Translator().send, size=len, max_calls=-1, max_items=16)
    with pytest.raises(ValueError):
        Coalescer(Translator().send, size=len, max_calls=2, max_items=0)
