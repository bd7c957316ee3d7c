"""Glossaries at work: CC-CEDICT terms in sentence pairs the models never trained on, translated with and
without the term as a glossary entry: the service's term finding (service.text.protected) and the engine's
constrained search, at beam 4 in batches of 16.

A pair gives a term when a CC-CEDICT gloss occurs in its English side as whole words and the gloss's headword in
its Chinese side (en→zh: {gloss: headword}; zh→en: {headword: gloss}); one term a sentence, the longest. Sets:
the Tatoeba dev split (held out from training) and FLORES-200 devtest (test only). Reported per direction and set:
how often the target term is in the translation with and without the glossary, how often with it among those that
miss it without, chrF of both against the references, and the time of 16-text batches with and without.

    python -m bench.glossary                       # writes bench/results/glossary.json
    python -m bench.glossary --limit 200 --sets tatoeba
"""

from __future__ import annotations

import argparse
import gzip
import re
import time
from pathlib import Path

from sacrebleu.metrics import CHRF

from bench import SHARED_DATA, machine, report_command, write_report
from bench.protected_spans import restored_translations
from model import DecodingOptions, Translator
from service.text.protected import protect

SETS = {"tatoeba": ("tatoeba-en-zh", "dev.tsv"), "flores": ("flores200-en-zh", "devtest")}
HAN = re.compile(r"^[\u4e00-\u9fff]{2,}$")
GLOSS = re.compile(r"^[a-z][a-z' -]{2,}[a-z]$")
BATCH = 16


def read_pairs(data: Path, name: str) -> list[tuple[str, str]]:
    folder, stem = SETS[name]
    if stem.endswith(".tsv"):
        rows = (line.split("\t") for line in (data / folder / stem).read_text(encoding="utf-8").splitlines())
        return [(row[0], row[1]) for row in rows if len(row) >= 2]
    english = (data / folder / f"{stem}.en").read_text(encoding="utf-8").splitlines()
    chinese = (data / folder / f"{stem}.zh").read_text(encoding="utf-8").splitlines()
    return list(zip(english, chinese, strict=True))


def read_glosses(data: Path) -> dict[str, set[str]]:
    """English gloss (1–3 words, lower case) → the simplified headwords (2+ Han characters) it glosses."""
    glosses: dict[str, set[str]] = {}
    with gzip.open(data / "cc-cedict" / "cedict_ts.u8.gz", "rt", encoding="utf-8") as handle:
        for line in handle:
            match = re.match(r"^\S+ (\S+) \[[^\]]*\] /(.*)/\s*$", line)
            if not match or not HAN.match(match.group(1)):
                continue
            for gloss in match.group(2).split("/"):
                gloss = re.sub(r"\([^)]*\)", "", gloss).strip().lower()
                gloss = re.sub(r"^(to|a|an|the) ", "", gloss)
                if GLOSS.match(gloss) and len(gloss.split()) <= 3:
                    glosses.setdefault(gloss, set()).add(match.group(1))
    return glosses


def find_term(english: str, chinese: str, glosses: dict[str, set[str]]) -> tuple[str, str] | None:
    """The longest (gloss, headword) with the gloss in the English as whole words and the headword in the Chinese."""
    words = re.findall(r"[a-z']+", english.lower())
    best = None
    for size in (3, 2, 1):
        for start in range(len(words) - size + 1):
            gloss = " ".join(words[start : start + size])
            for headword in glosses.get(gloss, ()):
                if headword in chinese and re.search(rf"(?<!\w){re.escape(gloss)}(?!\w)", english, re.IGNORECASE):
                    candidate = (gloss, headword)
                    if best is None or len(gloss) + len(headword) > len(best[0]) + len(best[1]):
                        best = candidate
        if best:
            return best
    return None


def translate(model: Translator, texts: list[str], options: DecodingOptions) -> tuple[list, float]:
    started = time.process_time()
    out = []
    for first in range(0, len(texts), BATCH):
        out.extend(model.translate(texts[first : first + BATCH], options))
    return out, time.process_time() - started


