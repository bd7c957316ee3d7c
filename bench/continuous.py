"""Continuous vs static scheduling on `serve run deploy/serve.yaml`, one run: a table and bench/results JSON.

    python -m bench.continuous                 # both schedulers, shipped en-zh, dev sentences
    python -m bench.continuous --quick         # fewer requests (a smoke run)
    python -m bench.continuous --variants static continuous continuous:coalesce_max_calls=0
                                               # a variant is a scheduler, optionally with other service args
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from bench import machine, report_command
from bench.service import DEFAULT_DATA, RESULTS, bench_config, medians, read_sentences, serve_running
from tests.harness.loadgen import run_load, translate_bodies
from tests.harness.processes import free_port

REPOSITORY = Path(__file__).resolve().parents[1]

EN_ZH = {"source_lang": "en", "target_lang": "zh"}


def texts_for(sentences: list[str], rng: random.Random) -> tuple[list[str], list[str]]:
    """Short texts (≤ 8 words) and long ones (dev sentences joined to 40-60 words)."""
    short = [s for s in sentences if len(s.split()) <= 8]
    long = []
    pool = [s for s in sentences if len(s.split()) > 6]
    while len(long) < 100:
        parts, words = [], 0
        while words < 40:
            sentence = rng.choice(pool)
            parts.append(sentence)
            words += len(sentence.split())
        if words <= 60:
            long.append(" ".join(parts))
    return short, long


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(1000 * ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))], 1)


async def open_loop(url: str, arrivals: list[tuple[float, str, str]], beam_size: int) -> dict[str, Any]:
    """POST each (time, class, text) at its time; latency per class."""
    latencies: dict[str, list[float]] = {"short": [], "long": []}
    statuses: dict[str, int] = {}
    started = time.perf_counter()
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:

        async def one(at: float, kind: str, text: str) -> None:
            await asyncio.sleep(max(0.0, started + at - time.perf_counter()))
            sent = time.perf_counter()
            body = {**EN_ZH, "texts": [text], "beam_size": beam_size, "split_sentences": False}
            response = await client.post(f"{url}/v1/translate", json=body)
            statuses[str(response.status_code)] = statuses.get(str(response.status_code), 0) + 1
            if response.status_code == 200:
                latencies[kind].append(time.perf_counter() - sent)

        await asyncio.gather(*(one(*arrival) for arrival in arrivals))
    wall = time.perf_counter() - started
    return {
        "wall_s": round(wall, 2),
        "texts_per_s": round(sum(len(v) for v in latencies.values()) / wall, 2),
        "statuses": statuses,
        **{f"{kind}_p50_ms": percentile(values, 50) for kind, values in latencies.items()},
        **{f"{kind}_p99_ms": percentile(values, 99) for kind, values in latencies.items()},
    }


async def first_token_ms(url: str, text: str, concurrency: int, rounds: int) -> float | None:
    """Median time from sending a greedy stream request to its first token event, `concurrency` at once."""
    waits: list[float] = []
    async with httpx.AsyncClient(timeout=120) as client:

        async def one() -> None:
            sent = time.perf_counter()
            body = {**EN_ZH, "texts": [text], "beam_size": 1}
            first = None
            async with client.stream("POST", f"{url}/v1/translate/stream", json=body) as response:
                async for line in response.aiter_lines():  # read to the end: the result event closes it
                    if first is None and line.startswith("event: token"):
                        first = time.perf_counter() - sent
            if first is not None:
                waits.append(first)

        for _ in range(rounds):
            await asyncio.gather(*(one() for _ in range(concurrency)))
    return percentile(waits, 50)


def engine_translator():
    """The shipped en-zh engine on the CPU, one thread: what the --engine-only comparisons decode with."""
    import torch

    from model import Translator

    torch.set_num_threads(1)
    return Translator.from_pretrained("en-zh", device="cpu")


def engine_comparison(translator, sentences: list[str], beam_size: int, rounds: int = 5) -> dict[str, Any]:
    """The engine alone, no service: 32 dev sentences decoded by the static search in one batch, and submitted
    together to the continuous scheduler, one thread, both on the translator's step (the compiled decode loop where
    it builds); best of `rounds` each, seconds."""
    from model import DecodingOptions
    from model.decoding.scheduler import Scheduler
    from model.decoding.search import beam_search

    ids = translator.encode_source(sentences[:32])
    options = DecodingOptions(beam_size=beam_size)
    timings: dict[str, list[float]] = {"static": [], "continuous": []}
    for _ in range(rounds):
        started = time.perf_counter()
        beam_search(translator.model, ids, options, return_attention=True, step=translator.step)
        timings["static"].append(time.perf_counter() - started)
        scheduler = Scheduler(translator.model, max_rows=32 * beam_size, step=translator.step)
        for source in ids:
            scheduler.submit(source, options, return_attention=True)
        started = time.perf_counter()
        scheduler.run()
        timings["continuous"].append(time.perf_counter() - started)
    best = {name: round(min(values), 4) for name, values in timings.items()}
    return {**best, "ratio": round(best["static"] / best["continuous"], 2), "sentences": len(ids)}


def closed_loop_comparison(
    translator, sentences: list[str], beam_size: int, rounds: int = 5, texts: int = 192, outstanding: int = 16
) -> dict[str, Any]:
    """The engine alone in bench.service's closed-loop scenario, one replica's share of it: `texts` dev sentences,
    static = the search over batches of `outstanding` (what the static queue forms at concurrency 32 over two
    replicas), continuous = the scheduler (max_rows 64) with `outstanding` sources in flight, a new one submitted
    as each finishes. CPU ms per text, median and best over `rounds` alternating rounds, and where the continuous
    scheduler's time goes (its step's phases, ms per text, in the median round)."""
    import statistics

    import model.decoding.scheduler as scheduler_module
    from model import DecodingOptions
    from model.decoding.search import beam_search

    ids = translator.encode_source(sentences[:texts])
    options = DecodingOptions(beam_size=beam_size)

    def static() -> None:
        for begin in range(0, len(ids), outstanding):
            beam_search(translator.model, ids[begin : begin + outstanding], options, return_attention=True,
                        step=translator.step)

    def continuous(phases: dict[str, float]) -> None:
        scheduler = scheduler_module.Scheduler(
            translator.model, max_rows=64, alignment_head=translator.alignment_head, step=translator.step
        )

        def timed(name: str, function):
            def run(*args, **kwargs):
                started = time.process_time()
                try:
                    return function(*args, **kwargs)
                finally:
                    phases[name] = phases.get(name, 0.0) + time.process_time() - started
            return run

        scheduler._admit = timed("admit (encoder, join)", scheduler._admit)
        scheduler.loop = _TimedLoop(scheduler.loop, timed)  # its step is one call: decoder, search, row moves
        queue, in_flight = list(ids), 0
        while queue or in_flight:
            while queue and in_flight < outstanding:
                scheduler.submit(queue.pop(0), options, return_attention=True)
                in_flight += 1
            in_flight -= len(scheduler.step())

    cpu_ms: dict[str, list[float]] = {"static": [], "continuous": []}
    phases_per_round: list[dict[str, float]] = []
    for round_ in range(rounds):
        order = ("static", "continuous") if round_ % 2 == 0 else ("continuous", "static")
        for name in order:
            started = time.process_time()
            if name == "static":
                static()
            else:
                phases: dict[str, float] = {}
                continuous(phases)
                phases_per_round.append(phases)
            cpu_ms[name].append(1000 * (time.process_time() - started) / len(ids))
    middle = sorted(range(rounds), key=lambda r: cpu_ms["continuous"][r])[rounds // 2]
    median = {name: round(statistics.median(values), 2) for name, values in cpu_ms.items()}
    best = {name: round(min(values), 2) for name, values in cpu_ms.items()}
    return {
        "texts": len(ids),
        "outstanding": outstanding,
        "cpu_ms_per_text_median": median,
        "cpu_ms_per_text_best": best,
        "throughput_ratio_median": round(median["static"] / median["continuous"], 2),
        "throughput_ratio_best": round(best["static"] / best["continuous"], 2),
        "continuous_phases_ms_per_text": {
            name: round(1000 * seconds / len(ids), 2) for name, seconds in phases_per_round[middle].items()
        },
    }


class _TimedLoop:
    """The decode loop (compiled or Python) with its `step` timed as one phase (decoder, search and row moves)."""

    def __init__(self, loop, timed) -> None:
        self._loop = loop
        self.step = timed("loop step (decoder, search, rows)", loop.step)

    def __getattr__(self, name: str):
        return getattr(self._loop, name)


def parse_variant(spec: str) -> tuple[str, dict[str, Any]]:
    """The spec "continuous:coalesce_max_calls=0,max_rows=128" → (the spec, {"scheduler": "continuous", ...});
    values are read as YAML scalars (numbers, booleans, strings)."""
    scheduler, _, rest = spec.partition(":")
    if scheduler not in ("static", "continuous"):
        raise SystemExit(f"variant {spec!r}: the scheduler is static or continuous")
    overrides: dict[str, Any] = {"scheduler": scheduler}
    for item in filter(None, rest.split(",")):
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"variant {spec!r}: {item!r} is not arg=value")
        overrides[key] = yaml.safe_load(value)
    return spec, overrides


def mixed_arrivals(short: list[str], long: list[str], rate: float, count: int, seed: int) -> list:
    rng = random.Random(seed)
    at, arrivals = 0.0, []
    for _ in range(count):
        at += rng.expovariate(rate)
        kind = "long" if rng.random() < 0.25 else "short"
        arrivals.append((at, kind, rng.choice(long if kind == "long" else short)))
    return arrivals


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--load", type=float, default=0.7, help="arrival rate as a share of static capacity")
    parser.add_argument("--beam-size", type=int, default=4)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every variant, alternating; medians")
    parser.add_argument(
        "--variants",
        nargs="+",
        default=["static", "continuous"],
        help="scheduler[:arg=value,...] per service (args of deploy/serve.yaml's application); the first is the "
        "baseline the ratios divide by and sets the arrival rate",
    )
    parser.add_argument(
        "--engine-only", action="store_true", help="only the engine comparison (no service), to --output"
    )
    parser.add_argument("--output", type=Path, default=RESULTS / "continuous-cpu.json")
    args = parser.parse_args(argv)
    sentences = read_sentences(args.data, 1000)
    if args.engine_only:
        result = {"command": report_command("bench.continuous"), "beam_size": args.beam_size}
        translator = engine_translator()
        result["engine"] = engine_comparison(translator, sentences, args.beam_size)
        print(f"engine alone, 32 sentences together, beam {args.beam_size}: {result['engine']}")
        rounds = max(args.rounds, 5)
        result["closed_loop"] = closed_loop_comparison(translator, sentences, args.beam_size, rounds=rounds)
        closed = result["closed_loop"]
        print(
            f"engine alone, closed loop ({closed['outstanding']} in flight, {closed['texts']} texts), CPU ms per "
            f"text median / best: static {closed['cpu_ms_per_text_median']['static']} / "
            f"{closed['cpu_ms_per_text_best']['static']}, continuous {closed['cpu_ms_per_text_median']['continuous']}"
            f" / {closed['cpu_ms_per_text_best']['continuous']}; throughput continuous/static "
            f"{closed['throughput_ratio_median']}× (best {closed['throughput_ratio_best']}×)"
        )
        print("continuous, where a text's CPU goes (ms, median round):", closed["continuous_phases_ms_per_text"])
        result["alone"] = closed_loop_comparison(translator, sentences, args.beam_size, rounds, texts=48, outstanding=1)
        alone = result["alone"]
        print(
            f"engine alone, one text at a time ({alone['texts']} texts), CPU ms per text median / best: static "
            f"{alone['cpu_ms_per_text_median']['static']} / {alone['cpu_ms_per_text_best']['static']}, continuous "
            f"{alone['cpu_ms_per_text_median']['continuous']} / {alone['cpu_ms_per_text_best']['continuous']}"
        )
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
        return 0
    rng = random.Random(0)
    short, long = texts_for(sentences, rng)
    mixed_count, closed_count, alone_count = (60, 100, 20) if args.quick else (300, 400, 100)
    report: dict[str, Any] = {
        "command": report_command("bench.continuous"),
        "machine": machine(),
        "beam_size": args.beam_size,
        "load": args.load,
        "schedulers": {},
    }
    rate = None
    variants = [parse_variant(spec) for spec in args.variants]
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in variants}
    for round_ in range(args.rounds):
        # rotate which variant goes first: a drift in the machine's speed then favours none; the arrival rate
        # comes from the baseline's capacity, so it goes first in the first round
        order = variants[round_ % len(variants) :] + variants[: round_ % len(variants)]
        for name, overrides in order:
            config = bench_config(free_port(), None)
            config["applications"][0]["args"].update(overrides)
            with tempfile.TemporaryDirectory(prefix="bench-continuous-") as scratch:
                with serve_running(config, Path(scratch)) as url:
                    result: dict[str, Any] = {}
                    warm = translate_bodies(short, 1, beam_size=args.beam_size)
                    asyncio.run(run_load(f"{url}/v1/translate", warm, 32, 8))
                    if rate is None:  # the baseline's capacity on the mix: closed loop, the same texts
                        mix = [rng.choice(long) if i % 4 == 0 else rng.choice(short) for i in range(64)]
                        bodies = translate_bodies(mix, 1, beam_size=args.beam_size, split_sentences=False)
                        capacity = asyncio.run(run_load(f"{url}/v1/translate", bodies, 64, 32)).summary()
                        rate = args.load * capacity["texts_per_s"]
                        report["static_mixed_capacity_texts_per_s"] = capacity["texts_per_s"]
                        report["arrival_rate_per_s"] = round(rate, 2)
                    arrivals = mixed_arrivals(short, long, rate, mixed_count, seed=1 + round_)
                    result["mixed"] = asyncio.run(open_loop(url, arrivals, args.beam_size))
                    bodies = translate_bodies(sentences, 1, beam_size=args.beam_size)
                    closed = asyncio.run(run_load(f"{url}/v1/translate", bodies, closed_count, 32)).summary()
                    result["closed"] = closed
                    alone = translate_bodies(short, 1, beam_size=args.beam_size, split_sentences=False)
                    result["alone"] = asyncio.run(run_load(f"{url}/v1/translate", alone, alone_count, 1)).summary()
                    if overrides["scheduler"] == "continuous":
                        text = short[0]
                        result["first_token_ms"] = {
                            "concurrency_1": asyncio.run(first_token_ms(url, text, 1, 10)),
                            "concurrency_32": asyncio.run(first_token_ms(url, text, 32, 2)),
                        }
                    runs[name].append(result)
            print(
                f"round {round_ + 1}/{args.rounds} {name}: short p50 {result['mixed']['short_p50_ms']} ms, "
                f"closed {result['closed']['texts_per_s']} texts/s",
                flush=True,
            )
    report["rounds"] = args.rounds
    report["variants"] = {name: overrides for name, overrides in variants}
    report["schedulers"] = {name: medians(results) for name, results in runs.items()}
    report["per_round"] = runs
    baseline = variants[0][0]

    def ratio(a: float | None, b: float | None) -> float | None:
        return round(a / b, 2) if a and b else None

    def ratios(variant: dict[str, Any], base: dict[str, Any]) -> dict[str, float | None]:
        return {
            "short_p50": ratio(variant["mixed"]["short_p50_ms"], base["mixed"]["short_p50_ms"]),
            "short_p99": ratio(variant["mixed"]["short_p99_ms"], base["mixed"]["short_p99_ms"]),
            "long_p50": ratio(variant["mixed"]["long_p50_ms"], base["mixed"]["long_p50_ms"]),
            "mixed_throughput": ratio(variant["mixed"]["texts_per_s"], base["mixed"]["texts_per_s"]),
            "closed_throughput": ratio(variant["closed"]["texts_per_s"], base["closed"]["texts_per_s"]),
        }

    others = [name for name, _ in variants[1:]]
    report["ratios"] = {name: ratios(report["schedulers"][name], report["schedulers"][baseline]) for name in others}
    report["ratios_per_round"] = {
        name: [ratios(v, b) for v, b in zip(runs[name], runs[baseline], strict=True)] for name in others
    }
    print_table(report)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return 0


def print_table(report: dict[str, Any]) -> None:
    print(f"arrival rate {report['arrival_rate_per_s']}/s ({report['load']:.0%} of static's mixed capacity)")
    print(
        "| scheduler | short p50 ms | short p99 ms | long p50 ms | mixed texts/s | closed c32 texts/s "
        "| short alone p50 ms |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, result in report["schedulers"].items():
        mixed, closed, alone = result["mixed"], result["closed"], result["alone"]
        print(
            f"| {name} | {mixed['short_p50_ms']} | {mixed['short_p99_ms']} | {mixed['long_p50_ms']} "
            f"| {mixed['texts_per_s']} | {closed['texts_per_s']} | {alone['p50_ms']} |"
        )
    baseline = next(iter(report["schedulers"]))
    for name, ratios in report["ratios"].items():
        print(f"{name} / {baseline}: {ratios}")
    for name, result in report["schedulers"].items():
        if result.get("first_token_ms"):
            print(f"{name}, first streamed token (greedy, median ms): {result['first_token_ms']}")


if __name__ == "__main__":
    sys.exit(main())
