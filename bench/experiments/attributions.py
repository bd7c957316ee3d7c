"""What each attribution method costs on a shipped model: milliseconds per (source, target) pair by length.

    python -m bench.experiments.attributions      # en-zh, one thread; writes bench/results/attributions-cpu.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from bench import report_command
from model.errors import InputTooLongError
from model.explanations.attribution import DEFAULT_STEPS, MAX_TOKENS, METHODS
from model.training.data import read_pairs
from model.translator import Translator

REPOSITORY = Path(__file__).resolve().parents[2]

DATA = REPOSITORY.parent / "shared" / "data" / "tatoeba-en-zh" / "dev.tsv"
RESULTS = REPOSITORY / "bench" / "results"
GROUPS = {"short": (0, 24), "medium": (25, 60), "long": (61, MAX_TOKENS)}


def grouped_pairs(translator: Translator, sources: list[str], per_group: int) -> dict[str, list[tuple]]:
    """(source ids, target ids) per length group; long pairs are dev sentences joined until they are long."""
    groups: dict[str, list[tuple]] = {name: [] for name in GROUPS}
    candidates = sources + [" ".join(sources[i : i + 6]) for i in range(0, len(sources), 6)]
    for text in candidates:
        source_ids = translator.encode_source([text])[0]
        target_ids = translator.generate([source_ids], beam_size=4)[0][0].token_ids
        total = len(source_ids) + len(target_ids)
        for name, (low, high) in GROUPS.items():
            if low <= total <= high and len(groups[name]) < per_group:
                groups[name].append((source_ids, target_ids))
        if all(len(pairs) == per_group for pairs in groups.values()):
            break
    return groups


def milliseconds(call) -> float:
    started = time.perf_counter()
    call()
    return (time.perf_counter() - started) * 1000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="en-zh")
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--pairs", type=int, default=5, help="pairs per length group")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (a translator replica's share)")
    parser.add_argument("--output", type=Path, default=RESULTS / "attributions-cpu.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    translator = Translator.from_pretrained(args.model, device="cpu")
    column = 0 if args.model.startswith("en") else 1
    sources = [pair[column] for pair in read_pairs(str(args.data), 0, 1)[:400]]
    groups = grouped_pairs(translator, sources, args.pairs)
    runs = {"attention (forced decode)": lambda s, t: translator.explain(s, t, encoder_attention=True)}
    runs.update({method: (lambda s, t, m=method: translator.attribute(s, t, m)) for method in METHODS})
    table: dict[str, dict] = {}
    for name, run in runs.items():
        table[name] = {}
        for group, pairs in groups.items():
            try:
                run(*pairs[0])  # warm-up
                times = [milliseconds(lambda p=p, run=run: run(*p)) for p in pairs]
            except InputTooLongError:  # integrated gradients' work bound: the service answers 413
                table[name][group] = "413"
                continue
            table[name][group] = round(statistics.median(times), 1)
    sizes = {group: [len(s) + len(t) for s, t in pairs] for group, pairs in groups.items()}
    print(f"{args.model}, {args.threads} thread(s), median ms per pair; tokens (source + target) per group: {sizes}")
    print(f"{'method':28}" + "".join(f"{group:>10}" for group in GROUPS))
    for name, row in table.items():
        print(f"{name:28}" + "".join(f"{row[group]:>10}" for group in GROUPS))
    report = {
        "command": report_command("bench.experiments.attributions", argv or None),
        "model": args.model,
        "threads": args.threads,
        "integrated_gradients_steps": DEFAULT_STEPS,
        "tokens_per_group": sizes,
        "median_ms": table,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
