"""Continuous (iteration-level) batching: requests join and leave the running decode at every step.

`Scheduler` keeps the queue and decides when waiting requests join; the rows decode on the compiled
step's decode loop (model/runtime/csrc/decoding.h, the loop every compiled search runs on), or, on the
eager step, on one ragged KV cache here whose rows belong to different requests at different positions.
Each `step()` first admits waiting requests (their encoder pass runs and their cross-attention
keys/values join), then runs one decoder step for every row, then advances each request's search on its
own rows; a request that is done leaves at once and its rows are freed for the next step. A request
with beam size k holds k rows (greedy: one).

Exactness: each request's search is `model.decoding.search._beam` for one input (both step through
`model.decoding.search.beam_step`, with the same tie-breaking and the same back-tracking), and the rows of other
requests only add masked positions to its attention (weight exactly 0), so its ids, scores and
attention equal decoding it alone, up to float summation order (tests/model/test_scheduler.py).

Orca (OSDI 2022) named the idea; vLLM and TensorRT-LLM's in-flight batching do it for decoders.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch
from torch import Tensor

from model.decoding.search import (
    BeamState,
    Hypothesis,
    StepRecord,
    backtrack,
    beam_step,
    captured,
    length_budget,
    loop_hypotheses,
    next_logprobs,
    to_host,
)
from model.errors import DecoderBusyError
from model.options import DecodingOptions
from model.runtime import CAPTURE, EagerStep
from model.transformer import Transformer

# on_token(request, token id, its log-probability, its cross-attention (layers, heads, S) or None):
# called for greedy requests after every step (streaming); beams are only known at the end.
ADMISSION_WAIT_STEPS = 4  # the longest a waiting request is held back to join with others (see _admission_due)
TokenCallback = Callable[["DecodeRequest", int, float, Tensor | None], None]
Moves = list[tuple[int, int, int]]  # blocks of rows that move: (old first row, new first row, rows) each


@dataclass(eq=False)
class DecodeRequest:
    """One source being decoded: its search state while running, `hypotheses` when done."""

    source_ids: list[int]
    options: DecodingOptions
    return_attention: bool = False
    on_token: TokenCallback | None = None
    budget: int = 0
    alignment_rows: bool = False  # keep the scheduler's alignment head's rows (Hypothesis.alignment_attention)
    # search state (see model.decoding.search._beam, here for one input)
    step: int = 0
    state: BeamState | None = None  # for this one input (G = 1)
    steps: list[StepRecord] = field(default_factory=list)
    run_source_row: Tensor | None = None
    run_token: Tensor | None = None
    run_logprob: Tensor | None = None
    hypotheses: list[Hypothesis] | None = None
    cancelled: bool = False
    waited: int = 0  # steps spent in the queue
    loop_id: int | None = None  # its id in the compiled decode loop

    @property
    def beams(self) -> int:
        return self.options.beam_size

    @property
    def done(self) -> bool:
        return self.hypotheses is not None or self.cancelled


def _grown(needed: int, have: int, least: int) -> int:
    """A buffer dimension's new size: `have` if it suffices, else at least double it (and at least `least`)."""
    return have if needed <= have else max(needed, 2 * have, least)


