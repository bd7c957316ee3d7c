"""Beam search for a static batch (greedy is beam_size=1), as transformers' generate(num_beams=k,
early_stopping=True), a hypothesis at its length budget closed by a forced </s> as Marian's forced_eos_token_id."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from model.decoding.loop import capture_code, new_loop
from model.decoding.reference import ReferenceLoop
from model.options import DecodingOptions
from model.runtime import EagerStep
from model.transformer import Transformer


@dataclass
class Hypothesis:
    """One finished translation of one input."""

    token_ids: list[int]  # generated ids, without the start token, with the final eos if produced
    score: float  # sum of token log-probabilities
    token_logprobs: list[float]
    cross_attention: Tensor | None  # (decoder_layers, heads, len(token_ids), source_length) or None
    normalized_score: float  # score / len**length_penalty, the beam ranking key
    alignment_attention: Tensor | None = None  # (len(token_ids), source_length): the alignment head's rows
    forced: list[bool] = field(default_factory=list)  # per token: set by a constraint (empty: none applied)


@dataclass
class ForcedPass:
    """A target teacher-forced through a decoding step: what that step computed for each of its tokens."""

    cross_attention: Tensor  # (layers, heads, T, S) float32 on the host
    token_logprobs: list[float]  # each target token's log-probability (log-softmax over the whole vocabulary)


@torch.inference_mode()
def forced_pass(step, source_ids: list[int], target_ids: list[int]) -> ForcedPass:
    """`target_ids` (eos included) teacher-forced through `step`'s own decode loop, so the maps and scores are the
    numbers its search computes. A token forced at the budget has its model log-probability here."""
    model = step.model
    hidden = encoded(step, [list(source_ids)], model.config.pad_token_id, model.final_logits_bias.device)
    loop = new_loop(step)
    loop.join(hidden, [len(source_ids)], [1], [len(target_ids)], [0], [1.0], [capture_code(True, False)], [False],
              [], [list(target_ids)])
    found = []
    while len(loop):
        found += loop.step()[1]
    _, logprobs, _, attention, _ = found[0][1][0]
    return ForcedPass(attention.permute(1, 2, 0, 3).float().contiguous(), list(logprobs))


def default_max_new_tokens(source_length: int, limit: int) -> int:
    """A generous length budget relative to the source: 2 × source + 10, within the model's positions."""
    return max(1, min(limit, 2 * source_length + 10))


def length_budget(source_length: int, options: DecodingOptions, limit: int) -> int:
    """New tokens a source may get: options.max_new_tokens, else the default budget raised to min_new_tokens (a
    translation asked to run that long may); within `limit` positions."""
    if options.max_new_tokens is None:
        return min(limit, max(default_max_new_tokens(source_length, limit), options.min_new_tokens))
    return min(options.max_new_tokens, limit)


@torch.inference_mode()
def beam_search(
    model: Transformer,
    source_ids: list[list[int]],
    options: DecodingOptions | None = None,
    return_attention: bool = False,
    alignment_head: tuple[int, int | None] | None = None,
    step=None,
    reference: bool = False,
    constraints: list[list[list[int]]] | None = None,
    word_continuations: list[int] | None = None,
) -> list[list[Hypothesis]]:
    """Every source's best hypotheses, best first. return_attention: every head's maps; alignment_head (layer, head
    or None): that head's rows only. step: None is EagerStep; reference: the oracle search. constraints: per source,
    token sequences every hypothesis contains, as whole words past word_continuations."""
    options = options or DecodingOptions()
    config = model.config
    device = model.final_logits_bias.device
    batch = len(source_ids)
    lengths = [len(ids) for ids in source_ids]
    budgets = [length_budget(n, options, config.max_position_embeddings) for n in lengths]

    step = step if step is not None else EagerStep(model)
    hidden = encoded(step, source_ids, config.pad_token_id, device)
    what = capture_code(return_attention, alignment_head is not None)
    loop = ReferenceLoop(step, alignment_head) if reference else new_loop(step, alignment_head, word_continuations)
    ids = loop.join(
        hidden, lengths, [options.beam_size] * batch, budgets, [options.min_new_tokens] * batch,
        [float(options.length_penalty)] * batch, [what] * batch, [False] * batch, constraints or [],
    )
    found: dict[int, list] = {}
    while len(loop):
        _, done = loop.step()
        found.update(done)
    return [loop_hypotheses(found[i], options.n_best, return_attention) for i in ids]


def encoded(step, source_ids: list[list[int]], pad: int, device: torch.device) -> Tensor:
    """The encoder's hidden states (B, S, d_model) of the sources right-padded, in one pass."""
    lengths = [len(ids) for ids in source_ids]
    width = max(lengths)
    padded = torch.full((len(source_ids), width), pad, dtype=torch.long)
    for i, ids in enumerate(source_ids):
        padded[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
    mask = torch.arange(width, device=device)[None, :] < torch.tensor(lengths, device=device)[:, None]
    return step.encode(padded.to(device), mask)


def loop_hypotheses(found: list, n_best: int, full: bool) -> list[Hypothesis]:
    """The first n_best of what the loop gives a finished request, as Hypotheses (attention (T, L, h, S) when `full`,
    else one head's rows (T, S))."""
    hypotheses = []
    for tokens, logprobs, normalized, attention, forced in found[:n_best]:
        cross_attention = alignment_attention = None
        if attention is not None:
            if full:
                cross_attention = attention.permute(1, 2, 0, 3).contiguous()
            else:
                alignment_attention = attention.float().contiguous()
        hypotheses.append(
            Hypothesis(list(tokens), sum(logprobs), list(logprobs), cross_attention, normalized, alignment_attention,
                       list(forced))
        )
    return hypotheses
