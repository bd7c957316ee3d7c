"""The reference beam search: each request alone on its own k rows, in plain Python. The oracle every step kind is
tested against, and the decode loop where the runtime does not build (the loop's contract: join, step, cancel)."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import torch
from torch import Tensor

from model.runtime import CAPTURE
from model.runtime.rows import StaticRows

NEG = -1.0e9  # the score of a beam that does not exist yet (the k beams start as one)
EVERY_HEAD, ONE_HEAD = CAPTURE["every_head"], CAPTURE["one_head"]


@dataclass
class _Beam:
    score: float  # summed log-probability
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    attention: list[Tensor] = field(default_factory=list)


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
    cache: StaticRows
    beams: list[_Beam]
    finished: list[tuple[float, bool, _Beam | None]] = field(default_factory=list)  # k slots: (score, taken, beam)
    improvable: bool = True
    step: int = 0
    emitted: int = 0
    cancelled: bool = False
    forced: list[int] = field(default_factory=list)  # a target teacher-forced, eos included


def f32(value: float) -> float:
    """`value` rounded to float32, as the search's float arithmetic rounds each result."""
    return struct.unpack("f", struct.pack("f", value))[0]


class ReferenceLoop:
    """The decode loop's contract over `step.decode_rows`, each request decoded alone."""

    def __init__(self, step, alignment_head: tuple[int, int | None] | None = None) -> None:
        self.decoder_step, self.model = step, step.model
        self.config = self.model.config
        self.device = self.model.final_logits_bias.device
        self.head = alignment_head if alignment_head is not None else (0, 0)
        self.requests: list[_Request] = []
        self._next_id = 0

    def __len__(self) -> int:
        return len(self.requests)

    def rows(self) -> int:
        return sum(request.k for request in self.requests if not request.cancelled)

    def cancel(self, id: int) -> None:
        for request in self.requests:
            if request.id == id:
                request.cancelled = True

    @torch.inference_mode()
    def join(
        self, hidden: Tensor, lengths: list[int], beams: list[int], budgets: list[int], min_new_tokens: list[int],
        length_penalties: list[float], captures: list[int], streams: list[bool],
        constraints: list[list[list[int]]] | None = None, forced: list[list[int]] | None = None,
    ) -> list[int]:
        if constraints and any(constraints):
            raise ValueError("lexical constraints need the compiled runtime's search (model.decoding.loop)")
        ids = []
        for i, k in enumerate(beams):
            if k < 1 or budgets[i] < 1 or not 1 <= lengths[i] <= hidden.size(1):
                raise ValueError("a bad request")
            if budgets[i] > self.config.max_position_embeddings:
                raise ValueError("a budget past the model's positions")
            target = list(forced[i]) if forced else []
            if target and (k != 1 or budgets[i] != len(target)):
                raise ValueError("a forced target decodes on one beam, its length its budget")
            keys, values = self.decoder_step.cross_key_values(hidden[i : i + 1, : lengths[i]], k)
            cache = self.decoder_step.rows_cache()
            cache.join(keys, values, torch.ones(k, lengths[i], dtype=torch.bool, device=self.device), budgets[i],
                       [lengths[i]] * k)
            beams_of = [_Beam(0.0 if j == 0 else NEG) for j in range(k)]
            slots = [(NEG, False, None)] * k
            self.requests.append(_Request(self._next_id, k, budgets[i], min_new_tokens[i], float(length_penalties[i]),
                                          captures[i], bool(streams[i]), lengths[i], cache, beams_of, slots,
                                          forced=target))
            ids.append(self._next_id)
            self._next_id += 1
        return ids

    @torch.inference_mode()
    def step(self) -> tuple[list, list]:
        """One token for every request: the streamed tokens, and the requests done with their hypotheses."""
        self.requests = [request for request in self.requests if not request.cancelled]
        tokens, finished, kept = [], [], []
        for request in self.requests:
            done = self._advance(request)
            if request.stream:
                self._settle(request, done, tokens)
            if done:
                found = [(b.tokens, b.logprobs, score, torch.stack(b.attention) if b.attention else None, [])
                         for score, taken, b in request.finished if taken]
                finished.append((request.id, found))
            else:
                kept.append(request)
        self.requests = kept
        return tokens, finished

    def _advance(self, request: _Request) -> bool:
        config, k = self.config, request.k
        last = [b.tokens[-1] if b.tokens else config.decoder_start_token_id for b in request.beams]
        capture = request.capture in (EVERY_HEAD, ONE_HEAD)
        logits, cross = self.decoder_step.decode_rows(torch.tensor(last, device=self.device), request.cache, capture)
        logprobs = torch.log_softmax(logits.float(), dim=-1).cpu()
        maps = None
        if capture:
            layer, head = self.head
            maps = (torch.stack(cross, dim=1) if request.capture == EVERY_HEAD
                    else cross[layer].mean(dim=1) if head is None else cross[layer][:, head])
            maps = maps[..., : request.length].float().cpu().clone()  # the step's buffers are reused
        if request.forced:
            return self._force(request, logprobs, maps)
        logprobs[:, config.pad_token_id] = float("-inf")
        if request.step + 1 < request.min_new_tokens:
            logprobs[:, config.eos_token_id] = float("-inf")
        ending = request.budget <= request.step + 1
        if ending:  # the budget ends here: eos is forced
            logprobs[:] = float("-inf")
            logprobs[:, config.eos_token_id] = 0.0

        # the 2k best continuations over all beams; of equal scores the lower beam, then the lower token, first
        running = torch.tensor([b.score for b in request.beams], dtype=torch.float32)
        total = (running[:, None] + logprobs).view(-1)
        vocabulary = logprobs.size(1)
        candidates = []  # (its beam, the beam it makes, whether it ends here)
        for flat in torch.sort(total, descending=True, stable=True).indices[: 2 * k].tolist():
            beam, token = divmod(flat, vocabulary)
            parent = request.beams[beam]
            child = _Beam(float(total[flat]), parent.tokens + [token], parent.logprobs + [float(logprobs[beam, token])],
                          parent.attention + ([maps[beam]] if maps is not None else []))
            candidates.append((beam, child, token == config.eos_token_id or ending))

        # an ending candidate among the first k is a finished hypothesis, scored by length; the k best slots stay
        divisor = f32(float(request.step + 1) ** request.length_penalty)
        open_slots = request.improvable and not all(done for _, done, _ in request.finished)
        merged = list(request.finished)
        for rank, (_, child, hit) in enumerate(candidates):
            taking = hit and rank < k
            score = f32(child.score / divisor) if taking and open_slots else f32(child.score + 2 * NEG)
            merged.append((score, taking, child))
        request.finished = sorted(merged, key=lambda slot: -slot[0])[:k]  # stable: slots held first among equals

        # the k best that do not end continue; could the best of them still beat the worst finished?
        running_score = [f32(child.score + NEG) if hit else child.score for _, child, hit in candidates]
        ranked = sorted(range(2 * k), key=lambda j: -running_score[j])
        best_possible = f32(running_score[ranked[0]] / divisor)
        worst = min(score for score, _, _ in request.finished)
        request.improvable = request.improvable and any(
            best_possible > (worst if done else NEG) for _, done, _ in request.finished)
        every_done = all(done for _, done, _ in request.finished)
        if not request.improvable or every_done or all(hit for _, _, hit in candidates):
            return True
        going = [candidates[j] for j in ranked[:k]]
        request.cache.keep(torch.tensor([0 if request.step == 0 else beam for beam, _, _ in going], device=self.device))
        request.beams = [child for _, child, _ in going]
        request.step += 1
        return False

    @staticmethod
    def _force(request: _Request, logprobs: Tensor, maps: Tensor | None) -> bool:
        """A forced request's step: its next target token at the model's log-probability."""
        beam, token = request.beams[0], request.forced[request.step]
        logprob = float(logprobs[0, token])
        request.beams[0] = _Beam(f32(beam.score + logprob), beam.tokens + [token], beam.logprobs + [logprob],
                                 beam.attention + ([maps[0]] if maps is not None else []))
        request.step += 1
        if request.step < len(request.forced):
            return False
        request.finished = [(request.beams[0].score, True, request.beams[0])]
        return True

    @staticmethod
    def _settle(request: _Request, done: bool, tokens: list) -> None:
        """Stream the tokens every open path shares (once done, the rest of the best)."""
        paths = [beam for _, taken, beam in request.finished if taken]
        if done:
            paths = paths[:1]
        else:
            paths += request.beams
        if not paths:
            return
        first = paths[0]
        shared = min(len(path.tokens) for path in paths)
        for path in paths[1:]:
            same = 0
            while same < shared and path.tokens[same] == first.tokens[same]:
                same += 1
            shared = same
        for t in range(request.emitted, shared):
            attention = first.attention[t] if t < len(first.attention) else None
            tokens.append((request.id, t, first.tokens[t], first.logprobs[t], attention))
        request.emitted = max(request.emitted, shared)
