"""Fit a model's trust score (model.calibration) and store it beside its weights as trust.json.

    python -m model.training.calibrate_trust --model en-zh --reverse zh-en     # the shipped en→zh model
    python -m model.training.calibrate_trust --model DIR --reverse DIR2 --source-language en --target-language zh

Rerun it whenever the weights change (trust.json names the weights digest it was fitted on; a Translator whose
weights differ from it ignores it and says so). It translates the "fit" half of the labelled development set
(model.training.trust_data: clean, perturbed and long sources, labelled by sentence chrF), reads each
translation's signals (model.trust), and fits one logistic regression per trust mode on the signals
model.calibration.SCORE_SIGNALS names for it (chosen by python -m bench.trust_heldout). Then it translates the
"test" half, which the fit never saw, and stores what each mode's scores meant there
(model.calibration.reliability: equal-count bins of scores, each with the share of its translations labelled
good): the meaning the viewer and the API give a score. bench.trust scores the test half too.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

from model.calibration import SCORE_SIGNALS, Calibration, fit_mode, reliability, roc_auc
from model.loading import resolve_model_path
from model.training.trust_data import good_chrf, labelled_sources, translate_and_label
from model.translator import Translator


def fit(model: Translator, reverse: Translator, data: str, source_language: str, target_language: str) -> Calibration:
    items = labelled_sources(data, source_language, target_language, model, "fit")
    timing = translate_and_label(items, model, reverse, target_language)
    rows = [item.signals for item in items]
    labels = [item.good for item in items]
    modes = {mode: fit_mode(rows, labels, names) for mode, names in SCORE_SIGNALS.items()}
    counts = Counter((item.category, "good" if item.good else "bad") for item in items)
    held = labelled_sources(data, source_language, target_language, model, "test")
    held_timing = translate_and_label(held, model, reverse, target_language)
    held_labels = [item.good for item in held]
    held_auc = {}
    for mode, calibration in modes.items():
        scores = [calibration.probability(item.signals) for item in held]
        calibration.reliability = reliability(scores, held_labels)
        held_auc[mode] = round(roc_auc(scores, held_labels), 4)
    fitted_on = {
        "weights_digest": model.weights_digest,
        "reverse_model": reverse.name,
        "reverse_weights_digest": reverse.weights_digest,
        "translations": len(items),
        "counts": {f"{category} {label}": n for (category, label), n in sorted(counts.items())},
        "label": f"good: sentence chrF >= {good_chrf(target_language)} against the reference(s) and no oscillation",
        "beam_size": 4,
        "precision": model.precision,
        "training_auc": {
            mode: round(roc_auc([c.probability(r) for r in rows], labels), 4) for mode, c in modes.items()
        },
        "held_out_translations": len(held),
        "held_out_good": sum(held_labels),
        "held_out_auc": held_auc,
        "seconds": round(timing["seconds"] + held_timing["seconds"], 1),
        "command": " ".join(["python -m model.training.calibrate_trust", *sys.argv[1:]]),
    }
    return Calibration(modes, fitted_on)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m model.training.calibrate_trust",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--model", required=True, help="model directory or shipped name")
    parser.add_argument("--reverse", required=True, help="the model translating the other way")
    parser.add_argument("--data", default=str(Path(__file__).resolve().parents[2].parent / "shared" / "data"))
    parser.add_argument("--source-language", help="default: the model name's first part (en-zh → en)")
    parser.add_argument("--target-language", help="default: the model name's second part")
    parser.add_argument("--output", help="directory for trust.json (default: the model's own)")
    parser.add_argument(
        "--dtype", default="auto", help="how the model decodes while fitted (default auto: as the service serves it)"
    )
    args = parser.parse_args(argv)
    directory = resolve_model_path(args.model)
    source_language = args.source_language or directory.name.split("-")[0]
    target_language = args.target_language or directory.name.split("-")[-1]
    model = Translator.from_pretrained(directory, dtype=args.dtype)
    reverse = Translator.from_pretrained(args.reverse, dtype=args.dtype)
    calibration = fit(model, reverse, args.data, source_language, target_language)
    path = calibration.save(args.output or directory)
    print(json.dumps(calibration.fitted_on, indent=1, ensure_ascii=False))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