class RaggedCache:
    """Decoder K/V for rows at different positions, over sources of different lengths.

    Storage is preallocated and grows (doubling) only when rows, source length or decoding budget
    outgrow it, so joining and leaving copy nothing but the rows that move:
    self-attention K/V (row capacity, h, position capacity, d_k) per layer, row r's next position
    `positions[r]`, `self_mask` hiding every position a row has not reached; cross-attention K/V
    (row capacity, h, source capacity, d_k), `source_mask` hiding each row's padding. The first
    `rows` rows are in use, exposed as views (`cross_key`, `cross_value`, `source_mask`,
    `positions`) cut to the longest source in use; `prepare` sets `self_mask` before each step.
    The mask value is the dtype's lowest: a hidden position's weight is exactly 0, and what it hides
    is always a finite number (zeros, or K/V a row left behind), never garbage.
    """

    def __init__(self, model: Transformer) -> None:
        self.model = model
        self.device = model.final_logits_bias.device
        self._self_key: list[Tensor] = []  # storage, allocated by `_grow`
        self._self_value: list[Tensor] = []
        self._cross_key: list[Tensor] = []
        self._cross_value: list[Tensor] = []
        self._spare: dict[str, list[Tensor]] = {}
        self._source_mask: Tensor | None = None  # (R, 1, 1, S_cap) additive
        self._positions = torch.zeros(0, dtype=torch.long, device=self.device)
        self.clear()

    def clear(self) -> None:
        """No rows (storage is kept)."""
        self._rows = 0
        self._lengths: list[int] = []  # per row in use: its source length (host)
        self.self_mask: Tensor | None = None  # (rows, 1, 1, width) additive, set by `prepare`; None: rows level
        self.width = 0  # positions written by the furthest row + 1, after `prepare`
        self._views()

    @property
    def rows(self) -> int:
        return self._rows

    @property
    def key_buffers(self) -> list[Tensor]:
        """Each layer's self-attention K storage (row capacity, h, position capacity, d_k): what `append` writes."""
        return self._self_key

    @property
    def value_buffers(self) -> list[Tensor]:
        return self._self_value

    def _views(self) -> None:
        """The rows in use, cut to the longest source among them: what a decoding step reads."""
        rows, source = self._rows, max(self._lengths, default=0)
        self.cross_key = [b[:rows, :, :source] for b in self._cross_key]
        self.cross_value = [b[:rows, :, :source] for b in self._cross_value]
        self.source_mask = self._source_mask[:rows, :, :, :source] if self._source_mask is not None else None
        self.positions = self._positions[:rows]

    def _grow(self, rows: int, source: int, capacity: int, dtype: torch.dtype, heads: int, d_k: int) -> None:
        """Make room for `rows` rows, sources of `source` tokens and `capacity` positions (copying what is kept)."""
        have_rows = self._positions.numel()
        have_source = self._cross_key[0].size(2) if self._cross_key else 0
        have_capacity = self._self_key[0].size(2) if self._self_key else 0
        if rows <= have_rows and source <= have_source and capacity <= have_capacity:
            return
        # Every dimension grows geometrically: a request with a longer source or budget than any before would
        # otherwise reallocate (and zero) every buffer and its spare again, which under a mixed load of new
        # lengths took a third of the decode loop's time (py-spy on a replica, bench.continuous's mixed load).
        new_rows = _grown(rows, have_rows, 8)
        new_source = _grown(source, have_source, 16)
        new_capacity = _grown(capacity, have_capacity, 16)
        layers = len(self.model.decoder_layers)
        used = self._rows

        def moved(old: list[Tensor], width: int, length: int) -> list[Tensor]:
            fresh = []
            for i in range(layers):
                buffer = torch.zeros(new_rows, heads, width, d_k, dtype=dtype, device=self.device)
                if old:
                    buffer[:used, :, :length] = old[i][:used, :, :length]
                fresh.append(buffer)
            return fresh

        self._self_key = moved(self._self_key, new_capacity, have_capacity)
        self._self_value = moved(self._self_value, new_capacity, have_capacity)
        self._cross_key = moved(self._cross_key, new_source, have_source)
        self._cross_value = moved(self._cross_value, new_source, have_source)
        mask = torch.full((new_rows, 1, 1, new_source), torch.finfo(dtype).min, dtype=dtype, device=self.device)
        if self._source_mask is not None:
            mask[:used, :, :, :have_source] = self._source_mask[:used]
        self._source_mask = mask
        positions = torch.zeros(new_rows, dtype=torch.long, device=self.device)
        positions[:used] = self._positions[:used]
        self._positions = positions
        self._spare = {}  # spares follow the storage's shapes

    def join(
        self, cross_keys: list[Tensor], cross_values: list[Tensor], source_mask: Tensor, capacity: int,
        lengths: list[int],
    ) -> None:
        """Add rows (their cross K/V per layer (n, h, S', d_k), bool mask (n, S'), source lengths) at position 0."""
        added, heads, source, d_k = cross_keys[0].shape
        self._grow(self._rows + added, source, capacity, cross_keys[0].dtype, heads, d_k)
        new = slice(self._rows, self._rows + added)
        for i, (key, value) in enumerate(zip(cross_keys, cross_values, strict=True)):
            self._cross_key[i][new, :, :source] = key
            self._cross_value[i][new, :, :source] = value
        lowest = torch.finfo(self._source_mask.dtype).min
        self._source_mask[new] = lowest
        hidden = torch.zeros_like(source_mask, dtype=self._source_mask.dtype).masked_fill_(~source_mask, lowest)
        self._source_mask[new, 0, 0, :source] = hidden
        self._positions[new] = 0
        self._rows += added
        self._lengths.extend(lengths)
        self._views()

    def _spares(self, name: str, buffers: list[Tensor]) -> list[Tensor]:
        spares = self._spare.get(name)
        if spares is None:
            # zeros: a position no row has written must hold finite numbers (masked, weight 0)
            spares = self._spare[name] = [torch.zeros_like(b) for b in buffers]
        return spares

    def _gather(self, name: str, buffers: list[Tensor], index: Tensor, length: int) -> None:
        """buffers[i][:m, :, :length] = buffers[i][index, :, :length], through a spare (nothing allocated)."""
        rows = index.numel()
        spares = self._spares(name, buffers)
        for i, buffer in enumerate(buffers):
            torch.index_select(buffer[: self._rows, :, :length], 0, index, out=spares[i][:rows, :, :length])
            buffers[i], spares[i] = spares[i], buffer

    def keep(self, index: Tensor, same_sources: bool = False, moves: Moves | None = None) -> None:
        """Row r becomes old row index[r] (beam reordering; rows of finished requests leave).

        same_sources: every row keeps a row of its own request (no request left), so the cross-attention
        K/V, the source mask and the positions stay as they are and only self-attention K/V move.
        moves: what changed instead, as blocks of rows whose source state (identical across a request's beams)
        moves, (old first row, new first row, rows) each, to below the kept row count from above it; every
        other kept row's source state stays where it is. None: gather every row's.
        """
        if index.numel() == 0:
            self.clear()
            return
        written = self.width
        self._gather("self_key", self._self_key, index, written)
        self._gather("self_value", self._self_value, index, written)
        if same_sources and index.numel() == self._rows:
            pass  # every row stays with its own source: only self-attention K/V moved
        elif moves is not None:
            source = max(self._lengths)
            for old, new, rows in moves:
                for buffer in (*self._cross_key, *self._cross_value):
                    buffer[new : new + rows, :, :source] = buffer[old : old + rows, :, :source]
                self._source_mask[new : new + rows] = self._source_mask[old : old + rows]
                self._positions[new : new + rows] = self._positions[old : old + rows]
                self._lengths[new : new + rows] = self._lengths[old : old + rows]
            self._rows = index.numel()
            del self._lengths[self._rows :]
        else:
            source = max(self._lengths)
            self._gather("cross_key", self._cross_key, index, source)
            self._gather("cross_value", self._cross_value, index, source)
            kept = index.numel()
            self._source_mask[:kept] = self._source_mask[: self._rows].index_select(0, index)
            self._positions[:kept] = self._positions[: self._rows].index_select(0, index)
            order = index.tolist()
            self._lengths = [self._lengths[r] for r in order]
            self._rows = kept
        self._views()

    def prepare(self) -> None:
        """Before a step: the self-attention mask for positions 0..max(positions), and where `append` writes.

        When every row is at the same position (one request alone, or requests that joined together) nothing
        is hidden: no mask, and `append` writes one slice, as the static search's cache does (the same values
        as the masked, indexed path: adding a mask of zeros changes no score)."""
        low, high = torch.stack(torch.aminmax(self.positions)).tolist()  # one read of the device
        self.width = high + 1
        if low == high:
            self.self_mask = None
            return
        reached = torch.arange(self.width, device=self.device)[None, :] <= self.positions[:, None]
        mask = torch.zeros(reached.shape, dtype=self._source_mask.dtype, device=self.device)
        self.self_mask = mask.masked_fill_(~reached, torch.finfo(mask.dtype).min)[:, None, None, :]

    def advance(self) -> None:
        """After a step: every row moves one position on."""
        self._positions[: self._rows] += 1

    def append(self, layer: int, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        """Write one step's K/V (rows, h, 1, d_k) at each row's own position; return K/V up to `width`."""
        rows, width = self._rows, self.width
        if self.self_mask is None:  # every row at position width - 1 (see `prepare`)
            self._self_key[layer][:rows, :, width - 1] = key[:, :, 0]
            self._self_value[layer][:rows, :, width - 1] = value[:, :, 0]
        else:
            index = torch.arange(rows, device=key.device)
            self._self_key[layer][index, :, self.positions] = key[:, :, 0]
            self._self_value[layer][index, :, self.positions] = value[:, :, 0]
        return self._self_key[layer][:rows, :, :width], self._self_value[layer][:rows, :, :width]


def _rows_gathered(
    values: Tensor | None, members: list[tuple[int, DecodeRequest]], flags: list[bool], k: int
) -> Tensor | None:
    """The k rows of each flagged member's (first row, request) from `values`, in order, or None when none is."""
    if values is None or not any(flags):
        return None
    if all(flags) and len(members) * k == values.size(0):
        return values
    index = [first + j for (first, _), flag in zip(members, flags, strict=True) if flag for j in range(k)]
    return values.index_select(0, torch.tensor(index, device=values.device))


def _rows_of(flags: list[bool], k: int) -> list[int]:
    """The rows (k per request, in order) of the requests whose flag is set."""
    return [g * k + j for g, flag in enumerate(flags) if flag for j in range(k)]


class Scheduler:
    """Iteration-level batching over one model: `submit`, then `step()` until the requests are done.

    Not thread-safe: one loop (one thread) calls `submit`, `cancel` and `step`.
    max_rows bounds the rows in flight (a beam of k takes k rows); max_waiting bounds the queue
    behind them, beyond which `submit` raises DecoderBusyError.
    """

    def __init__(
        self,
        model: Transformer,
        max_rows: int = 64,
        max_waiting: int = 1024,
        alignment_head: tuple[int, int | None] | None = None,
        step=None,
    ) -> None:
        if max_rows < 1:
            raise ValueError("max_rows must be at least 1")
        self.model = model
        self.decoder_step = step if step is not None else EagerStep(model)  # model.runtime's compiled or eager step
        self.config = model.config
        self.device = model.final_logits_bias.device
        self.max_rows = max_rows
        self.max_waiting = max_waiting
        self.alignment_head = alignment_head  # (layer, head or None for the average) for `alignment_rows`
        # the compiled decode loop where the step has one, else the ragged cache this module steps from Python
        new_loop = getattr(self.decoder_step, "new_loop", None)
        self.loop = new_loop(alignment_head) if new_loop is not None else None
        rows_cache = getattr(self.decoder_step, "rows_cache", None)  # the graph step's fixed buffers, on a GPU
        self.cache = rows_cache() if rows_cache is not None else RaggedCache(model)
        self.running: list[DecodeRequest] = []  # in row order: request i owns the next `beams` rows
        self._by_loop_id: dict[int, DecodeRequest] = {}
        self.waiting: deque[DecodeRequest] = deque()
        self.last_tokens = torch.zeros(0, dtype=torch.long, device=self.device)

    # ---- the queue ---------------------------------------------------------------------
    def submit(
        self,
        source_ids: list[int],
        options: DecodingOptions | None = None,
        return_attention: bool = False,
        on_token: TokenCallback | None = None,
        alignment_rows: bool = False,
    ) -> DecodeRequest:
        options = options or DecodingOptions()
        if options.beam_size > self.max_rows:
            raise ValueError(f"beam_size {options.beam_size} exceeds the scheduler's {self.max_rows} rows")
        if len(self.waiting) >= self.max_waiting:
            raise DecoderBusyError(f"{len(self.waiting)} requests already wait for the decoder")
        budget = length_budget(len(source_ids), options, self.config.max_position_embeddings)
        if alignment_rows and self.alignment_head is None:
            raise ValueError("alignment_rows needs the scheduler's alignment_head")
        request = DecodeRequest(list(source_ids), options, return_attention, on_token, budget, alignment_rows)
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
        if self.loop is not None:
            return sum(request.beams for request in self.running)
        return self.cache.rows

    @property
    def idle(self) -> bool:
        return not self.running and not self.waiting

    def run(self) -> None:
        """Step until every submitted request is done."""
        while not self.idle:
            self.step()

    # ---- one iteration ---------------------------------------------------------------------
    @torch.inference_mode()
    def step(self) -> list[DecodeRequest]:
        """Admit waiting requests, decode one token for every row, advance every search; return those done."""
        if self.loop is not None:
            return self._step_on_the_loop()
        self._drop_cancelled()
        self._admit()
        if not self.running:
            return []
        full = any(r.return_attention or r.on_token is not None for r in self.running)
        rows_only = any(r.alignment_rows and not r.return_attention for r in self.running)
        logits, cross = self.decoder_step.decode_rows(self.last_tokens, self.cache, full or rows_only)
        attention = torch.stack(cross, dim=1) if full else None  # (N, L, h, S)
        alignment = captured(cross, False, self.alignment_head) if rows_only else None  # (N, S)

        # Requests of one beam size advance together: one set of tensor operations per beam size
        # per step, whatever the number of requests (each one's arithmetic is still its own).
        groups: dict[int, list[tuple[int, DecodeRequest]]] = {}
        firsts: dict[int, int] = {}  # id(request) → its first row at this step
        first = 0
        for request in self.running:
            groups.setdefault(request.beams, []).append((first, request))
            firsts[id(request)] = first
            first += request.beams
        continuing: dict[int, tuple[Tensor, Tensor]] = {}  # id(request) → (its next rows, their tokens)
        finished: list[DecodeRequest] = []
        for k, members in groups.items():
            outcome = self._advance_group(k, members, logits, attention, alignment)
            for (_, request), rows_tokens in zip(members, outcome, strict=True):
                if rows_tokens is None:
                    finished.append(request)
                else:
                    continuing[id(request)] = rows_tokens
        order, moves = self._compacted(finished)
        keep_rows = [continuing[id(request)][0] + firsts[id(request)] for request in order]
        next_tokens = [continuing[id(request)][1] for request in order]
        self.running = order
        tokens = torch.cat(next_tokens) if next_tokens else self.last_tokens[:0]
        self._keep_rows(keep_rows, tokens, same_sources=not finished, moves=moves)
        return finished

    def _step_on_the_loop(self) -> list[DecodeRequest]:
        """`step` on the compiled decode loop: it keeps the rows and every request's search; this hands on the
        streamed tokens and builds the finished requests' hypotheses."""
        for request in self.running:
            if request.cancelled:
                self.loop.cancel(request.loop_id)
                del self._by_loop_id[request.loop_id]
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
        if finished:
            gone = {id(request) for request in finished}
            self.running = [request for request in self.running if id(request) not in gone]
        return finished

    def _join_the_loop(self, joining: list[DecodeRequest], hidden: Tensor, lengths: list[int]) -> None:
        """Requests whose encoder pass is done join the compiled decode loop, each capturing what it needs: every
        head's maps (return_attention), or the alignment head's rows (alignment_rows, or a stream's tokens)."""
        captures = []
        for request in joining:
            if request.return_attention:
                captures.append(CAPTURE["every_head"])
            elif (request.alignment_rows or request.on_token is not None) and self.alignment_head is not None:
                captures.append(CAPTURE["one_head"])
            else:
                captures.append(CAPTURE["nothing"])
        ids = self.loop.join(
            hidden, lengths, [r.beams for r in joining], [r.budget for r in joining],
            [r.options.min_new_tokens for r in joining], [float(r.options.length_penalty) for r in joining],
            captures, [r.on_token is not None for r in joining],
        )
        for request, loop_id in zip(joining, ids, strict=True):
            request.loop_id = loop_id
            self._by_loop_id[loop_id] = request
        self.running.extend(joining)

    def _compacted(self, finished: list[DecodeRequest]) -> tuple[list[DecodeRequest], Moves | None]:
        """The running requests once `finished` leave, in their new row order, and how the rows of each source's
        state (cross-attention K/V, mask, position) move: when every request has the same beam size, the last
        requests take the places the finished ones leave, so only their rows move ((old first row, new first row,
        rows) each) and the others stay put; with mixed beam sizes the order is kept and every row is gathered
        (None)."""
        if not finished:
            return self.running, []
        gone = {id(request) for request in finished}
        kept = [request for request in self.running if id(request) not in gone]
        k = self.running[0].beams
        if any(request.beams != k for request in self.running):
            return kept, None
        count = len(kept)
        order = self.running[:count]
        movers = iter([(count + i, r) for i, r in enumerate(self.running[count:]) if id(r) not in gone])
        moves = []
        for slot, request in enumerate(order):
            if id(request) in gone:
                place, mover = next(movers)
                order[slot] = mover
                moves.append((place * k, slot * k, k))
        return order, moves

    def _keep_rows(
        self, parts: list[Tensor], last_tokens: Tensor, same_sources: bool = False, moves: Moves | None = None
    ) -> None:
        """The rows the next step continues (old row numbers, in order; none empties the cache) and their inputs;
        `moves` as `RaggedCache.keep` takes them."""
        index = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long, device=self.device)
        self.cache.keep(index, same_sources, moves)
        self.last_tokens = last_tokens

    def _drop_cancelled(self) -> None:
        if not any(r.cancelled for r in self.running):
            return
        index, kept, first = [], [], 0
        for request in self.running:
            if not request.cancelled:
                index.append(torch.arange(first, first + request.beams, device=self.device))
                kept.append(request)
            first += request.beams
        self.running = kept
        self._keep_rows(index, self.last_tokens.index_select(0, torch.cat(index)) if index else self.last_tokens[:0])

    def _admission_due(self) -> bool:
        """Whether waiting requests join at this step. An encoder pass for one or two sources costs
        several times its share of one for many, so while the batch is nearly full they join in
        groups: when a quarter of the rows are free, when all that wait fit, or when the oldest has
        waited ADMISSION_WAIT_STEPS steps. With rows to spare a request joins at the next step."""
        if not self.waiting:
            return False
        free = self.max_rows - self.rows
        if free * 4 >= self.max_rows or sum(r.beams for r in self.waiting) <= free:
            return True
        return self.waiting[0].waited >= ADMISSION_WAIT_STEPS

    def _admit(self) -> None:
        """Move waiting requests into the batch while their rows fit: one encoder pass for all of them."""
        for request in self.waiting:
            request.waited += 1
        if not self._admission_due():
            return
        joining: list[DecodeRequest] = []
        rows = self.rows
        while self.waiting and rows + self.waiting[0].beams <= self.max_rows:
            request = self.waiting.popleft()
            joining.append(request)
            rows += request.beams
        if not joining:
            return
        lengths = [len(r.source_ids) for r in joining]
        width = max(lengths)
        padded = torch.full((len(joining), width), self.config.pad_token_id, dtype=torch.long)
        for i, request in enumerate(joining):
            padded[i, : lengths[i]] = torch.tensor(request.source_ids, dtype=torch.long)
        padded = padded.to(self.device)
        mask = torch.arange(width, device=self.device)[None, :] < torch.tensor(lengths, device=self.device)[:, None]
        hidden = self.decoder_step.encode(padded, mask)
        if self.loop is not None:
            self._join_the_loop(joining, hidden, lengths)
            return
        repeat = torch.tensor([r.beams for r in joining], device=self.device)
        keys, values = self.decoder_step.cross_key_values(hidden, repeat)  # each request's on its k rows
        row_lengths = [length for request, length in zip(joining, lengths, strict=True) for _ in range(request.beams)]
        self.cache.join(
            keys, values, mask.repeat_interleave(repeat, dim=0), max(r.budget for r in joining), row_lengths
        )
        start = torch.full((int(repeat.sum()),), self.config.decoder_start_token_id, device=self.device)
        self.last_tokens = torch.cat([self.last_tokens, start])
        for request in joining:
            request.state = BeamState.start(1, request.beams, self.device)
        self.running.extend(joining)

    def _advance_group(
        self,
        k: int,
        members: list[tuple[int, DecodeRequest]],
        logits: Tensor,
        attention: Tensor | None,
        alignment: Tensor | None,
    ) -> list[tuple[Tensor, Tensor] | None]:
        """One step of beam search (`model.decoding.search.beam_step`) for G requests of beam size k, each on its own
        k rows of logits: the static search's step for a batch of G inputs, except that every input is at its
        own step with its own length budget, minimum length and length penalty. Per request: the rows (0..k-1)
        the next step continues and their tokens, or None when it is done.
        """
        config, device = self.config, self.device
        requests = [request for _, request in members]
        if len(members) * k == logits.size(0):  # every row, in order: one beam size runs (the usual case)
            group_logits = logits
        else:
            rows = torch.cat([torch.arange(first, first + k) for first, _ in members]).to(device)  # (G·k,)
            group_logits = logits.index_select(0, rows)
        steps = [request.step for request in requests]
        ending = [request.budget <= step + 1 for request, step in zip(requests, steps, strict=True)]
        banned = [step + 1 < request.options.min_new_tokens for request, step in zip(requests, steps, strict=True)]
        # the static search's constraints, each request's rows under its own step, minimum length and budget
        logprobs = next_logprobs(group_logits, _rows_of(banned, k), _rows_of(ending, k), config)
        # length normalisation per request: the divisor is the static search's float(step + 1) ** penalty
        penalties = [request.options.length_penalty for request in requests]
        divisor = torch.tensor(
            [[float(step + 1) ** penalty] for penalty, step in zip(penalties, steps, strict=True)], device=device
        )
        refs = torch.tensor(steps, device=device)[:, None] * 2 * k + torch.arange(2 * k, device=device)
        state, choice = beam_step(
            BeamState.cat([request.state for request in requests]),
            logprobs,
            torch.tensor(ending, device=device),
            divisor,
            refs,
            config.eos_token_id,
        )
        beam, token, token_logprob, chosen = choice.beam, choice.token, choice.logprob, choice.chosen

        new_rows = beam.gather(1, chosen)  # (G, k)
        tokens = token.gather(1, chosen)
        new_logprobs = token_logprob.gather(1, chosen)
        # the maps the requests keep, only their rows, gathered on the device: they travel with the step's results
        mapped = [attention is not None and (r.return_attention or r.on_token is not None) for _, r in members]
        aligned = [alignment is not None and r.alignment_rows and not r.return_attention for _, r in members]
        maps = _rows_gathered(attention, members, mapped, k)
        rows = _rows_gathered(alignment, members, aligned, k)
        host = to_host([beam, token, token_logprob, new_rows, tokens, new_logprobs, maps, rows, choice.done])
        done = host.pop().tolist()  # one copy per dtype for the whole step, not one per request
        maps = iter(host[6].split(k) if any(mapped) else ())
        rows = iter(host[7].split(k) if any(aligned) else ())
        outcome: list[tuple[Tensor, Tensor] | None] = []
        for g, (_, request) in enumerate(members):
            request_attention = kept = None
            source_length = len(request.source_ids)
            if mapped[g]:
                request_attention = next(maps)[..., :source_length]  # (k, L, h, S)
            if request.return_attention:
                kept = request_attention
            elif aligned[g]:
                kept = next(rows)[:, :source_length]  # (k, S)
            request.steps.append(
                StepRecord(
                    request.run_source_row, request.run_token, request.run_logprob,
                    host[0][g : g + 1], host[1][g : g + 1], host[2][g : g + 1], kept,
                )
            )  # fmt: skip
            request.step += 1
            request.state = state.select(slice(g, g + 1))
            if request.on_token is not None and k == 1:
                request.on_token(
                    request, int(host[1][g, 0]), float(host[2][g, 0]),
                    request_attention[0] if request_attention is not None else None,
                )  # fmt: skip
            if done[g]:
                request.hypotheses = self._hypotheses(request)
                outcome.append(None)
                continue
            request.run_source_row, request.run_token, request.run_logprob = host[3][g], host[4][g], host[5][g]
            outcome.append((new_rows[g], tokens[g]))
        return outcome

    def _hypotheses(self, request: DecodeRequest) -> list[Hypothesis]:
        k = request.beams
        final = (request.state.finished, request.state.finished_done, request.state.finished_ref)
        scores, finished, refs = (t[0].cpu() for t in final)
        hypotheses: list[Hypothesis] = []
        for slot in range(k):
            if not bool(finished[slot]) or len(hypotheses) == request.options.n_best:
                continue
            source_length = len(request.source_ids)
            hypotheses.append(
                backtrack(
                    request.steps, int(refs[slot]), 2 * k, k, float(scores[slot]), source_length,
                    request.return_attention,
                )
            )  # fmt: skip
        request.steps = []  # the back-pointers are no longer needed
        return hypotheses


