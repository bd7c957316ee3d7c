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
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from model.options import DecodingOptions
from model.transformer import Transformer

NEG_INF = -1.0e9


@dataclass
class Hypothesis:
    """One finished translation of one input."""

    token_ids: list[int]  # generated ids, without the start token, with the final eos if produced
    score: float  # sum of token log-probabilities
    token_logprobs: list[float]
    cross_attention: Tensor | None  # (decoder_layers, heads, len(token_ids), source_length) or None
    normalized_score: float  # score / len**length_penalty, the beam ranking key


def default_max_new_tokens(source_length: int, limit: int) -> int:
    """A generous length budget relative to the source: 2 × source + 10, within the model's positions."""
    return max(1, min(limit, 2 * source_length + 10))


@dataclass
class _Step:
    """What one decoding step leaves behind for back-tracking (all on CPU unless noted)."""

    run_source_row: Tensor | None  # (N,) row at the previous step each running row came from
    run_token: Tensor | None  # (N,) token appended to make this row
    run_logprob: Tensor | None  # (N,)
    candidate_row: Tensor  # (A, 2k) row this step each candidate extends
    candidate_token: Tensor  # (A, 2k)
    candidate_logprob: Tensor  # (A, 2k) log-probability of the candidate token alone
    attention: Tensor | None  # (N, L, h, S) cross-attention rows used at this step


