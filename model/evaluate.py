"""Score a model on a parallel TSV with sacrebleu: BLEU and chrF, greedy and beam.

    python -m model.evaluate --model en-zh --dev dev.tsv --source-column 0 --target-column 1 --tokenize zh

Sources with several reference translations in the file are scored multi-reference.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from model.train import dev_references, read_pairs, score_translations, translate_all
from model.translator import Translator

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m model.evaluate", description=__doc__)
    parser.add_argument("--model", required=True, help="model directory or shipped name")
    parser.add_argument("--dev", required=True, help="TSV with source and target columns")
    parser.add_argument("--source-column", type=int, default=0)
    parser.add_argument("--target-column", type=int, default=1)
    parser.add_argument("--tokenize", default="13a", help="sacrebleu tokenizer: zh for Chinese output, 13a otherwise")
    parser.add_argument("--beam-sizes", default="1,4", help="comma-separated beam sizes to score")
    parser.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--json", help="also write the scores to this file")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    translator = Translator.from_pretrained(args.model, device="cpu", dtype=DTYPES[args.dtype])
    sources, references = dev_references(read_pairs(args.dev, args.source_column, args.target_column))
    scores = {"model": args.model, "sources": len(sources), "dtype": args.dtype}
    for beam_size in (int(b) for b in args.beam_sizes.split(",")):
        hypotheses = translate_all(translator.model, translator.tokenizer, sources, beam_size=beam_size)
        scores["greedy" if beam_size == 1 else f"beam{beam_size}"] = score_translations(
            hypotheses, references, args.tokenize
        )
    print(json.dumps(scores, indent=1))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(scores, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
