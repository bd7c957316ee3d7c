"""The one scheduler: requests join and leave the running decode between steps (iteration-level batching, as
Orca and vLLM do), or, under the "static" policy, a batch joins only an empty loop.

A request's rows only add masked positions (weight exactly 0) to other requests' attention, so each decodes as it
would alone, up to float summation order.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor

from model.decoding.loop import capture_code, new_loop
from model.decoding.search import Hypothesis, encoded, length_budget, loop_hypotheses
from model.errors import DecoderBusyError
from model.options import DecodingOptions
from model.runtime import EagerStep
from model.transformer import Transformer

# on_token(request, token id, log-probability, cross-attention (layers, heads, S) or None), as each token settles
ADMISSION_WAIT_STEPS = 4  # the longest a waiting request is held back to join with others (see _admission_due)
TokenCallback = Callable[["DecodeRequest", int, float, Tensor | None], None]
Policy = Literal["continuous", "static"]
POLICIES = ("continuous", "static")


@dataclass(eq=False)
class DecodeRequest:
    """One source from submission to its hypotheses: the one record of it in the scheduler and its thread."""

    source_ids: list[int]
    options: DecodingOptions
    return_attention: bool = False
    on_token: TokenCallback | None = None
    budget: int = 0
    alignment_rows: bool = False  # keep the scheduler's alignment head's rows (Hypothesis.alignment_attention)
    constraints: list[list[int]] = field(default_factory=list)  # token sequences every hypothesis contains
    note: str | None = None  # its caller's word on how it is searched, for its result (Translation.search_note)
    step: int = 0  # tokens streamed so far
    hypotheses: list[Hypothesis] | None = None
    cancelled: bool = False
    waited: int = 0  # steps spent in the queue
    loop_id: int | None = None  # its id in the decode loop
    arrived: float = field(default_factory=time.monotonic)
    batch: Batch | None = None  # the requests it joined the loop with
    future: Future | None = None  # SchedulerThread's, for its caller

    @property
    def beams(self) -> int:
        return self.options.beam_size

    @property
    def done(self) -> bool:
        return self.hypotheses is not None or self.cancelled


def request_of(
    source_ids: list[int], options: DecodingOptions | None, return_attention: bool, on_token: TokenCallback | None,
    alignment_rows: bool, constraints: list[list[int]] | None, note: str | None = None,
) -> DecodeRequest:
    return DecodeRequest(list(source_ids), options or DecodingOptions(), return_attention, on_token,
                         alignment_rows=alignment_rows, constraints=[list(c) for c in constraints or []], note=note)


@dataclass(eq=False)
class Batch:
    """Requests that joined the loop at one step (one encoder pass): when, how many, how many still run."""

    size: int
    joined: float = field(default_factory=time.monotonic)
    running: int = 0


class Scheduler:
    """Batching over one model's decode loop: `submit`, then `step()` until the requests are done. One thread.

    max_rows bounds the rows in flight (a beam of k takes k), max_texts the requests joining at once, max_waiting
    the queue. on_joined(batch, waits) and on_done(batch) feed the service's metrics.
    """

    def __init__(
        self,
        model: Transformer,
        max_rows: int = 64,
        max_waiting: int = 1024,
        alignment_head: tuple[int, int | None] | None = None,
        step=None,
        policy: Policy = "continuous",
        max_texts: int | None = None,
        on_joined: Callable[[Batch, list[float]], None] | None = None,
        on_done: Callable[[Batch], None] | None = None,
        word_continuations: list[int] | None = None,
    ) -> None:
        if max_rows < 1:
            raise ValueError("max_rows must be at least 1")
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, not {policy!r}")
        self.policy = policy
        self.max_texts = max_texts if max_texts is not None else max_rows
        self.on_joined, self.on_done = on_joined, on_done
        self.model = model
        self.decoder_step = step if step is not None else EagerStep(model)
        self.config = model.config
        self.device = model.final_logits_bias.device
        self.max_rows = max_rows
        self.max_waiting = max_waiting
        self.alignment_head = alignment_head  # (layer, head or None for the average) for `alignment_rows`
        self.loop = new_loop(self.decoder_step, alignment_head, word_continuations)
        self.running: list[DecodeRequest] = []  # on the loop, in the order they joined
        self._by_loop_id: dict[int, DecodeRequest] = {}
        self.waiting: deque[DecodeRequest] = deque()

    def submit(
        self,
        source_ids: list[int],
        options: DecodingOptions | None = None,
        return_attention: bool = False,
        on_token: TokenCallback | None = None,
        alignment_rows: bool = False,
        constraints: list[list[int]] | None = None,
    ) -> DecodeRequest:
        """Queue one source (constraints: token sequences every hypothesis must contain)."""
        return self.enqueue(request_of(source_ids, options, return_attention, on_token, alignment_rows, constraints))

    def enqueue(self, request: DecodeRequest) -> DecodeRequest:
        """Queue a request made by `request_of`, checked against this scheduler."""
        if request.beams > self.max_rows:
            raise ValueError(f"beam_size {request.beams} exceeds the scheduler's {self.max_rows} rows")
        if len(self.waiting) >= self.max_waiting:
            raise DecoderBusyError(f"{len(self.waiting)} requests already wait for the decoder")
        if request.alignment_rows and self.alignment_head is None:
            raise ValueError("alignment_rows needs the scheduler's alignment_head")
        request.budget = length_budget(len(request.source_ids), request.options, self.config.max_position_embeddings)
        self.waiting.append(request)
        return request

    def cancel(self, request: DecodeRequest) -> None:
        """Stop decoding `request`: it leaves the queue now, or its rows at the next step."""
        request.cancelled = True
        if request in self.waiting:
            self.waiting.remove(request)

    @property
    def rows(self) -> int:
        """Rows in flight: k per running request of beam size k."""
        return sum(request.beams for request in self.running)

    @property
    def idle(self) -> bool:
        return not self.running and not self.waiting

    def run(self) -> None:
        """Step until every submitted request is done."""
        while not self.idle:
            self.step()

    @torch.inference_mode()
    def step(self) -> list[DecodeRequest]:
        """Admit waiting requests, decode one token for every row; return the requests done."""
        for request in self.running:
            if request.cancelled:
                self.loop.cancel(request.loop_id)
                del self._by_loop_id[request.loop_id]
                self._left(request)
        self.running = [request for request in self.running if not request.cancelled]
        self._admit()
        if not self.running:
            return []
        tokens, done = self.loop.step()
        for loop_id, position, token, logprob, attention in tokens:  # under beam search, the settled prefix
            request = self._by_loop_id[loop_id]
            request.step = position + 1
            request.on_token(request, token, logprob, attention)
        finished = []
        for loop_id, found in done:
            request = self._by_loop_id.pop(loop_id)
            request.hypotheses = loop_hypotheses(found, request.options.n_best, request.return_attention)
            finished.append(request)
            self._left(request)
        if finished:
            gone = {id(request) for request in finished}
            self.running = [request for request in self.running if id(request) not in gone]
        return finished

    def _left(self, request: DecodeRequest) -> None:
        batch = request.batch
        batch.running -= 1
        if batch.running == 0 and self.on_done is not None:
            self.on_done(batch)

    def _join_the_loop(self, joining: list[DecodeRequest], hidden: Tensor, lengths: list[int]) -> None:
        """Encoded requests join the loop, each keeping every head's maps, the alignment head's rows, or nothing."""
        has_head = self.alignment_head is not None
        captures = [
            capture_code(r.return_attention, has_head and (r.alignment_rows or r.on_token is not None))
            for r in joining
        ]
        ids = self.loop.join(
            hidden, lengths, [r.beams for r in joining], [r.budget for r in joining],
            [r.options.min_new_tokens for r in joining], [float(r.options.length_penalty) for r in joining],
            captures, [r.on_token is not None for r in joining], [r.constraints for r in joining],
        )
        batch = Batch(len(joining), running=len(joining))
        for request, loop_id in zip(joining, ids, strict=True):
            request.loop_id = loop_id
            request.batch = batch
            self._by_loop_id[loop_id] = request
        self.running.extend(joining)
        if self.on_joined is not None:
            self.on_joined(batch, [batch.joined - request.arrived for request in joining])

    def _admission_due(self) -> bool:
        """Static: only into an empty loop. Continuous: an encoder pass for one or two sources costs several times
        its share of one for many, so near a full batch they join in groups (a quarter free, all fit, or the oldest
        has waited ADMISSION_WAIT_STEPS steps)."""
        if not self.waiting:
            return False
        if self.policy == "static":
            return not self.running
        free = self.max_rows - self.rows
        if free * 4 >= self.max_rows or sum(r.beams for r in self.waiting) <= free:
            return True
        return self.waiting[0].waited >= ADMISSION_WAIT_STEPS

    def _admit(self) -> None:
        """Waiting requests join while their rows fit, with one encoder pass."""
        for request in self.waiting:
            request.waited += 1
        if not self._admission_due():
            return
        joining: list[DecodeRequest] = []
        rows = self.rows
        while self.waiting and rows + self.waiting[0].beams <= self.max_rows and len(joining) < self.max_texts:
            request = self.waiting.popleft()
            joining.append(request)
            rows += request.beams
        if not joining:
            return
        sources = [r.source_ids for r in joining]
        hidden = encoded(self.decoder_step, sources, self.config.pad_token_id, self.device)
        self._join_the_loop(joining, hidden, [len(ids) for ids in sources])


class SchedulerThread:
    """A `Scheduler` stepping in its own thread: submit from any thread, a Future per source. `close()` fails
    whatever is still queued or running.

    gather_s (static): a batch short of max_texts waits this long from its oldest arrival for company, except
    right after a batch of one (light load). finish(requests): run in the loop's thread on each step's finished
    requests; their Futures give its results.
    """

    def __init__(
        self,
        model: Transformer,
        max_rows: int = 64,
        max_waiting: int = 1024,
        alignment_head: tuple[int, int | None] | None = None,
        step=None,
        policy: Policy = "continuous",
        max_texts: int | None = None,
        gather_s: float = 0.0,
        finish: Callable[[list[DecodeRequest]], list] | None = None,
        on_joined: Callable[[Batch, list[float]], None] | None = None,
        on_done: Callable[[Batch], None] | None = None,
        word_continuations: list[int] | None = None,
    ) -> None:
        self.scheduler = Scheduler(
            model, max_rows=max_rows, max_waiting=max_waiting, alignment_head=alignment_head, step=step,
            policy=policy, max_texts=max_texts, on_joined=self._joined, on_done=on_done,
            word_continuations=word_continuations,
        )
        self.gather_s = gather_s
        self._finish = finish
        self._on_joined = on_joined
        self._last_batch = 0  # sources in the batch that joined last (0: none yet)
        self._inbox: deque[tuple[str, DecodeRequest | Future]] = deque()  # ("submit", request), ("cancel", future)
        self._wake = threading.Condition()
        self._running: dict[int, DecodeRequest] = {}  # by id(future)
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="decode-loop", daemon=True)
        self._thread.start()

    def submit(
        self,
        source_ids: list[int],
        options: DecodingOptions | None = None,
        return_attention: bool = False,
        on_token: TokenCallback | None = None,
        alignment_rows: bool = False,
        constraints: list[list[int]] | None = None,
    ) -> Future:
        """Queue one source (`submit_all` of one request made by `request_of`)."""
        return self.submit_all([request_of(source_ids, options, return_attention, on_token, alignment_rows,
                                           constraints)])[0]

    def submit_all(self, requests: list[DecodeRequest]) -> list[Future]:
        """Queue requests together, so that they join the loop at one step; a Future each gives its hypotheses
        (best first), or `finish`'s result for it. Raises DecoderBusyError, queueing none, when they do not fit."""
        futures = []
        for request in requests:
            request.future = Future()
            futures.append(request.future)
        with self._wake:
            if self._closed:
                raise RuntimeError("the decode loop is closed")
            if len(self.scheduler.waiting) + len(self._inbox) + len(requests) > self.scheduler.max_waiting:
                raise DecoderBusyError(f"{self.scheduler.max_waiting} sources already wait for the decoder")
            self._inbox.extend(("submit", request) for request in requests)
            self._wake.notify()
        for future in futures:
            future.add_done_callback(self._given_up)
        return futures

    def _given_up(self, future: Future) -> None:
        """A Future cancelled before its source joined: wake the loop, which may be holding a batch for it."""
        if future.cancelled():
            with self._wake:
                self._wake.notify()

    def cancel(self, future: Future) -> None:
        """Stop decoding the source behind `future` (a client went away): its rows are freed next step."""
        with self._wake:
            self._inbox.append(("cancel", future))
            self._wake.notify()

    def close(self) -> None:
        with self._wake:
            self._closed = True
            self._wake.notify()
        self._thread.join(timeout=30)

    def _joined(self, batch: Batch, waits: list[float]) -> None:
        self._last_batch = batch.size
        if self._on_joined is not None:
            self._on_joined(batch, waits)

    def _gather(self) -> None:
        """Static: hold a batch that would join the empty loop for company (gather_s). Holds self._wake."""
        scheduler = self.scheduler
        if scheduler.policy != "static" or scheduler.running or self.gather_s <= 0 or self._last_batch == 1:
            return
        while not self._closed:
            arrivals = self._live_arrivals()
            if not arrivals or len(arrivals) >= scheduler.max_texts:
                return
            remaining = min(arrivals) + self.gather_s - time.monotonic()
            if remaining <= 0:
                return
            self._wake.wait(remaining)

    def _live_arrivals(self) -> list[float]:
        """When each source still wanted arrived, queued or in the inbox: one whose caller gave up holds no batch
        back. Holds self._wake."""
        dropped = {id(payload) for kind, payload in self._inbox if kind == "cancel"}
        queued = [payload for kind, payload in self._inbox if kind == "submit"]
        return [request.arrived for request in (*self.scheduler.waiting, *queued)
                if not (request.cancelled or request.future.cancelled() or id(request.future) in dropped)]

    def _run(self) -> None:
        scheduler = self.scheduler
        while True:
            with self._wake:
                while not self._inbox and scheduler.idle and not self._closed:
                    self._wake.wait()
                self._gather()
                if self._closed:
                    break
                inbox, self._inbox = list(self._inbox), deque()
            for kind, payload in inbox:
                if kind == "cancel":
                    if (request := self._running.pop(id(payload), None)) is not None:
                        scheduler.cancel(request)
                elif payload.future.set_running_or_notify_cancel():
                    try:
                        scheduler.enqueue(payload)
                    except Exception as error:  # noqa: BLE001 - the caller's error, delivered to the caller
                        payload.future.set_exception(error)
                        continue
                    self._running[id(payload.future)] = payload
            try:
                finished = scheduler.step()
            except Exception as error:  # noqa: BLE001 - fail every source in flight, keep the loop alive
                for request in self._running.values():
                    scheduler.cancel(request)
                    request.future.set_exception(error)
                self._running.clear()
                scheduler.step()  # drops the cancelled rows
                continue
            if finished:
                self._deliver(finished)
        for request in self._running.values():
            request.future.set_exception(RuntimeError("the decode loop closed before this source was decoded"))

    def _deliver(self, finished: list[DecodeRequest]) -> None:
        """The Futures of the requests one step finished: their hypotheses, or `finish`'s results for them all."""
        futures = [self._running.pop(id(request.future)).future for request in finished]
        results = [request.hypotheses for request in finished]
        if self._finish is not None:
            try:
                results = self._finish(finished)
            except Exception as error:  # noqa: BLE001 - delivered to the callers waiting on these requests
                for future in futures:
                    future.set_exception(error)
                return
        for future, result in zip(futures, results, strict=True):
            future.set_result(result)
