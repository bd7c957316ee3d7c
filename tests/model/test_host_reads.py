"""What a decode reads back from the device: the Python decode loop's one copy per step (counted by its own counter
on the CPU as if the tensors were on a device; bench/gpu/check.py counts them on a GPU), and the work after a decode.
"""

from __future__ import annotations

import traceback

import pytest
import torch
from torch.overrides import TorchFunctionMode

from model import Translator
from model.decoding import loop, search
from model.explanations.alignment import alignment_matrix
from model.explanations.explain import forced_decode
from model.runtime import EagerStep
from tests.harness.tiny import DEVICE, synthetic_corpus

SENTENCES = [english for english, _ in synthetic_corpus(count=40, seed=11)]


@pytest.fixture(scope="module")
def translator(shared_model_dir):
    """The conftest's shared-vocabulary model, made to finish early (its own copy: the bias is changed)."""
    translator = Translator.from_pretrained(shared_model_dir, device=DEVICE)
    # A random model rarely says </s>: favour it so that inputs finish at different steps, some early.
    translator.model.final_logits_bias[translator.config.eos_token_id] = 6.0
    return translator


def decode(translator, ids, beam_size, **extra):
    """The batch on the Python decode loop (the eager step's), and the loop's host reads while it ran."""
    before = loop.host_reads
    nbest = search.beam_search(
        translator.model,
        ids,
        search.DecodingOptions(beam_size=beam_size, n_best=min(2, beam_size), **extra),
        return_attention=True,
        step=EagerStep(translator.model),
    )
    return nbest, loop.host_reads - before


def force_reads(monkeypatch):
    """Count reads as if the tensors were on a device (on the CPU `to_host` has nothing to copy)."""
    if DEVICE != "cpu":
        return
    original = loop.to_host

    def counting(tensors):
        loop.host_reads += any(t is not None for t in tensors)
        return original(tensors)

    monkeypatch.setattr(loop, "to_host", counting)


@pytest.mark.parametrize("beam_size", [1, 4])
def test_the_python_loop_reads_the_device_once_per_step(translator, beam_size, monkeypatch):
    force_reads(monkeypatch)
    ids = translator.encode_source(SENTENCES[:8])
    # min_new_tokens keeps every input decoding for 30 steps, so the count is about the loop, not early exits
    nbest, reads = decode(translator, ids, beam_size, max_new_tokens=30, min_new_tokens=30)
    steps = max(len(h[0].token_ids) for h in nbest)
    assert steps == 30
    assert reads == steps  # the choices, finished slots and attention rows of a step in one copy; nothing else


def test_one_packed_copy_brings_every_dtype_back_exactly():
    """What packed_to_host promises the loop: ids, indices and flags below 2**24 and float32 values survive the
    float32 trip unchanged."""
    from model.host import packed_to_host

    tensors = [torch.tensor([[0, 7, 2**24 - 1]]), torch.tensor([True, False]), torch.randn(3, 4), None,
               torch.randn(2, 5).half()]
    if DEVICE != "cpu":
        tensors = [t.to(DEVICE) if t is not None else None for t in tensors]
    back, transfers = packed_to_host(tensors, every=True)
    assert transfers == 1
    for original, copy in zip(tensors, back, strict=True):
        if original is None:
            assert copy is None
            continue
        assert copy.device.type == "cpu" and copy.dtype == original.dtype and torch.equal(copy, original.cpu())


def test_translate_captures_every_head_only_when_asked(translator):
    texts = SENTENCES[:6]
    plain = translator.translate(texts, beam_size=3)
    full = translator.translate(texts, beam_size=3, return_attention=True)
    layer, head = translator.alignment_head
    for without, with_maps in zip(plain, full, strict=True):
        assert without.cross_attention is None
        assert with_maps.cross_attention is not None
        assert without.target_ids == with_maps.target_ids
        assert without.alignment == with_maps.alignment
        assert without.word_alignment == with_maps.word_alignment


@pytest.mark.parametrize("beam_size", [1, 3])
def test_the_alignment_rows_kept_are_the_alignment_heads_rows(translator, beam_size):
    ids = translator.encode_source(SENTENCES[:6])
    full = translator.generate(ids, beam_size=beam_size, return_attention=True)
    rows = translator.generate(ids, beam_size=beam_size, alignment_attention=True)
    layer, head = translator.alignment_head
    for a, b in zip(full, rows, strict=True):
        assert b[0].cross_attention is None
        expected = alignment_matrix(a[0].cross_attention, layer, head)
        assert b[0].alignment_attention.shape == expected.shape
        assert torch.allclose(b[0].alignment_attention, expected, atol=1e-6)


def test_explanations_compute_the_encoder_maps_only_when_asked(translator):
    (translation,) = translator.translate(SENTENCES[:1], min_new_tokens=5)
    without = forced_decode(translator.model, translation.source_ids, translation.target_ids, encoder_attention=False)
    with_maps = forced_decode(translator.model, translation.source_ids, translation.target_ids)
    assert without.encoder_self_attention is None
    assert with_maps.encoder_self_attention.shape[-1] == len(translation.source_ids)
    assert torch.allclose(without.cross_attention, with_maps.cross_attention, atol=1e-5)  # SDPA vs explicit
    explained = translator.explain(translation.source_ids, translation.target_ids)
    assert explained.encoder_self_attention is None


class HostReads(TorchFunctionMode):
    """Counts what waits for a device: every .cpu(), .item(), .tolist(), .numpy() and Python conversion of a tensor,
    except inside the search and the runtime (counted by search.host_reads and bench/gpu/check.py)."""

    NAMES = frozenset({"cpu", "item", "tolist", "numpy", "__bool__", "__int__", "__float__", "__index__"})

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in self.NAMES:
            stack = traceback.extract_stack()
            if not any(part in frame.filename for frame in stack for part in SEARCH_FILES):
                self.reads.append(f"{func.__name__} at {stack[-2].filename}:{stack[-2].lineno}")
        return func(*args, **(kwargs or {}))


SEARCH_FILES = ("model/decoding/", "model/runtime/")


@pytest.mark.parametrize("beam_size", [1, 4])
def test_the_work_after_a_decode_reads_the_device_at_most_twice_per_batch(beam_size):
    """What a translator replica does with a batch after its search (Translator._translations' tokens, alignments
    and word alignments, as the decode loop's finish builds them; Translator.assess's trust signals, as
    service/finishing.py's Finisher runs it) reads the device
    at most twice, whatever the batch's size: the results come to the host once and the rest is Python over them."""
    translator = Translator.from_pretrained("en-zh", device=DEVICE)
    texts = ["The cat sat on the mat.", "Where is the station?", "I would like a cup of tea, please.", "Thank you!",
             "We went to school together yesterday.", "It is very cold today.", "", "My sister is a doctor."]
    options = search.DecodingOptions(beam_size=beam_size, n_best=min(2, beam_size))
    expected = translator.translate(texts, options)
    with HostReads() as counter:
        translations = translator.translate(texts, options)
        translator.assess(translations, "fast", None, options)
    assert len(counter.reads) <= 2, counter.reads
    assert [t.alignment for t in translations] == [t.alignment for t in expected]
    assert all(t.trust is not None for t in translations if t.target_ids)
