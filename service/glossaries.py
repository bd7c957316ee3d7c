"""Glossaries: a client's term pairs for one language pair, made, read and deleted as DeepL's v2 glossary API
does, kept in the shared store (service/store.py) and cached by each replica until any glossary changes. With
API keys on, a glossary belongs to the key that made it.
"""

from __future__ import annotations

import csv
import hashlib
import io
import threading
import unicodedata
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

from service.errors import GlossaryNotFoundError, GlossaryTooLargeError, InvalidGlossaryError
from service.store import Store

# DeepL's limits: 10 MiB of entries, 1,024 UTF-8 bytes per term and per name, 1,000 glossaries per account.
MAX_ENTRIES_BYTES = 10 * 1024 * 1024
MAX_TERM_BYTES = 1024
MAX_NAME_BYTES = 1024
MAX_GLOSSARIES_PER_OWNER = 1000
MAX_INLINE_ENTRIES = 1000  # /v1's "glossary" object
ENTRIES_FORMATS = ("tsv", "csv")
GENERATION = "glossaries"


@dataclass(frozen=True)
class Glossary:
    glossary_id: str
    name: str
    source_lang: str
    target_lang: str
    creation_time: str  # ISO 8601, UTC, as DeepL writes it
    entries: tuple[tuple[str, str], ...]

    def info(self) -> dict:
        """DeepL's GlossaryInfo object."""
        return {
            "glossary_id": self.glossary_id,
            "name": self.name,
            "ready": True,
            "source_lang": self.source_lang,
            "target_lang": self.target_lang,
            "creation_time": self.creation_time,
            "entry_count": len(self.entries),
        }

    def tsv(self) -> str:
        return "\n".join(f"{source}\t{target}" for source, target in self.entries)


