"""Word alignments from both shipped models' alignment heads, symmetrised several ways, on the in-domain set.

Each pair of ../shared/data/alignment-tatoeba-zh-en/ is forced through the en→zh model (Chinese rows over English)
and the zh→en model (English rows over Chinese); each model's declared head is read as the service reads it and
turned into a word matrix (a word's row: the mean of its pieces' rows; a word's column: the sum of its pieces'
columns). Variants: each direction's one-best (what /v1 gives today), their intersection, union and
grow-diag-final-and, and soft agreement: a link where the product of the two directions' probabilities (each
renormalised over real words, the </s> column's mass left out) exceeds a threshold.

    python -m bench.experiments.alignment_variants     # writes bench/results/alignment-variants.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from bench import write_report
from bench.alignment import DATA
from model.training.evaluate_alignment import AlignmentItem, ForcedMaps, forced_maps, head_rows, in_domain_items
from model.training.gold import GoldLinks, alignment_error_rate, grow_diag_final_and
from model.translator import Translator

DEV = DATA / "alignment-tatoeba-zh-en" / "dev.json"
THRESHOLDS = (0.05, 0.08, 0.1, 0.12, 0.15, 0.2, 0.25)


def word_matrix(forced: ForcedMaps, item: AlignmentItem, translator: Translator) -> torch.Tensor:
    """(target words, source words) from the model's alignment head, read as the service reads it."""
    rows = head_rows(forced.cross_attention, *translator.alignment_head, translator.alignment_shift)
    words = torch.zeros(len(item.target_words), len(item.source_words))
    counts = torch.zeros(len(item.target_words))
    for t, target_words in enumerate(forced.target_map):
        for target_word in target_words:
            counts[target_word] += 1
            for s, source_words in enumerate(forced.source_map):
                for source_word in source_words:
                    words[target_word, source_word] += rows[t, s]
    return words / counts.clamp(min=1).unsqueeze(1)


def scored(links: list[set], gold: list[GoldLinks]) -> dict:
    return alignment_error_rate(links, gold).as_dict()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dev", type=Path, default=DEV)
    parser.add_argument("--output", help="JSON path (default bench/results/alignment-variants.json)")
    args = parser.parse_args(argv)
    records = json.loads(args.dev.read_text(encoding="utf-8"))
    gold = [item.reference for item in in_domain_items(args.dev, "zh")]  # (zh word, en word), as the variants
    zh_en = {}  # per direction: per pair, the word matrix in (zh word, en word) orientation
    for direction in ("en-zh", "zh-en"):
        translator = Translator.from_pretrained(direction, device="cpu")
        items = in_domain_items(args.dev, direction.split("-")[0])
        maps = forced_maps(translator.model, translator.tokenizer, items)
        matrices = [word_matrix(forced, item, translator) for forced, item in zip(maps, items, strict=True)]
        zh_en[direction] = matrices if direction == "en-zh" else [m.T for m in matrices]
    forward = [{(z, int(m[z].argmax())) for z in range(m.shape[0])} for m in zh_en["en-zh"]]  # per Chinese word
    backward = [{(int(m[:, e].argmax()), e) for e in range(m.shape[1])} for m in zh_en["zh-en"]]  # per English word
    variants = {
        "en-zh one-best (today's /v1 en→zh)": forward,
        "zh-en one-best (today's /v1 zh→en)": backward,
        "intersection": [f & b for f, b in zip(forward, backward, strict=True)],
        "union": [f | b for f, b in zip(forward, backward, strict=True)],
        "grow-diag-final-and": [grow_diag_final_and(f, b) for f, b in zip(forward, backward, strict=True)],
    }
    agreement = [
        (f / f.sum(1, keepdim=True).clamp(min=1e-9)) * (b / b.sum(0, keepdim=True).clamp(min=1e-9))
        for f, b in zip(zh_en["en-zh"], zh_en["zh-en"], strict=True)
    ]
    for threshold in THRESHOLDS:
        variants[f"soft agreement > {threshold}"] = [{tuple(map(int, x)) for x in (m > threshold).nonzero().tolist()}
                                                     for m in agreement]  # fmt: skip
    report = {
        "command": " ".join(["python -m bench.experiments.alignment_variants", *sys.argv[1:]]),
        "pairs": len(records),
        "reference": {"eflomal": 16.2, "diagonal": 52.3},
        "variants": {name: scored(links, gold) for name, links in variants.items()},
    }
    print(f"{len(records)} in-domain pairs (eflomal AER 16.2, diagonal 52.3)\n")
    print("| variant | AER | precision | recall |\n|---|---|---|---|")
    for name, score in report["variants"].items():
        print(f"| {name} | {score['aer']:.1f} | {score['precision']:.1f} | {score['recall']:.1f} |")
    print()
    write_report(report, args.output, "alignment-variants.json")


if __name__ == "__main__":
    main()
