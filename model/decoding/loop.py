"""The decode loop in Python, for the steps without a compiled one: the lecture model's eager step (a CPU where the
runtime does not build, TRANSLATE_RUNTIME=eager) and, on a GPU, the same step replayed as CUDA graphs.

`Loop` keeps the contract of the compiled loop (model/runtime/csrc/decoding.h's Loop): requests `join` with their
encoder's hidden states, each `step` decodes one token for every row and hands out the streamed tokens and the
requests that are done, `cancel` frees a request's rows at the next step. A static batch is the case where every
request joins before the first step; the continuous scheduler joins them as they arrive. `new_loop(step)` gives the
compiled loop where the step has one, else this one: the search (model/decoding/search.py) and the scheduler run on
whichever it is, and nothing else decodes.

Each request runs `model.decoding.search.beam_step` (greedy is one beam) on its own k rows, at its own step, with
its own length budget, minimum length, length penalty and capture; requests of one beam size step together, one set
of tensor operations per beam size per step. Its rows read only their own positions and their own source (the cache
masks the rest with weight exactly 0), so its ids, scores and attention are what it gets decoded alone, up to float
summation order. The rows live in one KV cache of model.runtime.rows: `RaggedCache` or, on the graph step, the fixed
buffers of graphs.StaticRows (`step.rows_cache()`).

Host reads: one copy per step (model.host.packed_to_host), which brings the step's choices, the finished slots and
the attention rows the requests keep; the bookkeeping (back-pointers, streaming, hypotheses) is Python over those.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from model.decoding.beam import BeamState, beam_step, captured, next_logprobs
from model.host import packed_to_host
from model.runtime import CAPTURE
from model.runtime.rows import Moves, RaggedCache
from model.transformer import Transformer

EVERY_HEAD, ONE_HEAD, NOTHING = CAPTURE["every_head"], CAPTURE["one_head"], CAPTURE["nothing"]
host_reads = 0  # device → host copies made by the loop (one per step), for tests and benchmarks
SEARCH_PARTS = 10  # the tensors `Loop._search` returns per beam size, in the order `Loop.step` reads them

# A streamed token: (request id, its position in the output, token, log-probability, its attention row or None).
Token = tuple[int, int, int, float, Tensor | None]
# A finished hypothesis: (tokens, log-probabilities, normalised score, attention (T, L, h, S) or (T, S), or None).
Found = tuple[list[int], list[float], float, Tensor | None]


def new_loop(step, alignment_head: tuple[int, int | None] | None = None):
    """The decode loop for `step`: its compiled one (CompiledStep.new_loop), else `Loop` over it. alignment_head
    (layer, head or None for the layer's average): the rows a request capturing one head keeps."""
    if getattr(step, "new_loop", None) is not None:
        return step.new_loop(alignment_head)
    return Loop(step, alignment_head)


def capture_code(every_head: bool, head_rows: bool) -> int:
    """What a request's rows keep (model.runtime.CAPTURE): every head's maps (a client asked for the attention), else
    the alignment head's rows (an alignment or a stream needs them, and the model has an alignment head), else
    nothing. The one place the search and the scheduler choose it."""
    return EVERY_HEAD if every_head else ONE_HEAD if head_rows else NOTHING


def to_host(tensors: list[Tensor | None]) -> list[Tensor | None]:
    """The CPU copies of a step's device tensors in one transfer (model.host.packed_to_host), counted in
    `host_reads`."""
    global host_reads
    out, transfers = packed_to_host(tensors)
    host_reads += transfers
    return out


@dataclass(eq=False)
class _Record:
    """One step of the requests of one beam size k, on the host: per member, its 2k candidates (the beam each
    extends, its token and log-probability) and the k the running beams continue with; the attention rows its
    capturing members keep (every head's, one head's), k per member in member order."""

    beam: list[list[int]]
    token: list[list[int]]
    logprob: list[list[float]]
    chosen: list[list[int]]
    every_head: Tensor | None  # (rows, L, h, S)
    one_head: Tensor | None  # (rows, S)


@dataclass(eq=False)
class _Request:
    id: int
    k: int
    budget: int
    min_new_tokens: int
    length_penalty: float
    capture: int
    stream: bool
    length: int
    step: int = 0  # tokens decoded so far
    emitted: int = 0  # tokens streamed so far
    cancelled: bool = False
    slot: int = 0  # its row in its beam size's search state
    # per step: (that step's record, its member index there, its first attention row there or -1)
    records: list[tuple[_Record, int, int]] = field(default_factory=list)


@dataclass
class _Path:
    tokens: list[int]
    logprobs: list[float]
    attention: list[Tensor]


class Loop:
    """The compiled decode loop's contract (join, step, cancel, rows, len) over a step driven from Python
    (`decode_rows`: the eager step, or the graph step on its fixed buffers). Not thread-safe: one thread drives it."""

    def __init__(self, step, alignment_head: tuple[int, int | None] | None = None) -> None:
        self.decoder_step = step
        model: Transformer = step.model
        self.config = model.config
        self.device = model.final_logits_bias.device
        self.head = alignment_head if alignment_head is not None else (0, 0)
        rows_cache = getattr(step, "rows_cache", None)  # the graph step's fixed buffers
        self.cache = rows_cache() if rows_cache is not None else RaggedCache(model)
        self.requests: list[_Request] = []  # in row order: request i owns the next k rows
        self.states: dict[int, BeamState] = {}  # per beam size: its requests' search state, row `slot` each
        self.last_tokens = torch.zeros(0, dtype=torch.long, device=self.device)
        self._next_id = 0

    def __len__(self) -> int:
        return len(self.requests)

    def rows(self) -> int:
        return sum(request.k for request in self.requests if not request.cancelled)

    def cancel(self, id: int) -> None:
        """Stop decoding a request: its rows leave at the next step."""
        for request in self.requests:
            if request.id == id:
                request.cancelled = True

    @torch.inference_mode()
    def join(
        self, hidden: Tensor, lengths: list[int], beams: list[int], budgets: list[int], min_new_tokens: list[int],
        length_penalties: list[float], captures: list[int], streams: list[bool],
    ) -> list[int]:
        """Sources whose encoder pass is done (hidden (n, S, d_model), right-padded) join, each with its source
        length, beam size, length budget, minimum new tokens, length penalty, capture (model.runtime.CAPTURE) and
        whether its tokens are streamed; they decode from the next step. Returns their ids."""
        count, width = hidden.size(0), hidden.size(1)
        settings = (lengths, beams, budgets, min_new_tokens, length_penalties, captures, streams)
        if any(len(values) != count for values in settings):
            raise ValueError("one length, beam size, budget, minimum, penalty, capture and stream flag per source")
        for length, beam, budget in zip(lengths, beams, budgets, strict=True):
            if beam < 1 or budget < 1 or not 1 <= length <= width:
                raise ValueError("a bad request")
            if budget > self.config.max_position_embeddings:
                raise ValueError("a budget past the model's positions")
        repeat = torch.tensor(beams, device=self.device)
        keys, values = self.decoder_step.cross_key_values(hidden, repeat)  # each source's on its k rows
        mask = torch.arange(width, device=self.device)[None, :] < torch.tensor(lengths, device=self.device)[:, None]
        row_lengths = [length for length, beam in zip(lengths, beams, strict=True) for _ in range(beam)]
        self.cache.join(keys, values, mask.repeat_interleave(repeat, dim=0), max(budgets), row_lengths)
        start = torch.full((sum(beams),), self.config.decoder_start_token_id, device=self.device)
        self.last_tokens = torch.cat([self.last_tokens, start])
        ids = []
        for i in range(count):
            k = beams[i]
            request = _Request(self._next_id, k, budgets[i], min_new_tokens[i], float(length_penalties[i]),
                               captures[i], bool(streams[i]), lengths[i])
            held = self.states.get(k)
            request.slot = 0 if held is None else held.running.size(0)
            start_state = BeamState.start(1, k, self.device)
            self.states[k] = start_state if held is None else BeamState.cat([held, start_state])
            self._next_id += 1
            self.requests.append(request)
            ids.append(request.id)
        return ids

    @torch.inference_mode()
    def step(self) -> tuple[list[Token], list[tuple[int, list[Found]]]]:
        """One token for every row: the streamed tokens of this step, and the requests that are done with their
        hypotheses (finished slots in order: best first)."""
        self._drop_cancelled()
        if not self.requests:
            return [], []
        every = any(r.capture == EVERY_HEAD for r in self.requests)
        one = any(r.capture == ONE_HEAD for r in self.requests)
        logits, cross = self.decoder_step.decode_rows(self.last_tokens, self.cache, every or one)
        all_heads = torch.stack(cross, dim=1) if every else None  # (N, L, h, S)
        head_rows = captured(cross, False, self.head) if one else None  # (N, S)

        firsts, first = [], 0
        groups: dict[int, list[int]] = {}  # beam size → its requests (indices into self.requests), in row order
        for index, request in enumerate(self.requests):
            firsts.append(first)
            first += request.k
            groups.setdefault(request.k, []).append(index)
        parts: list[Tensor | None] = []
        for k, members in groups.items():
            parts += self._search(k, members, firsts, logits, all_heads, head_rows)
        host = to_host(parts)  # the step's choices, finished slots and kept maps: one copy

        tokens: list[Token] = []
        finished: list[tuple[int, list[Found]]] = []
        continuing: dict[int, tuple[list[int], list[int]]] = {}  # request id → its next rows (its own 0..k-1), tokens
        for at, (k, members) in zip(range(0, len(parts), SEARCH_PARTS), groups.items(), strict=True):
            parts_of_k = host[at : at + SEARCH_PARTS]
            beam, token, logprob, chosen, done, score, slot_done, ref, every_maps, one_maps = parts_of_k
            record = _Record(beam.tolist(), token.tolist(), logprob.tolist(), chosen.tolist(), every_maps, one_maps)
            done, score, slot_done, ref = done.tolist(), score.tolist(), slot_done.tolist(), ref.tolist()
            every_at = one_at = 0
            for g, index in enumerate(members):
                request = self.requests[index]
                offset = -1
                if request.capture == EVERY_HEAD:
                    offset, every_at = every_at, every_at + k
                elif request.capture == ONE_HEAD:
                    offset, one_at = one_at, one_at + k
                request.records.append((record, g, offset))
                request.step += 1
                slots = [(score[g][s], ref[g][s]) for s in range(k) if slot_done[g][s]]
                if request.stream:
                    self._settle(request, bool(done[g]), slots, record.chosen[g], tokens)
                if done[g]:
                    found = []
                    for normalized, reference in slots:
                        path = self._trace(request, *divmod(reference, 2 * k))
                        attention = torch.stack(path.attention) if path.attention else None
                        found.append((path.tokens, path.logprobs, normalized, attention))
                    finished.append((request.id, found))
                else:
                    picks = record.chosen[g]
                    continuing[request.id] = ([record.beam[g][c] for c in picks], [record.token[g][c] for c in picks])
        self._keep(firsts, continuing)
        return tokens, finished

    def _search(
        self, k: int, members: list[int], firsts: list[int], logits: Tensor, all_heads: Tensor | None,
        head_rows: Tensor | None,
    ) -> list[Tensor | None]:
        """`beam_step` for the requests `members` of beam size k on their rows of `logits`, each at its own step
        under its own budget, minimum length and length penalty; keeps the new state and returns what the host
        reads of it (see `step`), still on the device."""
        requests = [self.requests[i] for i in members]
        config, device = self.config, self.device
        if len(members) * k == logits.size(0):  # every row, in order: one beam size runs (the usual case)
            group_logits = logits
        else:
            rows = torch.tensor([firsts[i] + j for i in members for j in range(k)], device=device)
            group_logits = logits.index_select(0, rows)
        banned = [g * k + j for g, r in enumerate(requests) if r.step + 1 < r.min_new_tokens for j in range(k)]
        ending_flags = [r.budget <= r.step + 1 for r in requests]
        ending = [g * k + j for g, flag in enumerate(ending_flags) if flag for j in range(k)]
        logprobs = next_logprobs(group_logits, banned, ending, config)
        # length normalisation per request: float(step + 1) ** its penalty; finished refs: its step · 2k + candidate
        divisor = torch.tensor([[float(r.step + 1) ** r.length_penalty] for r in requests], device=device)
        refs = torch.tensor([r.step * 2 * k for r in requests], device=device)[:, None] + torch.arange(
            2 * k, device=device)
        state = self.states[k]
        order = [r.slot for r in requests]
        if order != list(range(state.running.size(0))):
            state = state.select(torch.tensor(order, device=device))
        state, choice = beam_step(state, logprobs, torch.tensor(ending_flags, device=device), divisor, refs,
                                  config.eos_token_id)
        self.states[k] = state
        for g, request in enumerate(requests):
            request.slot = g
        maps = []
        for kind, source in ((EVERY_HEAD, all_heads), (ONE_HEAD, head_rows)):
            index = [firsts[i] + j for i, r in zip(members, requests, strict=True) if r.capture == kind
                     for j in range(k)]
            maps.append(source.index_select(0, torch.tensor(index, device=device)) if index else None)
        return [choice.beam, choice.token, choice.logprob, choice.chosen, choice.done, state.finished,
                state.finished_done, state.finished_ref, *maps]

    def _trace(self, request: _Request, step: int, candidate: int, first: int = 0) -> _Path:
        """The path that candidate `candidate` of the request's step `step` ends, back to its token at position
        `first` (0: its first token), with the attention rows that produced each token where the request keeps
        them (cut to its source)."""
        tokens, logprobs, attention = [], [], []
        while step >= first:
            record, g, offset = request.records[step]
            beam = record.beam[g][candidate]
            tokens.append(record.token[g][candidate])
            logprobs.append(record.logprob[g][candidate])
            if offset >= 0:
                maps = record.every_head if request.capture == EVERY_HEAD else record.one_head
                attention.append(maps[offset + beam, ..., : request.length])
            step -= 1
            if step >= first:
                previous, previous_g, _ = request.records[step]
                candidate = previous.chosen[previous_g][beam]  # the candidate running beam `beam` continued
        tokens.reverse()
        logprobs.reverse()
        attention.reverse()
        return _Path(tokens, logprobs, attention)

    def _settle(
        self, request: _Request, done: bool, slots: list[tuple[float, int]], chosen: list[int], tokens: list[Token]
    ) -> None:
        """Hand out the tokens of a streamed request that no later step can take back, from the first not handed
        out yet: the prefix its running beams and its finished hypotheses share (greedy: each token as it comes),
        and, once it is done, the rest of its best hypothesis (csrc/decoding.h's `settled`). Every path already
        shares the tokens handed out, so each is traced back only to the first one not handed out: a step costs
        the unsettled stretch, not the whole length."""
        k, start = request.k, request.emitted
        paths = [self._trace(request, *divmod(reference, 2 * k), start) for _, reference in slots]  # best first
        if done:
            if not paths:
                return
            paths = paths[:1]  # the answer
        else:
            paths += [self._trace(request, request.step - 1, candidate, start) for candidate in chosen]
        first = paths[0]
        shared = len(first.tokens)
        for path in paths[1:]:
            same, limit = 0, min(shared, len(path.tokens))
            while same < limit and path.tokens[same] == first.tokens[same]:
                same += 1
            shared = same
        for i in range(shared):
            attention = first.attention[i] if i < len(first.attention) else None
            tokens.append((request.id, start + i, first.tokens[i], first.logprobs[i], attention))
        request.emitted = start + shared

    def _keep(self, firsts: list[int], continuing: dict[int, tuple[list[int], list[int]]]) -> None:
        """After a step: the rows the next step continues, each request's beams on its own rows (reordered), and
        the requests that are done gone. With one beam size the last requests take the places the finished ones
        leave, so only their rows' source state moves; with mixed sizes the order is kept and every row gathered."""
        place = {request.id: firsts[index] for index, request in enumerate(self.requests)}
        kept = [request for request in self.requests if request.id in continuing]
        moves: Moves | None = None
        same_sources = len(kept) == len(self.requests)  # nobody left: only self-attention K/V move
        if same_sources:
            order = kept
        elif any(request.k != self.requests[0].k for request in self.requests):
            order, moves = kept, None
        else:
            k, count = self.requests[0].k, len(kept)
            order, moves = self.requests[:count], []
            movers = iter([(count + i, r) for i, r in enumerate(self.requests[count:]) if r.id in continuing])
            for position, request in enumerate(order):
                if request.id not in continuing:
                    was, mover = next(movers)
                    order[position] = mover
                    moves.append((was * k, position * k, k))
        index = [place[request.id] + row for request in order for row in continuing[request.id][0]]
        next_tokens = [token for request in order for token in continuing[request.id][1]]
        self.cache.keep(torch.tensor(index, dtype=torch.long, device=self.device), same_sources, moves)
        self.last_tokens = torch.tensor(next_tokens, dtype=torch.long, device=self.device)
        self.requests = order
        self._forget_idle_beam_sizes()

    def _drop_cancelled(self) -> None:
        if not any(request.cancelled for request in self.requests):
            return
        index, kept, first = [], [], 0
        for request in self.requests:
            if not request.cancelled:
                index += range(first, first + request.k)
                kept.append(request)
            first += request.k
        rows = torch.tensor(index, dtype=torch.long, device=self.device)
        self.cache.keep(rows)
        self.last_tokens = self.last_tokens.index_select(0, rows)
        self.requests = kept
        self._forget_idle_beam_sizes()

    def _forget_idle_beam_sizes(self) -> None:
        """The search state of a beam size no running request has."""
        for k in [k for k in self.states if not any(request.k == k for request in self.requests)]:
            del self.states[k]
