"""A learned alignment layer over both shipped models' states, supervised by eflomal's links: measured, not served.

Can alignments learned from the models themselves reach eflomal's? This trains a small
attention layer per direction on top of the frozen models: its queries are the translating model's decoder states
at the step where each target piece is the input (layers 1 and 2) beside the reverse model's encoder states over
the same text; its keys the translating model's encoder states beside the reverse model's decoder states over the
source (both projected onto the translating model's pieces by character offsets). Its logit for a pair of pieces
is q·k/√d plus learned multiples of the log of the two alignment heads' probabilities (what "agreement"
multiplies), and a pair is linked where σ(logit) clears a threshold. Trained with binary cross-entropy per piece
pair on eflomal's grow-diag-final-and links (eflomal run on the Tatoeba train and dev pairs only, never the
alignment sets), either on the 27,155 training pairs (the translation models' own) or on the 1,000 dev pairs
(unseen by them). Scored through pieces as the service is, beside the served agreement on the same pieces.

    python -m bench.experiments.learned_alignment                 # writes bench/results/learned-alignment.json
    python -m bench.experiments.learned_alignment --train-on dev --epochs 8
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bench import machine, report_command, write_report
from bench.alignment import DATA
from model.explanations.agreement import agreement_threshold, overlapping_words, piece_offsets
from model.explanations.alignment import shift_rows
from model.explanations.explain import teacher_forcing_batch
from model.training.evaluate_alignment import gold_items, in_domain_items, link_items
from model.training.gold import alignment_error_rate, words_from_pieces
from model.training.statistical_alignment import main as statistical_alignment
from model.translator import Translator

REVERSE = {"en-zh": "zh-en", "zh-en": "en-zh"}
SOURCE_LANGUAGE = {"en-zh": "en", "zh-en": "zh"}
THRESHOLDS = (0.3, 0.4, 0.5, 0.6)
FEATURES = 768  # three d_model=256 states side by side, on each side


@torch.inference_mode()
def forced_states(translator: Translator, pairs: list[tuple[str, str]], batch_size: int = 64) -> list[dict]:
    """Per (source text, target text): encoder states (S, d), decoder states per layer (L, T, d) and the
    alignment head's rows read as declared (T, S), from a teacher-forced pass of the float32 model; piece spans."""
    model, tokenizer = translator.exact_model, translator.tokenizer
    layer, head = translator.alignment_head
    encoded = [(tokenizer.encode_source(s), tokenizer.encode_target(t)) for s, t in pairs]
    results: list = [None] * len(pairs)
    order = sorted(range(len(pairs)), key=lambda i: len(encoded[i][0]))
    for first in range(0, len(order), batch_size):
        chunk = order[first : first + batch_size]
        source, mask, decoder_input = teacher_forcing_batch(encoded, chunk, model.config)
        length = decoder_input.size(1)
        encoder = model.encode(source, mask)
        x = model.add_positions(model.token_embeddings(model.decoder_embed_tokens, decoder_input))
        causal = torch.ones(length, length, dtype=torch.bool).tril()
        states, cross = [], []
        for decoder_layer in model.decoder_layers:
            key, value = decoder_layer.self_attn.project_key_value(x)
            cross_key, cross_value = decoder_layer.encoder_attn.project_key_value(encoder.hidden)
            x, weights = decoder_layer(x, key, value, causal, cross_key, cross_value, mask[:, None, None, :], True)
            states.append(x)
            cross.append(weights)
        for row, i in enumerate(chunk):
            (source_text, target_text), (source_ids, target_ids) = pairs[i], encoded[i]
            rows = cross[layer][row, :, : len(target_ids), : len(source_ids)]
            rows = rows.mean(0) if head is None else rows[head]
            results[i] = {
                "encoder": encoder.hidden[row, : len(source_ids)].half(),
                "decoder": torch.stack([s[row, : len(target_ids)] for s in states]).half(),
                "rows": (shift_rows(rows) if translator.alignment_shift else rows).float(),
                "source_spans": piece_offsets(source_text, tokenizer.source_tokens(source_ids))[:-1],  # no </s>
                "target_spans": piece_offsets(target_text, tokenizer.target_tokens(target_ids))[:-1],  # no eos
            }
    return results


def overlap(spans: list[tuple[int, int]], other: list[tuple[int, int]]) -> Tensor:
    """(len spans, len other): 1 where two non-empty character spans overlap."""
    matrix = torch.zeros(len(spans), len(other))
    for i, (a, b) in enumerate(spans):
        for j, (c, d) in enumerate(other):
            if a < b and c < d and a < d and c < b:
                matrix[i, j] = 1.0
    return matrix


