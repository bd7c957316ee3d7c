"""The scheduler: every request decoded among others (random arrivals, lengths and settings, a row cap) equals the
search on it alone, itself tested against transformers in test_transformers_parity.py; the static policy admits
only into an empty loop; the threaded SchedulerThread gathers static batches and builds a step's finished requests
together.
"""

from __future__ import annotations

import random
import threading
import time

import pytest
import torch

from model import Translator
from model.config import ModelConfig
from model.decoding.scheduler import Scheduler, SchedulerThread
from model.decoding.search import beam_search
from model.errors import DecoderBusyError
from model.options import DecodingOptions
from model.runtime import EagerStep, compiled_extension
from model.runtime.step import GraphStep
from model.transformer import Transformer
from tests.harness.tiny import DEVICE

EOS, PAD = 0, 49


def random_model(seed: int) -> Transformer:
    config = ModelConfig(
        vocab_size=50,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=64,
        pad_token_id=PAD,
        eos_token_id=EOS,
        decoder_start_token_id=PAD,
        dropout=0.0,
    )
    torch.manual_seed(seed)
    model = Transformer(config)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() > 1:
                parameter.normal_(0.0, 0.3)
        model.final_logits_bias[EOS] = 1.5  # so that hypotheses end at varied lengths, not only at the budget
    return model.eval()


def random_requests(
    rng: random.Random, count: int, beams: tuple[int, ...] = (1, 1, 2, 3, 4)
) -> list[tuple[int, list[int], DecodingOptions]]:
    """(arrival step, source ids ending in eos, options) for `count` requests, beam sizes drawn from `beams`."""
    requests = []
    for _ in range(count):
        beam = rng.choice(beams)
        options = DecodingOptions(
            beam_size=beam,
            n_best=rng.randint(1, beam),
            max_new_tokens=rng.choice([None, rng.randint(1, 12)]),
            length_penalty=rng.choice([1.0, 0.6, 1.4]),
            min_new_tokens=rng.choice([0, 0, 3]),
        )
        source = [rng.randrange(1, PAD) for _ in range(rng.randint(1, 14))] + [EOS]
        requests.append((rng.randint(0, 12), source, options))
    return requests


def assert_same(got, expected, context) -> None:
    assert len(got) == len(expected), context
    for hypothesis, reference in zip(got, expected, strict=True):
        assert hypothesis.token_ids == reference.token_ids, context
        assert hypothesis.score == pytest.approx(reference.score, abs=1e-4), context
        assert hypothesis.normalized_score == pytest.approx(reference.normalized_score, abs=1e-4), context
        assert hypothesis.token_logprobs == pytest.approx(reference.token_logprobs, abs=1e-4), context
        if reference.cross_attention is not None:
            assert hypothesis.cross_attention.shape == reference.cross_attention.shape, context
            torch.testing.assert_close(hypothesis.cross_attention, reference.cross_attention, atol=1e-5, rtol=0)


def run_interleaved(seed: int, beams: tuple[int, ...], max_rows: list[int], static: bool = False) -> None:
    """Random requests (see random_requests) through one scheduler, each checked against the reference search
    decoding it alone. static: the rows on the graph step's fixed buffers (StaticRows; CUDA graphs where the tests
    run on a GPU)."""
    rng = random.Random(seed)
    model = random_model(seed).to(DEVICE)
    requests = random_requests(rng, 14, beams)
    alone = [beam_search(model, [source], options, return_attention=True, reference=True)[0]
             for _, source, options in requests]

    step = GraphStep(model, capture=DEVICE == "cuda") if static else EagerStep(model)
    scheduler = Scheduler(model, max_rows=rng.choice(max_rows), step=step)
    pending = sorted(range(len(requests)), key=lambda i: requests[i][0])
    submitted = {}
    step = 0
    most_rows = 0
    while pending or not scheduler.idle:
        while pending and requests[pending[0]][0] <= step:
            index = pending.pop(0)
            _, source, options = requests[index]
            submitted[index] = scheduler.submit(source, options, return_attention=True)
        scheduler.step()
        most_rows = max(most_rows, scheduler.rows)
        step += 1
        assert step < 2_000
    assert most_rows <= scheduler.max_rows
    for index, request in submitted.items():
        assert request.done and request.hypotheses is not None
        assert_same(request.hypotheses, alone[index], (seed, index, requests[index]))


@pytest.mark.parametrize("seed", range(6))
def test_requests_joining_and_leaving_decode_as_if_alone(seed):
    run_interleaved(seed, (1, 1, 2, 3, 4), [4, 8, 64])


