"""Placeholders, URLs and numbers through the shipped models, with and without protection, against human
translations that keep them.

Sets, per direction: UI strings from Debian's evaluation catalogs (git, coreutils, dpkg, glib20; never trained
on) whose msgid holds a placeable translate-toolkit finds, with the other language's string as the reference;
Tatoeba dev pairs with the name Tom/汤姆 turned into a placeholder on both sides; Tatoeba dev pairs with a URL
added on both sides. Reported: the share of translations that keep every span (each as often as the source has
it), and chrF against the references, with the service's protection (service.text.protected) and without.

    python -m bench.protected_spans                # writes bench/results/protected-spans.json
"""

from __future__ import annotations

import argparse
import gettext
import random
from pathlib import Path

from sacrebleu.metrics import CHRF

from bench import SHARED_DATA, machine, report_command, write_report
from model import DecodingOptions, Translator
from service.records import TranslationRecord
from service.text.protected import Protected, find_spans, protect, restore

CATALOGS = Path("/usr/share/locale/zh_CN/LC_MESSAGES")
EVALUATION_CATALOGS = ("git", "coreutils", "dpkg", "glib20")
PLACEHOLDERS = ["%s", "{name}", "{{name}}", "%(name)s", "%1$s", "${name}"]
NAMES = {"en": "Tom", "zh": "汤姆"}


def catalog_pairs(limit: int) -> list[tuple[str, str]]:
    """(English, Chinese) UI strings of the evaluation catalogs with a span to keep, one line each."""
    pairs = []
    for domain in EVALUATION_CATALOGS:
        path = CATALOGS / f"{domain}.mo"
        if not path.exists():
            continue
        with open(path, "rb") as handle:
            catalog = gettext.GNUTranslations(handle)
        for message, translation in catalog._catalog.items():
            english = message[0] if isinstance(message, tuple) else message
            if english and translation and "\n" not in english.strip() and len(english) < 200 and find_spans(english):
                pairs.append((english.strip(), translation.strip()))
    random.Random(0).shuffle(pairs)
    return pairs[:limit]


def tatoeba_pairs(data: Path, limit: int) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    rows = [line.split("\t") for line in (data / "tatoeba-en-zh" / "dev.tsv").read_text(encoding="utf-8").splitlines()]
    rows = [(row[0], row[1]) for row in rows if len(row) >= 2]
    named = [(en, zh) for en, zh in rows if NAMES["en"] in en and NAMES["zh"] in zh][:limit]
    placeholders = [
        (en.replace(NAMES["en"], p), zh.replace(NAMES["zh"], p))
        for (en, zh), p in zip(named, PLACEHOLDERS * len(named), strict=False)
    ]
    urls = [
        (f"{en} https://example.com/help/{i}", f"{zh} https://example.com/help/{i}")
        for i, (en, zh) in enumerate(rows[:limit])
    ]
    return placeholders, urls


def kept(source: str, translation: str) -> bool:
    return all(translation.count(span.text) >= source.count(span.text) for span in find_spans(source))


def restored_translations(
    model: Translator, protections: list[Protected], target: str, terms: bool = False
) -> list[str]:
    """Each protected text translated at beam 4 in batches of 16, its spans put back as the service puts them;
    `terms`: its glossary terms enforced in the search, as the service asks."""
    out = []
    for first in range(0, len(protections), 16):
        chunk = protections[first : first + 16]
        wanted = [p.term_targets for p in chunk] if terms else None
        outcomes = model.translate([p.text for p in chunk], DecodingOptions(beam_size=4), terms=wanted)
        for protection, outcome in zip(chunk, outcomes, strict=True):
            record = TranslationRecord(
                text=outcome.text,
                source_tokens=outcome.source_tokens,
                target_tokens=outcome.target_tokens,
                alignment=[list(pair) for pair in outcome.alignment],
            )
            out.append(restore(protection, record, target).text)
    return out


def translate(model: Translator, texts: list[str], source: str, target: str, protected: bool) -> list[str]:
    if not protected:
        batches = (texts[first : first + 16] for first in range(0, len(texts), 16))
        return [t.text for batch in batches for t in model.translate(batch, DecodingOptions(beam_size=4))]
    return restored_translations(model, [protect(text, source, target) for text in texts], target)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=SHARED_DATA)
    parser.add_argument("--limit", type=int, default=300, help="most texts per set")
    parser.add_argument("--output")
    args = parser.parse_args(argv)
    placeholders, urls = tatoeba_pairs(args.data, args.limit)
    sets = {"UI strings (gettext)": catalog_pairs(args.limit), "Tatoeba + placeholder": placeholders}
    sets["Tatoeba + URL"] = urls
    report: dict = {"command": report_command("bench.protected_spans"), "beam_size": 4, "results": {}}
    chrf = CHRF()
    for direction in ("en-zh", "zh-en"):
        source, target = direction.split("-")
        model = Translator.from_pretrained(direction)
        for name, pairs in sets.items():
            oriented = pairs if source == "en" else [(zh, en) for en, zh in pairs]
            oriented = [(s, r) for s, r in oriented if find_spans(s)]
            sources, references = [s for s, _ in oriented], [[r for _, r in oriented]]
            result: dict = {"texts": len(sources)}
            for protected in (False, True):
                outputs = translate(model, sources, source, target, protected)
                label = "with" if protected else "without"
                result[f"all_kept_{label}"] = round(sum(map(kept, sources, outputs)) / len(sources), 4)
                result[f"chrf_{label}"] = round(chrf.corpus_score(outputs, references).score, 2)
                result[f"examples_{label}"] = list(zip(sources[:4], outputs[:4], strict=True))
            report["results"][f"{direction} {name}"] = result
            print(direction, name, {k: v for k, v in result.items() if not k.startswith("examples")}, flush=True)
    report["machine"] = machine()
    print(format_table(report))
    write_report(report, args.output, "protected-spans.json")
    return 0


def format_table(report: dict) -> str:
    lines = [
        "| direction and set | texts | every span kept: without → with | chrF: without → with |",
        "|---|---|---|---|",
    ]
    for name, r in report["results"].items():
        lines.append(
            f"| {name} | {r['texts']} | {100 * r['all_kept_without']:.1f} % → {100 * r['all_kept_with']:.1f} % | "
            f"{r['chrf_without']:.1f} → {r['chrf_with']:.1f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
