"""The static-shape step (model/runtime/graphs.py) decodes what the eager step decodes.

On a CPU it runs the static step eagerly (the part a GPU captures as CUDA graphs); with TRANSLATE_TEST_DEVICE=cuda
the same tests replay the captured graphs. The eager step is the oracle (itself held to transformers in
test_transformers_parity.py and test_decode_step.py); both run on the Python decode loop (model/decoding/loop.py),
the graph step with its rows on fixed buffers.
"""

from __future__ import annotations

import pytest
import torch

from model import Translator
from model.decoding.scheduler import Scheduler
from model.decoding.search import beam_search
from model.options import DecodingOptions
from model.runtime import EagerStep
from model.runtime.rows import LENGTH_BUCKETS, ROW_BUCKETS, Shape, bucket
from model.runtime.step import GraphStep
from tests.harness.tiny import DEVICE

SENTENCES = [
    "The cat sat on the mat.", "Where is the station?", "I would like a cup of tea, please.",
    "Tom reads a book every evening before he goes to bed, even when he is very tired.", "Thank you!",
    "We went to school together yesterday.", "It is very cold today.", "My sister is a doctor in a small town.",
    "Can you help me carry these heavy boxes up to the third floor of the old building?", "Yes.",
]


@pytest.fixture(scope="module")
def translator():
    return Translator.from_pretrained("en-zh", device=DEVICE)


def decode(translator, step, beam: int, attention: bool, n_best: int = 1, reference: bool = False):
    ids = translator.encode_source(SENTENCES)
    options = DecodingOptions(beam_size=beam, n_best=n_best, max_new_tokens=40)
    return beam_search(translator.model, ids, options, return_attention=attention, step=step, reference=reference)


@pytest.mark.parametrize("beam", [1, 4])
def test_static_step_decodes_the_eager_steps_ids_scores_and_attention(translator, beam):
    model = translator.model
    static = GraphStep(model, capture=DEVICE == "cuda")
    expected = decode(translator, EagerStep(model), beam, attention=True, n_best=min(beam, 2), reference=True)
    got = decode(translator, static, beam, attention=True, n_best=min(beam, 2))
    for want, have in zip(expected, got, strict=True):
        assert [h.token_ids for h in have] == [h.token_ids for h in want]
        for a, b in zip(want, have, strict=True):
            assert b.score == pytest.approx(a.score, abs=1e-4)
            assert torch.allclose(a.cross_attention, b.cross_attention, atol=1e-5)
    if DEVICE == "cuda":
        assert static.graphs.failure is None and static.graphs.captured > 0


def test_static_step_keeps_the_alignment_heads_rows(translator):
    model = translator.model
    head = (model.config.decoder_layers - 1, 0)
    ids = translator.encode_source(SENTENCES)
    options = DecodingOptions(beam_size=4, max_new_tokens=40)
    want = beam_search(model, ids, options, alignment_head=head, reference=True)
    have = beam_search(model, ids, options, alignment_head=head, step=GraphStep(model, capture=DEVICE == "cuda"))
    for a, b in zip(want, have, strict=True):
        assert a[0].token_ids == b[0].token_ids
        assert torch.allclose(a[0].alignment_attention, b[0].alignment_attention, atol=1e-5)


def test_a_search_decodes_on_one_row_buckets_fixed_buffers(translator):
    """Static shapes: every step of a static batch reads and writes the same buffers while rows leave, at the row
    buckets only."""
    model = translator.model
    step = GraphStep(model, capture=False)
    seen: list[tuple[int, ...]] = []
    buckets: set[int] = set()
    run_rows = step.graphs.run_rows

    def recording(cache, weights):
        seen.append((cache.ids.data_ptr(), cache.logits.data_ptr(), cache.self_key[0].data_ptr(),
                     tuple(cache.self_key[0].shape)))
        buckets.add(bucket(cache.rows, ROW_BUCKETS))
        run_rows(cache, weights)

    step.graphs.run_rows = recording
    decode(translator, step, beam=1, attention=False)
    assert len(seen) > 3 and len(set(seen)) == 1
    assert buckets <= {1, 2, 4, 8, 16}  # 10 rows, fewer as they finish: a graph per power of two at most


def test_buckets_round_up_and_grow_past_the_largest():
    assert [bucket(n, ROW_BUCKETS) for n in (1, 3, 16, 17, 256, 257)] == [1, 4, 16, 32, 256, 512]
    assert Shape.holding(10 * 4, 40, 9) == Shape(64, 64, 16)
    assert bucket(300, LENGTH_BUCKETS) == 512


@pytest.mark.parametrize("beam", [1, 4])
def test_the_continuous_schedulers_rows_on_fixed_buffers_decode_the_eager_steps_ids(translator, beam):
    """The GPU's continuous path on the shipped model: sentences arriving one per step join the rows on StaticRows
    (graph replays on a GPU) and decode what the eager static search decodes for each alone."""
    model = translator.model
    ids = translator.encode_source(SENTENCES)
    options = DecodingOptions(beam_size=beam, max_new_tokens=40)
    alone = beam_search(model, ids, options, return_attention=True, reference=True)
    step = GraphStep(model, capture=DEVICE == "cuda")
    scheduler = Scheduler(model, max_rows=32, step=step)
    submitted = []
    for source in ids:
        submitted.append(scheduler.submit(source, options, return_attention=True))
        scheduler.step()
    scheduler.run()
    for request, want in zip(submitted, alone, strict=True):
        assert request.hypotheses[0].token_ids == want[0].token_ids
        assert request.hypotheses[0].score == pytest.approx(want[0].score, abs=1e-4)
        assert torch.allclose(request.hypotheses[0].cross_attention, want[0].cross_attention, atol=1e-5)
    if DEVICE == "cuda":
        assert step.graphs.failure is None and step.graphs.captured > 0
