"""The software-strings data stage on this machine's own gettext catalogs (Debian's zh_CN .mo files, read by
Python's gettext, the reference reader): held-out catalogs stay out, mnemonics go, placeholders stay."""

from __future__ import annotations

import gettext
import re
from collections import Counter

import pytest

from model.training.catalogs import HELD_OUT, LOCALE_DIR, MAX_CHARS, catalog_pairs, read_catalog

pytestmark = pytest.mark.skipif(not (LOCALE_DIR / "gtk30.mo").is_file(), reason="no zh_CN gettext catalogs here")
PRINTF = re.compile(r"%(?:\d+\$)?[-+ #0]*\d*(?:\.\d+)?(?:hh|h|ll|l|z|j|t|L)?[diouxXeEfgGcsp%]|\{[\w.]*\}")


@pytest.fixture(scope="module")
def parts():
    return catalog_pairs()


def test_no_pair_of_the_held_out_catalogs_is_trained_on_nor_any_that_shares_a_side_with_them(parts):
    assert {pair.catalog for pair in parts["held_out"]} == set(HELD_OUT)
    assert not {pair.catalog for pair in parts["train"]} & set(HELD_OUT)
    held = {pair.english for pair in parts["held_out"]} | {pair.chinese for pair in parts["held_out"]}
    assert not any(pair.english in held or pair.chinese in held for pair in parts["train"])
    assert len(parts["train"]) > 20_000 and len(parts["held_out"]) > 5_000


def test_every_translated_message_is_read_plural_forms_included(parts):
    with (LOCALE_DIR / "gnupg2.mo").open("rb") as handle:
        raw = gettext.GNUTranslations(handle)
    plural = raw.ngettext(" (%d validity count cleared)\n", " (%d validity counts cleared)\n", 1).strip()
    pairs = {(pair.english, pair.chinese) for pair in read_catalog(LOCALE_DIR / "gnupg2.mo")}
    assert ("(%d validity count cleared)", plural) in pairs


def test_a_mnemonic_goes_from_both_sides_and_nothing_else_changes():
    with (LOCALE_DIR / "gtk30.mo").open("rb") as handle:
        raw = gettext.GNUTranslations(handle)._catalog
    marked = {key: value for key, value in raw.items() if isinstance(key, str) and re.search(r"[(（]_[A-Za-z]", value)}
    assert len(marked) > 20
    cleaned = {pair.english: pair.chinese for pair in read_catalog(LOCALE_DIR / "gtk30.mo")}
    for key in marked:
        english = " ".join(key.split("\x04")[-1].replace("_", "", 1).split())
        assert english in cleaned, key
        assert "(_" not in cleaned[english] and "（_" not in cleaned[english]
    assert cleaned.get("Cancel") == raw.get("_Cancel", "").replace("(_C)", "")


def test_placeholders_come_through_as_written_and_pairs_are_unique_and_bounded(parts):
    for catalog in ("gnupg2", "libc", "postgres-15"):
        with (LOCALE_DIR / f"{catalog}.mo").open("rb") as handle:
            raw = gettext.GNUTranslations(handle)._catalog
        raw_placeholders = {" ".join(k.split()): Counter(PRINTF.findall(k)) for k in raw if isinstance(k, str)}
        for pair in (p for p in parts["train"] if p.catalog == catalog):
            if pair.english in raw_placeholders:
                assert Counter(PRINTF.findall(pair.english)) == raw_placeholders[pair.english], pair
    keys = [(pair.english, pair.chinese) for pair in parts["train"]]
    assert len(keys) == len(set(keys))
    assert all(max(len(a), len(b)) <= MAX_CHARS and "\n" not in a + b for a, b in keys)


def test_the_recipe_mixes_the_catalogs_in_by_name_with_their_attribution(tmp_path, parts):
    from pathlib import Path

    from model.training.recipe import RecipeOptions, build

    data = Path(__file__).resolve().parents[3].parent / "shared" / "data"
    if not (data / "tatoeba-en-zh" / "train.tsv").is_file():
        pytest.skip("shared data missing")
    recipe = build(RecipeOptions(data=str(data), output=str(tmp_path), sources=("tatoeba", "catalogs"),
                                 weights={"tatoeba": 1, "catalogs": 1}))
    rows = [line.split("\t") for line in (tmp_path / "train.tsv").read_text(encoding="utf-8").splitlines()]
    from_catalogs = [row for row in rows if row[3] == "catalogs"]
    assert from_catalogs and all(row[2].startswith("gettext catalog ") for row in from_catalogs)
    assert not {row[2].removeprefix("gettext catalog ") for row in from_catalogs} & set(HELD_OUT)
    held = {pair.english for pair in parts["held_out"]}
    assert not any(row[0] in held for row in rows)
    (catalogs,) = [entry for entry in recipe["table"] if entry["source"] == "catalogs"]
    assert catalogs["kept"] == len(from_catalogs) and catalogs["licence"].startswith("each catalog")
