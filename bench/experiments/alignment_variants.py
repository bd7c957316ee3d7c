"""Word alignments from both shipped models' alignment heads, symmetrised many ways, on the in-domain set and the
newswire gold set: every variant measured on the way to the served "agreement".

Each pair is forced through the en→zh model (Chinese rows over English) and the zh→en model (English rows over
Chinese); a head is turned into a word matrix on the set's own words (a word's row: the mean of its pieces' rows;
a word's column: the sum of its pieces' columns) and links are scored on those words directly. Variants: each
direction's one-best (what /v1 gave), intersection, union, grow-diag-final-and; soft agreement (the product of the
two directions' renormalised probabilities above a threshold) and what was tried on top of it: reading steps,
other heads, a diagonal prior, null mass, self-agreement within one model, four-way and power combinations,
awesome-align's two-threshold extraction, softmax both ways over the head's logits, length-scaled thresholds.

A threshold is chosen on the in-domain pairs (`dev_best`); `leave_one_out` chooses it on 64 pairs and scores the
65th, pair by pair, so the figure is not the one the choice was made on; newswire is scored at the dev choice.

    python -m bench.experiments.alignment_variants     # writes bench/results/alignment-variants.json
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path

import torch

from bench import SHARED_DATA as DATA
from bench import report_command, write_report
from model.training.evaluate_alignment import AlignmentItem, forced_maps, gold_items, head_rows, in_domain_items
from model.training.gold import GoldLinks, alignment_error_rate, grow_diag_final_and
from model.translator import Translator

DEV = DATA / "alignment-tatoeba-zh-en" / "dev.json"
GOLD = DATA / "alignment-zh-en"
THRESHOLDS = (0.02, 0.03, 0.05, 0.06, 0.08, 0.1, 0.12, 0.14, 0.15, 0.16, 0.18, 0.2, 0.25, 0.3)
SERVED_THRESHOLD = 0.12
Matrices = dict[str, list[torch.Tensor]]  # per set: per pair (zh words, en words)


class Pairs:
    """One set's pairs through both models: word matrices per (model, layer, head, step) and head logits."""

    def __init__(self, items: dict[str, list[AlignmentItem]], translators: dict[str, Translator]) -> None:
        self.items = items
        self.gold = [item.reference for item in items["zh-en"]]  # (zh word, en word)
        self.translators = translators
        self.maps = {
            direction: forced_maps(translator.model, translator.tokenizer, items[direction])
            for direction, translator in translators.items()
        }
        self._cache: dict = {}

    def words(self, direction: str, layer: int | None = None, head: int | None = -1, step: str = "declared"):
        """(zh words, en words) matrices from one head (head None: the layer's mean; -1: the declared head)."""
        translator = self.translators[direction]
        if head == -1:
            layer, head = translator.alignment_head
        key = (direction, layer, head, step)
        if key not in self._cache:
            matrices = []
            for forced, item in zip(self.maps[direction], self.items[direction], strict=True):
                if step == "both":
                    rows = (head_rows(forced.cross_attention, layer, head, False)
                            + head_rows(forced.cross_attention, layer, head, True)) / 2  # fmt: skip
                else:
                    shift = translator.alignment_shift if step == "declared" else step == "input"
                    rows = head_rows(forced.cross_attention, layer, head, shift)
                matrix = pool(rows, forced.target_map, forced.source_map, item)
                matrices.append(matrix if direction == "en-zh" else matrix.T)
            self._cache[key] = matrices
        return self._cache[key]

    def logits(self, direction: str) -> list[torch.Tensor]:
        """The declared head's scaled scores Q·Kᵀ/√d_k (before the softmax), pooled as the weights are."""
        key = (direction, "logits")
        if key not in self._cache:
            translator = self.translators[direction]
            matrices = []
            for forced, item in zip(self.maps[direction], self.items[direction], strict=True):
                scores = head_scores(translator, item)
                matrix = pool(scores, forced.target_map, forced.source_map, item, average_columns=True)
                matrices.append(matrix if direction == "en-zh" else matrix.T)
            self._cache[key] = matrices
        return self._cache[key]