@pytest.mark.parametrize(("seed", "beam"), [(0, 1), (1, 3), (2, 4), (3, 4)])
def test_requests_of_one_beam_size_joining_and_leaving_decode_as_if_alone(seed, beam):
    run_interleaved(seed, (beam,), [8 * beam, 64])


@pytest.mark.parametrize("seed", range(4))
def test_rows_on_the_graph_steps_fixed_buffers_decode_as_if_alone(seed):
    # the GPU's continuous path: the same random arrivals, mixed beam sizes and one beam size, on StaticRows, whose
    # step runs over a row bucket at full capacity with each row's own position
    run_interleaved(seed, (1, 1, 2, 3, 4), [4, 8, 64], static=True)
    run_interleaved(seed, (4,), [32, 64], static=True)


def test_static_rows_keep_their_storage_while_rows_come_and_go():
    """What makes a graph replayable: the buffers a step reads stay put while requests join and leave; they are
    replaced only when a request outgrows them (more rows, a longer source or budget than any before)."""
    model = random_model(3).to(DEVICE)
    step = GraphStep(model, capture=DEVICE == "cuda")
    scheduler = Scheduler(model, max_rows=16, step=step)
    rng = random.Random(3)
    requests = [(source, DecodingOptions(beam_size=2, max_new_tokens=8)) for _, source, _ in random_requests(rng, 24)]
    for source, options in requests[:8]:
        scheduler.submit(source, options)
    scheduler.step()
    storage = scheduler.loop.cache.self_key[0].data_ptr()
    shapes = set()
    for source, options in requests[8:]:
        scheduler.submit(source, options)
        scheduler.step()
        shapes.add(scheduler.loop.cache.shape)
        assert scheduler.loop.cache.self_key[0].data_ptr() == storage
    scheduler.run()
    assert shapes == {scheduler.loop.cache.shape}


def test_a_request_that_arrives_mid_decode_joins_at_the_next_step_and_a_short_one_leaves_first():
    model = random_model(7)
    long = [5] * 14 + [EOS]
    short = [6, EOS]
    scheduler = Scheduler(model)
    first = scheduler.submit(long, DecodingOptions(beam_size=2, max_new_tokens=30, min_new_tokens=25))
    scheduler.step()
    scheduler.step()
    second = scheduler.submit(short, DecodingOptions(beam_size=1, max_new_tokens=3))
    finished_at = {}
    for step in range(40):
        for request in scheduler.step():
            finished_at[id(request)] = step
        if scheduler.idle:
            break
    # the short request did not wait for the long one: it finished within its 3-token budget
    assert finished_at[id(second)] <= 3 < finished_at[id(first)]
    short_options = DecodingOptions(beam_size=1, max_new_tokens=3)
    assert_same(second.hypotheses, beam_search(model, [short], short_options, reference=True)[0], "")
    long_options = DecodingOptions(beam_size=2, max_new_tokens=30, min_new_tokens=25)
    reference = beam_search(model, [long], long_options, reference=True)[0]
    assert_same(first.hypotheses, reference, "")


@pytest.mark.parametrize("static", [False, True])
def test_cancel_frees_the_rows_at_once_and_leaves_the_others_exact(static):
    """static: on the graph step's buffers, where a cancel's move of the rows follows the beam's own before the
    next step has made it (the two compose)."""
    model = random_model(3)
    options = DecodingOptions(beam_size=3, max_new_tokens=20, min_new_tokens=20)
    scheduler = Scheduler(model, step=GraphStep(model, capture=DEVICE == "cuda") if static else None)
    doomed = scheduler.submit([7, 8, 9, EOS], options)
    kept = scheduler.submit([10, 11, EOS], options, return_attention=True)
    scheduler.step()
    assert scheduler.rows == 6
    scheduler.cancel(doomed)
    scheduler.step()
    assert scheduler.rows == 3 and doomed.done and doomed.hypotheses is None
    scheduler.run()
    alone = beam_search(model, [[10, 11, EOS]], options, return_attention=True, reference=True)[0]
    assert_same(kept.hypotheses, alone, "")
    waiting = scheduler.submit([12, EOS], options)
    scheduler.cancel(waiting)
    assert scheduler.idle


