"""Score a model's attention as a word aligner, against human gold links and against eflomal in domain.

    python -m model.training.evaluate_alignment --model en-zh --gold ../shared/data/alignment-zh-en
    python -m model.training.evaluate_alignment --model zh-en --links runs/eflomal/dev.jsonl
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from model.explanations.agreement import piece_offsets
from model.explanations.alignment import alignment_matrix, attention_links, shift_rows
from model.tokenizer import MarianTokenizer
from model.training.data import collate
from model.training.gold import (
    AlignmentScore,
    GoldLinks,
    alignment_error_rate,
    is_chinese,
    piece_spans,
    pieces_to_words,
    transpose,
    words_from_pieces,
)
from model.transformer import Transformer


@dataclass
class AlignmentItem:
    """One sentence pair in the model's direction with reference word links (source_word, target_word)."""

    source: str
    target: str
    source_words: list[tuple[int, int]]
    target_words: list[tuple[int, int]]
    reference: GoldLinks


def gold_items(directory: str | Path, source_language: str) -> list[AlignmentItem]:
    """The human gold set (zh words, en words, zh-en links) in the direction of a model."""
    from model.training.statistical_alignment import gold_texts, read_gold

    zh_lines, en_lines, gold = read_gold(directory)
    items = []
    for zh_line, en_line, links in zip(zh_lines, en_lines, gold):
        zh_text, zh_spans, en_text, en_spans = gold_texts(zh_line, en_line)
        if is_chinese(source_language):
            items.append(AlignmentItem(zh_text, en_text, zh_spans, en_spans, links))
        else:
            items.append(
                AlignmentItem(
                    en_text, zh_text, en_spans, zh_spans, GoldLinks(transpose(links.sure), transpose(links.possible))
                )
            )
    return items


def in_domain_items(path: str | Path, source_language: str) -> list[AlignmentItem]:
    """The in-domain development set (../shared/data/alignment-tatoeba-zh-en/dev.json: word spans, sure and
    possible links as [zh word, en word]) in the direction of a model."""
    items = []
    for record in json.loads(Path(path).read_text(encoding="utf-8")):
        sure = {tuple(link) for link in record["sure"]}
        possible = sure | {tuple(link) for link in record["possible"]}
        en, zh = [tuple(s) for s in record["en_spans"]], [tuple(s) for s in record["zh_spans"]]
        if is_chinese(source_language):
            items.append(AlignmentItem(record["zh"], record["en"], zh, en, GoldLinks(sure, possible)))
        else:
            items.append(
                AlignmentItem(record["en"], record["zh"], en, zh, GoldLinks(transpose(sure), transpose(possible)))
            )
    return items


def link_items(path: str | Path, source_language: str, limit: int = 0) -> list[AlignmentItem]:
    """Pairs with eflomal links (model.training.statistical_alignment's JSONL: links are [en_word, zh_word])."""
    items = []
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            record = json.loads(line)
            links = {tuple(link) for link in record["links"]}
            en_words = [tuple(s) for s in record["en_words"]]
            zh_words = [tuple(s) for s in record["zh_words"]]
            if is_chinese(source_language):
                links = transpose(links)
                items.append(AlignmentItem(record["zh"], record["en"], zh_words, en_words, GoldLinks(links, links)))
            else:
                items.append(AlignmentItem(record["en"], record["zh"], en_words, zh_words, GoldLinks(links, links)))
            if limit and len(items) >= limit:
                break
    return items


@dataclass
class ForcedMaps:
    cross_attention: torch.Tensor  # (L, H, T, S), T and S with </s>
    source_map: list[list[int]]  # per source piece, its reference word indices
    target_map: list[list[int]]


@torch.inference_mode()
def forced_maps(
    model: Transformer, tokenizer: MarianTokenizer, items: list[AlignmentItem], batch_size: int = 32
) -> list[ForcedMaps]:
    """Teacher-force every item's target and return its cross-attention with the piece→word maps."""
    was_training = model.training
    model.eval()
    config = model.config
    device = model.final_logits_bias.device
    limit = config.max_position_embeddings
    encoded = [
        (tokenizer.encode_source(item.source)[:limit], tokenizer.encode_target(item.target)[:limit]) for item in items
    ]
    results: list[ForcedMaps | None] = [None] * len(items)
    order = sorted(range(len(items)), key=lambda i: len(encoded[i][0]))
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        source, mask, decoder_input, _ = (t.to(device) for t in collate(encoded, chunk, config))
        _, cross = model.decode(decoder_input, model.encode(source, mask), need_weights=True)
        stacked = torch.stack(cross, dim=1).float().cpu()  # (B, L, H, T, S)
        for row, index in enumerate(chunk):
            source_ids, target_ids = encoded[index]
            item = items[index]
            results[index] = ForcedMaps(
                stacked[row, :, :, : len(target_ids), : len(source_ids)],
                pieces_to_words(piece_spans(tokenizer.source_spm, item.source), item.source_words),
                pieces_to_words(piece_spans(tokenizer.target_spm, item.target), item.target_words),
            )
    model.train(was_training)
    return results