def pool(rows, target_map, source_map, item: AlignmentItem, average_columns: bool = False) -> torch.Tensor:
    """(target words, source words) from piece rows: rows averaged over a word's pieces, columns summed (or
    averaged, for scores that are not probabilities)."""
    target_count, source_count = len(item.target_words), len(item.source_words)
    average = torch.zeros(target_count, rows.size(0))
    for piece, words in enumerate(target_map):
        for word in words:
            average[word, piece] = 1.0
    membership = torch.zeros(rows.size(1), source_count)
    for piece, words in enumerate(source_map):
        for word in words:
            membership[piece, word] = 1.0
    if average_columns:
        membership = membership / membership.sum(0, keepdim=True).clamp(min=1)
    average = average / average.sum(1, keepdim=True).clamp(min=1)
    return average @ rows.float() @ membership


@torch.inference_mode()
def head_scores(translator: Translator, item: AlignmentItem) -> torch.Tensor:
    """The declared head's scaled scores for a forced pair, at the declared reading step (T, S)."""
    from model.explanations.explain import teacher_forcing_inputs

    model, (layer, head) = translator.model, translator.alignment_head
    limit = model.config.max_position_embeddings
    source_ids = translator.tokenizer.encode_source(item.source)[:limit]
    target_ids = translator.tokenizer.encode_target(item.target)[:limit]
    source, mask, decoder_input = teacher_forcing_inputs(model, source_ids, target_ids)
    attention = model.decoder_layers[layer].encoder_attn
    queries: list[torch.Tensor] = []
    hook = attention.register_forward_pre_hook(lambda _module, args: queries.append(args[0]))
    try:
        encoder = model.encode(source, mask)
        model.decode(decoder_input, encoder)
    finally:
        hook.remove()
    rows = slice(head * attention.d_k, (head + 1) * attention.d_k)
    q = queries[0][0].float() @ attention.q_proj.weight[rows].float().T + attention.q_proj.bias[rows].float()
    k = encoder.hidden[0].float() @ attention.k_proj.weight[rows].float().T + attention.k_proj.bias[rows].float()
    scores = q @ k.T / math.sqrt(attention.d_k)  # (T, S)
    return torch.cat([scores[1:], scores[-1:]]) if translator.alignment_shift else scores


# ---- combinations (each: the two (zh words, en words) matrices → a score per word pair) ------------------------
def given_zh(m: torch.Tensor) -> torch.Tensor:  # en-zh's rows: p(en | zh)
    return m / m.sum(1, keepdim=True).clamp(min=1e-9)


def given_en(m: torch.Tensor) -> torch.Tensor:  # zh-en's rows, transposed: p(zh | en)
    return m / m.sum(0, keepdim=True).clamp(min=1e-9)


def diagonal(m: torch.Tensor, strength: float) -> torch.Tensor:
    rows, columns = m.shape
    i = (torch.arange(rows).float() + 0.5) / rows
    j = (torch.arange(columns).float() + 0.5) / columns
    return m * torch.exp(-strength * (i[:, None] - j[None, :]).abs())


def with_null(m: torch.Tensor, mass: float, dim: int) -> torch.Tensor:
    return m / (m.sum(dim, keepdim=True) + mass)


Combination = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
SOFT: Combination = lambda f, b: given_zh(f) * given_en(b)  # noqa: E731


def links_above(scores: torch.Tensor, threshold: float) -> set:
    return {tuple(map(int, x)) for x in (scores > threshold).nonzero().tolist()}


def score(links: list[set], gold: list[GoldLinks]) -> dict:
    return alignment_error_rate(links, gold).as_dict()


def counts(links: set, gold: GoldLinks) -> tuple[int, int, int, int]:
    return len(links & gold.sure), len(links & gold.possible), len(links), len(gold.sure)


def aer_of(total: list[int]) -> float:
    return 1 - (total[0] + total[1]) / max(total[2] + total[3], 1)