def test_streamed_tokens_are_the_greedy_result_token_by_token():
    model = random_model(5)
    seen = []
    scheduler = Scheduler(model)
    options = DecodingOptions(beam_size=1, max_new_tokens=15)
    request = scheduler.submit(
        [3, 4, 5, EOS], options, return_attention=True,
        on_token=lambda r, token, logprob, attention: seen.append((token, logprob, attention)),
    )
    scheduler.run()
    (hypothesis,) = beam_search(model, [[3, 4, 5, EOS]], options, return_attention=True, reference=True)[0]
    assert [token for token, _, _ in seen] == hypothesis.token_ids == request.hypotheses[0].token_ids
    assert [lp for _, lp, _ in seen] == pytest.approx(hypothesis.token_logprobs, abs=1e-4)
    streamed = torch.stack([attention for _, _, attention in seen], dim=2)  # (L, h, T, S)
    torch.testing.assert_close(streamed, hypothesis.cross_attention, atol=1e-5, rtol=0)


@pytest.mark.parametrize("runtime", ["compiled", "eager"])
def test_a_beam_streams_its_settled_tokens_as_they_settle_and_takes_none_back(runtime):
    # the compiled loop and the Python one (the eager step's) hand out the same settled prefixes
    if runtime == "compiled" and compiled_extension() is None:
        pytest.skip("the compiled runtime is not built here")
    translator = Translator.from_pretrained("en-zh", device="cpu")
    model = translator.model
    step = translator.step if runtime == "compiled" else EagerStep(model)
    (source,) = translator.encode_source(["Tom reads a very long book about the history of the railway."])
    options = DecodingOptions(beam_size=4, max_new_tokens=40)
    scheduler = Scheduler(model, step=step, alignment_head=translator.alignment_head)
    seen = []

    def on_token(request, token, logprob, attention):
        seen.append((request.step - 1, token, logprob, attention, steps))

    request = scheduler.submit(source, options, on_token=on_token)
    steps = 0
    while not request.done:
        scheduler.step()
        steps += 1
    best = beam_search(model, [source], options, alignment_head=translator.alignment_head, step=step)[0][0]
    assert request.hypotheses[0].token_ids == best.token_ids
    assert [index for index, *_ in seen] == list(range(len(best.token_ids)))  # in order, each once
    assert [token for _, token, *_ in seen] == best.token_ids
    assert [lp for _, _, lp, *_ in seen] == pytest.approx(best.token_logprobs, abs=1e-6)
    streamed = torch.stack([attention for *_, attention, _ in seen])  # (T, S): the alignment head's rows
    torch.testing.assert_close(streamed, best.alignment_attention, atol=1e-6, rtol=0)
    assert seen[0][-1] < steps - 1  # the first token came before the search ended


def test_the_queue_is_bounded():
    scheduler = Scheduler(random_model(1), max_rows=2, max_waiting=2)
    greedy = DecodingOptions(beam_size=1)
    scheduler.submit([1, EOS], greedy)
    scheduler.submit([2, EOS], greedy)
    with pytest.raises(DecoderBusyError):
        scheduler.submit([3, EOS], greedy)
    with pytest.raises(ValueError):
        scheduler.submit([3, EOS], DecodingOptions(beam_size=4))


@pytest.mark.parametrize("head", [1, None], ids=["one head", "layer average"])
def test_alignment_rows_are_the_alignment_heads_rows_of_the_full_maps(head):
    model = random_model(6)
    scheduler = Scheduler(model, alignment_head=(1, head))
    rng = random.Random(6)
    submitted = []
    for _, source, options in random_requests(rng, 8):
        submitted.append((scheduler.submit(source, options, alignment_rows=True), source, options))
    scheduler.run()
    for request, source, options in submitted:
        alone = beam_search(model, [source], options, return_attention=True, reference=True)[0]
        for got, expected in zip(request.hypotheses, alone, strict=True):
            assert got.token_ids == expected.token_ids
            assert got.cross_attention is None
            maps = expected.cross_attention[1]
            rows = maps.mean(dim=0) if head is None else maps[head]
            torch.testing.assert_close(got.alignment_attention, rows, atol=1e-5, rtol=0)


def test_under_the_static_policy_requests_join_only_an_empty_loop_and_still_decode_as_if_alone():
    """`scheduler: static`: a batch decodes to its end before the next joins, up to max_texts at once."""
    model = random_model(9)
    rng = random.Random(9)
    requests = [(source, options) for _, source, options in random_requests(rng, 7)]
    joined = []
    scheduler = Scheduler(
        model, max_rows=64, policy="static", max_texts=3, on_joined=lambda batch, waits: joined.append(batch.size)
    )
    submitted = [scheduler.submit(source, options) for source, options in requests[:5]]
    scheduler.step()
    first_batch = list(scheduler.running)
    assert first_batch == submitted[:3]  # max_texts, oldest first
    late = [scheduler.submit(source, options) for source, options in requests[5:]]
    while any(not request.done for request in first_batch):
        assert not any(request in scheduler.running for request in submitted[3:] + late)
        scheduler.step()
    scheduler.run()
    assert joined == [3, 3, 1]
    for request, (source, options) in zip(submitted + late, requests, strict=True):
        assert_same(request.hypotheses, beam_search(model, [source], options, reference=True)[0], f"{source} {options}")


