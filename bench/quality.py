"""Translation quality of the shipped models (and, beside them, a baseline's) on the development and test sets.

Beam 4, sacrebleu BLEU (tokenize "zh" for Chinese output, "13a" for English) and chrF, multi-reference where a
source has several translations: the recipe's Tatoeba and HSK development pairs (model.training.recipe), 500 UI
strings of the gettext catalogs no model trains on (git, coreutils, dpkg, glib20: model.training.catalogs), and the
out-of-domain test sets TICO-19 (test) and FLORES-200 (devtest), which no model here trained or was tuned on,
beside the best public OPUS-MT model's published BLEU where one exists.

    python -m bench.quality                                              # writes bench/results/quality.json
    python -m bench.quality --baseline en-zh=runs/old/en-zh zh-en=runs/old/zh-en
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

from bench import SHARED_DATA, machine, named_models, report_command, write_report
from model.options import DecodingOptions
from model.training.catalogs import catalog_pairs
from model.training.data import dev_references
from model.training.evaluate import score_translations
from model.training.recipe import development_pairs
from model.translator import Translator

REPOSITORY = Path(__file__).resolve().parents[1]
DATA = SHARED_DATA
# The OPUS-MT leaderboard's best public models on TICO-19 (sacrebleu BLEU), as tico19-en-zh/README.md quotes it.
OPUS_MT = {("en-zh", "tico19 test"): 34.2, ("zh-en", "tico19 test"): 25.7}
SETS = ("tatoeba dev", "hsk dev", "catalogs held-out", "tico19 test", "flores200 devtest")
CATALOG_SAMPLE = 500  # UI strings drawn (seeded) from the held-out gettext catalogs: the software domain's test


def read_set(data: Path, name: str) -> list[tuple[str, str]]:
    """(English, Chinese) pairs of a named set."""
    if name in ("tatoeba dev", "hsk dev"):
        pairs = development_pairs(data)["tatoeba" if name == "tatoeba dev" else "hsk"]
        return [(p.english, p.chinese) for p in pairs]
    if name == "catalogs held-out":  # read from this machine's locale files at run time (never committed)
        held_out = catalog_pairs()["held_out"]
        chosen = random.Random(0).sample(held_out, min(CATALOG_SAMPLE, len(held_out)))
        return [(p.english, p.chinese) for p in chosen]
    folder, stem = {"tico19 test": ("tico19-en-zh", "test"), "flores200 devtest": ("flores200-en-zh", "devtest")}[name]
    english = (data / folder / f"{stem}.en").read_text(encoding="utf-8").splitlines()
    chinese = (data / folder / f"{stem}.zh").read_text(encoding="utf-8").splitlines()
    return list(zip(english, chinese, strict=True))


def within_positions(model: Translator, text: str, limit: int) -> str:
    """The text, or its first pieces that fit the model's positions (out-of-domain sets have a few longer ones)."""
    keep = len(model.tokenizer.encode_source(text))
    while keep > limit:  # detokenized pieces may encode to a few more: shorten until it fits
        text = model.tokenizer.source_text(model.tokenizer.encode_source(text)[: limit - 1 - (keep - limit)])
        keep = len(model.tokenizer.encode_source(text))
    return text


def translate_all(model: Translator, texts: list[str], beam_size: int, batch_size: int = 32) -> list[str]:
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    out: dict[int, str] = {}
    limit = model.config.max_position_embeddings
    for first in range(0, len(order), batch_size):
        chunk = order[first : first + batch_size]
        texts_here = [within_positions(model, texts[i], limit) for i in chunk]
        for index, translation in zip(chunk, model.translate(texts_here, DecodingOptions(beam_size=beam_size))):
            out[index] = translation.text
    return [out[i] for i in range(len(texts))]


def score_model(model: Translator, direction: str, data: Path, sets: list[str], beam_size: int) -> dict:
    tokenize = "zh" if direction.endswith("zh") else "13a"
    results = {}
    for name in sets:
        pairs = read_set(data, name)
        oriented = pairs if direction.startswith("en") else [(zh, en) for en, zh in pairs]
        sources, references = dev_references(oriented)
        started = time.monotonic()
        hypotheses = translate_all(model, sources, beam_size)
        results[name] = {
            **score_translations(hypotheses, references, tokenize),
            "sources": len(sources),
            "seconds": round(time.monotonic() - started, 1),
        }
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--models", nargs="*", default=["en-zh", "zh-en"], help="NAME or NAME=DIRECTORY")
    parser.add_argument("--baseline", nargs="*", default=[], help="NAME=DIRECTORY: scored beside, as `before`")
    parser.add_argument(
        "--baseline-from", help="an earlier report of this benchmark whose models' scores stand beside as `before`"
    )
    parser.add_argument("--sets", nargs="*", default=list(SETS), choices=SETS)
    parser.add_argument("--beam-size", type=int, default=4)
    parser.add_argument("--output")
    args = parser.parse_args(argv)
    report: dict = {"command": report_command("bench.quality"), "beam_size": args.beam_size}
    models = named_models(args.models)
    baselines = dict(item.split("=", 1) for item in args.baseline)
    earlier = json.loads(Path(args.baseline_from).read_text()) if args.baseline_from else {"models": {}}
    report["models"] = {}
    for name, path in models.items():
        model = Translator.from_pretrained(path)
        entry = {"path": path, "weights_digest": model.weights_digest}
        entry["scores"] = score_model(model, name, args.data, args.sets, args.beam_size)
        if name in baselines:
            before = Translator.from_pretrained(baselines[name])
            entry["baseline"] = {"path": baselines[name], "weights_digest": before.weights_digest}
            entry["baseline"]["scores"] = score_model(before, name, args.data, args.sets, args.beam_size)
        elif name in earlier["models"]:
            old = earlier["models"][name]
            entry["baseline"] = {"path": old["path"], "weights_digest": old["weights_digest"], "scores": old["scores"]}
            entry["baseline"]["report"] = earlier["command"]
        entry["opus_mt_bleu"] = {s: OPUS_MT[(name, s)] for s in args.sets if (name, s) in OPUS_MT}
        report["models"][name] = entry
    report["machine"] = machine()
    print(format_table(report))
    write_report(report, args.output, "quality.json")
    return 0


def format_table(report: dict) -> str:
    lines = [
        f"beam {report['beam_size']}: BLEU / chrF",
        "| direction | set | sources | this model | baseline | OPUS-MT BLEU |",
        "|---|---|---|---|---|---|",
    ]
    for name, entry in report["models"].items():
        for set_name, scores in entry["scores"].items():
            before = entry.get("baseline", {}).get("scores", {}).get(set_name)
            cells = [
                name,
                set_name,
                str(scores["sources"]),
                f"{scores['bleu']:.1f} / {scores['chrf']:.1f}",
                f"{before['bleu']:.1f} / {before['chrf']:.1f}" if before else "",
                str(entry["opus_mt_bleu"].get(set_name, "")),
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
