"""One step of beam search for many inputs at once (greedy is one beam), with the constraints transformers applies:
what every decode loop runs per step (model/decoding/loop.py here; csrc/decoding.h's `advance` is the same
arithmetic in C++). Semantics: model/decoding/search.py."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from model.runtime.topk import row_topk

NEG_INF = -1.0e9


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
    Every request on model/decoding/loop.py's Loop steps through here (greedy: k = 1).
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