class DecodeLoop:
    """A `Scheduler` stepping in its own thread: submit from any thread, get a Future per source.

    The loop sleeps while there is nothing to decode and steps while anything runs or waits, so a
    source submitted mid-decode joins at the next step. `close()` stops it; sources still queued or
    running then fail with RuntimeError rather than waiting forever.
    """

    def __init__(
        self,
        model: Transformer,
        max_rows: int = 64,
        max_waiting: int = 1024,
        alignment_head: tuple[int, int | None] | None = None,
        step=None,
    ) -> None:
        self.scheduler = Scheduler(
            model, max_rows=max_rows, max_waiting=max_waiting, alignment_head=alignment_head, step=step
        )
        self._inbox: deque[tuple[str, object]] = deque()
        self._wake = threading.Condition()
        self._futures: dict[int, tuple[DecodeRequest, Future]] = {}
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
    ) -> Future:
        """Queue one source; the Future gives its hypotheses (best first). Raises DecoderBusyError when full."""
        future: Future = Future()
        with self._wake:
            if self._closed:
                raise RuntimeError("the decode loop is closed")
            if len(self.scheduler.waiting) + len(self._inbox) >= self.scheduler.max_waiting:
                raise DecoderBusyError(f"{self.scheduler.max_waiting} sources already wait for the decoder")
            self._inbox.append(
                ("submit", (list(source_ids), options, return_attention, on_token, alignment_rows, future))
            )
            self._wake.notify()
        return future

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

    def _run(self) -> None:
        scheduler = self.scheduler
        while True:
            with self._wake:
                while not self._inbox and scheduler.idle and not self._closed:
                    self._wake.wait()
                if self._closed:
                    break
                inbox, self._inbox = list(self._inbox), deque()
            for kind, payload in inbox:
                if kind == "submit":
                    source_ids, options, return_attention, on_token, alignment_rows, future = payload
                    if not future.set_running_or_notify_cancel():
                        continue
                    try:
                        request = scheduler.submit(source_ids, options, return_attention, on_token, alignment_rows)
                    except Exception as error:  # noqa: BLE001 - the caller's error, delivered to the caller
                        future.set_exception(error)
                        continue
                    self._futures[id(request)] = (request, future)
                else:
                    for key, (request, future) in list(self._futures.items()):
                        if future is payload:
                            scheduler.cancel(request)
                            del self._futures[key]
            try:
                finished = scheduler.step()
            except Exception as error:  # noqa: BLE001 - fail every source in flight, keep the loop alive
                for request, future in self._futures.values():
                    scheduler.cancel(request)
                    future.set_exception(error)
                self._futures.clear()
                scheduler.step()  # drops the cancelled rows
                continue
            for request in finished:
                _, future = self._futures.pop(id(request))
                future.set_result(request.hypotheses)
        for _, future in self._futures.values():
            future.set_exception(RuntimeError("the decode loop closed before this source was decoded"))
