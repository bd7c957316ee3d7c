"""Resident memory of one process decoding varied batches in a loop: does the compiled runtime leak?

Random dev batches of 1–16 texts, greedy or beam 4, every third with all attention returned; the process's
resident memory every 100 decodes. Run it for the compiled runtime and for the eager step side by side:

    python -m bench.experiments.runtime_memory --decodes 2000                  # the runtime
    TRANSLATE_RUNTIME=eager python -m bench.experiments.runtime_memory --decodes 2000 --output \\
        bench/results/runtime-memory-eager-cpu.json
"""

from __future__ import annotations

import argparse
import os
import random
import time
from pathlib import Path

import torch

from bench import machine, report_command, write_report
from bench.fidelity import DEFAULT_DEV
from bench.soak import resident_mib
from model.translator import Translator

SAMPLE_EVERY = 100


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="en-zh")
    parser.add_argument("--decodes", type=int, default=2000)
    parser.add_argument("--dev", default=str(DEFAULT_DEV))
    parser.add_argument("--output", help="JSON path (default bench/results/runtime-memory-<runtime>-cpu.json)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    translator = Translator.from_pretrained(args.model, device="cpu")
    runtime = translator.runtime_info["runtime"]
    texts = [line.split("\t")[0] for line in Path(args.dev).read_text(encoding="utf-8").splitlines() if line.strip()]
    rng = random.Random(0)
    samples, started = [], time.monotonic()
    for decode in range(args.decodes + 1):
        if decode % SAMPLE_EVERY == 0:
            samples.append({"decodes": decode, "rss_mib": resident_mib(os.getpid()),
                            "seconds": round(time.monotonic() - started, 1)})  # fmt: skip
            print(f"{runtime}: {decode} decodes, {samples[-1]['rss_mib']} MiB", flush=True)
        batch = rng.sample(texts, rng.randint(1, 16))
        translator.translate(batch, beam_size=rng.choice([1, 4]), return_attention=rng.random() < 1 / 3)
    later = [s["rss_mib"] for s in samples[len(samples) // 2 :]]
    report = {
        "command": report_command("bench.experiments.runtime_memory"),
        "machine": machine(),
        "model": args.model, "runtime": runtime, "samples": samples,
        "second_half": {"min_mib": min(later), "max_mib": max(later), "first_mib": later[0], "last_mib": later[-1]},
    }  # fmt: skip
    print(f"second half: {min(later)}–{max(later)} MiB (first {later[0]}, last {later[-1]})")
    write_report(report, args.output, f"runtime-memory-{runtime}-cpu.json")


if __name__ == "__main__":
    main()
