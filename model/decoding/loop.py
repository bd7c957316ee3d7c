"""The decode loop of each step kind, all on the one search (the runtime's BeamSearch): `join`, `step` (the streamed
tokens and the requests done), `cancel`. The compiled step's loop is C++; the eager and graph steps run under
StepLoop; without the runtime the reference search decodes."""

from __future__ import annotations

import torch
from torch import Tensor

from model.decoding.reference import ReferenceLoop
from model.host import packed_to_host
from model.runtime import CAPTURE
from model.runtime.extension import compiled_extension

EVERY_HEAD, ONE_HEAD, NOTHING = CAPTURE["every_head"], CAPTURE["one_head"], CAPTURE["nothing"]
host_reads = 0  # device → host copies a StepLoop made (one per step), for tests and benchmarks


def new_loop(step, alignment_head: tuple[int, int | None] | None = None, word_continuations: list[int] | None = None):
    """The decode loop for `step`. alignment_head: (layer, head or None for the average) a capture keeps;
    word_continuations: target tokens that go on a word (a constraint followed by one is not met)."""
    if getattr(step, "new_loop", None) is not None:
        loop = step.new_loop(alignment_head)
    elif (extension := compiled_extension()) is None:
        return ReferenceLoop(step, alignment_head)
    else:
        loop = StepLoop(step, extension, alignment_head)
    if word_continuations:
        loop.set_word_continuations(list(word_continuations))
    return loop


def capture_code(every_head: bool, head_rows: bool) -> int:
    """What a request's rows keep: every head's maps, else the alignment head's rows, else nothing."""
    return EVERY_HEAD if every_head else ONE_HEAD if head_rows else NOTHING


def to_host(tensors: list[Tensor | None]) -> list[Tensor | None]:
    """The CPU copies of a step's device tensors in one transfer, counted in `host_reads`."""
    global host_reads
    out, transfers = packed_to_host(tensors)
    host_reads += transfers
    return out


class StepLoop:
    """The search over a step's `decode_rows` (eager, or CUDA graphs, over its fixed buffers), one copy to the host a
    step."""

    def __init__(self, step, extension, alignment_head: tuple[int, int | None] | None = None) -> None:
        self.decoder_step, model = step, step.model
        self.config = model.config
        self.device = model.final_logits_bias.device
        self.vocabulary = model.output_weight.size(0)
        self.topk = extension.row_topk
        self.head = alignment_head if alignment_head is not None else (0, 0)
        self.cache = step.rows_cache()
        config = self.config
        self.search = extension.BeamSearch(config.eos_token_id, config.pad_token_id, config.decoder_start_token_id,
                                           config.max_position_embeddings)

    def __len__(self) -> int:
        return len(self.search)

    def rows(self) -> int:
        return self.search.rows()

    def cancel(self, id: int) -> None:
        self.search.cancel(id)

    def set_word_continuations(self, tokens: list[int]) -> None:
        self.search.set_word_continuations(tokens)

    @torch.inference_mode()
    def join(
        self, hidden: Tensor, lengths: list[int], beams: list[int], budgets: list[int], min_new_tokens: list[int],
        length_penalties: list[float], captures: list[int], streams: list[bool],
        constraints: list[list[list[int]]] | None = None, forced: list[list[int]] | None = None,
    ) -> list[int]:
        """Encoded sources (hidden (n, S, d_model), right-padded) join, each on one row until its first step; returns
        their ids. forced: per source a target to teacher-force (one beam, its length the budget), or []."""
        count, width = hidden.size(0), hidden.size(1)
        if any(not 1 <= length <= width for length in lengths) or len(lengths) != count:
            raise ValueError("a bad request")
        ids = self.search.join(lengths, beams, budgets, min_new_tokens, length_penalties, captures, streams,
                               [0] * count, constraints or [], forced or [])
        keys, values = self.decoder_step.cross_key_values(hidden, 1)
        mask = torch.arange(width, device=self.device)[None, :] < torch.tensor(lengths, device=self.device)[:, None]
        self.cache.join(keys, values, mask, max(budgets), list(lengths), self.search.beam_rows())
        return ids

    @torch.inference_mode()
    def step(self) -> tuple[list, list]:
        """One token for every row: the streamed tokens, and the requests done with their hypotheses."""
        layout = self.search.plan()
        if not layout.unchanged:  # cancelled requests' rows leave
            self._keep(layout)
        if layout.rows == 0:
            return [], []
        ids = torch.tensor(layout.ids, dtype=torch.long, device=self.device)
        logits, cross = self.decoder_step.decode_rows(ids, self.cache, layout.every_head or layout.one_head)
        m = 2 * layout.widest_beam
        # each row's best log-probabilities: enough that m remain once pad and eos are banned
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        values, tokens = self.topk(logprobs, min(self.vocabulary, m + 2))
        all_heads = torch.stack(cross, dim=1).float() if layout.every_head else None  # (N, L, h, S)
        head_rows = None
        if layout.one_head:
            layer, head = self.head
            head_rows = (cross[layer].mean(dim=1) if head is None else cross[layer][:, head]).float()  # (N, S)
        wanted = None
        if layout.wanted_width:  # the log-probabilities of the tokens constraints want
            index = torch.tensor(layout.wanted, dtype=torch.long, device=self.device).view(layout.rows, -1)
            wanted = logprobs.gather(1, index.clamp(min=0))
        values, tokens, all_heads, head_rows, wanted = to_host([values, tokens, all_heads, head_rows, wanted])
        streamed, finished = self.search.advance(values, tokens, m, all_heads, head_rows, wanted)
        self._keep(self.search.compact())  # the rows the next step continues, before any more join after them
        return streamed, finished

    def _keep(self, layout) -> None:
        self.cache.keep(torch.tensor(layout.previous, dtype=torch.long, device=self.device), layout.same_sources)