@torch.inference_mode()
def encoder_position_similarity(model: Transformer, tokenizer: MarianTokenizer, texts: list[str]) -> float:
    """Mean cosine similarity between the final encoder states of different source positions (</s> left out).

    Near 1.0 the encoder has collapsed: every position carries the same vector, so cross-attention
    keys are alike and attention goes uniform whatever the training does to the decoder. The shipped
    en→zh model before guided alignment measured 0.999 here (its embeddings 0.33).
    """
    was_training = model.training
    model.eval()
    device = model.final_logits_bias.device
    values = []
    for text in texts:
        ids = tokenizer.encode_source(text)[: model.config.max_position_embeddings]
        if len(ids) < 3:
            continue
        source = torch.tensor([ids], device=device)
        hidden = model.encode(source, torch.ones_like(source, dtype=torch.bool)).hidden[0, :-1].float()
        unit = torch.nn.functional.normalize(hidden, dim=-1)
        count = unit.size(0)
        similarity = unit @ unit.T
        values.append(float((similarity.sum() - similarity.diagonal().sum()) / (count * (count - 1))))
    model.train(was_training)
    return round(sum(values) / max(len(values), 1), 4)


def head_rows(cross_attention: Tensor, layer: int, head: int | None, shift: bool) -> Tensor:
    """One head's (T, S) rows, shifted (`shift_rows`) for the shift variant."""
    matrix = alignment_matrix(cross_attention, layer, head)
    return shift_rows(matrix) if shift else matrix


def score_head(
    maps: list[ForcedMaps], items: list[AlignmentItem], layer: int, head: int | None, shift: bool = False
) -> AlignmentScore:
    """AER of the links read from one head (or a layer's head average) against the items' references."""
    predicted = []
    for forced in maps:
        matrix = head_rows(forced.cross_attention, layer, head, shift)
        predicted.append(words_from_pieces(attention_links(matrix), forced.source_map, forced.target_map))
    return alignment_error_rate(predicted, [item.reference for item in items])


