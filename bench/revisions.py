"""The service as the working tree has it against the service at a git revision, side by side in one run.

    python -m bench.revisions HEAD~1                  # 3 rounds, the working tree's deploy/serve.yaml for both
    python -m bench.revisions 293c0d3 --rounds 5 --output /tmp/ab.json
    python -m bench.revisions HEAD~1 --scheduler continuous   # both sides with args.scheduler: continuous
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx

from bench import machine, report_command
from bench.service import DEFAULT_DATA, RESULTS, bench_config, read_sentences, serve_running
from tests.harness.loadgen import run_load, translate_bodies
from tests.harness.processes import free_port
from tests.harness.prometheus_text import total

REPOSITORY = Path(__file__).resolve().parents[1]

MODEL = "en-zh"


def queue_figures(before: str, after: str) -> dict[str, float | None]:
    """Between two scrapes: the batch queue's mean wait per text (ms) and texts per batch (en-zh, all replicas)."""

    def grown(name: str) -> float:
        return total(after, name, model=MODEL) - total(before, name, model=MODEL)

    waits = grown("translation_batch_queue_wait_seconds_sum")
    texts = grown("translation_batch_size_sum")
    batches = grown("translation_batch_size_count")
    return {
        "queue_wait_ms_per_text": round(1000 * waits / texts, 2) if texts else None,
        "texts_per_batch": round(texts / batches, 2) if batches else None,
    }


def measure(url: str, sentences: list[str], beam_size: int) -> dict[str, Any]:
    """One service's figures: single texts alone, then the closed loop (see the module's docstring)."""
    endpoint = f"{url}/v1/translate"
    bodies = translate_bodies(sentences, 1, beam_size=beam_size)
    asyncio.run(run_load(endpoint, bodies, 32, 8))  # warm up
    scrapes = [httpx.get(f"{url}/metrics", timeout=30).text]
    alone = asyncio.run(run_load(endpoint, bodies, 60, 1)).summary()
    scrapes.append(httpx.get(f"{url}/metrics", timeout=30).text)
    closed = asyncio.run(run_load(endpoint, bodies, 400, 32)).summary()
    scrapes.append(httpx.get(f"{url}/metrics", timeout=30).text)
    if alone["lost"] or closed["lost"]:
        raise RuntimeError(f"requests were lost: alone {alone}, closed loop {closed}")
    return {
        "alone": {"p50_ms": alone["p50_ms"], "p95_ms": alone["p95_ms"], **queue_figures(*scrapes[0:2])},
        "closed": {
            "texts_per_s": closed["texts_per_s"], "p50_ms": closed["p50_ms"], "p99_ms": closed["p99_ms"],
            **queue_figures(*scrapes[1:3]),
        },
    }


def median_of(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Each figure's median over rounds (None where no round has it: the continuous scheduler has no batch queue)."""

    def median(values: list[float]) -> float | None:
        return statistics.median(values) if values else None

    return {
        phase: {key: median([r[phase][key] for r in rounds if r[phase][key] is not None]) for key in rounds[0][phase]}
        for phase in rounds[0]
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("revision", help="the git revision to compare the working tree against, e.g. HEAD~1")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--beam-size", type=int, default=4)
    parser.add_argument("--scheduler", choices=["static", "continuous"], help="args.scheduler on both sides")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--output", type=Path, default=RESULTS / "revisions-cpu.json")
    args = parser.parse_args(argv)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", args.revision], cwd=REPOSITORY, check=True, capture_output=True, text=True
    ).stdout.strip()
    sentences = read_sentences(args.data, 1000)
    runs: dict[str, list[dict[str, Any]]] = {"revision": [], "working tree": []}
    with tempfile.TemporaryDirectory(prefix="bench-revision-") as scratch:
        checkout = Path(scratch) / "checkout"
        subprocess.run(["git", "worktree", "add", "--detach", str(checkout), commit], cwd=REPOSITORY, check=True,
                       capture_output=True)
        try:
            for round_ in range(args.rounds):
                order = ("revision", "working tree") if round_ % 2 == 0 else ("working tree", "revision")
                for side in order:
                    repository = checkout if side == "revision" else REPOSITORY
                    # each side as it ships (its own deploy/serve.yaml), without no-op apps it may not have
                    config = bench_config(free_port(), None, noop=False, source=repository / "deploy" / "serve.yaml")
                    if args.scheduler:
                        config["applications"][0]["args"]["scheduler"] = args.scheduler
                    with tempfile.TemporaryDirectory(prefix="bench-serve-") as workdir:
                        with serve_running(config, Path(workdir), repository=repository) as url:
                            result = measure(url, sentences, args.beam_size)
                    runs[side].append(result)
                    print(f"round {round_ + 1}/{args.rounds} {side}: {json.dumps(result)}", flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(checkout)], cwd=REPOSITORY, check=False)
    medians = {side: median_of(results) for side, results in runs.items()}
    report = {
        "command": report_command("bench.revisions"),
        "machine": machine(),
        "revision": commit,
        "beam_size": args.beam_size,
        "scheduler": args.scheduler or "as deploy/serve.yaml",
        "rounds": args.rounds,
        "medians": medians,
        "per_round": runs,
    }
    print(f"\n| {MODEL}, beam {args.beam_size}, median of {args.rounds} | revision {commit} | working tree | ratio |")
    print("|---|---|---|---|")
    for phase, figures in medians["revision"].items():
        for key, before in figures.items():
            after = medians["working tree"][phase][key]
            ratio = f"{after / before:.2f}×" if before and after is not None else ""
            print(f"| {phase} {key} | {before} | {after} | {ratio} |")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
