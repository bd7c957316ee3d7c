"""The document worker each ingress replica runs: it claims queued jobs (or jobs whose replica was lost), sends
their segments through the translation path the compatibility routes use, a chunk at a time so that the
paragraphs of a document decode together, and saves each chunk before it renews its lease.
"""

from __future__ import annotations

import asyncio
import logging
import time

from service.compat.backend import TranslationBackend
from service.compat.translation import detect_texts, translate_texts
from service.documents.formats import Document, DocumentError, Segment, markup_text, read_document
from service.documents.jobs import DocumentJobs, Job
from service.errors import (
    DocumentNotFoundError,
    GlossaryNotFoundError,
    InvalidParameterError,
    ModelNotServedError,
    OverloadedError,
    RequestTimeoutError,
    StoreUnavailableError,
    describe,
)
from service.store import StoreError

logger = logging.getLogger("ray.serve")

CHUNK_SEGMENTS = 32  # segments sent together, then saved: what a lost replica's successor does again at most
DETECTION_CHARS = 2000  # the document's first characters its language is detected from
TRANSIENT_RETRIES = 5  # a chunk refused for load or timed out is sent again this many times, a pause between
RETRY_PAUSE_S = 1.0
EXPIRY_EVERY_S = 60.0

# A refusal that says something about the document (its language, its glossary): the job fails with it.
DOCUMENT_FAULTS = (ModelNotServedError, GlossaryNotFoundError, InvalidParameterError, DocumentNotFoundError)


async def translate_segments(
    backend: TranslationBackend, segments: list[Segment], source: str, target: str, glossary
) -> list[str]:
    """Each segment's translation, the plain ones and the HTML ones each in one call of translate_texts."""
    out: list[str] = [""] * len(segments)
    groups = [[i for i, s in enumerate(segments) if s.html == html] for html in (False, True)]

    async def run(indices: list[int], html: bool) -> None:
        if indices:
            results = await translate_texts(
                backend, [segments[i].text for i in indices], source, target, html=html, glossary=glossary
            )
            for i, result in zip(indices, results, strict=True):
                out[i] = result.text

    await asyncio.gather(run(groups[0], False), run(groups[1], True))
    return out


async def translate_document(
    backend: TranslationBackend, segments: list[Segment], source: str, target: str, glossary,
    done: list[str] | None = None, saved=None, retries: int = TRANSIENT_RETRIES,
) -> list[str] | None:
    """Every segment's translation, CHUNK_SEGMENTS at a time from those `done` before; after each chunk,
    `saved(done)` (a coroutine function) records them, and a False from it stops the work (None is returned).
    A chunk refused for load or time is sent again `retries` times."""
    done = list(done or [])
    while len(done) < len(segments):
        chunk = segments[len(done) : len(done) + CHUNK_SEGMENTS]
        send = lambda chunk=chunk: translate_segments(backend, chunk, source, target, glossary)  # noqa: E731
        done += await _with_retries(send, retries)
        if saved is not None and not await saved(done):
            return None
    return done


async def _with_retries(send, retries: int):
    """send(), again (`retries` times) after a pause while it is refused for load, times out or finds no replica
    (503, 504)."""
    for attempt in range(retries + 1):
        try:
            return await send()
        except Exception as error:
            if attempt == retries or isinstance(error, DOCUMENT_FAULTS):
                raise
            transient = isinstance(error, OverloadedError | RequestTimeoutError) or describe(error)[0] in (503, 504)
            if not transient:
                raise
            logger.warning("document chunk refused (%s); sending it again", type(error).__name__)
            await asyncio.sleep(RETRY_PAUSE_S * (attempt + 1))


