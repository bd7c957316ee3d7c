"""The hallucination signal, measured: does ALTI+'s source share tell a translation of the source from an
unrelated sentence? One run, a table and bench/results/hallucination.json.

    python -m bench.hallucination                    # both shipped models, the 1,000 Tatoeba dev pairs
    python -m bench.hallucination --limit 200        # a quicker look
    python -m bench.hallucination --limit 150 --steps 16 --output bench/results/hallucination-methods.json \
        --methods saliency input_x_gradient integrated_gradients value_zeroing alti_plus

For each dev source: its reference (a true pair), another source's reference (a mismatched pair: a
derangement of the references, seeded), and the model's own beam-4 translation. Each pair is force-decoded:
the sentence's source share (mean over its target tokens, </s> included, of ALTI+'s source share) and,
as the baseline a detector must beat, the model's length-normalised log-probability (mean token
log-probability). ROC AUC of each score at ranking true above mismatched pairs, and own translations
above mismatched pairs.

--methods measures several attribution methods' source shares side by side (default ALTI+ alone, the
report's `source_share`), each under the sentence-level aggregations of AGGREGATIONS: the mean over all
tokens (as above), and, </s> left out, the mean, the minimum and the mean over the last half of the
tokens (hallucinations tend to detach late). Each is read as "higher = more source = a true pair"; an
AUC under 0.5 means mismatched pairs score higher, the opposite of the hypothesis.
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

from model.attribution import MAX_GRADIENT_WORK, METHODS  # noqa: E402
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


def _last_half(shares: list[float]) -> float:
    half = shares[len(shares) // 2 :]
    return sum(half) / len(half)


def _without_eos(shares: list[float]) -> list[float]:
    return shares[:-1] or shares  # a target of </s> alone keeps it


# Sentence-level source share from the per-token shares (</s> last): the aggregations the literature uses.
AGGREGATIONS = {
    "mean": lambda shares: sum(shares) / len(shares),
    "mean_no_eos": lambda shares: sum(_without_eos(shares)) / len(_without_eos(shares)),
    "min_no_eos": lambda shares: min(_without_eos(shares)),
    "last_half_no_eos": lambda shares: _last_half(_without_eos(shares)),
}


def _steps_for(method: str, steps: int | None, source_ids: list[int], target_ids: list[int]) -> int | None:
    """Integrated gradients' steps, lowered to what model.attribution allows for a long pair."""
    if method != "integrated_gradients":
        return None
    tokens = len(source_ids) + len(target_ids)
    wanted = steps or 50
    return max(1, min(wanted, MAX_GRADIENT_WORK // (len(target_ids) * tokens)))


def pair_scores(
    translator: Translator, source: str, target_ids: list[int], methods: list[str], steps: int | None, seconds: dict
) -> dict:
    source_ids = translator.tokenizer.encode_source(source)
    scores = {}
    for method in methods:
        started = time.perf_counter()
        pair_steps = _steps_for(method, steps, source_ids, target_ids)
        shares = translator.attribute(source_ids, target_ids, method, pair_steps).source_share.tolist()
        seconds[method] = seconds.get(method, 0.0) + time.perf_counter() - started
        if pair_steps is not None and pair_steps < (steps or 50):
            seconds["integrated_gradients_fewer_steps"] = seconds.get("integrated_gradients_fewer_steps", 0) + 1
        for aggregation, aggregate in AGGREGATIONS.items():
            scores[f"{method}/{aggregation}"] = aggregate(shares)
    logprobs = translator.explain(source_ids, target_ids).token_logprobs
    scores["logprob"] = sum(logprobs) / len(logprobs)
    return scores


def _separation(values: dict[str, list[float]]) -> dict:
    return {
        "auc_true_vs_mismatched": round(roc_auc(values["true"], values["mismatched"]), 4),
        "auc_own_vs_mismatched": round(roc_auc(values["own"], values["mismatched"]), 4),
        "mean": {kind: round(sum(v) / len(v), 4) for kind, v in values.items()},
    }


def measure(name: str, pairs: list[tuple[str, str]], seed: int, methods: list[str], steps: int | None) -> dict:
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
    method_seconds: dict = {}
    scores = {}
    for kind, targets in kinds.items():
        scores[kind] = [
            pair_scores(translator, source, ids, methods, steps, method_seconds)
            for source, ids in zip(sources, targets)
        ]
        print(f"{name}: {kind} pairs done, {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    seconds = time.perf_counter() - started

    def separation(score: str) -> dict:
        return _separation({kind: [item[score] for item in items] for kind, items in scores.items()})

    report = {"pairs": len(pairs), "seconds": round(seconds, 1)}
    if "alti_plus" in methods:
        report["source_share"] = separation("alti_plus/mean")  # the signal, as before --methods
    report["logprob"] = separation("logprob")
    report["methods"] = {
        method: {aggregation: separation(f"{method}/{aggregation}") for aggregation in AGGREGATIONS}
        for method in methods
    }
    report["integrated_gradients_fewer_steps"] = method_seconds.pop("integrated_gradients_fewer_steps", 0)  # pairs
    report["method_seconds"] = {method: round(value, 1) for method, value in method_seconds.items()}
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DATA, help="Tatoeba dev TSV (English, Chinese, attribution)")
    parser.add_argument("--models", nargs="*", default=["en-zh", "zh-en"])
    parser.add_argument("--limit", type=int, default=None, help="only the first N dev pairs")
    parser.add_argument("--seed", type=int, default=0, help="seed of the mismatched pairing")
    parser.add_argument("--output", type=Path, default=RESULTS / "hallucination.json")
    parser.add_argument(
        "--methods", nargs="+", choices=METHODS, default=["alti_plus"], help="attribution methods, side by side"
    )
    parser.add_argument(
        "--steps", type=int, default=None, help="integrated gradients' steps (default 50; fewer for a long pair)"
    )
    args = parser.parse_args(argv)
    results = {}
    for name in args.models:
        pairs = read_pairs(str(args.data), *COLUMNS[name])[: args.limit]
        results[name] = measure(name, pairs, args.seed, args.methods, args.steps)
        print_row(name, results[name])
    if args.methods != ["alti_plus"]:
        print_methods(results)
    report = {"command": "python -m bench.hallucination " + " ".join(argv or sys.argv[1:]), "models": results}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    return 0


def print_methods(results: dict) -> None:
    """ROC AUC per method × aggregation (rows) and model × comparison (columns)."""
    columns = [(name, comparison) for name in results for comparison in ("true", "own")]
    print(f"{'source share':<40}" + "".join(f"{name + ' ' + kind + '/mism':>18}" for name, kind in columns))
    rows = [("logprob (baseline)", lambda result: result["logprob"])]
    for method in next(iter(results.values()))["methods"]:
        for aggregation in AGGREGATIONS:
            rows.append((f"{method} {aggregation}", lambda result, m=method, a=aggregation: result["methods"][m][a]))
    for label, pick in rows:
        cells = [pick(results[name])[f"auc_{kind}_vs_mismatched"] for name, kind in columns]
        print(f"{label:<40}" + "".join(f"{cell:>18.3f}" for cell in cells))


def print_row(name: str, result: dict) -> None:
    logprob = result["logprob"]
    if "source_share" not in result:
        print(f"{name}: {result['pairs']} pairs, {result['seconds']} s, per method {result['method_seconds']}")
        return
    share = result["source_share"]
    print(
        f"{name}: {result['pairs']} pairs, {result['seconds']} s | ROC AUC true vs mismatched: "
        f"source share {share['auc_true_vs_mismatched']:.3f}, log-prob {logprob['auc_true_vs_mismatched']:.3f} | "
        f"own vs mismatched: source share {share['auc_own_vs_mismatched']:.3f}, "
        f"log-prob {logprob['auc_own_vs_mismatched']:.3f} | mean source share true/mismatched/own "
        f"{share['mean']['true']:.3f}/{share['mean']['mismatched']:.3f}/{share['mean']['own']:.3f}"
    )


if __name__ == "__main__":
    sys.exit(main())
