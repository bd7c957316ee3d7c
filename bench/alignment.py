"""Alignment quality of the shipped models beside a statistical aligner, one run: a table and bench/results JSON.

    python -m bench.alignment                      # both shipped models; writes bench/results/alignment.json
    python -m bench.alignment --models en-zh=DIR   # another directory under a shipped name
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from model.training.evaluate_alignment import alignment_report, gold_items, link_items
from model.training.statistical_alignment import main as statistical_alignment
from model.translator import Translator

REPOSITORY = Path(__file__).resolve().parents[1]

DATA = REPOSITORY.parent / "shared" / "data"
RESULTS = REPOSITORY / "bench" / "results"
SOURCE_LANGUAGE = {"en-zh": "en", "zh-en": "zh"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DATA, help="folder with tatoeba-en-zh/ and alignment-zh-en/")
    parser.add_argument("--models", nargs="*", default=["en-zh", "zh-en"], help="NAME or NAME=DIRECTORY")
    parser.add_argument("--output", type=Path, default=RESULTS / "alignment.json")
    args = parser.parse_args(argv)
    tatoeba, gold = args.data / "tatoeba-en-zh", args.data / "alignment-zh-en"
    started = time.monotonic()
    report: dict = {"command": " ".join(["python -m bench.alignment", *sys.argv[1:]]), "models": {}}
    with tempfile.TemporaryDirectory(prefix="eflomal-") as scratch:
        statistical_alignment(
            ["--train", str(tatoeba / "train.tsv"), "--dev", str(tatoeba / "dev.tsv"), "--gold", str(gold),
             "--output", scratch]
        )  # fmt: skip
        summary = json.loads((Path(scratch) / "summary.json").read_text())
        report["eflomal"] = {"gold": summary["gold"], "pairs": summary["pairs"]}
        for entry in args.models:
            name, _, directory = entry.partition("=")
            translator = Translator.from_pretrained(directory or name, device="cpu")
            layer, head = translator.alignment_head
            language = SOURCE_LANGUAGE[name]
            sets = {
                "in_domain": link_items(Path(scratch) / "dev.jsonl", language),
                "gold": gold_items(gold, language),
            }
            report["models"][name] = {
                "weights_digest": translator.weights_digest,
                **{
                    part: alignment_report(
                        translator.model, translator.tokenizer, items, layer, head, translator.alignment_shift
                    )
                    for part, items in sets.items()
                },
            }
    report["minutes"] = round((time.monotonic() - started) / 60, 2)
    print_table(report)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return 0


def print_table(report: dict) -> None:
    print(f"eflomal on the gold set: AER {report['eflomal']['gold']['aer']}")
    header = (
        "| model | set | alignment head | AER | precision | recall | entropy | best head (AER) | diagonal AER "
        "| encoder position similarity |"
    )
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    for name, result in report["models"].items():
        for part in ("in_domain", "gold"):
            r = result[part]
            readings = [
                (value[key], f"{name_} {step}")
                for name_, value in r["heads"].items()
                for key, step in (("aer", "prediction"), ("aer_shift", "input"))
            ]
            best = min(readings)
            head = r["alignment_head"]
            where = f"layer {head['layer']} " + ("mean" if head["head"] is None else f"head {head['head']}")
            where += ", input step" if head.get("shift") else ", prediction step"
            service = r["service"]
            print(
                f"| {name} | {part} | {where} | {service['aer']} | {service['precision']} | {service['recall']} "
                f"| {r['entropy']} | {best[1]} ({best[0]}) | {r['diagonal']['aer']} "
                f"| {r['encoder_similarity']} |"
            )


if __name__ == "__main__":
    sys.exit(main())
