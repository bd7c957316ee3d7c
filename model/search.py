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
    beam_size: int = 4,
    max_new_tokens: int | list[int] | None = None,
    length_penalty: float = 1.0,
    num_return_sequences: int = 1,
    return_attention: bool = False,
) -> list[list[Hypothesis]]:
    """Decode every source (ids ending in eos) and return its best hypotheses, best first."""
    config = model.config
    device = model.final_logits_bias.device
    k = beam_size
    if not 1 <= num_return_sequences <= k:
        raise ValueError(f"num_return_sequences must be between 1 and beam_size={k}")
    batch = len(source_ids)
    lengths = [len(ids) for ids in source_ids]
    limit = config.max_position_embeddings
    if max_new_tokens is None:
        budgets = [default_max_new_tokens(n, limit) for n in lengths]
    elif isinstance(max_new_tokens, int):
        budgets = [min(max_new_tokens, limit)] * batch
    else:
        budgets = [min(m, limit) for m in max_new_tokens]

    # Encoder once for the whole batch, right-padded; each source repeated k times for its beams.
    width = max(lengths)
    padded = torch.full((batch, width), config.pad_token_id, dtype=torch.long)
    for i, ids in enumerate(source_ids):
        padded[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
    padded = padded.to(device)
    mask = torch.arange(width, device=device)[None, :] < torch.tensor(lengths, device=device)[:, None]  # (B, S)
    encoder = model.encode(padded, mask)
    if k > 1:
        encoder.hidden = encoder.hidden.repeat_interleave(k, dim=0)
        encoder.mask = encoder.mask.repeat_interleave(k, dim=0)
    cache = model.start_cache(encoder, capacity=max(budgets))

    active = torch.arange(batch)  # original index of each active input
    budget = torch.tensor(budgets)
    running_scores = torch.full((batch, k), NEG_INF, device=device)
    running_scores[:, 0] = 0.0
    last_tokens = torch.full((batch * k,), config.decoder_start_token_id, dtype=torch.long, device=device)
    finished_scores = torch.full((batch, k), NEG_INF, device=device)
    finished_done = torch.zeros((batch, k), dtype=torch.bool, device=device)
    finished_ref = torch.full((batch, k), -1, dtype=torch.long, device=device)  # step * (2k) * batch + a * 2k + j
    improvable = torch.ones(batch, dtype=torch.bool, device=device)
    first_k = torch.arange(2 * k, device=device) < k
    # Per original input: its final (finished_scores, finished_done, finished_ref) and its row offset per step.
    results: dict[int, tuple[Tensor, Tensor, Tensor]] = {}
    steps: list[_Step] = []
    run_source_row = run_token = run_logprob = None
    vocab = config.target_vocab_size
    ref_stride = 2 * k * batch

    for step in range(max(budgets)):
        items = active.numel()
        logits, cross = model.decode_step(last_tokens, cache, need_weights=return_attention)
        logprobs = torch.log_softmax(logits.float(), dim=-1)  # normalised over the full vocabulary,
        logprobs[:, config.pad_token_id] = float("-inf")  # then pad is banned, as transformers does
        last_step = (budget <= step + 1).repeat_interleave(k).to(device)  # (N,)
        if bool(last_step.any()):
            # The final step of a budget forces </s> with log-probability 0 (transformers' forced_eos_token_id).
            logprobs[last_step] = float("-inf")
            logprobs[last_step, config.eos_token_id] = 0.0
        total = (logprobs.view(items, k, vocab) + running_scores[:, :, None]).view(items, k * vocab)
        top_scores, top_index = torch.topk(total, 2 * k, dim=1)  # (A, 2k)
        beam = top_index // vocab
        token = top_index % vocab
        row = torch.arange(items, device=device)[:, None] * k + beam  # row each candidate extends
        token_logprob = logprobs[row, token]
        out_of_budget = (budget.to(device)[:, None] <= step + 1).expand(-1, 2 * k)
        hits = (token == config.eos_token_id) | out_of_budget

        # Running beams for the next step: the k best candidates that did not finish.
        next_scores, chosen = torch.topk(top_scores + hits.float() * NEG_INF, k, dim=1)

        # Finished hypotheses: eos (or budget) candidates among the first k, length-normalised.
        candidate = top_scores / float(step + 1) ** length_penalty
        candidate = candidate + finished_done.all(dim=1, keepdim=True).float() * NEG_INF
        candidate = candidate + (~improvable)[:, None].float() * NEG_INF
        candidate = candidate + (~(hits & first_k)).float() * NEG_INF
        refs = step * ref_stride + torch.arange(items, device=device)[:, None] * 2 * k + torch.arange(2 * k, device=device)
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
        for a in torch.nonzero(done).flatten().tolist():
            results[int(active[a])] = (finished_scores[a].cpu(), finished_done[a].cpu(), finished_ref[a].cpu())
        if bool(done.all()):
            break

        # Keep the running inputs only; reorder the cache so row r holds the beam it continues.
        keep_items = torch.nonzero(~done).flatten()
        new_rows = row.gather(1, chosen)[keep_items].reshape(-1)  # (A' * k,)
        last_tokens = token.gather(1, chosen)[keep_items].reshape(-1)
        run_source_row = new_rows.cpu()
        run_token = last_tokens.cpu()
        run_logprob = token_logprob.gather(1, chosen)[keep_items].reshape(-1).cpu()
        cache.reorder(new_rows)
        running_scores = next_scores[keep_items]
        finished_scores = finished_scores[keep_items]
        finished_done = finished_done[keep_items]
        finished_ref = finished_ref[keep_items]
        improvable = improvable[keep_items]
        budget = budget[keep_items.cpu()]
        active = active[keep_items.cpu()]

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


def _backtrack(steps: list[_Step], ref: int, ref_stride: int, k: int, normalized: float, source_length: int) -> Hypothesis:
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
