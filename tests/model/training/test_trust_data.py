"""The labelled sets trust is measured on (model.training.trust_data.held_out_sets): no source on both sides of a
split, TICO-19 only ever tested on, and a source and its perturbed copy in one group. Needs the shared data."""

from __future__ import annotations

from pathlib import Path

import pytest

from model import Translator
from model.training.trust_data import HELD_OUT_SETS, Item, held_out_sets, label_by_own_median

DATA = Path(__file__).resolve().parents[3].parent / "shared" / "data"

pytestmark = pytest.mark.skipif(
    not (DATA / "tico19-en-zh" / "test.en").is_file(), reason=f"shared data missing at {DATA}"
)


@pytest.fixture(scope="module", params=[("en", "zh"), ("zh", "en")], ids=["en-zh", "zh-en"])
def items(request):
    source, target = request.param
    return held_out_sets(str(DATA), source, target, Translator.from_pretrained(f"{source}-{target}"))


def test_every_set_is_there_and_labelled_by_groups(items):
    assert {item.set for item in items} == set(HELD_OUT_SETS)
    for item in items:
        assert item.group >= 0 and item.references
    by_group: dict[int, list] = {}
    for item in items:
        by_group.setdefault(item.group, []).append(item)
    for members in by_group.values():
        assert len({member.set for member in members}) == 1
        assert sum(member.category != "perturbed" for member in members) == 1  # one source, at most its copy
        assert len(members) <= 2


def test_no_sentence_sits_in_two_sets(items):
    clean = {}
    for item in items:
        if item.category == "clean":
            assert item.source not in clean, item.source
            clean[item.source] = item.set
    long_texts = [item for item in items if item.category == "long"]
    assert long_texts
    for item in long_texts:  # a long text joins sentences that are nowhere else (as whole sentences)
        for source in clean:
            assert not joined_into(source, item.source), (source, item.source)


def joined_into(sentence: str, text: str) -> bool:
    """Whether `sentence` is one of the sentences laid end to end in `text` (not a piece of a longer one)."""
    start = text.find(sentence)
    while start >= 0:
        before = text[start - 1] if start else ""
        if not before or before in " 。.!?！？\"”":
            return True
        start = text.find(sentence, start + 1)
    return False


def test_a_perturbed_copy_keeps_its_source_group(items):
    clean = {item.group: item for item in items if item.category == "clean"}
    for item in items:
        if item.category == "perturbed":
            source = clean[item.group]
            assert item.set == source.set
            if item.perturbation in ("rare", "doubled"):
                assert source.source in item.source


def test_an_out_of_domain_set_is_labelled_against_its_own_median_chrf():
    # TICO-19 is judged within itself: the better half by chrF is good (an oscillating one never), the other sets
    # keep the labels they had
    chrfs = [12.0, 30.0, 18.0, 25.0, 40.0, 9.0]
    items = [Item("s", ["r"], "clean", chrf=c, set="tico19", good=0) for c in chrfs]
    items[4].oscillates = True
    other = Item("s", ["r"], "clean", chrf=5.0, set="tatoeba", good=1)
    thresholds = label_by_own_median([*items, other])
    assert thresholds == {"tico19": (18.0 + 25.0) / 2}
    assert [item.good for item in items] == [0, 1, 0, 1, 0, 0]
    assert other.good == 1
