"""Document jobs on the two stores (an embedded SQLite file and a real PostgreSQL): two DocumentJobs on one store
and queue are two replicas, a new one a restart (the upload, the saved segments and the result live in the store)."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
import uuid

import pytest

from service.documents.jobs import DocumentJobs, holder_gone, worker_name
from service.errors import DocumentNotFoundError, DocumentNotReadyError
from service.store import Store


def replica(store_url: str, queue: str, lease_s: float = 60, max_attempts: int = 3, retention_s: float = 3600):
    return DocumentJobs(
        Store(store_url), queue, retention_s=retention_s, lease_s=lease_s, max_attempts=max_attempts,
        max_file_bytes=2**20, max_characters=10_000,
    )


def fresh_queue() -> str:
    return f"test-{uuid.uuid4().hex}"  # a queue of its own: the PostgreSQL database is shared with the services


def files_of(store_url: str, document_id: str) -> list[str]:
    store = Store(store_url)
    try:
        return sorted(name for (name,) in store.rows(
            "SELECT name FROM document_files WHERE document_id = ?", (document_id,)))
    finally:
        store.close()


def queued(jobs: DocumentJobs, owner: str = "") -> tuple[str, str]:
    return jobs.create(owner, "notes.txt", ".txt", b"One.\nTwo.\n", "en", "zh", None, 2, 8)


def test_an_accepted_job_outlives_a_restart_and_is_claimed_once(store_url):
    queue = fresh_queue()
    document_id, key = queued(replica(store_url, queue))
    one, two = replica(store_url, queue), replica(store_url, queue)  # after the restart: two replicas
    claims: list = []
    threads = [threading.Thread(target=lambda jobs=jobs: claims.append(jobs.claim(str(id(jobs))))) for jobs in
               (one, two)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(job is None for job in claims) == [False, True]
    (job,) = [job for job in claims if job is not None]
    assert job.document_id == document_id and one.read_input(job) == b"One.\nTwo.\n"
    assert one.get(document_id, key, "").status == "translating"


def test_a_lost_workers_job_is_taken_again_from_its_saved_segments(store_url):
    queue = fresh_queue()
    lost, successor = replica(store_url, queue, lease_s=0.5), replica(store_url, queue, lease_s=0.5)
    document_id, key = queued(lost)
    job = lost.claim("lost")
    lost.save_progress(job, ["一。"])
    assert lost.renew(job, "lost", 1, 3)
    assert successor.claim("successor") is None  # the lease holds
    time.sleep(0.7)  # the lost worker never renews
    again = successor.claim("successor")
    assert again is not None and again.attempts == 2 and again.segments_done == 1
    assert successor.read_progress(again) == ["一。"]
    assert not lost.renew(job, "lost", 2, 0)  # the lost worker, if it comes back, finds the job taken
    assert successor.finish(again, "successor", "一。\n二。\n".encode())
    _, data = successor.take_result(document_id, key, "")
    assert data == "一。\n二。\n".encode()


def test_a_job_interrupted_too_often_ends_as_error(store_url):
    queue = fresh_queue()
    jobs = replica(store_url, queue, lease_s=0.2, max_attempts=2)
    document_id, key = queued(jobs)
    for worker in ("a", "b"):
        assert jobs.claim(worker) is not None
        time.sleep(0.3)
    assert jobs.claim("c") is None
    status = jobs.get(document_id, key, "").status_body()
    assert status["status"] == "error" and "interrupted 2 times" in status["error_message"]


def test_a_result_is_handed_over_once_and_only_with_its_key_and_owner(store_url):
    jobs = replica(store_url, fresh_queue())
    document_id, key = queued(jobs, owner="alice")
    with pytest.raises(DocumentNotReadyError):
        jobs.take_result(document_id, key, "alice")
    job = jobs.claim("w")
    jobs.finish(job, "w", b"done")
    for wrong_key, owner in ((key.lower()[::-1], "alice"), (key, "bob"), ("", "alice")):
        with pytest.raises(DocumentNotFoundError):
            jobs.get(document_id, wrong_key, owner)
    results: list = []

    def take() -> None:
        try:
            results.append(jobs.take_result(document_id, key, "alice")[1])
        except DocumentNotFoundError:
            results.append(None)

    threads = [threading.Thread(target=take) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results, key=lambda r: r is None) == [b"done", None, None]
    assert files_of(store_url, document_id) == []


def test_a_finished_document_never_downloaded_is_deleted_after_its_retention(store_url):
    queue = fresh_queue()
    jobs = replica(store_url, queue, retention_s=0.2)
    document_id, key = queued(jobs)
    jobs.finish(jobs.claim("w"), "w", b"done")
    time.sleep(0.3)
    assert files_of(store_url, document_id) == ["output"]  # the upload went when it was done
    assert jobs.expire() == 1
    assert files_of(store_url, document_id) == []
    with pytest.raises(DocumentNotFoundError):
        jobs.get(document_id, key, "")


def test_another_queues_jobs_are_never_taken_nor_seen(store_url):
    mine, theirs = replica(store_url, fresh_queue()), replica(store_url, fresh_queue())
    document_id, key = queued(theirs)
    assert mine.claim("w") is None
    with pytest.raises(DocumentNotFoundError):
        mine.get(document_id, key, "")


def test_a_job_whose_worker_process_died_on_this_machine_is_taken_before_its_lease_runs_out(store_url):
    queue = fresh_queue()
    jobs = replica(store_url, queue, lease_s=600)
    queued(jobs)
    exited = subprocess.Popen([sys.executable, "-c", "pass"])
    exited.wait()
    gone = f"{socket.gethostname()}/{exited.pid}/0"
    assert jobs.claim(gone) is not None and holder_gone(gone)
    alive = worker_name()  # this process
    assert not holder_gone(alive) and not holder_gone(f"another-host/{exited.pid}/0")
    taken = jobs.claim(alive)
    assert taken is not None and taken.attempts == 2
    assert jobs.claim("third") is None  # its new holder lives
