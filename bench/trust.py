"""How well the trust score separates good from bad translations, beside each of its signals alone.

Builds the "test" half of the labelled development set (model.training.trust_data: the recipe's Tatoeba and HSK
development sources, perturbed sources and longer texts, labelled by sentence chrF; the calibration was fitted on
the other half), translates it with each shipped model at beam 4, and reports per direction and category ROC AUC
of good against bad and the false-positive rate at 90 % recall of bad translations (the share of good translations
a threshold catching 90 % of the bad ones also marks), for the served score in both modes and for every signal
alone, Seq-Logprob (forward_logprob) included. Also the cost of each mode per single sentence.

    python -m bench.trust                         # both shipped models; writes bench/results/trust.json
    python -m bench.trust --models en-zh=DIR zh-en=DIR2
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator
from pathlib import Path

from bench import SHARED_DATA, close_report, named_models, report_command
from model.calibration import roc_auc
from model.errors import InputTooLongError
from model.options import DecodingOptions
from model.training.trust_data import CATEGORIES, labelled_sources, translate_and_label
from model.translator import Translator
from model.trust import FULL_SIGNALS

REPOSITORY = Path(__file__).resolve().parents[1]
DATA = SHARED_DATA
REVERSE = {"en-zh": "zh-en", "zh-en": "en-zh"}
# Each signal alone, oriented before looking at any data: +1 where higher means better, -1 where lower does.
ORIENTATION = {
    "forward_logprob": 1,
    "forward_min_logprob": 1,
    "source_coverage": 1,
    "target_support": 1,
    "repetition": -1,
    "length_ratio": 0,  # scored as -|length_ratio|
    "untranslated": -1,
    "truncated": -1,
    "source_length": -1,
    "source_familiarity": 1,
    "reverse_logprob": 1,
    "alti_source_share": 1,
}


def add_source_shares(model: Translator, items: list) -> None:
    """ALTI+'s mean source share of each translation (what the viewer once marked as "a sign of hallucination"),
    as one more signal alone: is it one here?"""
    for item in items:
        source_ids, target_ids = item.ids
        try:
            shares = model.attribute(source_ids, target_ids, "alti_plus").source_share.tolist()
        except InputTooLongError:  # past the attributions' token limit: ranked at chance
            shares = [0.5]
        item.signals["alti_source_share"] = sum(shares) / len(shares) if shares else 0.5


def signal_score(signals: dict, name: str) -> float:
    value = float(signals[name])
    return -abs(value) if ORIENTATION[name] == 0 else ORIENTATION[name] * value


def false_positive_rate(scores: list[float], labels: list[int], recall: float = 0.9) -> float:
    """Share of good items at or below the threshold that marks `recall` of the bad items (low score = bad)."""
    bad = sorted(s for s, label in zip(scores, labels) if not label)
    good = [s for s, label in zip(scores, labels) if label]
    if not bad or not good:
        return float("nan")
    threshold = bad[min(len(bad) - 1, max(0, int(round(recall * len(bad))) - 1))]
    return sum(s <= threshold for s in good) / len(good)


def mode_cost(model: Translator, reverse: Translator, texts: list[str], rounds: int = 3) -> dict:
    """CPU ms per single sentence: translate alone, then the trust of each mode on top (best of `rounds`)."""
    options = DecodingOptions(beam_size=4)
    best = {"translate": float("inf"), "fast": float("inf"), "full": float("inf")}
    for _ in range(rounds):
        spent = {"translate": 0.0, "fast": 0.0, "full": 0.0}
        for text in texts:
            start = time.process_time()
            translations = model.translate([text], options)
            spent["translate"] += time.process_time() - start
            for mode in ("fast", "full"):
                start = time.process_time()
                model.assess(translations, mode, reverse)
                spent[mode] += time.process_time() - start
        for key, value in spent.items():
            best[key] = min(best[key], value * 1000 / len(texts))
    return {
        "translate_ms": round(best["translate"], 2),
        "fast_ms": round(best["fast"], 2),
        "full_ms": round(best["full"], 2),
        "fast_share": round(best["fast"] / best["translate"], 4),
        "full_share": round(best["full"] / best["translate"], 4),
    }


def directions(models: list[str], dtype: str) -> Iterator[tuple[str, str, Translator, Translator]]:
    """Per `NAME` or `NAME=DIRECTORY` of `models`: its name, path, the model, and the model of the other direction
    (the one named beside it, else the shipped one), both loaded as `dtype` decodes."""
    paths = named_models(models)
    for name, path in paths.items():
        model = Translator.from_pretrained(path, dtype=dtype)
        reverse = Translator.from_pretrained(paths.get(REVERSE[name], REVERSE[name]), dtype=dtype)
        yield name, path, model, reverse


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=str(DATA))
    parser.add_argument("--models", nargs="*", default=["en-zh", "zh-en"], help="NAME or NAME=DIRECTORY")
    parser.add_argument("--cost-texts", type=int, default=40, help="single sentences the cost is measured on")
    parser.add_argument("--dtype", default="auto", help="how the models decode (default auto: as served)")
    parser.add_argument("--output")
    args = parser.parse_args(argv)
    report: dict = {"command": report_command("bench.trust"), "models": {}}
    for name, path, model, reverse in directions(args.models, args.dtype):
        source_language, target_language = name.split("-")
        items = labelled_sources(args.data, source_language, target_language, model, "test")
        timing = translate_and_label(items, model, reverse, target_language)
        add_source_shares(model, items)
        fast, full = model.trust_fit("fast"), model.trust_fit("full")
        scorers = {
            "trust.score (fast)": (lambda s, c=fast: c.probability(s)) if fast else None,
            "trust.score (full)": (lambda s, c=full: c.probability(s)) if full else None,
            **{name_: (lambda s, n=name_: signal_score(s, n)) for name_ in (*FULL_SIGNALS, "alti_source_share")},
        }
        rows = {}
        for category in ("all", *CATEGORIES):
            chosen = [item for item in items if category in ("all", item.category)]
            labels = [item.good for item in chosen]
            row = {"translations": len(chosen), "good": sum(labels)}
            for scorer_name, scorer in scorers.items():
                if scorer is None:
                    continue
                scores = [scorer(item.signals) for item in chosen]
                row[scorer_name] = {
                    "auc": round(roc_auc(scores, labels), 4),
                    "fpr_at_90_recall": round(false_positive_rate(scores, labels), 4),
                }
            rows[category] = row
        flags: dict[str, dict] = {}
        for item in items:
            for kind in set(item.flags or []):
                entry = flags.setdefault(kind, {"flagged": 0, "bad": 0})
                entry["flagged"] += 1
                entry["bad"] += 1 - item.good
        clean = [item.source for item in items if item.category == "clean"][: args.cost_texts]
        report["models"][name] = {
            "path": str(path),
            "weights_digest": model.weights_digest,
            "calibrated": fast is not None,
            "categories": rows,
            "flags": flags,
            "cost": mode_cost(model, reverse, clean),
            "seconds": timing["seconds"],
        }
    return close_report(report, args.output, "trust.json", format_table)


def format_table(report: dict) -> str:
    lines = []
    for name, result in report["models"].items():
        lines.append(f"\n{name} (ROC AUC good vs bad / false-positive rate at 90 % recall of bad)")
        categories = result["categories"]
        scorers = [k for k in categories["all"] if isinstance(categories["all"][k], dict)]
        counts = {c: f"{c} ({v['good']}/{v['translations']} good)" for c, v in categories.items()}
        header = ["signal", *counts.values()]
        lines.append("| " + " | ".join(header) + " |")
        lines.append("|" + "---|" * len(header))
        for scorer in scorers:
            cells = [scorer]
            for category in categories:
                value = categories[category].get(scorer)
                cells.append(f"{value['auc']:.3f} / {value['fpr_at_90_recall']:.2f}" if value else "")
            lines.append("| " + " | ".join(cells) + " |")
        cost = result["cost"]
        lines.append(
            f"cost per sentence: translate {cost['translate_ms']} ms CPU, fast +{cost['fast_ms']} ms "
            f"({cost['fast_share']:.1%}), full +{cost['full_ms']} ms ({cost['full_share']:.1%})"
        )
        flagged = ", ".join(f"{k} {v['flagged']} ({v['bad']} bad)" for k, v in sorted(result["flags"].items()))
        lines.append(f"flags: {flagged or 'none'}")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