def score_diagonal(maps: list[ForcedMaps], items: list[AlignmentItem]) -> AlignmentScore:
    """The baseline of no model at all: target piece t aligned with source piece ⌊t·S/T⌋ (</s> left out)."""
    predicted = []
    for forced in maps:
        target_len, source_len = forced.cross_attention.shape[-2:]
        content = max(source_len - 1, 1)
        links = [(min(content - 1, t * content // target_len), t) for t in range(target_len)]
        predicted.append(words_from_pieces(links, forced.source_map, forced.target_map))
    return alignment_error_rate(predicted, [item.reference for item in items])


def normalized_entropy(matrix: Tensor) -> float:
    """Mean over rows of entropy / log(S): 1.0 for uniform rows, 0.0 for one-hot rows."""
    rows, width = matrix.shape
    if width <= 1 or rows == 0:
        return 0.0
    probabilities = matrix.float().clamp_min(1e-12)
    entropy = -(probabilities * probabilities.log()).sum(dim=-1)
    return float((entropy / math.log(width)).mean())


def mean_entropy(maps: list[ForcedMaps], layer: int, head: int | None, shift: bool = False) -> float:
    values = [normalized_entropy(head_rows(f.cross_attention, layer, head, shift)) for f in maps]
    return round(sum(values) / max(len(values), 1), 4)


def alignment_report(
    model: Transformer,
    tokenizer: MarianTokenizer,
    items: list[AlignmentItem],
    layer: int,
    head: int | None,
    shift: bool = False,
    every_head: bool = True,
) -> dict:
    """The alignment head's AER/precision/recall and entropy, and (every_head) every layer and head.

    "service" is the alignment as the service reads it (`shift` as the model's config declares);
    "readings" scores the same head read at the step predicting each target token ("prediction")
    and at the step where it is the decoder's input ("input", Chen et al.'s shift).
    """
    maps = forced_maps(model, tokenizer, items)
    report = {
        "pairs": len(items),
        "alignment_head": {"layer": layer, "head": head, "shift": shift},
        "service": score_head(maps, items, layer, head, shift).as_dict(),
        "readings": {
            "prediction": score_head(maps, items, layer, head).as_dict()["aer"],
            "input": score_head(maps, items, layer, head, shift=True).as_dict()["aer"],
        },
        "entropy": mean_entropy(maps, layer, head, shift),
        "diagonal": score_diagonal(maps, items).as_dict(),
        "encoder_similarity": encoder_position_similarity(model, tokenizer, [item.source for item in items[:100]]),
    }
    if every_head:
        heads = {}
        config = model.config
        for each_layer in range(config.decoder_layers):
            for each_head in [*range(config.decoder_attention_heads), None]:
                name = f"layer{each_layer}." + ("mean" if each_head is None else f"head{each_head}")
                heads[name] = {
                    "aer": score_head(maps, items, each_layer, each_head).as_dict()["aer"],
                    "aer_shift": score_head(maps, items, each_layer, each_head, shift=True).as_dict()["aer"],
                    "entropy": mean_entropy(maps, each_layer, each_head),
                }
        report["heads"] = heads
    return report


def item_word_maps(item: AlignmentItem, source_tokens: list[str], target_tokens: list[str]):
    """(source map, target map): per piece of the pair, the item's words its characters cover."""
    return (
        pieces_to_words(piece_offsets(item.source, source_tokens), item.source_words),
        pieces_to_words(piece_offsets(item.target, target_tokens), item.target_words),
    )


def served_alignment_score(translator, items: list[AlignmentItem], reverse=None) -> AlignmentScore:
    """AER of the alignment `Translator.explain` serves for each item's pair (agreed with `reverse`, a model
    translating the other way, or without it the head's one-best), its token links mapped onto the items' words."""
    predicted = []
    for item in items:
        source_ids = translator.tokenizer.encode_source(item.source)
        target_ids = translator.tokenizer.encode_target(item.target)
        explained = translator.explain(source_ids, target_ids, reverse=reverse)
        source_map, target_map = item_word_maps(item, explained.source_tokens, explained.target_tokens)
        predicted.append(words_from_pieces(explained.alignment, source_map, target_map))
    return alignment_error_rate(predicted, [item.reference for item in items])


def through_pieces_score(tokenizer: MarianTokenizer, items: list[AlignmentItem], links: list[set]) -> AlignmentScore:
    """AER of word `links` (source word, target word) per item once they pass through a model's pieces as served
    links do: a piece pair is linked when any of their words are, then scored as `served_alignment_score` scores.
    With the gold sure links: the best any alignment on these pieces can score; with eflomal's: the statistical
    aligner on the same footing as the served alignments."""
    predicted = []
    for item, word_links in zip(items, links, strict=True):
        source_ids, target_ids = tokenizer.encode_source(item.source), tokenizer.encode_target(item.target)
        source_map, target_map = item_word_maps(
            item, tokenizer.source_tokens(source_ids), tokenizer.target_tokens(target_ids)
        )
        piece_links = [
            (s, t)
            for s, source_words in enumerate(source_map)
            for t, target_words in enumerate(target_map)
            if any((a, b) in word_links for a in source_words for b in target_words)
        ]
        predicted.append(words_from_pieces(piece_links, source_map, target_map))
    return alignment_error_rate(predicted, [item.reference for item in items])


def main(argv: list[str] | None = None) -> None:
    from model.translator import Translator

    parser = argparse.ArgumentParser(
        prog="python -m model.training.evaluate_alignment",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--model", required=True, help="a shipped model's name or a Marian directory")
    parser.add_argument("--gold", help="human gold directory (zh.txt, en.txt, gold.align)")
    parser.add_argument("--links", help="eflomal links JSONL (model.training.statistical_alignment's dev.jsonl)")
    parser.add_argument("--limit", type=int, default=0, help="score only the first N pairs of --links")
    parser.add_argument("--source-language", help="the model's source language (default: from the name, xx-yy)")
    parser.add_argument("--output", help="write the report as JSON here")
    args = parser.parse_args(argv)
    if not args.gold and not args.links:
        parser.error("give --gold, --links or both")
    torch.set_num_threads(max(1, torch.get_num_threads()))
    translator = Translator.from_pretrained(args.model, device="cpu")
    source_language = args.source_language or translator.name.split("-")[0]
    layer, head = translator.alignment_head
    shift = translator.alignment_shift
    report = {"model": translator.name, "source_language": source_language}
    if args.gold:
        items = gold_items(args.gold, source_language)
        report["gold"] = alignment_report(translator.model, translator.tokenizer, items, layer, head, shift)
    if args.links:
        items = link_items(args.links, source_language, args.limit)
        report["links"] = alignment_report(translator.model, translator.tokenizer, items, layer, head, shift)
    text = json.dumps(report, indent=1)
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(text + "\n", encoding="utf-8")
    sys.stdout.write(text + "\n")


if __name__ == "__main__":
    main()