def owner_of(key: str | None) -> str:
    """Who owns what a request makes: a digest of its API key (never the key), or "" with keys off."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:32] if key else ""


def _term(text: str, index: int, side: str) -> str:
    term = text.strip()
    if not term:
        raise InvalidGlossaryError(f"entry {index + 1}: the {side} term is empty")
    if len(term.encode("utf-8")) > MAX_TERM_BYTES:
        raise InvalidGlossaryError(f"entry {index + 1}: the {side} term is over {MAX_TERM_BYTES} UTF-8 bytes")
    if any(unicodedata.category(c) in ("Cc", "Zl", "Zp") for c in term):
        raise InvalidGlossaryError(f"entry {index + 1}: the {side} term holds a control character or line break")
    return term


def checked_entries(pairs: list[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """Entries as DeepL accepts them: terms trimmed, none empty, none too long, every source term once."""
    if not pairs:
        raise InvalidGlossaryError("the glossary has no entries")
    seen: dict[str, int] = {}
    checked = []
    for index, (source, target) in enumerate(pairs):
        source, target = _term(source, index, "source"), _term(target, index, "target")
        if source in seen:
            first = seen[source] + 1
            raise InvalidGlossaryError(f"entry {index + 1} repeats the source term of entry {first}: {source!r}")
        seen[source] = index
        checked.append((source, target))
    return tuple(checked)


def parse_entries(entries: str, entries_format: str) -> tuple[tuple[str, str], ...]:
    """DeepL's entry formats: TSV (source<TAB>target per line) or CSV (source,target[,source_lang,target_lang],
    quoted as RFC 4180 quotes); blank lines are skipped."""
    if entries_format not in ENTRIES_FORMATS:
        raise InvalidGlossaryError(f"entries_format must be tsv or csv, not {entries_format!r}")
    if len(entries.encode("utf-8")) > MAX_ENTRIES_BYTES:
        raise GlossaryTooLargeError(f"glossary entries are limited to {MAX_ENTRIES_BYTES} bytes")
    pairs = []
    if entries_format == "tsv":
        for number, line in enumerate(entries.splitlines(), 1):
            if not line.strip():
                continue
            fields = line.split("\t")
            if len(fields) != 2:
                raise InvalidGlossaryError(f"line {number}: a TSV entry is a source and a target term split by one tab")
            pairs.append((fields[0], fields[1]))
    else:
        try:
            rows = list(csv.reader(io.StringIO(entries), strict=True))
        except csv.Error as error:
            raise InvalidGlossaryError(f"the CSV entries are malformed: {error}") from None
        for number, row in enumerate(rows, 1):
            if not row or all(not field.strip() for field in row):
                continue
            if len(row) not in (2, 4):
                raise InvalidGlossaryError(
                    f"line {number}: a CSV entry is source,target or source,target,source_lang,target_lang"
                )
            pairs.append((row[0], row[1]))
    return checked_entries(pairs)


class Glossaries:
    """The glossaries in the store, with this replica's cache of those it has read."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._cache: dict[tuple[str, str], Glossary] = {}
        self._generation = -1

    def create(self, owner: str, name: str, source_lang: str, target_lang: str, entries: tuple) -> Glossary:
        if not name.strip():
            raise InvalidGlossaryError("the glossary name must not be empty")
        if len(name.encode("utf-8")) > MAX_NAME_BYTES:
            raise InvalidGlossaryError(f"the glossary name is over {MAX_NAME_BYTES} UTF-8 bytes")
        count = self.store.rows("SELECT COUNT(*) FROM glossaries WHERE owner = ?", (owner,))[0][0]
        if count >= MAX_GLOSSARIES_PER_OWNER:
            raise GlossaryTooLargeError(f"at most {MAX_GLOSSARIES_PER_OWNER} glossaries per API key")
        created = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        glossary = Glossary(str(uuid.uuid4()), name, source_lang, target_lang, created, entries)
        row = (owner, name, source_lang, target_lang, created, len(entries), glossary.tsv())
        self.store.change(
            [
                (
                    "INSERT INTO glossaries (glossary_id, owner, name, source_lang, target_lang, creation_time, "
                    "entry_count, entries) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (glossary.glossary_id, *row),
                )
            ],
            GENERATION,
        )
        return glossary

    def _fresh(self) -> None:
        generation = self.store.generation(GENERATION)
        with self._lock:
            if generation != self._generation:
                self._cache.clear()
                self._generation = generation

    def get(self, owner: str, glossary_id: str) -> Glossary:
        """The owner's glossary (GlossaryNotFoundError for another owner's, as for one that does not exist)."""
        self._fresh()
        with self._lock:
            cached = self._cache.get((owner, glossary_id))
        if cached is not None:
            return cached
        rows = self.store.rows(
            "SELECT name, source_lang, target_lang, creation_time, entries FROM glossaries "
            "WHERE glossary_id = ? AND owner = ?",
            (glossary_id, owner),
        )
        if not rows:
            raise GlossaryNotFoundError("Glossary not found")
        name, source_lang, target_lang, created, tsv = rows[0]
        entries = tuple(tuple(line.split("\t", 1)) for line in tsv.splitlines())
        glossary = Glossary(glossary_id, name, source_lang, target_lang, created, entries)
        with self._lock:
            self._cache[(owner, glossary_id)] = glossary
        return glossary

    def list(self, owner: str) -> list[dict]:
        rows = self.store.rows(
            "SELECT glossary_id, name, source_lang, target_lang, creation_time, entry_count FROM glossaries "
            "WHERE owner = ? ORDER BY creation_time, glossary_id",
            (owner,),
        )
        keys = ("glossary_id", "name", "source_lang", "target_lang", "creation_time", "entry_count")
        return [{**dict(zip(keys, row, strict=True)), "ready": True} for row in rows]

    def delete(self, owner: str, glossary_id: str) -> None:
        (deleted,) = self.store.change(
            [("DELETE FROM glossaries WHERE glossary_id = ? AND owner = ?", (glossary_id, owner))], GENERATION
        )
        if deleted == 0:
            raise GlossaryNotFoundError("Glossary not found")


__all__ = [
    "ENTRIES_FORMATS",
    "Glossaries",
    "Glossary",
    "MAX_ENTRIES_BYTES",
    "MAX_GLOSSARIES_PER_OWNER",
    "MAX_INLINE_ENTRIES",
    "MAX_NAME_BYTES",
    "MAX_TERM_BYTES",
    "checked_entries",
    "owner_of",
    "parse_entries",
]