def input_step_states(decoder: Tensor, count: int) -> Tensor:
    """Decoder states (L, count, d) at the step where each of `count` target pieces is the input."""
    states = decoder[:, 1 : count + 1].float()
    if states.size(1) < count:
        states = torch.cat([states, decoder[:, -1:].float()], dim=1)
    return states


def example(forward: dict, backward: dict, item, sure_pieces: bool = True) -> dict | None:
    """Features, priors and labels of one pair on the forward model's pieces (its </s> and eos left out)."""
    source_spans, target_spans = forward["source_spans"], forward["target_spans"]
    count_s, count_t = len(source_spans), len(target_spans)
    if not count_s or not count_t:
        return None
    back_source, back_target = backward["source_spans"], backward["target_spans"]  # over target text, source text
    onto_source = overlap(source_spans, back_target)
    onto_target = overlap(target_spans, back_source)
    mean_source = onto_source / onto_source.sum(1, keepdim=True).clamp(min=1)
    mean_target = onto_target / onto_target.sum(1, keepdim=True).clamp(min=1)
    decoder = input_step_states(forward["decoder"], count_t)
    back_decoder = input_step_states(backward["decoder"], len(back_target))
    keys = torch.cat(
        [forward["encoder"][:count_s].float(), mean_source @ back_decoder[1], mean_source @ back_decoder[2]], -1
    )
    back_encoder = backward["encoder"][: len(back_source)].float()
    queries = torch.cat([decoder[1], decoder[2], mean_target @ back_encoder], -1)
    forward_p = forward["rows"][:count_t, :count_s]
    forward_p = forward_p / forward_p.sum(1, keepdim=True).clamp(min=1e-9)  # p(s | t)
    reverse_p = mean_source @ backward["rows"][: len(back_target), : len(back_source)] @ onto_target.T  # (S, T)
    reverse_p = reverse_p / reverse_p.sum(1, keepdim=True).clamp(min=1e-9)  # p(t | s)
    source_words = overlapping_words(source_spans, item.source_words)
    target_words = overlapping_words(target_spans, item.target_words)
    links = item.reference.sure
    label = torch.zeros(count_t, count_s)
    for s, words_s in enumerate(source_words):
        for t, words_t in enumerate(target_words):
            label[t, s] = float(any((a, b) in links for a in words_s for b in words_t))
    valid = torch.tensor([bool(w) for w in target_words])[:, None] & torch.tensor([bool(w) for w in source_words])
    return {
        "queries": queries,
        "keys": keys,
        "forward": forward_p,
        "reverse": reverse_p.T,
        "label": label,
        "valid": valid.float(),
        "source_words": source_words,
        "target_words": target_words,
        "gold": item.reference,
    }


class AlignmentLayer(nn.Module):
    """logit(t, s) = q_t·k_s/√d + a·log p(s|t) + b·log p(t|s) + c; with priors_only, the last three terms alone."""

    def __init__(self, dim: int = 64, priors_only: bool = False, dropout: float = 0.3) -> None:
        super().__init__()
        self.dim = dim
        self.query = (
            None
            if priors_only
            else nn.Sequential(nn.LayerNorm(FEATURES), nn.Dropout(dropout), nn.Linear(FEATURES, dim))
        )
        self.key = (
            None
            if priors_only
            else nn.Sequential(nn.LayerNorm(FEATURES), nn.Dropout(dropout), nn.Linear(FEATURES, dim))
        )
        self.priors = nn.Parameter(torch.tensor([1.0, 1.0, 0.0]))

    def forward(self, queries: Tensor, keys: Tensor, forward: Tensor, reverse: Tensor) -> Tensor:
        a, b, c = self.priors
        logits = a * torch.log(forward + 1e-6) + b * torch.log(reverse + 1e-6) + c
        if self.query is not None:
            logits = logits + self.query(queries) @ self.key(keys).transpose(-1, -2) / math.sqrt(self.dim)
        return logits


def padded(examples: list[dict]) -> tuple[Tensor, ...]:
    count_t = max(e["queries"].size(0) for e in examples)
    count_s = max(e["keys"].size(0) for e in examples)

    def stack(key: str, width: int) -> Tensor:
        out = torch.zeros(len(examples), count_t if key != "keys" else count_s, width)
        for i, e in enumerate(examples):
            out[i, : e[key].size(0), : e[key].size(1)] = e[key]
        return out

    return (
        stack("queries", FEATURES),
        stack("keys", FEATURES),
        stack("forward", count_s),
        stack("reverse", count_s),
        stack("label", count_s),
        stack("valid", count_s),
    )


