"""A statistical word aligner beside the model's attention: eflomal, symmetrized with grow-diag-final-and.

    python -m model.training.statistical_alignment --train ../shared/data/tatoeba-en-zh/train.tsv \\
        --dev ../shared/data/tatoeba-en-zh/dev.tsv --gold ../shared/data/alignment-zh-en \\
        --output runs/eflomal
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
from pathlib import Path

from model.training.data import read_pairs
from model.training.gold import GoldLinks, alignment_error_rate, grow_diag_final_and, parse_pharaoh, split_words

logger = logging.getLogger("model.training.statistical_alignment")


def read_gold(directory: str | Path) -> tuple[list[str], list[str], list[GoldLinks]]:
    """The gold set as texts (English joined with spaces, Chinese without) and its links (zh, en)."""
    directory = Path(directory)
    zh_lines = (directory / "zh.txt").read_text(encoding="utf-8").splitlines()
    en_lines = (directory / "en.txt").read_text(encoding="utf-8").splitlines()
    gold = [parse_pharaoh(line) for line in (directory / "gold.align").read_text(encoding="utf-8").splitlines()]
    if not len(zh_lines) == len(en_lines) == len(gold):
        raise ValueError(f"{directory}: zh.txt, en.txt and gold.align differ in line count")
    return zh_lines, en_lines, gold


def gold_word_spans(words: list[str], joiner: str) -> tuple[str, list[tuple[int, int]]]:
    """Join gold words into a text and return each word's character span in it."""
    text, spans = "", []
    for word in words:
        if text and joiner:
            text += joiner
        spans.append((len(text), len(text) + len(word)))
        text += word
    return text, spans


PTB_BRACKETS = {"-LRB-": "(", "-RRB-": ")", "-LSB-": "[", "-RSB-": "]", "-LCB-": "{", "-RCB-": "}"}


def gold_texts(zh_line: str, en_line: str) -> tuple[str, list, str, list]:
    """A gold pair as (zh text, zh word spans, en text, en word spans) in the gold file's word order."""
    zh_text, zh_spans = gold_word_spans(zh_line.split(), "")
    en_text, en_spans = gold_word_spans([PTB_BRACKETS.get(w, w) for w in en_line.split()], " ")
    return zh_text, zh_spans, en_text, en_spans


def eflomal_links(english: list[list[str]], chinese: list[list[str]], seed_iterations: int | None = None) -> list[set]:
    """Symmetrized eflomal links (english_word, chinese_word) for every pair of tokenized sentences."""
    import eflomal  # a training-time dependency only

    with tempfile.TemporaryDirectory() as folder:
        forward, reverse = Path(folder) / "fwd", Path(folder) / "rev"
        aligner = eflomal.Aligner(n_iterations=seed_iterations)
        src = [" ".join(words).lower() + "\n" for words in english]
        trg = [" ".join(words) + "\n" for words in chinese]
        aligner.align(src, trg, links_filename_fwd=str(forward), links_filename_rev=str(reverse), quiet=True)
        results = []
        for fwd_line, rev_line in zip(
            forward.read_text(encoding="utf-8").splitlines(), reverse.read_text(encoding="utf-8").splitlines()
        ):
            fwd = {tuple(map(int, link.split("-"))) for link in fwd_line.split()}
            rev = {tuple(map(int, link.split("-"))) for link in rev_line.split()}
            results.append(grow_diag_final_and(fwd, rev))
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m model.training.statistical_alignment",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--train", required=True, help="TSV of training pairs")
    parser.add_argument("--dev", help="TSV of dev pairs (aligned too, written to dev.jsonl)")
    parser.add_argument("--gold", help="directory of the gold set (zh.txt, en.txt, gold.align)")
    parser.add_argument("--in-domain", help="the in-domain gold links' dev.json (alignment-tatoeba-zh-en), scored too")
    parser.add_argument("--english-column", type=int, default=0)
    parser.add_argument("--chinese-column", type=int, default=1)
    parser.add_argument("--output", required=True, help="directory for train.jsonl, dev.jsonl and summary.json")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    started = time.monotonic()

    parts: dict[str, list[tuple[str, list, str, list]]] = {}
    for part, path in (("train", args.train), ("dev", args.dev)):
        if path:
            rows = []
            for english, chinese in read_pairs(path, args.english_column, args.chinese_column):
                rows.append((english, split_words(english, "en"), chinese, split_words(chinese, "zh")))
            parts[part] = rows
    gold_links = []
    if args.gold:
        zh_lines, en_lines, gold_links = read_gold(args.gold)
        rows = []
        for zh_line, en_line in zip(zh_lines, en_lines):
            zh_text, zh_spans, en_text, en_spans = gold_texts(zh_line, en_line)
            rows.append((en_text, en_spans, zh_text, zh_spans))
        parts["gold"] = rows
    in_domain_links = []
    if args.in_domain:
        records = json.loads(Path(args.in_domain).read_text(encoding="utf-8"))
        parts["in_domain"] = [
            (r["en"], [tuple(x) for x in r["en_spans"]], r["zh"], [tuple(x) for x in r["zh_spans"]]) for r in records
        ]
        in_domain_links = [
            GoldLinks({tuple(x) for x in r["sure"]}, {tuple(x) for x in r["sure"] + r["possible"]}) for r in records
        ]
    order = [(part, i) for part, rows in parts.items() for i in range(len(rows))]
    english = [[row[0][s:e] for s, e in row[1]] for part, rows in parts.items() for row in rows]
    chinese = [[row[2][s:e] for s, e in row[3]] for part, rows in parts.items() for row in rows]
    logger.info("aligning %d sentence pairs with eflomal", len(order))
    links = eflomal_links(english, chinese)

    output = Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    by_part: dict[str, list] = {part: [] for part in parts}
    for (part, _), pair_links in zip(order, links):
        by_part[part].append(pair_links)
    for part, rows in parts.items():
        with open(output / f"{part}.jsonl", "w", encoding="utf-8") as handle:
            for (en_text, en_spans, zh_text, zh_spans), pair_links in zip(rows, by_part[part]):
                record = {
                    "en": en_text,
                    "zh": zh_text,
                    "en_words": en_spans,
                    "zh_words": zh_spans,
                    "links": sorted(pair_links),
                }
                handle.write(json.dumps(record, ensure_ascii=False) + "\n")
    summary = {
        "pairs": {part: len(rows) for part, rows in parts.items()},
        "minutes": round((time.monotonic() - started) / 60, 2),
    }
    if gold_links:
        predicted = [{(z, e) for e, z in pair_links} for pair_links in by_part["gold"]]
        summary["gold"] = alignment_error_rate(predicted, gold_links).as_dict()
    if in_domain_links:
        predicted = [{(z, e) for e, z in pair_links} for pair_links in by_part["in_domain"]]
        summary["in_domain"] = alignment_error_rate(predicted, in_domain_links).as_dict()
    (output / "summary.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
