"""Lexically constrained search (a glossary's terms), in the one search every step kind runs.

Every finished hypothesis holds each constraint's tokens in order, marked as set by it; every step kind (the
compiled loop, the eager step and the graph step's fixed buffers) decodes the same ids, scores and attention; a
request without constraints decodes exactly as it does alone while constrained ones share its loop.
"""

from __future__ import annotations

import random
import re

import pytest
import torch

from model import Translator
from model.decoding.scheduler import Scheduler
from model.decoding.search import beam_search
from model.options import DecodingOptions
from model.runtime import EagerStep
from model.runtime.extension import compiled_extension
from model.runtime.step import CompiledStep, GraphStep
from tests.model.test_scheduler import EOS, PAD, assert_same, random_model

pytestmark = pytest.mark.skipif(compiled_extension() is None, reason="the search is the compiled runtime's")

SENTENCES = ["I like my computer very much.", "The cat sat on the mat.", "Where is the train station?",
             "My brother bought a new car yesterday."]
TERMS = [["电脑"], ["猫咪", "垫子"], ["火车站"], ["汽车", "哥哥"]]


def holds(tokens: list[int], phrase: list[int]) -> list[int] | None:
    """Where `phrase` starts in `tokens`, each start (None: nowhere)."""
    starts = [i for i in range(len(tokens) - len(phrase) + 1) if tokens[i : i + len(phrase)] == phrase]
    return starts or None


@pytest.fixture(scope="module")
def translator():
    return Translator.from_pretrained("en-zh")


def steps(model):
    return {"compiled": None, "eager": EagerStep(model), "graph": GraphStep(model, capture=False)}


@pytest.mark.parametrize("beam", [2, 4])
def test_every_hypothesis_holds_its_terms_on_every_step_kind_and_they_agree(translator, beam):
    ids = translator.encode_source(SENTENCES)
    constraints = [translator.term_ids(terms) for terms in TERMS]
    options = DecodingOptions(beam_size=beam, n_best=beam)
    decoded = {}
    for name, step in steps(translator.model).items():
        decoded[name] = beam_search(translator.model, ids, options, return_attention=True,
                                    step=translator.step if step is None else step, constraints=constraints)
    for nbest, wanted in zip(decoded["compiled"], constraints, strict=True):
        for hypothesis in nbest:
            marked = set()
            for phrase in wanted:
                starts = holds(hypothesis.token_ids, phrase)
                assert starts is not None, (translator.tokenizer.detokenize(hypothesis.token_ids), phrase)
                marked |= {i for start in starts for i in range(start, start + len(phrase))}
            forced = {i for i, flag in enumerate(hypothesis.forced) if flag}
            assert forced and forced <= marked  # exactly the term's tokens where the search set them
            assert len(hypothesis.forced) == len(hypothesis.token_ids)
    for name in ("eager", "graph"):
        for want, have in zip(decoded["compiled"], decoded[name], strict=True):
            assert [h.token_ids for h in have] == [h.token_ids for h in want], name
            for a, b in zip(want, have, strict=True):
                assert b.forced == a.forced
                assert b.score == pytest.approx(a.score, abs=1e-3)
                torch.testing.assert_close(b.cross_attention, a.cross_attention, atol=1e-4, rtol=0)


def test_a_term_the_model_writes_anyway_leaves_the_translation_as_it_was(translator):
    """火车站 is what the model writes for "train station" unasked: holding it to the term changes nothing."""
    (ids,) = translator.encode_source(["Where is the train station?"])
    options = DecodingOptions(beam_size=4)
    (plain,) = beam_search(translator.model, [ids], options, step=translator.step)
    (held,) = beam_search(translator.model, [ids], options, step=translator.step,
                          constraints=[translator.term_ids(["火车站"])])
    assert held[0].token_ids == plain[0].token_ids
    assert held[0].score == pytest.approx(plain[0].score, abs=1e-5)


@pytest.mark.parametrize("seed", range(3))
def test_requests_without_constraints_decode_as_alone_beside_constrained_ones(seed):
    rng = random.Random(seed)
    model = random_model(seed)
    for step in (CompiledStep(model, compiled_extension(), choose=False), EagerStep(model)):
        scheduler = Scheduler(model, max_rows=32, step=step)
        plain, constrained = [], []
        for index in range(8):
            source = [rng.randrange(1, PAD) for _ in range(rng.randint(1, 14))] + [EOS]
            options = DecodingOptions(beam_size=rng.choice([1, 2, 3]), max_new_tokens=rng.randint(6, 12))
            if index % 2:
                phrase = [rng.randrange(1, PAD) for _ in range(rng.randint(1, 2))]
                request = scheduler.submit(source, options, constraints=[phrase])
                constrained.append((request, phrase))
            else:
                plain.append((scheduler.submit(source, options), source, options))
            scheduler.step()
        scheduler.run()
        for request, source, options in plain:
            alone = beam_search(model, [source], options, step=step)[0]
            assert_same(request.hypotheses, alone, seed)
            if isinstance(step, EagerStep):
                assert_same(request.hypotheses, beam_search(model, [source], options, reference=True)[0], seed)
        for request, phrase in constrained:
            for hypothesis in request.hypotheses:
                ended = len(hypothesis.token_ids) >= request.budget  # the budget ends a search that found no room
                assert ended or holds(hypothesis.token_ids, phrase) is not None


def test_the_reference_search_says_it_takes_no_constraints(translator):
    ids = translator.encode_source(["The cat sat."])
    with pytest.raises(ValueError, match="constraints need the compiled runtime"):
        beam_search(translator.model, ids, reference=True, constraints=[[[5]]])


def test_a_greedy_text_with_terms_searches_wider_and_says_so(translator):
    (plain,) = translator.translate(["I like my computer very much."], DecodingOptions(beam_size=1))
    (held,) = translator.translate(["I like my computer very much."], DecodingOptions(beam_size=1), terms=[["电脑"]])
    assert plain.search_note is None and not plain.forced
    assert "beam of 3" in held.search_note and "电脑" in held.text
    assert [held.target_tokens[i] for i, flag in enumerate(held.forced) if flag] == ["电", "脑"]


def test_a_term_in_a_spaced_language_is_a_whole_word():
    """A term's last piece followed by one that goes on the word ("sales" + "7") is not the term: every
    translation holds each term as a word of its own."""
    translator = Translator.from_pretrained("zh-en")
    texts = ["他在销售部门工作。", "这个组织很大。", "我们要保护环境。", "机场的安保人员很多。", "这是原创的作品。"]
    terms = [["sales"], ["organization"], ["environment"], ["security"], ["original"]]
    for translation, wanted in zip(translator.translate(texts, terms=terms), terms, strict=True):
        for term in wanted:
            assert re.search(rf"(?<![\w]){term}(?![\w])", translation.text), (translation.text, term)
