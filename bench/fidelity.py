"""Fast-mode fidelity: does a model in bf16 (or another dtype) translate the dev set as it does in fp32?

    python -m bench.fidelity                      # shipped models, bf16 against fp32, beam 4
    python -m bench.fidelity --models en-zh --dtypes bfloat16 --limit 200
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import torch

from model.translator import Translator

REPOSITORY = Path(__file__).resolve().parents[1]

logger = logging.getLogger("bench.fidelity")

DEFAULT_DEV = REPOSITORY.parent / "shared" / "data" / "tatoeba-en-zh" / "dev.tsv"
# model name → (source column, target column, sacrebleu tokenizer) in the dev TSV (English, Chinese)
DIRECTIONS = {"en-zh": (0, 1, "zh"), "zh-en": (1, 0, "13a")}


def dev_rows(path: str | Path) -> list[list[str]]:
    """The dev TSV's rows, each split into its columns (English, Chinese, attribution); blank lines skipped."""
    return [line.split("\t") for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]


def translate_all(
    translator: Translator, sources: list[str], beam_size: int, batch_size: int
) -> tuple[list[str], float]:
    """Translations in input order, batched by source length; and the seconds they took."""
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    outputs: list[str] = [""] * len(sources)
    start = time.perf_counter()
    for begin in range(0, len(order), batch_size):
        chunk = order[begin : begin + batch_size]
        for index, translation in zip(chunk, translator.translate([sources[i] for i in chunk], beam_size=beam_size),
                                      strict=True):
            outputs[index] = translation.text
    return outputs, time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    import sacrebleu

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=sorted(DIRECTIONS), help="shipped names or directories")
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16"])
    parser.add_argument("--dev", default=str(DEFAULT_DEV))
    parser.add_argument("--limit", type=int, default=0, help="first N dev sentences only (0: all)")
    parser.add_argument("--beam-size", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--output", help="JSON path (default bench/results/fidelity-<device>.json)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(args.threads)

    rows = dev_rows(args.dev)
    if args.limit:
        rows = rows[: args.limit]
    report = {"dev": str(args.dev), "sentences": len(rows), "beam_size": args.beam_size, "models": {}}
    for name in args.models:
        source_column, target_column, tokenize = DIRECTIONS[Path(name).name]  # a shipped name or a directory
        sources = [row[source_column] for row in rows]
        references = [row[target_column] for row in rows]
        reference, seconds = translate_all(
            Translator.from_pretrained(name, device=args.device), sources, args.beam_size, args.batch_size
        )
        entry = {"float32": {"bleu": sacrebleu.corpus_bleu(reference, [references], tokenize=tokenize).score,
                             "seconds": seconds}}
        for dtype_name in args.dtypes:
            translator = Translator.from_pretrained(name, device=args.device, dtype=getattr(torch, dtype_name))
            outputs, seconds = translate_all(translator, sources, args.beam_size, args.batch_size)
            identical = sum(a == b for a, b in zip(outputs, reference, strict=True)) / len(reference)
            bleu = sacrebleu.corpus_bleu(outputs, [references], tokenize=tokenize).score
            entry[dtype_name] = {"bleu": bleu, "seconds": seconds, "identical_to_float32": identical,
                                 "bleu_delta": bleu - entry["float32"]["bleu"]}
            logger.info("%s %s: identical %.1f%%, BLEU %.2f (fp32 %.2f), %.1fs (fp32 %.1fs)", name, dtype_name,
                        100 * identical, bleu, entry["float32"]["bleu"], seconds, entry["float32"]["seconds"])
        report["models"][name] = entry
    print(json.dumps(report, indent=1))
    output = Path(args.output or REPOSITORY / "bench" / "results" / f"fidelity-{args.device}.json")
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
