"""The state that outlives a replica (glossaries, document jobs): one SQL store that every replica on every node
shares, an embedded SQLite file on one machine or PostgreSQL on a cluster, named by a URL in the deployment's config.
Every query is parameterised; calls block, so the ingress runs them in a worker thread.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

logger = logging.getLogger("ray.serve")

SCHEMA = (
    """CREATE TABLE IF NOT EXISTS glossaries (
        glossary_id TEXT PRIMARY KEY,
        owner TEXT NOT NULL,
        name TEXT NOT NULL,
        source_lang TEXT NOT NULL,
        target_lang TEXT NOT NULL,
        creation_time TEXT NOT NULL,
        entry_count INTEGER NOT NULL,
        entries TEXT NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS glossaries_by_owner ON glossaries (owner)",
    """CREATE TABLE IF NOT EXISTS documents (
        document_id TEXT PRIMARY KEY,
        queue TEXT NOT NULL,
        key_digest TEXT NOT NULL,
        owner TEXT NOT NULL,
        status TEXT NOT NULL,
        filename TEXT NOT NULL,
        extension TEXT NOT NULL,
        source_lang TEXT,
        target_lang TEXT NOT NULL,
        glossary_id TEXT,
        created DOUBLE PRECISION NOT NULL,
        updated DOUBLE PRECISION NOT NULL,
        lease_owner TEXT,
        lease_until DOUBLE PRECISION,
        attempts INTEGER NOT NULL,
        segments_total INTEGER NOT NULL,
        segments_done INTEGER NOT NULL,
        billed_characters INTEGER NOT NULL,
        seconds_remaining INTEGER,
        error_message TEXT,
        expires DOUBLE PRECISION
    )""",
    "CREATE INDEX IF NOT EXISTS documents_by_status ON documents (queue, status, created)",
    # a document's upload, its saved segments and its result (BYTEA: PostgreSQL's bytes; SQLite stores them as given)
    """CREATE TABLE IF NOT EXISTS document_files (
        document_id TEXT NOT NULL,
        name TEXT NOT NULL,
        data BYTEA NOT NULL,
        PRIMARY KEY (document_id, name)
    )""",
    # bumped by every change, so that a replica's cache knows when to drop what it holds
    "CREATE TABLE IF NOT EXISTS generations (name TEXT PRIMARY KEY, value INTEGER NOT NULL)",
)


class StoreError(Exception):
    """The store's URL is malformed, or its database cannot be reached."""


class Store:
    """One connection to the shared database, serialised by a lock, reopened once when a call finds it broken
    (a PostgreSQL restart). Queries are written with `?` placeholders; PostgreSQL's driver gets `%s`."""

    def __init__(self, url: str) -> None:
        self.url = url
        parts = urlsplit(url)
        if parts.scheme == "sqlite":  # SQLAlchemy's form: sqlite:////absolute/path, sqlite:///relative/path
            path = unquote(url[len("sqlite:///") :]) if url.startswith("sqlite:///") else ""
            if not path:
                raise StoreError(f"a SQLite store is sqlite:////absolute/path or sqlite:///relative/path, not {url!r}")
            self.kind = "sqlite"
            self._path = Path(path).expanduser()
        elif parts.scheme in ("postgresql", "postgres"):
            self.kind = "postgresql"
            self._parts = parts
        else:
            raise StoreError(f"the store URL must start with sqlite:/// or postgresql://, not {url!r}")
        self._lock = threading.Lock()
        self._connection: Any = None

    def _connect(self) -> Any:
        if self.kind == "sqlite":
            self._path.parent.mkdir(parents=True, exist_ok=True)
            connection = sqlite3.connect(self._path, timeout=30, check_same_thread=False, isolation_level=None)
            connection.execute("PRAGMA journal_mode=WAL")  # readers in other processes do not wait on a writer
            connection.execute("PRAGMA busy_timeout=30000")
        else:
            import pg8000.dbapi

            parts = self._parts
            connection = pg8000.dbapi.connect(
                user=unquote(parts.username or "postgres"),
                password=unquote(parts.password) if parts.password else None,
                host=parts.hostname or "localhost",
                port=parts.port or 5432,
                database=unquote(parts.path.lstrip("/")) or None,
                timeout=30,
            )
            connection.autocommit = True
        for attempt in range(3):  # several replicas may create the tables at once on PostgreSQL
            try:
                for statement in SCHEMA:
                    connection.cursor().execute(statement)
                break
            except Exception:
                if attempt == 2:
                    raise
                time.sleep(0.2)
        return connection

    def _run(self, work: Any) -> Any:
        """`work` on the connection; a broken connection is reopened once, and any database error (unreachable,
        refused, no permission) is a StoreError, logged with what the database said."""
        with self._lock:
            for attempt in range(2):
                try:
                    if self._connection is None:
                        self._connection = self._connect()
                    return work(self._connection)
                except (sqlite3.Error, OSError, *self._driver_errors()) as error:
                    self._close()
                    if attempt == 1 or not self._broken(error):
                        logger.error("the %s store failed: %s", self.kind, error)
                        raise StoreError(f"the store ({self.kind}) is unavailable") from error
        raise AssertionError("unreachable")

    def _driver_errors(self) -> tuple[type[BaseException], ...]:
        if self.kind != "postgresql":
            return ()
        import pg8000.dbapi

        return (pg8000.dbapi.Error,)

    def _broken(self, error: BaseException) -> bool:
        """A lost connection, worth one reconnection (not a refusal that another try meets again)."""
        if self.kind == "postgresql":
            import pg8000.dbapi

            return isinstance(error, pg8000.dbapi.InterfaceError | OSError)
        return isinstance(error, OSError)

    def _close(self) -> None:
        if self._connection is not None:
            try:
                self._connection.close()
            except Exception:  # already broken: nothing to close
                pass
            self._connection = None

    def _sql(self, query: str) -> str:
        return query.replace("?", "%s") if self.kind == "postgresql" else query

    def rows(self, query: str, parameters: Sequence[Any] = ()) -> list[tuple]:
        """The rows a SELECT gives."""

        def work(connection: Any) -> list[tuple]:
            cursor = connection.cursor()
            cursor.execute(self._sql(query), tuple(parameters))
            return [tuple(row) for row in cursor.fetchall()]

        return self._run(work)

    def change(self, statements: Sequence[tuple[str, Sequence[Any]]], generation: str | None) -> list[int]:
        """Run `statements` in one transaction and bump the generation `generation` (None: none); the rows each
        changed."""

        def work(connection: Any) -> list[int]:
            cursor = connection.cursor()
            cursor.execute("BEGIN")
            try:
                counts = []
                for query, parameters in statements:
                    cursor.execute(self._sql(query), tuple(parameters))
                    counts.append(cursor.rowcount)
                if generation is not None:
                    cursor.execute(
                        self._sql(
                            "INSERT INTO generations (name, value) VALUES (?, 1) "
                            "ON CONFLICT (name) DO UPDATE SET value = generations.value + 1"
                        ),
                        (generation,),
                    )
                cursor.execute("COMMIT")
                return counts
            except BaseException:
                cursor.execute("ROLLBACK")
                raise

        return self._run(work)

    def generation(self, name: str) -> int:
        found = self.rows("SELECT value FROM generations WHERE name = ?", (name,))
        return int(found[0][0]) if found else 0

    def close(self) -> None:
        with self._lock:
            self._close()


__all__ = ["Store", "StoreError"]