def thresholded(dev: list[torch.Tensor], gold: list[torch.Tensor], sets: dict[str, Pairs], rule=None) -> dict:
    """Choose the threshold on the in-domain pairs (and leave-one-out), score newswire at it. rule(t, I, J): the
    threshold a pair of I×J words gets for the choice t (default t)."""
    rule = rule or (lambda t, rows, columns: t)
    table = [[counts(links_above(m, rule(t, *m.shape)), g) for t in THRESHOLDS] for m, g in zip(dev, sets["dev"].gold)]
    totals = [[sum(row[i][k] for row in table) for k in range(4)] for i in range(len(THRESHOLDS))]
    best = min(range(len(THRESHOLDS)), key=lambda i: aer_of(totals[i]))
    held_out = [0, 0, 0, 0]
    chosen = set()
    for row in table:
        pick = min(range(len(THRESHOLDS)), key=lambda i: aer_of([totals[i][k] - row[i][k] for k in range(4)]))
        chosen.add(THRESHOLDS[pick])
        held_out = [held_out[k] + row[pick][k] for k in range(4)]
    threshold = THRESHOLDS[best]
    return {
        "threshold": threshold,
        "dev": score([links_above(m, rule(threshold, *m.shape)) for m in dev], sets["dev"].gold),
        "leave_one_out": {"aer": round(100 * aer_of(held_out), 2), "thresholds_chosen": sorted(chosen)},
        "gold": score([links_above(m, rule(threshold, *m.shape)) for m in gold], sets["gold"].gold),
    }


def soft_variants(sets: dict[str, Pairs]) -> dict[str, dict]:
    def both(combine: Combination, **where) -> tuple[list, list]:
        return tuple(
            [combine(f, b) for f, b in zip(pairs.words("en-zh", **where), pairs.words("zh-en", **where), strict=True)]
            for pairs in (sets["dev"], sets["gold"])
        )

    variants: dict[str, dict] = {}

    def add(name: str, combine: Combination, rule=None, **where) -> None:
        variants[name] = thresholded(*both(combine, **where), sets, rule)

    add("soft agreement (declared heads, input step)", SOFT)
    add("soft agreement, prediction step", SOFT, step="prediction")
    add("soft agreement, both steps averaged", SOFT, step="both")
    for layer in range(3):
        for head in (0, 1, 2, 3, None):
            if (layer, head) != (1, 1):
                add(f"soft agreement, layer {layer} {'mean' if head is None else f'head {head}'}", SOFT,
                    layer=layer, head=head)  # fmt: skip
    for strength in (1, 2, 3, 5):
        add(f"soft agreement × diagonal prior exp(-{strength}|i/I - j/J|)", lambda f, b, s=strength: given_zh(
            diagonal(f, s)) * given_en(diagonal(b, s)))  # fmt: skip
    for mass in (0.05, 0.1, 0.2, 0.4):
        add(f"soft agreement with null mass {mass}", lambda f, b, m=mass: with_null(f, m, 1) * with_null(b, m, 0))
    add("self-agreement within en-zh (rows × columns)", lambda f, b: given_zh(f) * given_en(f))
    add("self-agreement within zh-en (rows × columns)", lambda f, b: given_zh(b) * given_en(b))
    add("four-way √(both models' rows × columns)", lambda f, b: (given_zh(f) * given_en(f) * given_zh(b) *
                                                                given_en(b)).sqrt())  # fmt: skip
    add("soft agreement × √(the other two normalisations)",
        lambda f, b: SOFT(f, b) * (given_en(f) * given_zh(b)).sqrt())  # fmt: skip
    for power in (0.5, 0.75, 1.5, 2):
        add(f"soft agreement of probabilities ^{power}", lambda f, b, p=power: given_zh(given_zh(f) ** p) *
            given_en(given_en(b) ** p))  # fmt: skip
    add("mean of the two directions", lambda f, b: (given_zh(f) + given_en(b)) / 2)
    add("awesome-align extraction: both directions > t", lambda f, b: torch.minimum(given_zh(f), given_en(b)))
    for scale in (1.0, 1.5, 2.0):
        served = " (served)" if scale == 1.5 else ""
        add(f"soft agreement, threshold min(t, {scale}/√(I·J)){served}", SOFT,
            rule=lambda t, rows, columns, c=scale: min(t, c / math.sqrt(rows * columns)))  # fmt: skip
    add("soft agreement, threshold t·8/√(I·J)", SOFT, rule=lambda t, rows, columns: t * 8 / math.sqrt(rows * columns))
    logits = tuple((pairs.logits("en-zh"), pairs.logits("zh-en")) for pairs in (sets["dev"], sets["gold"]))
    for temperature in (0.5, 1.0, 2.0):
        variants[f"head logits, softmax both ways across models (T={temperature})"] = thresholded(
            *([(f / temperature).softmax(1) * (b / temperature).softmax(0) for f, b in zip(*part, strict=True)]
              for part in logits),
            sets,
        )  # fmt: skip
        variants[f"head logits, awesome-align within zh-en (T={temperature})"] = thresholded(
            *([(b / temperature).softmax(1) * (b / temperature).softmax(0) for b in part[1]] for part in logits), sets
        )
    return variants


