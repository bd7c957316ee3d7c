"""Each trust flag kind's precision and recall on constructed faults (model/training/flag_cases.py), per direction
and mode, and on the labelled held-out translations: a table and bench/results JSON.

    python -m bench.trust_flags                              # the shipped models, as served (int8)
    python -m bench.trust_flags --pairs 60                   # fewer adequate pairs per direction (a smoke run)

A kind is kept (shown by the viewer, answered by the API) where its precision on constructed faults reaches
model.training.flag_cases.KEEP_PRECISION in every direction and mode where its faults could be constructed. On the
labelled set the table gives, per kind, the translations flagged and the share of them labelled bad, beside the
share bad among all.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench import RESULTS, machine, report_command
from bench.trust import DATA, directions
from model.choices import FLAG_KINDS
from model.training.flag_cases import KEEP_PRECISION, constructed_cases, measure
from model.training.trust_data import labelled_sources, translate_and_label


def labelled_flags(items: list) -> dict:
    """Per flag kind ("full" flags of translate_and_label): translations flagged and the share of them bad."""
    result = {"translations": len(items), "bad_share": round(sum(1 - i.good for i in items) / max(len(items), 1), 4)}
    for kind in FLAG_KINDS:
        flagged = [item for item in items if kind in (item.flags or [])]
        result[kind] = {
            "flagged": len(flagged),
            "bad_share": round(sum(1 - i.good for i in flagged) / len(flagged), 4) if flagged else None,
        }
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=str(DATA))
    parser.add_argument("--models", nargs="*", default=["en-zh", "zh-en"], help="NAME or NAME=DIRECTORY")
    parser.add_argument("--pairs", type=int, default=150, help="adequate pairs per direction the cases start from")
    parser.add_argument("--dtype", default="auto", help="how the models decode (default auto: as served)")
    parser.add_argument("--output", default=str(RESULTS / "trust-flags.json"))
    args = parser.parse_args(argv)
    report: dict = {
        "command": report_command("bench.trust_flags"),
        "machine": machine(),
        "keep_precision": KEEP_PRECISION,
        "models": {},
    }
    for name, _, model, reverse in directions(args.models, args.dtype):
        source_language, target_language = name.split("-")
        items = labelled_sources(args.data, source_language, target_language, model, "test")
        translate_and_label(items, model, reverse, target_language)
        good = [(item.source, item.translation) for item in items if item.category == "clean" and item.good]
        cases = constructed_cases(model, good[: args.pairs], source_language, target_language)
        entry = {"pairs": min(len(good), args.pairs), "labelled": labelled_flags(items), "modes": {}}
        for mode in ("fast", "full"):
            entry["modes"][mode] = measure(model, reverse, cases, mode).as_dict()
        report["models"][name] = entry
    # kept: at least KEEP_PRECISION wherever its faults could be constructed (and at least once)
    verdicts = {
        kind: [mode["kinds"][kind]["kept"] for entry in report["models"].values() for mode in entry["modes"].values()]
        for kind in FLAG_KINDS
    }
    kept = {kind: any(v is True for v in found) and False not in found for kind, found in verdicts.items()}
    report["kept"] = [kind for kind, keep in kept.items() if keep]
    print(format_table(report))
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {args.output}")
    return 0


def format_table(report: dict) -> str:
    lines = [
        "| direction | mode | kind | faulty cases | precision (right / flagged words) | recall | labelled: flagged "
        "(bad share) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, entry in report["models"].items():
        labelled = entry["labelled"]
        for mode, measured in entry["modes"].items():
            for kind, t in measured["kinds"].items():
                flagged = labelled[kind]
                lines.append(
                    f"| {name} | {mode} | {kind} | {t['cases']} | {t['precision']} ({t['right']} / "
                    f"{t['right'] + t['wrong']}) | {t['recall']} | {flagged['flagged']} ({flagged['bad_share']}) |"
                )
        lines.append(
            f"| {name} | | (all {labelled['translations']} labelled; {measured['unmodified']} unmodified cases) "
            f"| | | | bad share {labelled['bad_share']} |"
        )
    lines.append(
        f"kept (precision >= {report['keep_precision']} wherever measured): {', '.join(report['kept']) or 'none'}"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
