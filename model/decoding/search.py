"""Batched beam search (greedy is beam_size=1) over the KV cache, with attention capture.

Semantics follow transformers' `generate(num_beams=k, early_stopping=True, length_penalty=lp)`:
at each step the 2k best continuations over all beams of an input are ranked; an
end-of-sequence continuation among the first k becomes a finished hypothesis scored
sum_logprobs / generated_length**lp; an input is done when it holds k finished
hypotheses, when no running beam can beat them, or when it reaches its length limit.
With k=1 this is exactly greedy decoding. The pad token is never generated; a
hypothesis that reaches its length budget is closed with a forced </s> (log-probability 0),
as transformers does for Marian's forced_eos_token_id.

Done inputs leave the batch (their cache rows are dropped), so they stop costing
compute. Per step we record which row each running beam came from; hypotheses are
rebuilt at the end by walking those back-pointers, which also yields the cross-attention
along the chosen path.

Host reads. On a GPU every read of a device tensor on the host (`.tolist()`, `.cpu()`) waits
for the device to finish its queue. The search keeps its state on the device, reads only
which inputs are done, once every `check_every` steps (1 on the CPU, where a read costs
nothing and a finished row leaves at once; CHECK_EVERY_GPU on a GPU, where finished rows
run a few extra steps instead), and copies tokens, scores and attention back once per
batch. `host_reads` counts the reads (tests and bench/gpu/check.py measure them).
Attention is captured in full (every layer and head) only when asked; otherwise only the
alignment head's rows, which the alignments need, and those stay on the device until the end.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from model.host import copy_to_host
from model.options import DecodingOptions
from model.runtime import CAPTURE, EagerStep
from model.topk import row_topk
from model.transformer import EncoderOutput, Transformer

NEG_INF = -1.0e9
CHECK_EVERY_GPU = 8  # decoding steps between reads of which inputs are done, on a GPU

host_reads = 0  # device → host reads made by the search (one per `_read`), for tests and benchmarks


def _read(tensor: Tensor) -> list:
    """The host's copy of a small device tensor as a list: the one way the search reads state back per step."""
    global host_reads
    host_reads += 1
    return tensor.tolist()


def to_host(tensors: list[Tensor | None]) -> list[Tensor | None]:
    """Copy many device tensors to the CPU with one transfer per dtype (model.host), counted in `host_reads`."""
    global host_reads
    out, transfers = copy_to_host(tensors)
    host_reads += transfers
    return out


def default_check_every(device: torch.device) -> int:
    return 1 if device.type == "cpu" else CHECK_EVERY_GPU


@dataclass
class Hypothesis:
    """One finished translation of one input."""

    token_ids: list[int]  # generated ids, without the start token, with the final eos if produced
    score: float  # sum of token log-probabilities
    token_logprobs: list[float]
    cross_attention: Tensor | None  # (decoder_layers, heads, len(token_ids), source_length) or None
    normalized_score: float  # score / len**length_penalty, the beam ranking key
    alignment_attention: Tensor | None = None  # (len(token_ids), source_length): the alignment head's rows


def default_max_new_tokens(source_length: int, limit: int) -> int:
    """A generous length budget relative to the source: 2 × source + 10, within the model's positions."""
    return max(1, min(limit, 2 * source_length + 10))


def length_budget(source_length: int, options: DecodingOptions, limit: int) -> int:
    """New tokens a source may get: options.max_new_tokens, else the default budget raised to min_new_tokens (a
    translation asked to run that long may); within `limit` positions."""
    if options.max_new_tokens is None:
        return min(limit, max(default_max_new_tokens(source_length, limit), options.min_new_tokens))
    return min(options.max_new_tokens, limit)


