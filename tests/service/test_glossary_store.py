"""The glossary store on its two databases: an embedded SQLite file and a real PostgreSQL (the one .ci/run starts,
named by TRANSLATE_TEST_POSTGRES_URL). Two Glossaries objects on one URL are two replicas; a new one after the
first is closed is a restart.
"""

from __future__ import annotations

import threading
import uuid

import pytest

from service.errors import GlossaryNotFoundError, GlossaryTooLargeError, InvalidGlossaryError
from service.glossaries import MAX_ENTRIES_BYTES, Glossaries, owner_of, parse_entries
from service.store import Store, StoreError

ENTRIES = parse_entries("cat\t猫\ntea ceremony\t茶道\n", "tsv")


def owner() -> str:
    return owner_of(f"key-{uuid.uuid4()}")  # a fresh key per test: the PostgreSQL database is shared


def test_a_glossary_outlives_a_restart_and_every_replica_reads_it(store_url):
    me = owner()
    first = Glossaries(Store(store_url))
    made = first.create(me, "UI terms", "en", "zh", ENTRIES)
    first.store.close()
    for replica in (Glossaries(Store(store_url)), Glossaries(Store(store_url))):
        found = replica.get(me, made.glossary_id)
        assert found.entries == ENTRIES and found.info() == made.info()
        assert [g["glossary_id"] for g in replica.list(me)] == [made.glossary_id]


def test_a_replica_that_cached_a_glossary_sees_another_replica_delete_it(store_url):
    me = owner()
    one, two = Glossaries(Store(store_url)), Glossaries(Store(store_url))
    made = one.create(me, "g", "en", "zh", ENTRIES)
    assert one.get(me, made.glossary_id).entries == ENTRIES  # now in one's cache
    two.delete(me, made.glossary_id)
    with pytest.raises(GlossaryNotFoundError):
        one.get(me, made.glossary_id)
    with pytest.raises(GlossaryNotFoundError):
        two.delete(me, made.glossary_id)


def test_a_glossary_belongs_to_the_key_that_made_it(store_url):
    me, other = owner(), owner()
    glossaries = Glossaries(Store(store_url))
    made = glossaries.create(me, "mine", "en", "zh", ENTRIES)
    assert glossaries.list(other) == []
    with pytest.raises(GlossaryNotFoundError):
        glossaries.get(other, made.glossary_id)
    with pytest.raises(GlossaryNotFoundError):
        glossaries.delete(other, made.glossary_id)
    assert glossaries.get(me, made.glossary_id).name == "mine"


def test_replicas_creating_at_once_lose_nothing(store_url):
    me = owner()
    replicas = [Glossaries(Store(store_url)) for _ in range(4)]
    made: list[str] = []

    def create(replica: Glossaries, index: int) -> None:
        for round_ in range(5):
            made.append(replica.create(me, f"g{index}-{round_}", "en", "zh", ENTRIES).glossary_id)

    threads = [threading.Thread(target=create, args=(r, i)) for i, r in enumerate(replicas)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(g["glossary_id"] for g in replicas[0].list(me)) == sorted(made) and len(made) == 20


def test_names_and_entries_are_stored_as_given_through_parameterised_queries(store_url):
    me = owner()
    glossaries = Glossaries(Store(store_url))
    hostile = parse_entries("'); DROP TABLE glossaries; --\t引号\nRobert'); --\t鲍比\n", "tsv")
    made = glossaries.create(me, "x'); DELETE FROM glossaries; --", "en", "zh", hostile)
    assert glossaries.get(me, made.glossary_id).entries == hostile
    assert glossaries.list(me)[0]["name"] == "x'); DELETE FROM glossaries; --"


@pytest.mark.parametrize(
    ("entries", "entries_format", "problem"),
    [
        ("cat\t猫\ncat\t猫咪", "tsv", "repeats the source term"),
        ("cat\t", "tsv", "target term is empty"),
        ("\t猫", "tsv", "source term is empty"),
        ("cat 猫", "tsv", "one tab"),
        ("cat\t猫\tmore", "tsv", "one tab"),
        ('"cat,猫', "csv", "malformed"),
        ("cat,猫,en", "csv", "source,target"),
        ("", "tsv", "no entries"),
        ("cat\t猫", "xlsx", "tsv or csv"),
    ],
)
def test_bad_entries_are_refused_with_what_is_wrong(entries, entries_format, problem):
    with pytest.raises(InvalidGlossaryError, match=problem):
        parse_entries(entries, entries_format)


def test_csv_entries_follow_rfc_4180_and_may_name_their_languages():
    assert parse_entries('"tea, green",绿茶\n"say ""hi""",打招呼,en,zh\n', "csv") == (
        ("tea, green", "绿茶"),
        ('say "hi"', "打招呼"),
    )


def test_entries_past_ten_mebibytes_are_refused():
    big = "x" * (MAX_ENTRIES_BYTES // 2) + "\t" + "y" * (MAX_ENTRIES_BYTES // 2 + 1)
    with pytest.raises(GlossaryTooLargeError):
        parse_entries(big, "tsv")


def test_a_store_url_of_another_kind_is_refused():
    with pytest.raises(StoreError):
        Store("mysql://localhost/x")
    with pytest.raises(StoreError):
        Store("sqlite://")


def test_an_unreachable_database_is_a_store_error_not_a_crash():
    glossaries = Glossaries(Store("postgresql://nobody@127.0.0.1:1/none"))
    with pytest.raises(StoreError, match="unavailable"):
        glossaries.list(owner())