def with_glossary(model: Translator, cases: list[tuple[str, str, tuple[str, str]]], source: str, target: str):
    """Each case's translation with its term as a glossary, and the CPU seconds it took."""
    started = time.process_time()
    protections = [protect(text, source, target, [term], keep_spans=False) for text, _, term in cases]
    texts = restored_translations(model, protections, target, terms=True)
    return texts, time.process_time() - started


def measure(model: Translator, direction: str, pairs: list[tuple[str, str]], glosses, limit: int) -> dict:
    source, target = direction.split("-")
    cases = []
    for english, chinese in pairs:
        found = find_term(english, chinese, glosses)
        if found is None:
            continue
        gloss, headword = found
        cases.append((english, chinese, (gloss, headword)) if source == "en" else (chinese, english, (headword, gloss)))
        if len(cases) == limit:
            break
    plain, plain_seconds = translate(model, [text for text, _, _ in cases], DecodingOptions(beam_size=4))
    plain_texts = [translation.text for translation in plain]
    glossed_texts, glossed_seconds = with_glossary(model, cases, source, target)

    def holds(text: str, term: str) -> bool:
        if target == "zh":
            return term in text
        return re.search(rf"(?<!\w){re.escape(term)}(?!\w)", text, re.IGNORECASE) is not None

    without = [holds(text, term[1]) for text, (_, _, term) in zip(plain_texts, cases, strict=True)]
    with_ = [holds(text, term[1]) for text, (_, _, term) in zip(glossed_texts, cases, strict=True)]
    missed = [w for w, before in zip(with_, without, strict=True) if not before]
    chrf = CHRF()
    references = [[reference for _, reference, _ in cases]]
    return {
        "cases": len(cases),
        "term_in_translation_without": round(sum(without) / len(cases), 4),
        "term_in_translation_with": round(sum(with_) / len(cases), 4),
        "term_where_missed_without": round(sum(missed) / len(missed), 4) if missed else None,
        "missed_without": len(missed),
        "chrf_without": round(chrf.corpus_score(plain_texts, references).score, 2),
        "chrf_with": round(chrf.corpus_score(glossed_texts, references).score, 2),
        "cpu_seconds_without": round(plain_seconds, 2),
        "cpu_seconds_with": round(glossed_seconds, 2),
        "time_ratio": round(glossed_seconds / plain_seconds, 3),
        "examples": [
            {"source": text, "term": list(term), "without": before, "with": after}
            for (text, _, term), before, after in list(zip(cases, plain_texts, glossed_texts, strict=True))[:5]
        ],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=SHARED_DATA)
    parser.add_argument("--directions", nargs="*", default=["en-zh", "zh-en"])
    parser.add_argument("--sets", nargs="*", default=list(SETS), choices=list(SETS))
    parser.add_argument("--limit", type=int, default=500, help="most cases per direction and set")
    parser.add_argument("--output")
    args = parser.parse_args(argv)
    glosses = read_glosses(args.data)
    report: dict = {"command": report_command("bench.glossary"), "beam_size": 4, "results": {}}
    for direction in args.directions:
        model = Translator.from_pretrained(direction)
        for name in args.sets:
            result = measure(model, direction, read_pairs(args.data, name), glosses, args.limit)
            report["results"][f"{direction} {name}"] = result
            print(direction, name, {k: v for k, v in result.items() if k != "examples"}, flush=True)
    report["machine"] = machine()
    print(format_table(report))
    write_report(report, args.output, "glossary.json")
    return 0


def format_table(report: dict) -> str:
    lines = [
        "| direction and set | cases | term without | term with | where missed without | chrF without → with "
        "| time with / without |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in report["results"].items():
        missed = "" if r["term_where_missed_without"] is None else f"{100 * r['term_where_missed_without']:.1f} %"
        lines.append(
            f"| {name} | {r['cases']} | {100 * r['term_in_translation_without']:.1f} % | "
            f"{100 * r['term_in_translation_with']:.1f} % | {missed} ({r['missed_without']}) | "
            f"{r['chrf_without']:.1f} → {r['chrf_with']:.1f} | {r['time_ratio']:.2f}× |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
