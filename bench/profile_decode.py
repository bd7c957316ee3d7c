"""Where a decode's CPU time goes: torch.profiler over Translator.generate on a shipped model, per ATen operator.

    python -m bench.profile_decode                          # en-zh, fp32, beam 4, B=1 and B=16, one thread
    python -m bench.profile_decode --dtype int8 --batch-sizes 16
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

from bench import machine, report_command, write_report
from bench.fidelity import DEFAULT_DEV, DIRECTIONS, dev_rows
from model.translator import Translator

TOP = 12  # operators shown per setting


def profile_setting(translator: Translator, source_ids: list[list[int]], batch_size: int, beam_size: int) -> dict:
    batches = [source_ids[i : i + batch_size] for i in range(0, len(source_ids), batch_size)]
    for batch in batches[:2]:  # warm-up
        translator.generate(batch, beam_size=beam_size)
    started = time.process_time()
    for batch in batches:
        translator.generate(batch, beam_size=beam_size)
    cpu_ms_per_text = 1000 * (time.process_time() - started) / len(source_ids)
    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        for batch in batches:
            translator.generate(batch, beam_size=beam_size)
    events = sorted(profiler.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in events) or 1
    return {
        "cpu_ms_per_text": cpu_ms_per_text,
        "operators": [
            {"name": e.key, "share": e.self_cpu_time_total / total, "calls": e.count,
             "self_ms": e.self_cpu_time_total / 1000}
            for e in events[:TOP]
        ],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="en-zh", choices=sorted(DIRECTIONS))
    parser.add_argument("--dtype", default="float32", choices=["float32", "int8"])
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 16])
    parser.add_argument("--beam-size", type=int, default=4)
    parser.add_argument("--texts", type=int, default=32, help="dev sentences decoded per setting")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--dev", default=str(DEFAULT_DEV))
    parser.add_argument("--output", help="JSON path (default bench/results/profile-decode-cpu.json)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    translator = Translator.from_pretrained(args.model, device="cpu", dtype=args.dtype)
    source_column = DIRECTIONS[args.model][0]
    rows = dev_rows(args.dev)
    source_ids = [translator.tokenizer.encode_source(row[source_column]) for row in rows[: args.texts]]
    report = {
        "command": report_command("bench.profile_decode", argv),
        "machine": machine(),
        "versions": {"torch": torch.__version__},
        "model": args.model, "dtype": args.dtype, "runtime": translator.runtime_info["runtime"],
        "beam_size": args.beam_size, "threads": args.threads, "texts": len(source_ids), "settings": {},
    }
    print(f"CPU: {report['machine']['cpu']}, {args.threads} thread(s); {args.model} {args.dtype} "
          f"({report['runtime']} runtime), beam {args.beam_size}, {len(source_ids)} dev texts")
    for size in args.batch_sizes:
        setting = profile_setting(translator, source_ids, size, args.beam_size)
        report["settings"][f"B={size}"] = setting
        print(f"\nB={size}: {setting['cpu_ms_per_text']:.1f} CPU ms per text\n")
        print("| operator | share of self CPU | calls | self ms |\n|---|---|---|---|")
        for op in setting["operators"]:
            print(f"| {op['name']} | {100 * op['share']:.1f}% | {op['calls']} | {op['self_ms']:.1f} |")
    print()
    write_report(report, args.output, "profile-decode-cpu.json")


if __name__ == "__main__":
    main()