class DocumentWorker:
    """Claims and translates jobs, `slots` at a time, until the replica ends."""

    def __init__(self, jobs: DocumentJobs, backend: TranslationBackend, name: str, slots: int, poll_s: float):
        self.jobs, self.backend, self.name, self.slots, self.poll_s = jobs, backend, name, slots, poll_s
        self._wake = asyncio.Event()
        self._running: set[asyncio.Task] = set()
        self._expired_at = 0.0

    def wake(self) -> None:
        """A job was queued: look now rather than at the next poll."""
        self._wake.set()

    async def run(self) -> None:
        while True:
            try:
                await self._claim_all()
                if time.monotonic() - self._expired_at > EXPIRY_EVERY_S:
                    self._expired_at = time.monotonic()
                    await asyncio.to_thread(self.jobs.expire)
            except StoreError as error:
                logger.warning("document worker: the store is unavailable (%s)", error)
            except Exception:
                logger.exception("document worker: unexpected error")
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), self.poll_s)
            except asyncio.TimeoutError:
                pass

    async def _claim_all(self) -> None:
        while len(self._running) < self.slots:
            job = await asyncio.to_thread(self.jobs.claim, self.name)
            if job is None:
                return
            task = asyncio.get_running_loop().create_task(self._translate(job))
            self._running.add(task)
            task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task) -> None:
        self._running.discard(task)
        self._wake.set()  # a slot is free

    async def _translate(self, job: Job) -> None:
        heartbeat = asyncio.get_running_loop().create_task(self._hold(job))
        try:
            await self._translate_job(job)
        except DocumentError as error:
            await self._fail(job, str(error))
        except DOCUMENT_FAULTS as error:
            await self._fail(job, getattr(error, "message", str(error)))
        except (StoreError, StoreUnavailableError) as error:  # the lease runs out and a worker takes it again
            logger.warning("document %s: the store failed (%s); it will be taken again", job.document_id, error)
        except asyncio.CancelledError:
            raise
        except Exception as error:
            logger.exception("document %s failed", job.document_id)
            await self._fail(job, f"internal error ({type(error).__name__})")
        finally:
            heartbeat.cancel()

    async def _hold(self, job: Job) -> None:
        """Keep the lease while the job is worked on, a third of it at a time (a slow chunk does not lose it)."""
        while True:
            await asyncio.sleep(self.jobs.lease_s / 3)
            try:
                if not await asyncio.to_thread(self.jobs.hold, job, self.name):
                    return
            except StoreError as error:
                logger.warning("document %s: could not renew its lease (%s)", job.document_id, error)

    async def _fail(self, job: Job, message: str) -> None:
        try:
            await asyncio.to_thread(self.jobs.fail, job, self.name, message)
        except StoreError as error:
            logger.warning("document %s: could not record its failure (%s)", job.document_id, error)

    async def _translate_job(self, job: Job) -> None:
        data = await asyncio.to_thread(self.jobs.read_input, job)
        document: Document = await asyncio.to_thread(read_document, data, job.extension)
        done = await asyncio.to_thread(self.jobs.read_progress, job)
        glossary = None
        if job.glossary_id:
            glossary = await asyncio.to_thread(self.backend.glossaries.get, job.owner, job.glossary_id)
        source = job.source_lang or await detect_language(self.backend, document)
        segments = document.segments
        started, at_start = time.monotonic(), len(done)

        async def saved(translations: list[str]) -> bool:
            await asyncio.to_thread(self.jobs.save_progress, job, translations)
            rate = (len(translations) - at_start) / max(time.monotonic() - started, 1e-3)
            remaining = round((len(segments) - len(translations)) / rate) if rate > 0 else None
            if await asyncio.to_thread(self.jobs.renew, job, self.name, len(translations), remaining):
                return True
            logger.warning("document %s: its lease went to another worker; leaving it", job.document_id)
            return False

        translations = await translate_document(self.backend, segments, source, job.target_lang, glossary, done, saved)
        if translations is not None:
            output = await asyncio.to_thread(document.render, translations)
            await asyncio.to_thread(self.jobs.finish, job, self.name, output)


async def detect_language(backend: TranslationBackend, document: Document) -> str:
    """The language of the document's first DETECTION_CHARS characters, among the served ones."""
    sample = " ".join(markup_text(s.text) if s.html else s.text for s in document.segments)[:DETECTION_CHARS]
    return (await detect_texts(backend, [sample]))[0][0].language


__all__ = ["CHUNK_SEGMENTS", "DocumentWorker", "detect_language", "translate_document", "translate_segments"]