def score(examples: list[dict], links_of) -> dict:
    predicted = []
    for e in examples:
        chosen = links_of(e)
        pairs = [(s, t) for t, s in chosen.nonzero().tolist()]
        predicted.append(words_from_pieces(pairs, e["source_words"], e["target_words"]))
    return alignment_error_rate(predicted, [e["gold"] for e in examples]).as_dict()


def agreement_links(e: dict) -> Tensor:
    product = e["forward"] * e["reverse"]
    return product > agreement_threshold(*product.shape)


def train(train_set: list[dict], sets: dict[str, list[dict]], args) -> dict:
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    layer = AlignmentLayer(priors_only=args.priors_only)
    optimizer = torch.optim.AdamW(layer.parameters(), lr=1e-3, weight_decay=0.01)
    ordered = sorted(train_set, key=lambda e: (e["queries"].size(0), e["keys"].size(0)))
    batches = [ordered[i : i + 32] for i in range(0, len(ordered), 32)]
    schedule = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, 1e-3, total_steps=args.epochs * len(batches), pct_start=0.1
    )
    epochs = []
    for epoch in range(args.epochs):
        layer.train()
        random.shuffle(batches)
        total = 0.0
        for batch in batches:
            queries, keys, forward, reverse, label, valid = padded(batch)
            loss = F.binary_cross_entropy_with_logits(layer(queries, keys, forward, reverse), label, reduction="none")
            loss = (loss * valid).sum() / valid.sum()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
            total += loss.item()
        layer.eval()
        with torch.no_grad():

            def learned(threshold):
                return lambda e: (
                    torch.sigmoid(layer(e["queries"][None], e["keys"][None], e["forward"][None], e["reverse"][None])[0])
                    > threshold
                )

            row = {
                "epoch": epoch + 1,
                "loss": round(total / len(batches), 4),
                "priors": [round(v, 3) for v in layer.priors.tolist()],
            }
            row["sets"] = {
                name: {str(t): score(examples, learned(t)) for t in THRESHOLDS} for name, examples in sets.items()
            }
        epochs.append(row)
        print(
            f"epoch {epoch + 1}: loss {row['loss']}, "
            + "; ".join(
                f"{name} " + " ".join(f"{t}:{row['sets'][name][str(t)]['aer']}" for t in THRESHOLDS) for name in sets
            )
        )
    return {"epochs": epochs}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--directions", nargs="+", default=["en-zh", "zh-en"], choices=sorted(REVERSE))
    parser.add_argument("--train-on", default="train", choices=["train", "dev"], help="eflomal-linked Tatoeba pairs")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--priors-only", action="store_true", help="learn only the two heads' weights and a bias")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--output", help="JSON path (default bench/results/learned-alignment.json)")
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    started = time.monotonic()
    translators = {name: Translator.from_pretrained(name, device="cpu") for name in REVERSE}
    report = {
        "command": report_command("bench.experiments.learned_alignment", argv),
        "machine": machine(threads=2),
        "directions": {},
    }
    with tempfile.TemporaryDirectory(prefix="eflomal-") as scratch:
        tatoeba = args.data / "tatoeba-en-zh"
        statistical_alignment(
            ["--train", str(tatoeba / "train.tsv"), "--dev", str(tatoeba / "dev.tsv"), "--output", scratch]
        )
        for name in args.directions:
            forward_model, backward_model = translators[name], translators[REVERSE[name]]
            language = SOURCE_LANGUAGE[name]
            sets = {
                "in_domain": in_domain_items(args.data / "alignment-tatoeba-zh-en" / "dev.json", language),
                "newswire": gold_items(args.data / "alignment-zh-en", language),
                "dev": link_items(Path(scratch) / "dev.jsonl", language),
            }
            if args.train_on == "train":
                sets["train"] = link_items(Path(scratch) / "train.jsonl", language)
            built = {}
            for part, items in sets.items():
                forward = forced_states(forward_model, [(i.source, i.target) for i in items])
                backward = forced_states(backward_model, [(i.target, i.source) for i in items])
                built[part] = [e for e in (example(f, b, i) for f, b, i in zip(forward, backward, items)) if e]
            train_set = built.pop(args.train_on)
            result = {
                "train_pairs": len(train_set),
                "agreement_on_the_same_pieces": {
                    part: score(examples, agreement_links) for part, examples in built.items()
                },
                "best_possible_through_the_pieces": {
                    part: score(examples, lambda e: e["label"] > 0) for part, examples in built.items()
                },
            }
            print(
                f"{name}: agreement on the same pieces "
                + ", ".join(f"{part} {r['aer']}" for part, r in result["agreement_on_the_same_pieces"].items())
            )
            result.update(train(train_set, built, args))
            report["directions"][name] = result
    report["minutes"] = round((time.monotonic() - started) / 60, 2)
    write_report(report, args.output, "learned-alignment.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