@dataclass
class StepRecord:
    """What one decoding step leaves behind for back-tracking (all on CPU unless noted)."""

    run_source_row: Tensor | None  # (N,) row at the previous step each running row came from
    run_token: Tensor | None  # (N,) token appended to make this row
    run_logprob: Tensor | None  # (N,)
    candidate_row: Tensor  # (A, 2k) row this step each candidate extends
    candidate_token: Tensor  # (A, 2k)
    candidate_logprob: Tensor  # (A, 2k) log-probability of the candidate token alone
    attention: Tensor | None  # (N, L, h, S) cross-attention rows used at this step, or (N, S) one head's


def captured(cross: list[Tensor] | None, full: bool, head: tuple[int, int | None] | None) -> Tensor | None:
    """What a step keeps of its cross-attention (per layer (N, h, S)): all of it (N, L, h, S) when
    `full`, else the alignment head's rows (N, S) (`head` = (layer, head or None for the layer's
    head average)), else nothing."""
    if cross is None:
        return None
    if full:
        return torch.stack(cross, dim=1)
    layer, index = head
    return cross[layer].mean(dim=1) if index is None else cross[layer][:, index]


@torch.inference_mode()
def beam_search(
    model: Transformer,
    source_ids: list[list[int]],
    options: DecodingOptions | None = None,
    return_attention: bool = False,
    alignment_head: tuple[int, int | None] | None = None,
    check_every: int | None = None,
    step=None,
) -> list[list[Hypothesis]]:
    """Decode every source (ids ending in eos) and return its best hypotheses, best first.

    min_new_tokens bans eos before that many tokens (transformers' min_new_tokens); the length budget still
    ends every hypothesis with eos. return_attention: each hypothesis carries every layer's and head's
    cross-attention; alignment_head (layer, head or None): it carries that head's rows
    (`alignment_attention`), all an alignment needs. check_every: steps between reads of which
    inputs are done (None: 1 on the CPU, CHECK_EVERY_GPU on a GPU); the output is the same. step: what runs each
    decoding step (model.runtime.load_step's compiled or eager step; None: the model's own, EagerStep).
    """
    options = options or DecodingOptions()
    config = model.config
    device = model.final_logits_bias.device
    batch = len(source_ids)
    lengths = [len(ids) for ids in source_ids]
    budgets = [length_budget(n, options, config.max_position_embeddings) for n in lengths]

    # Encoder once for the whole batch, right-padded.
    width = max(lengths)
    padded = torch.full((batch, width), config.pad_token_id, dtype=torch.long)
    for i, ids in enumerate(source_ids):
        padded[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
    padded = padded.to(device)
    mask = torch.arange(width, device=device)[None, :] < torch.tensor(lengths, device=device)[:, None]  # (B, S)
    step = step if step is not None else EagerStep(model)
    encoder = EncoderOutput(step.encode(padded, mask), mask)
    capture = _Capture(return_attention, alignment_head, check_every or default_check_every(device))
    if step.new_loop is not None and capture.check_every == 1:  # the compiled decode loop, every source joining now
        return _on_the_loop(step, encoder.hidden, lengths, budgets, options, capture)
    if options.beam_size == 1:
        return _greedy(model, step, encoder, lengths, budgets, options, capture)
    return _beam(model, step, encoder, lengths, budgets, options, capture)


@dataclass(frozen=True)
class _Capture:
    full: bool  # every layer's and head's cross-attention
    head: tuple[int, int | None] | None  # else this head's rows (layer, head or None for the average)
    check_every: int

    @property
    def wanted(self) -> bool:
        return self.full or self.head is not None

    def codes(self) -> tuple[int, int, int]:
        """(what, layer, head) as the compiled search takes them: what a model.runtime CAPTURE code (head -1: the
        layer's head average)."""
        if self.full:
            return CAPTURE["every_head"], 0, 0
        if self.head is None:
            return CAPTURE["nothing"], 0, 0
        layer, head = self.head
        return CAPTURE["one_head"], layer, -1 if head is None else head

    def keep(self, cross: list[Tensor] | None) -> Tensor | None:
        return captured(cross, self.full, self.head) if self.wanted else None

    def hypothesis(self, rows: Tensor | None, source_length: int) -> tuple[Tensor | None, Tensor | None]:
        """(cross_attention, alignment_attention) from one hypothesis's rows stacked per step:
        (T, L, h, S) or (T, S) → (L, h, T, S) or (T, S), cut to the source length."""
        if rows is None:
            return None, None
        if self.full:
            return rows.permute(1, 2, 0, 3)[..., :source_length].contiguous(), None
        return None, rows[..., :source_length].float().contiguous()


def next_logprobs(logits: Tensor, banned: list[int], ending: list[int], config) -> Tensor:
    """Log-probabilities (N, V) of the next token, with the constraints transformers applies.

    Normalised over the full vocabulary, then pad is banned; rows in `banned` have not reached
    min_new_tokens and may not end (eos banned); rows in `ending` reach their budget and are
    forced to eos (log-prob 0).
    """
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    logprobs[:, config.pad_token_id] = float("-inf")
    if banned:
        logprobs[_rows(banned, logprobs.size(0)), config.eos_token_id] = float("-inf")
    if ending:
        rows = _rows(ending, logprobs.size(0))
        logprobs[rows] = float("-inf")
        logprobs[rows, config.eos_token_id] = 0.0
    return logprobs


def _rows(rows: list[int], count: int) -> list[int] | slice:
    """Row indices as an index: a slice when they are all `count` rows (in order)."""
    return rows if len(rows) < count else slice(None)


def _too_early(step: int, min_new_tokens: int, rows: int) -> list[int]:
    """The rows whose eos is banned at `step`: all of them before min_new_tokens, else none."""
    return list(range(rows)) if step + 1 < min_new_tokens else []


@dataclass
class BeamState:
    """The search state of G inputs of beam size k, kept on the device between steps."""

    running: Tensor  # (G, k) summed log-probability of each running beam
    finished: Tensor  # (G, k) length-normalised scores of the best finished hypotheses so far
    finished_done: Tensor  # (G, k) which finished slots hold a hypothesis
    finished_ref: Tensor  # (G, k) the candidate each came from (a reference `backtrack` reads)
    improvable: Tensor  # (G,) whether a running beam could still beat the worst finished one

    @classmethod
    def start(cls, count: int, k: int, device: torch.device) -> BeamState:
        running = torch.full((count, k), NEG_INF, device=device)
        running[:, 0] = 0.0  # the k beams start as one: only the first may be extended at step 0
        return cls(
            running,
            torch.full((count, k), NEG_INF, device=device),
            torch.zeros((count, k), dtype=torch.bool, device=device),
            torch.full((count, k), -1, dtype=torch.long, device=device),
            torch.ones(count, dtype=torch.bool, device=device),
        )

    def select(self, index: Tensor | slice) -> BeamState:
        """The state of the inputs `index` picks (in its order)."""
        fields = (self.running, self.finished, self.finished_done, self.finished_ref, self.improvable)
        return BeamState(*(tensor[index] for tensor in fields))

    @classmethod
    def cat(cls, states: list[BeamState]) -> BeamState:
        """Several inputs' states as one, in order."""
        names = ("running", "finished", "finished_done", "finished_ref", "improvable")
        return cls(*(torch.cat([getattr(state, name) for state in states]) for name in names))


@dataclass
class BeamChoice:
    """What one step chose for G inputs: 2k candidates each, and the k of them that continue."""

    beam: Tensor  # (G, 2k) the beam (0..k-1) each candidate extends
    token: Tensor  # (G, 2k) its token
    logprob: Tensor  # (G, 2k) that token's own log-probability
    chosen: Tensor  # (G, k) the candidates (indices into the 2k) the running beams continue with
    done: Tensor  # (G,) inputs whose finished hypotheses are final


def beam_step(
    state: BeamState,
    logprobs: Tensor,
    ending: Tensor,
    divisor: Tensor | float,
    refs: Tensor,
    eos_token_id: int,
    frozen: Tensor | None = None,
) -> tuple[BeamState, BeamChoice]:
    """One step of beam search for G inputs of beam size k, each on its own k rows of `logprobs` (G·k, V).

    The 2k best continuations over an input's beams are ranked; the k best that do not end run on; an
    ending one (eos, or every candidate of an input in `ending`, at its length budget) among the first k
    becomes a finished hypothesis scored by its summed log-probability over `divisor`
    (generated length ** length penalty: a float, or (G, 1) per input). `refs` (G, 2k) name each
    candidate for back-tracking. `frozen` inputs (done, not yet removed) take no more hypotheses.
    The static search (`_beam`) and the continuous scheduler both step through here.
    """
    count, k = state.running.shape
    device = logprobs.device
    # The 2k best of running[beam] + logprobs[beam, token] over every beam and token are among each beam's own
    # 2k best tokens (the running score is one offset per beam), so rank those k·2k instead of k·V.
    row_logprob, row_token = row_topk(logprobs, 2 * k)  # (G·k, 2k) each
    total = (row_logprob.view(count, k, 2 * k) + state.running[:, :, None]).view(count, 2 * k * k)
    top_scores, pick = torch.topk(total, 2 * k, dim=1)  # (G, 2k)
    beam = pick // (2 * k)
    token = row_token.view(count, 2 * k * k).gather(1, pick)
    token_logprob = row_logprob.view(count, 2 * k * k).gather(1, pick)
    hits = (token == eos_token_id) | ending[:, None]  # (G, 2k)

    # Running beams for the next step: the k best candidates that did not end.
    next_scores, chosen = torch.topk(top_scores + hits.float() * NEG_INF, k, dim=1)

    # Finished hypotheses: ending candidates among the first k, length-normalised.
    first_k = torch.arange(2 * k, device=device) < k
    taking = hits & first_k if frozen is None else hits & first_k & ~frozen[:, None]
    eligible = taking & (state.improvable & ~state.finished_done.all(dim=1))[:, None]
    candidate = torch.where(eligible, top_scores / divisor, top_scores + 2 * NEG_INF)
    merged_scores = torch.cat([state.finished, candidate], dim=1)
    merged_done = torch.cat([state.finished_done, taking], dim=1)
    merged_ref = torch.cat([state.finished_ref, refs], dim=1)
    finished, keep = torch.topk(merged_scores, k, dim=1)
    finished_done = merged_done.gather(1, keep)
    finished_ref = merged_ref.gather(1, keep)

    # Could the best running beam still beat the worst finished one?
    best_possible = next_scores[:, :1] / divisor
    worst_finished = torch.where(finished_done, finished.min(dim=1, keepdim=True).values, NEG_INF)
    improvable = state.improvable & (best_possible > worst_finished).any(dim=1)
    done = ~improvable | finished_done.all(dim=1) | hits.all(dim=1)
    if frozen is not None:
        done = done | frozen
    new_state = BeamState(next_scores, finished, finished_done, finished_ref, improvable)
    return new_state, BeamChoice(beam, token, token_logprob, chosen, done)


def _on_the_loop(step, hidden: Tensor, lengths: list[int], budgets: list[int], options: DecodingOptions,
                 capture: _Capture) -> list[list[Hypothesis]]:
    """The search on the compiled decode loop (model/runtime/csrc/decoding.h): every source joins before the first
    step and leaves when done; each runs this module's beam step (greedy: one beam) on its own rows."""
    loop = step.new_loop(capture.head)
    count = len(lengths)
    what = capture.codes()[0]
    ids = loop.join(
        hidden, lengths, [options.beam_size] * count, budgets, [options.min_new_tokens] * count,
        [float(options.length_penalty)] * count, [what] * count, [False] * count,
    )
    found: dict[int, list] = {}
    while len(loop):
        _, done = loop.step()
        found.update(done)
    return [loop_hypotheses(found[i], options.n_best, capture.full) for i in ids]


def loop_hypotheses(found: list, n_best: int, full: bool) -> list[Hypothesis]:
    """Hypotheses from what the decode loop gives a finished request ((tokens, log-probabilities, normalised score,
    attention) per finished slot, best first): the first n_best; attention (T, L, h, S) every head's (`full`) →
    cross_attention (L, h, T, S), or one head's rows (T, S) → alignment_attention."""
    hypotheses = []
    for tokens, logprobs, normalized, attention in found[:n_best]:
        cross_attention = alignment_attention = None
        if attention is not None:
            if full:
                cross_attention = attention.permute(1, 2, 0, 3).contiguous()
            else:
                alignment_attention = attention.float().contiguous()
        hypotheses.append(
            Hypothesis(list(tokens), sum(logprobs), list(logprobs), cross_attention, normalized, alignment_attention)
        )
    return hypotheses


def _greedy(
    model: Transformer,
    step,
    encoder,
    lengths: list[int],
    budgets: list[int],
    options: DecodingOptions,
    capture: _Capture,
) -> list[list[Hypothesis]]:
    """Beam search with k=1, without the beam bookkeeping: argmax per row, finished rows leave the batch.

    Tokens and scores are written into device buffers; which rows finished is read every
    `capture.check_every` steps (a finished row keeps decoding until then; its extra tokens are
    cut off), and everything comes to the host once at the end.
    """
    config = model.config
    length_penalty, min_new_tokens = options.length_penalty, options.min_new_tokens
    device = encoder.hidden.device
    batch, width = len(lengths), max(budgets)
    decode = step.decode_step
    cache = step.start_cache(encoder, capacity=width)
    active = list(range(batch))  # input index of each row (host)
    rows_of = torch.arange(batch, device=device)  # the same on the device
    out_tokens = torch.full((batch, width), config.pad_token_id, dtype=torch.long, device=device)
    out_logprobs = torch.zeros((batch, width), device=device)
    out_length = torch.full((batch,), width, dtype=torch.long, device=device)
    alive = torch.ones(batch, dtype=torch.bool, device=device)  # per row: no eos yet
    attention_steps: list[Tensor] = []  # per step (N, L, h, S) or (N, S)
    attention_rows: list[list[int]] = [[] for _ in range(batch)]  # per input: its row in the concatenated steps
    offset = 0
    last_tokens = torch.full((batch,), config.decoder_start_token_id, dtype=torch.long, device=device)
    for step in range(width):
        logits, cross = decode(last_tokens, cache, need_weights=capture.wanted)
        ending = [row for row, index in enumerate(active) if budgets[index] <= step + 1]
        logprobs = next_logprobs(logits, _too_early(step, min_new_tokens, logits.size(0)), ending, config)
        best_logprob, best = logprobs.max(dim=-1)  # (N,)
        out_tokens[rows_of, step] = best
        out_logprobs[rows_of, step] = best_logprob
        ended = alive & (best == config.eos_token_id)
        out_length[rows_of] = torch.where(ended, step + 1, out_length[rows_of])
        alive = alive & ~ended
        if capture.wanted:
            attention_steps.append(capture.keep(cross))
            for row, index in enumerate(active):
                attention_rows[index].append(offset + row)
            offset += len(active)
        last_tokens = best
        if (step + 1) % capture.check_every and step + 1 < width:
            continue
        keep = [row for row, live in enumerate(_read(alive)) if live]
        if not keep:
            break
        if len(keep) < len(active):
            rows = torch.tensor(keep, device=device)
            cache.reorder(rows)
            last_tokens, alive, rows_of = last_tokens[rows], alive[rows], rows_of[rows]
            active = [active[row] for row in keep]
    return _greedy_hypotheses(out_tokens, out_logprobs, out_length, attention_steps, attention_rows, lengths,
                              length_penalty, capture)


def _greedy_hypotheses(
    out_tokens: Tensor, out_logprobs: Tensor, out_length: Tensor, attention_steps: list[Tensor],
    attention_rows: list[list[int]], lengths: list[int], length_penalty: float, capture: _Capture,
) -> list[list[Hypothesis]]:
    """The greedy search's hypotheses from its token and score buffers and the attention rows it kept."""
    batch = len(lengths)
    attention = torch.cat(attention_steps) if attention_steps else None  # (sum N, L, h, S) or (sum N, S)
    tokens, logprobs, ends, attention = to_host([out_tokens, out_logprobs, out_length, attention])
    output = []
    for index in range(batch):
        end = int(ends[index])
        rows = attention[attention_rows[index][:end]] if attention is not None else None
        cross_attention, alignment_attention = capture.hypothesis(rows, lengths[index])
        token_logprobs = logprobs[index, :end].tolist()
        score = sum(token_logprobs)
        normalized = score / end**length_penalty
        output.append(
            [
                Hypothesis(
                    tokens[index, :end].tolist(), score, token_logprobs, cross_attention, normalized,
                    alignment_attention,
                )
            ]
        )
    return output


def _beam(
    model: Transformer,
    step,
    encoder,
    lengths: list[int],
    budgets: list[int],
    options: DecodingOptions,
    capture: _Capture,
) -> list[list[Hypothesis]]:
    """Beam search proper: each source repeated k times for its beams, 2k candidates per input and step.

    The search state stays on the device. An input that is done freezes (it takes no more finished
    hypotheses) and leaves the batch at the next check, every `capture.check_every` steps; the
    back-pointers and finished hypotheses come to the host once, at the end.
    """
    k, length_penalty, min_new_tokens = options.beam_size, options.length_penalty, options.min_new_tokens
    num_return_sequences = options.n_best
    config = model.config
    device = encoder.hidden.device
    batch = len(lengths)
    ref_stride = 2 * k * batch  # a finished hypothesis's reference: step * ref_stride + input slot * 2k + j
    decode = step.decode_step
    cache = step.start_cache(encoder, capacity=max(budgets), beams=k)  # each source's K/V on its k rows

    active = list(range(batch))  # original index of each active input
    budget = torch.tensor(budgets, device=device)
    state = BeamState.start(batch, k, device)
    last_tokens = torch.full((batch * k,), config.decoder_start_token_id, dtype=torch.long, device=device)
    frozen = torch.zeros(batch, dtype=torch.bool, device=device)  # done: its finished hypotheses are final
    candidate_offsets = torch.arange(2 * k, device=device)
    # Per original input: its final (finished, finished_done, finished_ref), on the device until the end.
    results: dict[int, tuple[Tensor, Tensor, Tensor]] = {}
    steps: list[StepRecord] = []
    run_source_row = run_token = run_logprob = None
    width = max(budgets)

    for step in range(width):
        items = len(active)
        logits, cross = decode(last_tokens, cache, need_weights=capture.wanted)
        ending = [a * k + beam for a, index in enumerate(active) if budgets[index] <= step + 1 for beam in range(k)]
        logprobs = next_logprobs(logits, _too_early(step, min_new_tokens, logits.size(0)), ending, config)
        item_rows = torch.arange(items, device=device)[:, None]
        refs = step * ref_stride + item_rows * 2 * k + candidate_offsets
        divisor = float(step + 1) ** length_penalty
        state, choice = beam_step(state, logprobs, budget <= step + 1, divisor, refs, config.eos_token_id, frozen)
        frozen = choice.done
        row = item_rows * k + choice.beam  # (A, 2k) the row each candidate extends
        kept = capture.keep(cross)
        steps.append(StepRecord(run_source_row, run_token, run_logprob, row, choice.token, choice.logprob, kept))
        new_rows = row.gather(1, choice.chosen)  # (A, k)
        last_tokens = choice.token.gather(1, choice.chosen)
        new_logprobs = choice.logprob.gather(1, choice.chosen)
        if (step + 1) % capture.check_every == 0 or step + 1 == width:
            done_list = _read(frozen)
            for a, finished in enumerate(done_list):
                if finished:
                    results[active[a]] = (state.finished[a], state.finished_done[a], state.finished_ref[a])
            if all(done_list):
                break
            if any(done_list):  # inputs that are done leave
                keep_items = torch.tensor([a for a, finished in enumerate(done_list) if not finished], device=device)
                new_rows, last_tokens = new_rows[keep_items], last_tokens[keep_items]
                new_logprobs = new_logprobs[keep_items]
                state, budget, frozen = state.select(keep_items), budget[keep_items], frozen[keep_items]
                active = [index for index, finished in zip(active, done_list, strict=True) if not finished]
        # Reorder the cache so row r holds the beam it continues.
        new_rows, last_tokens = new_rows.reshape(-1), last_tokens.reshape(-1)  # (A' * k,)
        run_source_row, run_token, run_logprob = new_rows, last_tokens, new_logprobs.reshape(-1)
        cache.reorder(new_rows, same_sources=True)

    finals = [part for index in range(batch) for part in results[index]]
    return _beam_hypotheses(steps, finals, lengths, ref_stride, k, num_return_sequences, capture)


def _beam_hypotheses(
    steps: list[StepRecord], finals: list[Tensor], lengths: list[int], ref_stride: int, k: int,
    num_return_sequences: int, capture: _Capture,
) -> list[list[Hypothesis]]:
    """Each input's best finished hypotheses, rebuilt from the steps' back-pointers."""
    batch = len(lengths)
    steps, finals = steps_to_host(steps, finals)
    output: list[list[Hypothesis]] = []
    for index in range(batch):
        scores, finished, refs = finals[3 * index : 3 * index + 3]
        hypotheses = []
        for slot in range(k):
            if not bool(finished[slot]) or len(hypotheses) == num_return_sequences:
                continue
            hypotheses.append(
                backtrack(
                    steps, int(refs[slot]), ref_stride, k, float(scores[slot]), lengths[index], capture.full
                )
            )
        output.append(hypotheses)
    return output


def steps_to_host(steps: list[StepRecord], extra: list[Tensor]) -> tuple[list[StepRecord], list[Tensor]]:
    """Every step's back-pointers and attention, and `extra`, on the CPU in one transfer per dtype."""
    fields = ("run_source_row", "run_token", "run_logprob", "candidate_row", "candidate_token",
              "candidate_logprob", "attention")
    flat = to_host([getattr(step, name) for step in steps for name in fields] + extra)
    width = len(fields)
    return [StepRecord(*flat[i * width : (i + 1) * width]) for i in range(len(steps))], flat[len(steps) * width :]


def backtrack(
    steps: list[StepRecord], ref: int, ref_stride: int, k: int, normalized: float, source_length: int, full: bool
) -> Hypothesis:
    """Rebuild one finished hypothesis from its reference (step, input slot, candidate). The steps kept
    every layer's and head's attention (`full`) or the alignment head's rows (see `captured`)."""
    step, rest = divmod(ref, ref_stride)
    item, candidate = divmod(rest, 2 * k)
    record = steps[step]
    row = int(record.candidate_row[item, candidate])
    tokens = [int(record.candidate_token[item, candidate])]
    logprobs = [float(record.candidate_logprob[item, candidate])]
    attention = [record.attention[row]] if record.attention is not None else None
    while step > 0:
        record = steps[step]
        tokens.append(int(record.run_token[row]))
        logprobs.append(float(record.run_logprob[row]))
        row = int(record.run_source_row[row])
        step -= 1
        if attention is not None:
            attention.append(steps[step].attention[row])
    tokens.reverse()
    logprobs.reverse()
    cross_attention = alignment_attention = None
    if attention is not None:
        attention.reverse()
        stacked = torch.stack(attention, dim=-2)[..., :source_length].contiguous()  # (L, h, T, S) or (T, S)
        if full:
            cross_attention = stacked
        else:
            alignment_attention = stacked.float()
    return Hypothesis(tokens, sum(logprobs), logprobs, cross_attention, normalized, alignment_attention)
