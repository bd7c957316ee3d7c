"""Document jobs: a row each in the shared store (service/store.py), their files beside it in the same store, so
that every replica on every node reaches both. A job is queued on upload, claimed by one replica's worker under a
lease it renews as it goes, and taken again, from the segments it had saved, by any worker once the lease runs out
or by one on the same machine as soon as the holder's process is gone. Deployments that share a store keep apart
by their queue's name.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
import socket
import time
import uuid
from dataclasses import dataclass

from service.errors import DocumentNotFoundError, DocumentNotReadyError
from service.store import Store

STATUSES = ("queued", "translating", "done", "error")
_ID = re.compile(r"^[0-9A-F]{32}$")
_COLUMNS = (
    "document_id, owner, status, filename, extension, source_lang, target_lang, glossary_id, created, attempts, "
    "segments_total, segments_done, billed_characters, seconds_remaining, error_message, key_digest"
)


@dataclass(frozen=True)
class Job:
    document_id: str
    owner: str
    status: str
    filename: str
    extension: str
    source_lang: str | None  # None: detected from the document
    target_lang: str
    glossary_id: str | None
    created: float
    attempts: int
    segments_total: int
    segments_done: int
    billed_characters: int
    seconds_remaining: int | None
    error_message: str | None
    key_digest: str

    def status_body(self) -> dict:
        """DeepL's document status object."""
        body: dict = {"document_id": self.document_id, "status": self.status}
        if self.status in ("queued", "translating"):
            body["seconds_remaining"] = self.seconds_remaining if self.seconds_remaining is not None else 1
        if self.status == "done":
            body["billed_characters"] = self.billed_characters
        if self.status == "error":
            body["error_message"] = self.error_message or "the document could not be translated"
        return body


def worker_name() -> str:
    """A worker's name in the store: its machine, its process and a nonce (a restarted process is another)."""
    return f"{socket.gethostname()}/{os.getpid()}/{uuid.uuid4().hex[:8]}"


def holder_gone(holder: str | None) -> bool:
    """Whether a lease's worker ran on this machine in a process that no longer exists (its lease need not run
    out before another worker takes the job)."""
    host, _, rest = (holder or "").partition("/")
    pid = rest.partition("/")[0]
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    return False


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


_UPSERT_FILE = (
    "INSERT INTO document_files (document_id, name, data) VALUES (?, ?, ?) "
    "ON CONFLICT (document_id, name) DO UPDATE SET data = excluded.data"
)