def test_an_unknown_policy_is_refused():
    with pytest.raises(ValueError, match="policy"):
        Scheduler(random_model(1), policy="eager")


def test_a_batch_reports_when_it_joins_and_when_its_last_request_leaves():
    model = random_model(4)
    events = []
    scheduler = Scheduler(
        model,
        on_joined=lambda batch, waits: events.append(("joined", batch.size, len(waits))),
        on_done=lambda batch: events.append(("done", batch.size)),
    )
    short = scheduler.submit([3, EOS], DecodingOptions(max_new_tokens=2))
    long = scheduler.submit([4, 5, EOS], DecodingOptions(max_new_tokens=9, min_new_tokens=9))
    while not short.done:
        scheduler.step()
    assert events == [("joined", 2, 2)]  # the batch still runs: its long request has not left
    scheduler.cancel(long)
    scheduler.step()
    assert events == [("joined", 2, 2), ("done", 2)]


def static_loop(gather_s: float) -> tuple[SchedulerThread, list[int]]:
    """A static SchedulerThread of up to 8 texts a batch, and the sizes of the batches that joined it."""
    sizes: list[int] = []
    loop = SchedulerThread(
        random_model(6), policy="static", max_texts=8, gather_s=gather_s,
        on_joined=lambda batch, waits: sizes.append(batch.size),
    )
    return loop, sizes


def test_the_static_loop_gathers_a_batch_for_its_wait_but_a_lone_text_after_a_lone_batch_starts_at_once():
    loop, sizes = static_loop(gather_s=0.4)
    options = DecodingOptions(max_new_tokens=3)
    try:
        first = [loop.submit([3 + i, EOS], options) for i in range(2)]
        time.sleep(0.1)  # within the first text's wait: these join its batch
        first += [loop.submit([9 + i, EOS], options) for i in range(2)]
        for future in first:
            future.result(timeout=30)
        assert sizes == [4]
        started = time.monotonic()
        loop.submit([20, EOS], options).result(timeout=30)  # waits out gather_s for company, finds none
        assert time.monotonic() - started >= 0.35 and sizes == [4, 1]
        started = time.monotonic()
        loop.submit([21, EOS], options).result(timeout=30)  # after a batch of one: no wait
        assert time.monotonic() - started < 0.3 and sizes == [4, 1, 1]
    finally:
        loop.close()


def test_the_loop_builds_a_steps_finished_requests_together_and_a_failure_reaches_only_their_callers():
    model = random_model(8)
    calls = []
    fail = threading.Event()

    def finish(requests):
        calls.append(len(requests))
        if fail.is_set():
            raise RuntimeError("building failed")
        return [request.hypotheses[0].token_ids for request in requests]

    # one static batch of three (it joins once all three wait) of equal lengths: they finish at one step
    loop = SchedulerThread(model, policy="static", max_texts=3, gather_s=30.0, finish=finish)
    try:
        options = DecodingOptions(max_new_tokens=4, min_new_tokens=4)
        sources = [[3, EOS], [4, 5, EOS], [6, EOS]]
        futures = [loop.submit(source, options) for source in sources]
        results = [future.result(timeout=30) for future in futures]
        assert results == [beam_search(model, [source], options, reference=True)[0][0].token_ids for source in sources]
        assert calls == [3]
        fail.set()
        doomed = [loop.submit([7 + i, EOS], options) for i in range(3)]
        for future in doomed:
            with pytest.raises(RuntimeError, match="building failed"):
                future.result(timeout=30)
        fail.clear()
        kept = [loop.submit([7 + i, EOS], options) for i in range(3)]
        assert all(future.result(timeout=30) for future in kept)  # the loop kept serving
    finally:
        loop.close()


def test_a_gathering_batch_whose_oldest_source_is_given_up_waits_from_the_next_oldest():
    """As a caller that timed out: its Future cancelled before its source joined; the rest are not held to its wait."""
    loop, sizes = static_loop(gather_s=0.5)
    options = DecodingOptions(max_new_tokens=3)
    try:
        started = time.monotonic()
        oldest = loop.submit([3, EOS], options)
        time.sleep(0.3)
        second = loop.submit([4, EOS], options)
        assert oldest.cancel()
        second.result(timeout=30)
        assert time.monotonic() - started >= 0.75  # the second's own wait, not the cancelled one's
        assert sizes == [1]
    finally:
        loop.close()
