"""Document jobs on the running service when replicas die: a 160-paragraph .docx (five chunks) finishes, every
paragraph translated as /v2/translate translates it, when a translator replica is killed under it, and when the
ingress replica whose worker holds the job is killed (another replica's worker takes it over from its saved
segments). bench/documents.py measures the 300-paragraph case's speed."""

from __future__ import annotations

import io
import os
import signal
import time
from urllib.parse import urlsplit

import docx
import httpx
import pytest

from service.store import Store
from tests.harness.documents import word_file
from tests.harness.replica_processes import replica_pids, serving_replicas

pytestmark = pytest.mark.slow

SENTENCES = ["I like tea.", "The cat sat on the mat.", "We went to school today.", "Is the river cold?",
             "Thank you very much.", "Where is the station?"]
PARAGRAPHS = [f"{SENTENCES[i % len(SENTENCES)]} {SENTENCES[(i * 7 + 3) % len(SENTENCES)]}" for i in range(160)]


def upload(client: httpx.Client) -> dict:
    files = {"file": ("long.docx", word_file(PARAGRAPHS), "application/octet-stream")}
    response = client.post("/v2/document", data={"target_lang": "ZH", "source_lang": "EN"}, files=files)
    assert response.status_code == 200, response.text
    return response.json()


def wait_for(client: httpx.Client, handle: dict, states: tuple[str, ...], timeout_s: float = 300) -> dict:
    """Poll the status until it is one of `states` (a poll that meets a replica as it dies is polled again)."""
    deadline, found = time.monotonic() + timeout_s, None
    while time.monotonic() < deadline:
        try:
            response = client.post(
                f"/v2/document/{handle['document_id']}", json={"document_key": handle["document_key"]}
            )
        except httpx.TransportError:
            response = None
        if response is not None and response.status_code not in (502, 503):
            assert response.status_code == 200, response.text
            found = response.json()
            if found["status"] in states:
                return found
        time.sleep(0.1)
    raise AssertionError(f"the document did not reach {states} in {timeout_s:.0f} s: {found}")


def assert_every_paragraph_translated(client: httpx.Client, handle: dict) -> None:
    result = client.post(f"/v2/document/{handle['document_id']}/result", json={"document_key": handle["document_key"]})
    assert result.status_code == 200, result.text
    paragraphs = [p.text for p in docx.Document(io.BytesIO(result.content)).paragraphs]
    expected = []
    for start in range(0, len(PARAGRAPHS), 50):
        answer = client.post("/v2/translate", json={"text": PARAGRAPHS[start : start + 50], "source_lang": "EN",
                                                    "target_lang": "ZH"})
        expected += [t["text"] for t in answer.json()["translations"]]
    assert paragraphs == expected


def test_a_long_docx_finishes_whole_while_a_translator_replica_is_killed(service_url, client):
    port = urlsplit(service_url).port
    victim = serving_replicas(service_url, port, "translator-en-zh")[0]
    handle = upload(client)
    wait_for(client, handle, ("translating", "done"))
    os.kill(victim, signal.SIGKILL)
    assert wait_for(client, handle, ("done", "error"))["status"] == "done"
    assert_every_paragraph_translated(client, handle)
    assert victim not in serving_replicas(service_url, port, "translator-en-zh")  # both back for later tests


def job_row(serve_instance: dict, document_id: str) -> dict:
    """The job's row in the application's store: the worker holding it (its pid), attempts, progress."""
    store = Store(serve_instance["config"]["applications"][0]["args"]["store_url"])
    try:
        ((owner, attempts, done, state),) = store.rows(
            "SELECT lease_owner, attempts, segments_done, status FROM documents WHERE document_id = ?", (document_id,)
        )
    finally:
        store.close()
    return {"pid": int(owner.split("/")[1]) if owner else 0, "attempts": attempts, "done": done, "status": state}


def test_a_document_whose_ingress_replica_dies_is_taken_over_from_its_saved_segments(serve_instance, client):
    service_url = serve_instance["url"]
    port = urlsplit(service_url).port
    serving_replicas(service_url, port, "Ingress")
    handle = upload(client)
    deadline = time.monotonic() + 120
    while (row := job_row(serve_instance, handle["document_id"]))["done"] < 32:  # a chunk saved
        assert row["status"] in ("queued", "translating") and time.monotonic() < deadline, row
        time.sleep(0.05)
    assert row["attempts"] == 1 and row["pid"] in replica_pids(port, "translate", "Ingress")
    os.kill(row["pid"], signal.SIGKILL)
    assert wait_for(client, handle, ("done", "error"))["status"] == "done"
    assert job_row(serve_instance, handle["document_id"])["attempts"] == 2  # taken over once, by the other worker
    assert_every_paragraph_translated(client, handle)
    serving_replicas(service_url, port, "Ingress")  # both back for later tests
