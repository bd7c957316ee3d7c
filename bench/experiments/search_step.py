"""Beam search's candidate ranking: the runtime's `row_topk` against torch.topk, on one thread, same inputs.

    python -m bench.experiments.search_step              # writes bench/results/search-step-cpu.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from bench import machine, report_command
from model.runtime.extension import compiled_extension

REPOSITORY = Path(__file__).resolve().parents[2]

VOCABULARY = json.loads((REPOSITORY / "model" / "pretrained" / "en-zh" / "config.json").read_text())["vocab_size"]


def wall_ms(function: Callable[[], object], calls: int) -> float:
    """Milliseconds per call of `function`, over `calls` calls after ten to warm up."""
    for _ in range(10):
        function()
    start = time.perf_counter()
    for _ in range(calls):
        function()
    return (time.perf_counter() - start) / calls * 1e3


def measure(rows: int, m: int, rounds: int, calls: int) -> dict:
    row_topk = compiled_extension().row_topk
    generator = torch.Generator().manual_seed(rows)
    scores = torch.randn(rows, VOCABULARY, generator=generator).log_softmax(-1)
    expected, got = torch.topk(scores, m, dim=1), row_topk(scores, m)
    if not (torch.equal(expected.values, got[0]) and torch.equal(expected.indices, got[1])):
        raise SystemExit(f"row_topk differs from torch.topk at {rows} rows")
    timings: dict[str, list[float]] = {"torch.topk": [], "row_topk": []}
    for _ in range(rounds):
        timings["torch.topk"].append(wall_ms(lambda: torch.topk(scores, m, dim=1), calls) * 1e3)
        timings["row_topk"].append(wall_ms(lambda: row_topk(scores, m), calls) * 1e3)
    medians = {name: statistics.median(values) for name, values in timings.items()}
    return {"rows": rows, "m": m, "us": {k: round(v, 1) for k, v in medians.items()},
            "speedup": round(medians["torch.topk"] / medians["row_topk"], 2)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16, 32, 64])
    parser.add_argument("--beam-size", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--output", default=str(REPOSITORY / "bench" / "results" / "search-step-cpu.json"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    results = [measure(rows, 2 * args.beam_size, args.rounds, args.calls) for rows in args.rows]
    print(f"ranking the {2 * args.beam_size} best of {VOCABULARY} per row, 1 thread")
    print("| rows | torch.topk µs | row_topk µs | speed-up |")
    print("|---|---|---|---|")
    for result in results:
        us = result["us"]
        print(f"| {result['rows']} | {us['torch.topk']} | {us['row_topk']} | {result['speedup']}x |")
    report = {
        "command": report_command("bench.experiments.search_step"),
        "machine": machine(threads=torch.get_num_threads(), torch=torch.__version__),
        "vocabulary": VOCABULARY,
        "results": results,
    }
    Path(args.output).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