@torch.inference_mode()
def beam_search(
    model: Transformer,
    source_ids: list[list[int]],
    options: DecodingOptions | None = None,
    return_attention: bool = False,
) -> list[list[Hypothesis]]:
    """Decode every source (ids ending in eos) and return its best hypotheses, best first.

    min_new_tokens bans eos before that many tokens (transformers' min_new_tokens); the length budget still
    ends every hypothesis with eos.
    """
    options = options or DecodingOptions()
    config = model.config
    device = model.final_logits_bias.device
    batch = len(source_ids)
    lengths = [len(ids) for ids in source_ids]
    limit = config.max_position_embeddings
    if options.max_new_tokens is None:
        budgets = [default_max_new_tokens(n, limit) for n in lengths]
    else:
        budgets = [min(options.max_new_tokens, limit)] * batch

    # Encoder once for the whole batch, right-padded.
    width = max(lengths)
    padded = torch.full((batch, width), config.pad_token_id, dtype=torch.long)
    for i, ids in enumerate(source_ids):
        padded[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
    padded = padded.to(device)
    mask = torch.arange(width, device=device)[None, :] < torch.tensor(lengths, device=device)[:, None]  # (B, S)
    encoder = model.encode(padded, mask)
    if options.beam_size == 1:
        return _greedy(model, encoder, lengths, budgets, options, return_attention)
    return _beam(model, encoder, lengths, budgets, options, return_attention)


def _next_logprobs(logits: Tensor, step: int, min_new_tokens: int, ending: list[int], config) -> Tensor:
    """Log-probabilities (N, V) of the next token, with the constraints transformers applies.

    Normalised over the full vocabulary, then pad is banned; eos is banned before
    min_new_tokens; rows in `ending` reach their budget and are forced to eos (log-prob 0).
    """
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    logprobs[:, config.pad_token_id] = float("-inf")
    if step + 1 < min_new_tokens:
        logprobs[:, config.eos_token_id] = float("-inf")
    if ending:
        rows = ending if len(ending) < logprobs.size(0) else slice(None)
        logprobs[rows] = float("-inf")
        logprobs[rows, config.eos_token_id] = 0.0
    return logprobs


def _greedy(
    model: Transformer,
    encoder,
    lengths: list[int],
    budgets: list[int],
    options: DecodingOptions,
    return_attention: bool,
) -> list[list[Hypothesis]]:
    """Beam search with k=1, without the beam bookkeeping: argmax per row, finished rows leave the batch.

    Tokens and scores come to the host once per step (they decide which rows leave);
    the cross-attention of each step stays a tensor until the end.
    """
    config = model.config
    length_penalty, min_new_tokens = options.length_penalty, options.min_new_tokens
    device = encoder.hidden.device
    batch = len(lengths)
    cache = model.start_cache(encoder, capacity=max(budgets))
    active = list(range(batch))  # input index of each row
    tokens: list[list[int]] = [[] for _ in range(batch)]
    token_logprobs: list[list[float]] = [[] for _ in range(batch)]
    attention_steps: list[Tensor] = []  # per step (N, L, h, S)
    attention_rows: list[list[int]] = [[] for _ in range(batch)]  # per input: its row in the concatenated steps
    offset = 0
    last_tokens = torch.full((batch,), config.decoder_start_token_id, dtype=torch.long, device=device)
    for step in range(max(budgets)):
        logits, cross = model.decode_step(last_tokens, cache, need_weights=return_attention)
        ending = [row for row, index in enumerate(active) if budgets[index] <= step + 1]
        logprobs = _next_logprobs(logits, step, min_new_tokens, ending, config)
        best = logprobs.argmax(dim=-1)  # (N,)
        best_logprob = logprobs.gather(1, best[:, None])[:, 0]
        if return_attention:
            attention_steps.append(torch.stack(cross, dim=1))  # (N, L, h, S)
        keep = []
        for row, (token, logprob) in enumerate(zip(best.tolist(), best_logprob.tolist(), strict=True)):
            index = active[row]
            tokens[index].append(token)
            token_logprobs[index].append(logprob)
            attention_rows[index].append(offset + row)
            if token != config.eos_token_id:
                keep.append(row)
        offset += len(active)
        if not keep:
            break
        last_tokens = best
        if len(keep) < len(active):
            rows = torch.tensor(keep, device=device)
            cache.reorder(rows)
            last_tokens = best.index_select(0, rows)
            active = [active[row] for row in keep]

    attention = torch.cat(attention_steps).cpu() if return_attention else None  # (sum N, L, h, S)
    output = []
    for index in range(batch):
        cross_attention = None
        if attention is not None:
            rows = attention[attention_rows[index]]  # (T, L, h, S)
            cross_attention = rows.permute(1, 2, 0, 3)[..., : lengths[index]].contiguous()  # (L, h, T, S)
        score = sum(token_logprobs[index])
        normalized = score / len(tokens[index]) ** length_penalty
        output.append([Hypothesis(tokens[index], score, token_logprobs[index], cross_attention, normalized)])
    return output


def _beam(
    model: Transformer,
    encoder,
    lengths: list[int],
    budgets: list[int],
    options: DecodingOptions,
    return_attention: bool,
) -> list[list[Hypothesis]]:
    """Beam search proper: each source repeated k times for its beams, 2k candidates per input and step."""
    k, length_penalty, min_new_tokens = options.beam_size, options.length_penalty, options.min_new_tokens
    num_return_sequences = options.n_best
    config = model.config
    device = encoder.hidden.device
    batch = len(lengths)
    encoder.hidden = encoder.hidden.repeat_interleave(k, dim=0)
    encoder.mask = encoder.mask.repeat_interleave(k, dim=0)
    cache = model.start_cache(encoder, capacity=max(budgets))

    active = list(range(batch))  # original index of each active input
    budget = torch.tensor(budgets, device=device)
    running_scores = torch.full((batch, k), NEG_INF, device=device)
    running_scores[:, 0] = 0.0
    last_tokens = torch.full((batch * k,), config.decoder_start_token_id, dtype=torch.long, device=device)
    finished_scores = torch.full((batch, k), NEG_INF, device=device)
    finished_done = torch.zeros((batch, k), dtype=torch.bool, device=device)
    finished_ref = torch.full((batch, k), -1, dtype=torch.long, device=device)  # step * (2k) * batch + a * 2k + j
    improvable = torch.ones(batch, dtype=torch.bool, device=device)
    first_k = torch.arange(2 * k, device=device) < k
    candidate_offsets = torch.arange(2 * k, device=device)
    # Per original input: its final (finished_scores, finished_done, finished_ref).
    results: dict[int, tuple[Tensor, Tensor, Tensor]] = {}
    steps: list[_Step] = []
    run_source_row = run_token = run_logprob = None
    vocab = config.target_vocab_size
    ref_stride = 2 * k * batch

    for step in range(max(budgets)):
        items = len(active)
        logits, cross = model.decode_step(last_tokens, cache, need_weights=return_attention)
        ending = [a * k + beam for a, index in enumerate(active) if budgets[index] <= step + 1 for beam in range(k)]
        logprobs = _next_logprobs(logits, step, min_new_tokens, ending, config)
        total = (logprobs.view(items, k, vocab) + running_scores[:, :, None]).view(items, k * vocab)
        top_scores, top_index = torch.topk(total, 2 * k, dim=1)  # (A, 2k)
        beam = top_index // vocab
        token = top_index % vocab
        item_rows = torch.arange(items, device=device)[:, None]
        row = item_rows * k + beam  # row each candidate extends
        token_logprob = logprobs[row, token]
        hits = (token == config.eos_token_id) | (budget[:, None] <= step + 1)  # (A, 2k)

        # Running beams for the next step: the k best candidates that did not finish.
        next_scores, chosen = torch.topk(top_scores + hits.float() * NEG_INF, k, dim=1)

        # Finished hypotheses: eos (or budget) candidates among the first k, length-normalised.
        eligible = hits & first_k & improvable[:, None] & ~finished_done.all(dim=1, keepdim=True)
        candidate = torch.where(eligible, top_scores / float(step + 1) ** length_penalty, top_scores + 2 * NEG_INF)
        refs = step * ref_stride + item_rows * 2 * k + candidate_offsets
        merged_scores = torch.cat([finished_scores, candidate], dim=1)
        merged_done = torch.cat([finished_done, hits & first_k], dim=1)
        merged_ref = torch.cat([finished_ref, refs], dim=1)
        finished_scores, keep = torch.topk(merged_scores, k, dim=1)
        finished_done = merged_done.gather(1, keep)
        finished_ref = merged_ref.gather(1, keep)

        # Could the best running beam still beat the worst finished one?
        best_possible = next_scores[:, :1] / float(step + 1) ** length_penalty
        worst_finished = torch.where(finished_done, finished_scores.min(dim=1, keepdim=True).values, NEG_INF)
        improvable = improvable & (best_possible > worst_finished).any(dim=1)
        done = ~improvable | finished_done.all(dim=1) | hits.all(dim=1)

        steps.append(
            _Step(
                run_source_row, run_token, run_logprob,
                row.cpu(), token.cpu(), token_logprob.cpu(),
                torch.stack(cross, dim=1).cpu() if return_attention else None,  # (N, L, h, S)
            )
        )
        done_list = done.tolist()
        for a, finished in enumerate(done_list):
            if finished:
                results[active[a]] = (finished_scores[a].cpu(), finished_done[a].cpu(), finished_ref[a].cpu())
        if all(done_list):
            break

        # Reorder the cache so row r holds the beam it continues; inputs that are done leave.
        new_rows = row.gather(1, chosen)  # (A, k)
        last_tokens = token.gather(1, chosen)
        new_logprobs = token_logprob.gather(1, chosen)
        if any(done_list):
            keep_items = torch.tensor([a for a, finished in enumerate(done_list) if not finished], device=device)
            new_rows, last_tokens = new_rows[keep_items], last_tokens[keep_items]
            new_logprobs = new_logprobs[keep_items]
            running_scores, finished_scores = next_scores[keep_items], finished_scores[keep_items]
            finished_done, finished_ref = finished_done[keep_items], finished_ref[keep_items]
            improvable, budget = improvable[keep_items], budget[keep_items]
            active = [index for index, finished in zip(active, done_list, strict=True) if not finished]
        else:
            running_scores = next_scores
        new_rows, last_tokens = new_rows.reshape(-1), last_tokens.reshape(-1)  # (A' * k,)
        run_source_row, run_token, run_logprob = new_rows.cpu(), last_tokens.cpu(), new_logprobs.reshape(-1).cpu()
        cache.reorder(new_rows, same_sources=True)

    output: list[list[Hypothesis]] = []
    for index in range(batch):
        scores, finished, refs = results[index]
        hypotheses = []
        for slot in range(k):
            if not bool(finished[slot]) or len(hypotheses) == num_return_sequences:
                continue
            hypotheses.append(
                _backtrack(steps, int(refs[slot]), ref_stride, k, float(scores[slot]), lengths[index])
            )
        output.append(hypotheses)
    return output


def _backtrack(
    steps: list[_Step], ref: int, ref_stride: int, k: int, normalized: float, source_length: int
) -> Hypothesis:
    """Rebuild one finished hypothesis from its reference (step, input slot, candidate)."""
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
    cross_attention = None
    if attention is not None:
        attention.reverse()
        cross_attention = torch.stack(attention, dim=2)[..., :source_length].contiguous()  # (L, h, T, S)
    return Hypothesis(tokens, sum(logprobs), logprobs, cross_attention, normalized)