class DocumentJobs:
    """The jobs of one queue and their files. Every call blocks (the routes and the worker run them in a thread)."""

    def __init__(
        self, store: Store, queue: str, *, retention_s: float, lease_s: float, max_attempts: int,
        max_file_bytes: int, max_characters: int,
    ) -> None:
        self.store, self.queue = store, queue
        self.retention_s, self.lease_s, self.max_attempts = retention_s, lease_s, max_attempts
        self.max_file_bytes, self.max_characters = max_file_bytes, max_characters  # the upload's limits

    def _file(self, document_id: str, name: str) -> bytes | None:
        rows = self.store.rows(
            "SELECT data FROM document_files WHERE document_id = ? AND name = ?", (document_id, name)
        )
        return bytes(rows[0][0]) if rows else None

    @staticmethod
    def _drop_files(document_id: str, *names: str) -> tuple[str, tuple]:
        if not names:
            return "DELETE FROM document_files WHERE document_id = ?", (document_id,)
        marks = ", ".join("?" for _ in names)
        return f"DELETE FROM document_files WHERE document_id = ? AND name IN ({marks})", (document_id, *names)

    def _find(self, document_id: str) -> Job | None:
        if not _ID.match(document_id):
            return None
        rows = self.store.rows(
            f"SELECT {_COLUMNS} FROM documents WHERE document_id = ? AND queue = ?", (document_id, self.queue)
        )
        return Job(*rows[0]) if rows else None

    def _new(
        self, owner: str, status: str, filename: str, extension: str, source_lang: str | None, target_lang: str,
        glossary_id: str | None, segments_total: int, characters: int, **files: bytes,
    ) -> tuple[str, str]:
        """A new row and its files, in one transaction: (document_id, key)."""
        document_id, key = uuid.uuid4().hex.upper(), secrets.token_hex(32).upper()
        now = time.time()
        self.store.change([
            *((_UPSERT_FILE, (document_id, name, data)) for name, data in files.items()),
            ("INSERT INTO documents (document_id, queue, key_digest, owner, status, filename, extension, source_lang,"
             " target_lang, glossary_id, created, updated, attempts, segments_total, segments_done,"
             " billed_characters, expires) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0, ?, 0, ?, ?)",
             (document_id, self.queue, _digest(key), owner, status, filename, extension, source_lang, target_lang,
              glossary_id, now, now, segments_total, characters, now + self.retention_s)),
        ], None)
        return document_id, key

    # ---- the client's side -----------------------------------------------------------------
    def create(
        self, owner: str, filename: str, extension: str, data: bytes, source_lang: str | None, target_lang: str,
        glossary_id: str | None, segments_total: int, characters: int,
    ) -> tuple[str, str]:
        """A queued job for `data`: (document_id, document_key)."""
        return self._new(owner, "queued", filename, extension, source_lang, target_lang, glossary_id, segments_total,
                         characters, input=data)

    def store_result(self, owner: str, filename: str, extension: str, data: bytes, characters: int) -> tuple[str, str]:
        """A file translated in its request (LibreTranslate's /translate_file), kept for download like a done job's:
        (document_id, document_key)."""
        return self._new(owner, "done", filename, extension, None, "", None, 0, characters, output=data)

    def get(self, document_id: str, key: str, owner: str | None) -> Job:
        """The job, if `key` is its key and `owner` its owner (None: anyone's); else DocumentNotFoundError (nothing
        told apart)."""
        job = self._find(document_id)
        if job is None or not hmac.compare_digest(job.key_digest, _digest(key or "")):
            raise DocumentNotFoundError("Document not found")
        if owner is not None and job.owner != owner:
            raise DocumentNotFoundError("Document not found")
        return job

    def read_result(self, document_id: str, key: str) -> tuple[Job, bytes]:
        """A done job's file, kept for more downloads until it expires (a LibreTranslate link)."""
        job = self.get(document_id, key, None)
        data = self._file(document_id, "output") if job.status == "done" else None
        if data is None:
            raise DocumentNotFoundError("Document not found")
        return job, data

    def take_result(self, document_id: str, key: str, owner: str) -> tuple[Job, bytes]:
        """A done job's file, once: the job and its files are deleted as it is handed over."""
        job = self.get(document_id, key, owner)
        if job.status != "done":
            if job.status == "error":
                raise DocumentNotFoundError(f"Document translation failed: {job.error_message}")
            raise DocumentNotReadyError("Document not ready")
        data = self._file(document_id, "output")
        taken = self.store.change([
            ("DELETE FROM documents WHERE document_id = ? AND status = 'done'", (document_id,)),
            self._drop_files(document_id),
        ], None)
        if data is None or taken[0] != 1:  # another download took it first
            raise DocumentNotFoundError("Document not found")
        return job, data

    # ---- the worker's side -----------------------------------------------------------------
    def claim(self, worker: str) -> Job | None:
        """The oldest job that is queued, whose lease ran out, or whose worker's process is gone from this machine,
        now leased to `worker` (None: none)."""
        now = time.time()
        candidates = self.store.rows(
            "SELECT document_id, status, lease_owner, lease_until FROM documents WHERE queue = ? AND status IN "
            "('queued', 'translating') ORDER BY created LIMIT 32",
            (self.queue,),
        )
        for document_id, status, holder, until in candidates:
            if status == "translating" and until >= now and not holder_gone(holder):
                continue
            claimed = self.store.change([(
                "UPDATE documents SET status = 'translating', lease_owner = ?, lease_until = ?, "
                "attempts = attempts + 1, updated = ? WHERE document_id = ? AND status = ? AND "
                "COALESCE(lease_owner, '') = ?",
                (worker, now + self.lease_s, now, document_id, status, holder or ""),
            )], None)
            if claimed[0] != 1:
                continue  # another worker's
            job = self._find(document_id)
            if job is None:
                continue
            if job.attempts > self.max_attempts:
                self.fail(job, worker, f"the translation was interrupted {self.max_attempts} times")
                continue
            return job
        return None

    def renew(self, job: Job, worker: str, segments_done: int, seconds_remaining: int | None) -> bool:
        """Record progress and extend the lease; False when the job is no longer this worker's."""
        now = time.time()
        changed = self.store.change([(
            "UPDATE documents SET segments_done = ?, seconds_remaining = ?, lease_until = ?, updated = ? "
            "WHERE document_id = ? AND lease_owner = ? AND status = 'translating'",
            (segments_done, seconds_remaining, now + self.lease_s, now, job.document_id, worker),
        )], None)
        return changed[0] == 1

    def hold(self, job: Job, worker: str) -> bool:
        """Extend the lease alone (a heartbeat while a chunk decodes); False when the job is no longer this
        worker's."""
        now = time.time()
        changed = self.store.change([(
            "UPDATE documents SET lease_until = ? WHERE document_id = ? AND lease_owner = ? AND status = 'translating'",
            (now + self.lease_s, job.document_id, worker),
        )], None)
        return changed[0] == 1

    def finish(self, job: Job, worker: str, data: bytes) -> bool:
        """The job done with `data` its result, if it is still this worker's (one transaction)."""
        now = time.time()
        changed = self.store.change([
            ("UPDATE documents SET status = 'done', segments_done = segments_total, seconds_remaining = NULL, "
             "lease_owner = NULL, lease_until = NULL, updated = ?, expires = ? WHERE document_id = ? AND "
             "lease_owner = ? AND status = 'translating'",
             (now, now + self.retention_s, job.document_id, worker)),
            (_UPSERT_FILE, (job.document_id, "output", data)),
            self._drop_files(job.document_id, "input", "progress"),
        ], None)
        return changed[0] == 1

    def fail(self, job: Job, worker: str, message: str) -> None:
        now = time.time()
        self.store.change([
            ("UPDATE documents SET status = 'error', error_message = ?, seconds_remaining = NULL, lease_owner = NULL,"
             " lease_until = NULL, updated = ?, expires = ? WHERE document_id = ? AND lease_owner = ?",
             (message[:1000], now, now + self.retention_s, job.document_id, worker)),
            self._drop_files(job.document_id, "input", "progress"),
        ], None)

    def read_input(self, job: Job) -> bytes:
        data = self._file(job.document_id, "input")
        if data is None:
            raise DocumentNotFoundError("the document's upload is gone")
        return data

    def read_progress(self, job: Job) -> list[str]:
        """The translations of the segments done before (a job taken again goes on from them)."""
        data = self._file(job.document_id, "progress")
        try:
            return json.loads(data.decode("utf-8")) if data is not None else []
        except ValueError:
            return []

    def save_progress(self, job: Job, translations: list[str]) -> None:
        self.store.change(
            [(_UPSERT_FILE, (job.document_id, "progress", json.dumps(translations).encode("utf-8")))], None
        )

    def expire(self) -> int:
        """Delete the jobs past their retention time (done and never downloaded, failed, or abandoned)."""
        now = time.time()
        expired = self.store.rows(
            "SELECT document_id FROM documents WHERE queue = ? AND expires < ? AND status IN ('done', 'error')",
            (self.queue, now),
        )
        for (document_id,) in expired:
            self.store.change([
                ("DELETE FROM documents WHERE document_id = ? AND expires < ? AND status IN ('done', 'error')",
                 (document_id, now)),
                self._drop_files(document_id),
            ], None)
        return len(expired)


__all__ = ["STATUSES", "DocumentJobs", "Job", "holder_gone", "worker_name"]
