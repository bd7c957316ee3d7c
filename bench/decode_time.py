"""CPU time per text of one shipped model's decodes in a timed loop: the before/after measure of a runtime change.

    python -m bench.decode_time                                   # en-zh int8, beam 4, B=1 and B=16, 8 s each
    python -m bench.decode_time --models en-zh zh-en --dtype float32 --seconds 20
    python -m bench.decode_time --agreement       # also: the agreed alignment computed after each decode

Run it alternately from two checkouts (the older one's runtime built apart with TRANSLATE_RUNTIME_BUILD_DIR) and
compare pair by pair: this machine's noise moves a single run by more than most changes. The collector's
generations are frozen after loading, as a service replica does (service/deployments.py).
"""

from __future__ import annotations

import argparse
import gc
import time

import torch

from bench import machine, report_command, write_report
from bench.fidelity import DEFAULT_DEV, DIRECTIONS, dev_rows
from model.translator import Translator

REVERSE = {"en-zh": "zh-en", "zh-en": "en-zh"}


def time_decodes(translator: Translator, source_ids: list[list[int]], batch_size: int, beam_size: int,
                 seconds: float) -> dict:
    """Decode `source_ids` in batches, round after round, for at least `seconds` of CPU time."""
    batches = [source_ids[i : i + batch_size] for i in range(0, len(source_ids), batch_size)]
    for batch in batches[:2]:  # warm-up: kernels chosen, oneDNN primitives made
        translator.generate(batch, beam_size=beam_size)
    started, wall, texts, i = time.process_time(), time.perf_counter(), 0, 0
    while time.process_time() - started < seconds:
        batch = batches[i % len(batches)]
        translator.generate(batch, beam_size=beam_size)
        texts, i = texts + len(batch), i + 1
    cpu, wall = time.process_time() - started, time.perf_counter() - wall
    return {"texts": texts, "cpu_ms_per_text": 1000 * cpu / texts, "texts_per_s": texts / wall}


def time_agreement(translator: Translator, reverse: Translator, texts: list[str], batch_size: int,
                   beam_size: int, seconds: float) -> dict:
    """CPU time per text of `alignment_method` "agreement" after a batch's decode (`Translator.with_agreements`,
    the batch's forced decodes of the reverse model sharing batches), for at least `seconds` of CPU time."""
    batches = [texts[i : i + batch_size] for i in range(0, len(texts), batch_size)]
    decoded = [translator.translate(batch, beam_size=beam_size) for batch in batches[:8]]
    started, count, i = time.process_time(), 0, 0
    while time.process_time() - started < seconds:
        translator.with_agreements(decoded[i % len(decoded)], reverse)
        count, i = count + len(decoded[i % len(decoded)]), i + 1
    return {"texts": count, "cpu_ms_per_text": 1000 * (time.process_time() - started) / count}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["en-zh"], choices=sorted(DIRECTIONS))
    parser.add_argument("--dtype", default="int8", choices=["float32", "int8"])
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 16])
    parser.add_argument("--beam-size", type=int, default=4)
    parser.add_argument("--texts", type=int, default=256, help="dev sentences cycled through")
    parser.add_argument("--seconds", type=float, default=8.0, help="CPU seconds per setting")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--dev", default=str(DEFAULT_DEV))
    parser.add_argument("--agreement", action="store_true", help="also time the agreed alignment after the decodes "
                        "(the reverse shipped model loaded beside)")
    parser.add_argument("--output", help="JSON path (default bench/results/decode-time-cpu.json)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = dev_rows(args.dev)
    report = {
        "command": report_command("bench.decode_time", argv),
        "machine": machine(threads=args.threads),
        "versions": {"torch": torch.__version__},
        "dtype": args.dtype, "beam_size": args.beam_size, "results": {},
    }
    print(f"CPU: {report['machine']['cpu']}, {args.threads} thread(s); {args.dtype}, beam {args.beam_size}\n")
    print("| model | runtime | batch | texts | CPU ms per text | texts/s |\n|---|---|---|---|---|---|")
    for name in args.models:
        translator = Translator.from_pretrained(name, device="cpu", dtype=args.dtype)
        source_ids = [translator.tokenizer.encode_source(row[DIRECTIONS[name][0]]) for row in rows[: args.texts]]
        gc.freeze()
        for size in args.batch_sizes:
            result = time_decodes(translator, source_ids, size, args.beam_size, args.seconds)
            result["runtime"] = translator.runtime_info["runtime"]
            report["results"][f"{name} B={size}"] = result
            print(f"| {name} | {result['runtime']} | {size} | {result['texts']} | {result['cpu_ms_per_text']:.2f} "
                  f"| {result['texts_per_s']:.1f} |")
            if args.agreement:
                reverse = Translator.from_pretrained(REVERSE[name], device="cpu")
                texts = [row[DIRECTIONS[name][0]] for row in rows[: args.texts]]
                agreed = time_agreement(translator, reverse, texts, size, args.beam_size, args.seconds)
                report["results"][f"{name} B={size} agreement afterwards"] = agreed
                print(f"| {name} | + agreement afterwards | {size} | {agreed['texts']} "
                      f"| {agreed['cpu_ms_per_text']:.2f} | |")
    print()
    write_report(report, args.output, "decode-time-cpu.json")


if __name__ == "__main__":
    main()
