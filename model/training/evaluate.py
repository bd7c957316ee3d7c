"""Score a model on a parallel TSV with sacrebleu: BLEU and chrF, greedy and beam.

    python -m model.training.evaluate --model en-zh --dev dev.tsv --source-column 0 --target-column 1 --tokenize zh
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from model.decoding.search import beam_search
from model.loading import DTYPE_NAMES
from model.options import DecodingOptions
from model.tokenizer import MarianTokenizer
from model.training.data import dev_references, read_pairs
from model.transformer import Transformer
from model.translator import Translator


def score_translations(hypotheses: list[str], references: list[list[str]], tokenize: str) -> dict[str, float]:
    import sacrebleu  # a training-time dependency only

    width = max(map(len, references))
    streams = [[refs[i] if i < len(refs) else None for refs in references] for i in range(width)]
    bleu = sacrebleu.corpus_bleu(hypotheses, streams, tokenize=tokenize)
    chrf = sacrebleu.corpus_chrf(hypotheses, streams)
    return {"bleu": round(bleu.score, 2), "chrf": round(chrf.score, 2)}


def translate_all(
    model: Transformer, tokenizer: MarianTokenizer, texts: list[str], beam_size: int = 1, batch_size: int = 64
) -> list[str]:
    model.eval()
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    results: dict[int, str] = {}
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        ids = [tokenizer.encode_source(texts[i])[: model.config.max_position_embeddings] for i in chunk]
        for index, hypotheses in zip(chunk, beam_search(model, ids, DecodingOptions(beam_size=beam_size))):
            results[index] = tokenizer.detokenize(hypotheses[0].token_ids)
    return [results[i] for i in range(len(texts))]


def evaluate(
    model: Transformer,
    tokenizer: MarianTokenizer,
    sources: list[str],
    references: list[list[str]],
    tokenize: str,
    beam_size: int = 1,
) -> dict[str, float]:
    hypotheses = translate_all(model, tokenizer, sources, beam_size)
    return score_translations(hypotheses, references, tokenize)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m model.training.evaluate", description=__doc__)
    parser.add_argument("--model", required=True, help="model directory or shipped name")
    parser.add_argument("--dev", required=True, help="TSV with source and target columns")
    parser.add_argument("--source-column", type=int, default=0)
    parser.add_argument("--target-column", type=int, default=1)
    parser.add_argument("--tokenize", default="13a", help="sacrebleu tokenizer: zh for Chinese output, 13a otherwise")
    parser.add_argument("--beam-sizes", default="1,4", help="comma-separated beam sizes to score")
    parser.add_argument("--dtype", default="float32", choices=sorted(DTYPE_NAMES))
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--json", help="also write the scores to this file")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    translator = Translator.from_pretrained(args.model, device="cpu", dtype=args.dtype)
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
