"""The hallucination signal, measured: does ALTI+'s source share tell a translation of the source from an
unrelated sentence? One run, a table and bench/results/hallucination.json.

    python -m bench.hallucination                    # both shipped models, the 1,000 Tatoeba dev pairs
    python -m bench.hallucination --limit 200        # a quicker look

For each dev source: its reference (a true pair), another source's reference (a mismatched pair: a
derangement of the references, seeded), and the model's own beam-4 translation. Each pair is force-decoded:
the sentence's source share (mean over its target tokens, </s> included, of ALTI+'s source share) and,
as the baseline a detector must beat, the model's length-normalised log-probability (mean token
log-probability). ROC AUC of each score at ranking true above mismatched pairs, and own translations
above mismatched pairs.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
if str(REPOSITORY) not in sys.path:
    sys.path.insert(0, str(REPOSITORY))

from model.data import read_pairs  # noqa: E402
from model.translator import Translator  # noqa: E402

DATA = REPOSITORY.parent / "shared" / "data" / "tatoeba-en-zh" / "dev.tsv"
RESULTS = REPOSITORY / "bench" / "results"
COLUMNS = {"en-zh": (0, 1), "zh-en": (1, 0)}


def roc_auc(positives: list[float], negatives: list[float]) -> float:
    """P(score of a random positive > score of a random negative), ties counting one half (Mann–Whitney)."""
    ranked = sorted([(s, 1) for s in positives] + [(s, 0) for s in negatives])
    rank_sum, position = 0.0, 0
    while position < len(ranked):
        end = position
        while end < len(ranked) and ranked[end][0] == ranked[position][0]:
            end += 1
        average_rank = (position + 1 + end) / 2  # ranks position+1 … end share their mean
        rank_sum += average_rank * sum(label for _, label in ranked[position:end])
        position = end
    count = len(positives)
    return (rank_sum - count * (count + 1) / 2) / (count * len(negatives))


def derangement(count: int, seed: int) -> list[int]:
    """A seeded permutation with no fixed point: index i gets the reference of another source."""
    rng = random.Random(seed)
    order = list(range(count))
    while True:
        rng.shuffle(order)
        if all(i != j for i, j in enumerate(order)):
            return order


def pair_scores(translator: Translator, source: str, target_ids: list[int]) -> dict:
    source_ids = translator.tokenizer.encode_source(source)
    shares = translator.attribute(source_ids, target_ids, "alti_plus").source_share
    logprobs = translator.explain(source_ids, target_ids).token_logprobs
    return {"source_share": float(shares.mean()), "logprob": sum(logprobs) / len(logprobs)}


def measure(name: str, pairs: list[tuple[str, str]], seed: int) -> dict:
    translator = Translator.from_pretrained(name, device="cpu")
    sources = [source for source, _ in pairs]
    references = [reference for _, reference in pairs]
    mismatched = [references[j] for j in derangement(len(references), seed)]
    started = time.perf_counter()
    own = [t.target_ids for t in translator.translate(sources, beam_size=4)]
    kinds = {
        "true": [translator.tokenizer.encode_target(t) for t in references],
        "mismatched": [translator.tokenizer.encode_target(t) for t in mismatched],
        "own": own,
    }
    scores = {
        kind: [pair_scores(translator, source, ids) for source, ids in zip(sources, targets)]
        for kind, targets in kinds.items()
    }
    seconds = time.perf_counter() - started
    report = {"pairs": len(pairs), "seconds": round(seconds, 1)}
    for score in ("source_share", "logprob"):
        values = {kind: [item[score] for item in items] for kind, items in scores.items()}
        report[score] = {
            "auc_true_vs_mismatched": round(roc_auc(values["true"], values["mismatched"]), 4),
            "auc_own_vs_mismatched": round(roc_auc(values["own"], values["mismatched"]), 4),
            "mean": {kind: round(sum(v) / len(v), 4) for kind, v in values.items()},
        }
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DATA, help="Tatoeba dev TSV (English, Chinese, attribution)")
    parser.add_argument("--models", nargs="*", default=["en-zh", "zh-en"])
    parser.add_argument("--limit", type=int, default=None, help="only the first N dev pairs")
    parser.add_argument("--seed", type=int, default=0, help="seed of the mismatched pairing")
    parser.add_argument("--output", type=Path, default=RESULTS / "hallucination.json")
    args = parser.parse_args(argv)
    results = {}
    for name in args.models:
        pairs = read_pairs(str(args.data), *COLUMNS[name])[: args.limit]
        results[name] = measure(name, pairs, args.seed)
        print_row(name, results[name])
    report = {"command": "python -m bench.hallucination " + " ".join(argv or sys.argv[1:]), "models": results}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    return 0


def print_row(name: str, result: dict) -> None:
    share, logprob = result["source_share"], result["logprob"]
    print(
        f"{name}: {result['pairs']} pairs, {result['seconds']} s | ROC AUC true vs mismatched: "
        f"source share {share['auc_true_vs_mismatched']:.3f}, log-prob {logprob['auc_true_vs_mismatched']:.3f} | "
        f"own vs mismatched: source share {share['auc_own_vs_mismatched']:.3f}, "
        f"log-prob {logprob['auc_own_vs_mismatched']:.3f} | mean source share true/mismatched/own "
        f"{share['mean']['true']:.3f}/{share['mean']['mismatched']:.3f}/{share['mean']['own']:.3f}"
    )


if __name__ == "__main__":
    sys.exit(main())
