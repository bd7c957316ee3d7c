"""Documents against text requests: a .docx of N paragraphs through DeepL's document API (upload, status, result)
beside the same paragraphs as 16-text /v1/translate requests, on `serve run deploy/serve.yaml` (the shipped
models), alternating rounds; with --kill, an ingress replica (the colocated layout's translator) is killed while
each document decodes, and the document must still come back whole.

    python -m bench.documents --paragraphs 300 --rounds 3          # bench/results/documents-cpu.json
    python -m bench.documents --paragraphs 300 --rounds 2 --kill --output bench/results/documents-kill-cpu.json
"""

from __future__ import annotations

import argparse
import io
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import docx
import httpx

from bench import report_command
from bench.service import DEFAULT_DATA, RESULTS, bench_config, exit_on_sigterm, serve_running
from service.store import Store
from tests.harness.documents import word_file
from tests.harness.processes import command_line, free_port, session_pids

TEXTS_PER_REQUEST = 16


def paragraphs(path: Path, count: int) -> list[str]:
    """`count` paragraphs of two English sentences each, from a Tatoeba TSV (English, Chinese, attribution)."""
    english = [line.split("\t")[0].strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [f"{english[(2 * i) % len(english)]} {english[(2 * i + 1) % len(english)]}" for i in range(count)]


def as_requests(client: httpx.Client, texts: list[str]) -> list[str]:
    """The paragraphs as back-to-back 16-text /v1/translate requests (one stream, as one document is)."""
    out = []
    for start in range(0, len(texts), TEXTS_PER_REQUEST):
        body = {"texts": texts[start : start + TEXTS_PER_REQUEST], "source_lang": "en", "target_lang": "zh"}
        response = client.post("/v1/translate", json=body)
        response.raise_for_status()
        out += [t["text"] for t in response.json()["translations"]]
    return out


def ingress_pids(session: int) -> list[int]:
    return sorted(pid for pid in session_pids(session) if "ServeReplica:translate:Ingress" in command_line(pid))


def holder_pid(store_url: str, document_id: str) -> int | None:
    """The pid of the worker that holds the job, from the store (None before one does)."""
    store = Store(store_url)
    try:
        rows = store.rows("SELECT lease_owner FROM documents WHERE document_id = ?", (document_id,))
    finally:
        store.close()
    owner = rows[0][0] if rows else None
    return int(owner.split("/")[1]) if owner else None


def as_document(client: httpx.Client, data: bytes, store_url: str | None) -> tuple[list[str], dict]:
    """The paragraphs as one .docx job: upload, poll, download; with `store_url`, the ingress replica whose worker
    holds the job is killed two seconds in."""
    files = {"file": ("bench.docx", data, "application/octet-stream")}
    handle = client.post("/v2/document", data={"target_lang": "ZH", "source_lang": "EN"}, files=files).json()
    key = {"document_key": handle["document_key"]}
    killed, started = None, time.monotonic()
    while True:
        try:
            status = client.post(f"/v2/document/{handle['document_id']}", json=key)
        except httpx.TransportError:
            continue
        if status.status_code == 200:
            state = status.json()
            if state["status"] in ("done", "error"):
                break
            if store_url is not None and killed is None and time.monotonic() - started > 2.0:
                killed = holder_pid(store_url, handle["document_id"])
                if killed:
                    os.kill(killed, signal.SIGKILL)
        time.sleep(0.1)
    if state["status"] != "done":
        raise RuntimeError(f"the document ended as {state}")
    result = client.post(f"/v2/document/{handle['document_id']}/result", json=key)
    result.raise_for_status()
    texts = [p.text for p in docx.Document(io.BytesIO(result.content)).paragraphs]
    return texts, {"killed_pid": killed}


def wait_two_ingress(url: str, session: int, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if len(ingress_pids(session)) >= 2:
            try:
                if httpx.get(f"{url}/readyz", timeout=10).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
        time.sleep(1)
    raise RuntimeError("the killed ingress replica did not come back")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--paragraphs", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kill", action="store_true", help="kill an ingress replica while each document decodes")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--output", type=Path, default=RESULTS / "documents-cpu.json")
    args = parser.parse_args(argv)
    exit_on_sigterm()
    from model.runtime.extension import cpu_model

    texts = paragraphs(args.data, args.paragraphs)
    data = word_file(texts)
    sentences = 2 * len(texts)
    rounds: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="bench-documents-") as scratch:
        config = bench_config(free_port(), None, noop=False)
        store_url = f"sqlite:///{scratch}/state.db"
        config["applications"][0]["args"].update(store_url=store_url)
        started: list[int] = []
        with serve_running(config, Path(scratch), timeout_s=600, started=started) as url:
            with httpx.Client(base_url=url, timeout=600) as client:
                as_requests(client, texts[:32])  # warm both paths
                as_document(client, word_file(texts[:32]), None)
                for number in range(args.rounds):
                    order = ("document", "requests") if number % 2 else ("requests", "document")
                    row: dict = {}
                    for kind in order:
                        begin = time.perf_counter()
                        if kind == "requests":
                            row["requests_texts"] = as_requests(client, texts)
                        else:
                            row["document_texts"], facts = as_document(client, data, store_url if args.kill else None)
                            row.update(facts)
                        row[f"{kind}_s"] = time.perf_counter() - begin
                    if args.kill:
                        wait_two_ingress(url, started[0])
                    row["whole"] = len(row["document_texts"]) == len(texts) and all(row["document_texts"])
                    row["equal"] = row["document_texts"] == row.pop("requests_texts")
                    row.pop("document_texts")
                    rounds.append(row)
                    print(json.dumps(row), flush=True)
    document_rate = statistics.median(sentences / r["document_s"] for r in rounds)
    request_rate = statistics.median(sentences / r["requests_s"] for r in rounds)
    report = {
        "command": report_command("bench.documents", argv),
        "cpu_model": cpu_model(),
        "paragraphs": len(texts),
        "sentences": sentences,
        "kill": args.kill,
        "rounds": rounds,
        "document_sentences_per_s": round(document_rate, 1),
        "requests_sentences_per_s": round(request_rate, 1),
        "ratio": round(document_rate / request_rate, 3),
    }
    print(f"\n{'path':<34} {'sentences/s':>12}")
    print(f"{'.docx via /v2/document':<34} {document_rate:>12.1f}")
    print(f"{'16-text /v1/translate requests':<34} {request_rate:>12.1f}")
    print(f"ratio {report['ratio']:.2f}; every document whole: {all(r['whole'] for r in rounds)}; "
          f"equal to the requests' texts: {all(r['equal'] for r in rounds)}; CPU: {report['cpu_model']}")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {args.output}")
    return 0 if all(r["whole"] for r in rounds) else 1


if __name__ == "__main__":
    sys.exit(main())
