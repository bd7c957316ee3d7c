"""Does the trust score know more than the log-probability on sets its calibration never saw?

Each labelled set is held out in turn (model.training.trust_data.held_out_sets: Tatoeba, HSK, long texts, and
TICO-19, which is only ever tested on); the calibration of each mode is refitted on the other sets (TICO-19 never
among them) and scores the held-out one. Reported per direction and held-out set: ROC AUC of good against bad
for Seq-Logprob (forward_logprob, the model's own confidence) and for each mode's score, and each mode's gain
over Seq-Logprob with a paired bootstrap 95 % interval that resamples source groups (a source and its perturbed
copy together). Labels as everywhere for trust: sentence chrF against the reference(s) and the repetition
filter (trust_data.translate_and_label). The shipped calibration is not used: every score here is a refit.

    python -m bench.trust_heldout                   # both shipped models; writes bench/results/trust-heldout.json
    python -m bench.trust_heldout --limit 80        # the first 80 sources of each set (a quick look)
"""

from __future__ import annotations

import argparse
import sys

from bench import SHARED_DATA, close_report
from bench.trust import directions
from model.training.trust_data import HELD_OUT_SETS, Item, held_out_sets, translate_and_label
from model.trust import FAST_SIGNALS, FULL_SIGNALS, auc_gain_interval, fit_mode, roc_auc

MODES = {"fast": FAST_SIGNALS, "full": FULL_SIGNALS}
FITTED_ON = ("tatoeba", "hsk", "long")  # the sets a calibration may be fitted on (TICO-19 is test only)


def fitting_sets(held_out: str) -> list[str]:
    return [name for name in FITTED_ON if name != held_out]


def evaluate(items: list[Item], rounds: int, seed: int) -> dict:
    """Per held-out set: counts, Seq-Logprob's AUC, and each mode's refitted AUC and gain with its interval."""
    rows = {}
    for held_out in HELD_OUT_SETS:
        test = [item for item in items if item.set == held_out]
        fit = [item for item in items if item.set in fitting_sets(held_out)]
        labels = [item.good for item in test]
        if not test or len(set(labels)) < 2:
            continue
        baseline = [item.signals["forward_logprob"] for item in test]
        groups = [item.group for item in test]
        row: dict = {
            "translations": len(test),
            "bad": len(test) - sum(labels),
            "fitted_on": fitting_sets(held_out),
            "fit_translations": len(fit),
            "seq_logprob_auc": round(roc_auc(baseline, labels), 4),
        }
        calibrations: dict = {}
        for mode, names in MODES.items():
            # as served: a translation the reverse model cannot read back (too long for it) is scored as "fast"
            fitted = [item for item in fit if all(name in item.signals for name in names)]
            calibrations[mode] = fit_mode([item.signals for item in fitted], [item.good for item in fitted], names)
            scores = [
                calibrations[mode if all(name in item.signals for name in names) else "fast"].probability(item.signals)
                for item in test
            ]
            auc = roc_auc(scores, labels)
            low, high = auc_gain_interval(groups, labels, scores, baseline, rounds, seed)
            row[mode] = {
                "auc": round(auc, 4),
                "gain": round(auc - row["seq_logprob_auc"], 4),
                "gain_95": [round(low, 4), round(high, 4)],
            }
        rows[held_out] = row
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=str(SHARED_DATA))
    parser.add_argument("--models", nargs="*", default=["en-zh", "zh-en"], help="NAME or NAME=DIRECTORY")
    parser.add_argument("--limit", type=int, help="the first N sources of each set")
    parser.add_argument("--rounds", type=int, default=1000, help="bootstrap resamples")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--dtype", default="auto", help="how the models decode (default auto: as served)")
    parser.add_argument("--output")
    args = parser.parse_args(argv)
    report: dict = {"command": " ".join(["python -m bench.trust_heldout", *sys.argv[1:]]), "models": {}}
    for name, path, model, reverse in directions(args.models, args.dtype):
        source_language, target_language = name.split("-")
        items = held_out_sets(args.data, source_language, target_language, model, args.seed, args.limit)
        timing = translate_and_label(items, model, reverse, target_language)
        report["models"][name] = {
            "path": str(path),
            "weights_digest": model.weights_digest,
            "held_out": evaluate(items, args.rounds, args.seed),
            "seconds": timing["seconds"],
        }
    return close_report(report, args.output, "trust-heldout.json", format_table)


def format_table(report: dict) -> str:
    lines = [
        "",
        "| direction | held out (bad / all) | fitted on | Seq-Logprob AUC | fast: AUC, gain [95 %] "
        "| full: AUC, gain [95 %] |",
        "|---|---|---|---|---|---|",
    ]
    for name, result in report["models"].items():
        for held_out, row in result["held_out"].items():
            cells = [
                name,
                f"{held_out} ({row['bad']} / {row['translations']})",
                ", ".join(row["fitted_on"]),
                f"{row['seq_logprob_auc']:.3f}",
            ]
            for mode in MODES:
                value = row[mode]
                low, high = value["gain_95"]
                cells.append(f"{value['auc']:.3f}, {value['gain']:+.3f} [{low:+.3f}, {high:+.3f}]")
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
