"""Alignment quality of the shipped models beside a statistical aligner, one run: tables and bench/results JSON.

One table: every alignment on the in-domain gold links (alignment-tatoeba-zh-en, 65 pairs), the newswire gold
set (alignment-zh-en, 150 pairs) and eflomal's links on Tatoeba dev pairs, with precision and recall: eflomal
itself; what the service gives (`alignment_method` "head" and "agreement", through Translator.explain, its token
links mapped to each set's words as the sets' READMEs say); and every variant bench.experiments.alignment_variants
measured on the sets' own words; and, on the served alignments' footing, the gold sure links and eflomal's links
passed through each model's pieces (the best any alignment on those pieces can score, and the statistical aligner
scored as the service is). A second table: the alignment head's entropy, best head and diagonal.

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

from bench import SHARED_DATA, named_models, report_command
from model.training.evaluate_alignment import (
    alignment_report,
    gold_items,
    in_domain_items,
    link_items,
    served_alignment_score,
    through_pieces_score,
)
from model.training.statistical_alignment import main as statistical_alignment
from model.translator import Translator

REPOSITORY = Path(__file__).resolve().parents[1]

DATA = SHARED_DATA
RESULTS = REPOSITORY / "bench" / "results"
SOURCE_LANGUAGE = {"en-zh": "en", "zh-en": "zh"}
REVERSE = {"en-zh": "zh-en", "zh-en": "en-zh"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DATA, help="folder with tatoeba-en-zh/ and alignment-zh-en/")
    parser.add_argument("--models", nargs="*", default=["en-zh", "zh-en"], help="NAME or NAME=DIRECTORY")
    parser.add_argument("--output", type=Path, default=RESULTS / "alignment.json")
    parser.add_argument(
        "--eflomal-pairs", type=int, default=200, help="Tatoeba dev pairs the served alignments are scored on "
        "against eflomal's links (each costs two forced decodes per method; the head's report uses all)",
    )  # fmt: skip
    parser.add_argument("--no-variants", action="store_true", help="skip bench.experiments.alignment_variants")
    args = parser.parse_args(argv)
    tatoeba, gold = args.data / "tatoeba-en-zh", args.data / "alignment-zh-en"
    in_domain = args.data / "alignment-tatoeba-zh-en" / "dev.json"
    started = time.monotonic()
    report: dict = {
        "command": report_command("bench.alignment"),
        "eflomal_pairs_scored": args.eflomal_pairs,
        "models": {},
    }
    with tempfile.TemporaryDirectory(prefix="eflomal-") as scratch:
        statistical_alignment(
            ["--train", str(tatoeba / "train.tsv"), "--dev", str(tatoeba / "dev.tsv"), "--gold", str(gold),
             "--in-domain", str(in_domain), "--output", scratch]
        )  # fmt: skip
        summary = json.loads((Path(scratch) / "summary.json").read_text())
        report["eflomal"] = {"gold": summary["gold"], "in_domain": summary["in_domain"], "pairs": summary["pairs"]}
        translators = {}
        for name, directory in named_models(args.models).items():
            translators[name] = Translator.from_pretrained(directory, device="cpu")
        for name, translator in translators.items():
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
                "methods": served_methods(translator, translators.get(REVERSE[name]), language, args, scratch),
                "through_pieces": through_pieces(translator, language, args, scratch),
            }
    if not args.no_variants:
        from bench.experiments.alignment_variants import measure

        report["variants"] = measure(in_domain, gold)
    report["minutes"] = round((time.monotonic() - started) / 60, 2)
    print_quality_table(report)
    print()
    print_table(report)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return 0


def served_methods(translator, reverse, language: str, args, scratch: str) -> dict:
    """What the service gives (Translator.explain), "head" and, with the reverse model, "agreement", on the three
    references; the token links are mapped onto each set's words."""
    sets = {
        "in_domain_gold": in_domain_items(args.data / "alignment-tatoeba-zh-en" / "dev.json", language),
        "gold": gold_items(args.data / "alignment-zh-en", language),
        "eflomal_links": link_items(Path(scratch) / "dev.jsonl", language, args.eflomal_pairs),
    }
    methods = {"head": None, "agreement": reverse} if reverse is not None else {"head": None}
    return {
        method: {part: served_alignment_score(translator, items, other).as_dict() for part, items in sets.items()}
        for method, other in methods.items()
    }


def through_pieces(translator, language: str, args, scratch: str) -> dict:
    """The references on the served alignments' footing: the gold sure links (the best any alignment on this
    model's pieces can score: a piece across two gold words links both) and eflomal's links on the same pairs,
    each passed through the model's pieces as the served links are."""
    in_domain = in_domain_items(args.data / "alignment-tatoeba-zh-en" / "dev.json", language)
    newswire = gold_items(args.data / "alignment-zh-en", language)
    eflomal = {
        "in_domain_gold": link_items(Path(scratch) / "in_domain.jsonl", language),
        "gold": link_items(Path(scratch) / "gold.jsonl", language),
    }
    result = {}
    for part, items in (("in_domain_gold", in_domain), ("gold", newswire)):
        assert [(i.source, i.target) for i in items] == [(i.source, i.target) for i in eflomal[part]], part
        result.setdefault("gold sure links", {})[part] = through_pieces_score(
            translator.tokenizer, items, [set(item.reference.sure) for item in items]
        ).as_dict()
        result.setdefault("eflomal", {})[part] = through_pieces_score(
            translator.tokenizer, items, [set(item.reference.sure) for item in eflomal[part]]
        ).as_dict()
    return result


def print_quality_table(report: dict) -> None:
    """Every alignment, in-domain gold + newswire gold + eflomal's links, AER / precision / recall."""
    eflomal_pairs = report["eflomal_pairs_scored"]

    def cells(score: dict | None) -> str:
        if score is None:
            return "| | | "
        return f"| {score['aer']:.1f} | {score['precision']:.1f} | {score['recall']:.1f} "

    print(f"AER / precision / recall (%): in-domain gold links (65 pairs), newswire gold (150 pairs), eflomal's links "
          f"(the first {eflomal_pairs} Tatoeba dev pairs)")  # fmt: skip
    print("| alignment | scored on | in-domain AER | P | R | newswire AER | P | R | vs eflomal AER | P | R |")
    print("|---|---|" + "---|" * 9)
    eflomal = report["eflomal"]
    print(f"| eflomal (statistical; grow-diag-final-and) | the sets' words {cells(eflomal['in_domain'])}"
          f"{cells(eflomal['gold'])}{cells(None)}|")  # fmt: skip
    for name, result in report["models"].items():
        for method, scores in result["methods"].items():
            label = f"served {name} `{method}`" + (" (default of /v1/explain)" if method == "agreement" else "")
            print(f"| {label} | pieces → words {cells(scores['in_domain_gold'])}{cells(scores['gold'])}"
                  f"{cells(scores['eflomal_links'])}|")  # fmt: skip
        for reference, scores in result.get("through_pieces", {}).items():
            label = f"{reference} through {name}'s pieces" + (" (the ceiling)" if reference.startswith("gold") else "")
            print(f"| {label} | pieces → words {cells(scores['in_domain_gold'])}{cells(scores['gold'])}{cells(None)}|")
    for name, variant in report.get("variants", {}).get("variants", {}).items():
        threshold = f" (t = {variant['threshold']})" if "threshold" in variant else ""
        print(f"| {name}{threshold} | the sets' words {cells(variant['dev'])}{cells(variant['gold'])}{cells(None)}|")


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
