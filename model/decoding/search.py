"""Beam search (greedy is beam_size=1) for a static batch: every source joins the decode loop (model.decoding.loop)
before the first step and leaves when done, and `Hypothesis` is what a finished source gives.

Semantics follow transformers' `generate(num_beams=k, early_stopping=True, length_penalty=lp)`, with a hypothesis
that reaches its length budget closed by a forced </s> (log-probability 0), as for Marian's forced_eos_token_id.
Attention is captured in full only when asked; otherwise only the alignment head's rows, which alignments need.
"""

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
    """Decode every source (ids ending in eos) and return its best hypotheses, best first.

    min_new_tokens bans eos before that many tokens (transformers' min_new_tokens); the length budget still
    ends every hypothesis with eos. return_attention: each hypothesis carries every layer's and head's
    cross-attention; alignment_head (layer, head or None): it carries that head's rows
    (`alignment_attention`), all an alignment needs. step: what runs each decoding step (model.runtime.load_step's
    compiled or eager step; None: the model's own, EagerStep). reference: on the reference search (the oracle).
    constraints: per source, token sequences every hypothesis contains (lexically constrained search), as whole
    words where word_continuations names the tokens that go on a word.
    """
    options = options or DecodingOptions()
    config = model.config
    device = model.final_logits_bias.device
    batch = len(source_ids)
    lengths = [len(ids) for ids in source_ids]
    budgets = [length_budget(n, options, config.max_position_embeddings) for n in lengths]

    step = step if step is not None else EagerStep(model)
    hidden = encoded(step, source_ids, config.pad_token_id, device)  # the encoder once for the whole batch
    # every source joins the loop now and leaves when done
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
    """The encoder's hidden states (B, S, d_model) of sources right-padded to the longest, by `step`, in one pass."""
    lengths = [len(ids) for ids in source_ids]
    width = max(lengths)
    padded = torch.full((len(source_ids), width), pad, dtype=torch.long)
    for i, ids in enumerate(source_ids):
        padded[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
    mask = torch.arange(width, device=device)[None, :] < torch.tensor(lengths, device=device)[:, None]
    return step.encode(padded.to(device), mask)


def loop_hypotheses(found: list, n_best: int, full: bool) -> list[Hypothesis]:
    """Hypotheses from what the decode loop gives a finished request ((tokens, log-probabilities, normalised score,
    attention, tokens a constraint set) per finished slot, best first): the first n_best; attention (T, L, h, S)
    every head's (`full`) → cross_attention (L, h, T, S), or one head's rows (T, S) → alignment_attention."""
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