def hard_variants(pairs: Pairs) -> dict[str, list[set]]:
    f_words, b_words = pairs.words("en-zh"), pairs.words("zh-en")
    forward = [{(z, int(m[z].argmax())) for z in range(m.shape[0])} for m in f_words]  # per Chinese word
    backward = [{(int(m[:, e].argmax()), e) for e in range(m.shape[1])} for m in b_words]  # per English word
    agreement = [SOFT(f, b) for f, b in zip(f_words, b_words, strict=True)]
    final = []
    for scores in agreement:  # soft agreement, then the best link of every word left without one above 0.08
        links = links_above(scores, SERVED_THRESHOLD)
        for z in range(scores.shape[0]):
            if all(link[0] != z for link in links) and scores[z].max() > 0.08:
                links.add((z, int(scores[z].argmax())))
        for e in range(scores.shape[1]):
            if all(link[1] != e for link in links) and scores[:, e].max() > 0.08:
                links.add((int(scores[:, e].argmax()), e))
        final.append(links)
    return {
        "en-zh one-best (the head's, en→zh)": forward,
        "zh-en one-best (the head's, zh→en)": backward,
        "intersection": [f & b for f, b in zip(forward, backward, strict=True)],
        "union": [f | b for f, b in zip(forward, backward, strict=True)],
        "grow-diag-final-and": [grow_diag_final_and(f, b) for f, b in zip(forward, backward, strict=True)],
        "soft agreement > 0.12, then each unlinked word's best above 0.08": final,
    }


def measure(dev: Path = DEV, gold: Path = GOLD) -> dict:
    """Every variant on both sets: {"pairs", "variants": {name: {"dev", "gold", "threshold"?, "leave_one_out"?}}}."""
    translators = {direction: Translator.from_pretrained(direction, device="cpu") for direction in ("en-zh", "zh-en")}
    sets = {
        "dev": Pairs({d: in_domain_items(dev, d[:2]) for d in translators}, translators),
        "gold": Pairs({d: gold_items(gold, d[:2]) for d in translators}, translators),
    }
    hard = {part: hard_variants(pairs) for part, pairs in sets.items()}
    variants = {
        name: {"dev": score(hard["dev"][name], sets["dev"].gold), "gold": score(hard["gold"][name], sets["gold"].gold)}
        for name in hard["dev"]
    }
    variants.update(soft_variants(sets))
    return {
        "pairs": {"dev": len(sets["dev"].gold), "gold": len(sets["gold"].gold)},
        "scored_on": "the sets' own words (links between words directly, not through pieces)",
        "thresholds_tried": list(THRESHOLDS),
        "variants": variants,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dev", type=Path, default=DEV)
    parser.add_argument("--gold", type=Path, default=GOLD)
    parser.add_argument("--output", help="JSON path (default bench/results/alignment-variants.json)")
    args = parser.parse_args(argv)
    report = {
        "command": report_command("bench.experiments.alignment_variants"),
        "reference": {"eflomal": 16.2, "diagonal": 52.3},
        **measure(args.dev, args.gold),
    }
    variants = report["variants"]
    print(f"{report['pairs']['dev']} in-domain pairs (eflomal AER 16.2, diagonal 52.3); {report['pairs']['gold']} "
          "newswire pairs at the in-domain threshold\n")  # fmt: skip
    print("| variant | threshold | in-domain AER | P | R | leave-one-out AER | newswire AER | P | R |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, result in variants.items():
        dev, gold = result["dev"], result["gold"]
        held_out = result.get("leave_one_out", {}).get("aer")
        print(
            f"| {name} | {result.get('threshold', '')} | {dev['aer']:.1f} | {dev['precision']:.1f} "
            f"| {dev['recall']:.1f} | {'' if held_out is None else f'{held_out:.1f}'} | {gold['aer']:.1f} "
            f"| {gold['precision']:.1f} | {gold['recall']:.1f} |"
        )
    print()
    write_report(report, args.output, "alignment-variants.json")


if __name__ == "__main__":
    main()
