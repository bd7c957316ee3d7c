"""Guided alignment while training (Garg et al. 2019; Marian's --guided-alignment): word links turned into a
piece-level guide one cross-attention head is pulled toward, and the per-epoch check that the head still aligns."""

from __future__ import annotations

import json
import logging

import torch

from model.config import ModelConfig
from model.tokenizer import MarianTokenizer
from model.training.options import TrainingOptions
from model.transformer import Transformer

logger = logging.getLogger("model.training.train")


def load_guides(path: str, pairs: list[tuple[str, str]], tokenizer: MarianTokenizer) -> list[list[tuple[int, int]]]:
    """Piece-level guide links (source piece, target piece) for every training pair, </s> with </s>.

    `path` holds one JSON line per pair of the training file, in its order, with the English and
    Chinese texts, their word spans and the word links [en_word, zh_word].
    """
    from model.training.gold import piece_guide, piece_spans, pieces_to_words

    with open(path, encoding="utf-8") as handle:
        records = [json.loads(line) for line in handle]
    if len(records) != len(pairs):
        raise ValueError(f"{path} has {len(records)} lines for {len(pairs)} training pairs")
    guides = []
    for number, ((source, target), record) in enumerate(zip(pairs, records), start=1):
        links = [tuple(link) for link in record["links"]]
        if (record["en"], record["zh"]) == (source, target):
            source_words, target_words = record["en_words"], record["zh_words"]
        elif (record["zh"], record["en"]) == (source, target):
            source_words, target_words = record["zh_words"], record["en_words"]
            links = [(b, a) for a, b in links]
        else:
            raise ValueError(f"{path} line {number} is not the training file's pair {number}")
        source_spans = piece_spans(tokenizer.source_spm, source)
        target_spans = piece_spans(tokenizer.target_spm, target)
        guide = piece_guide(
            links, pieces_to_words(source_spans, source_words), pieces_to_words(target_spans, target_words)
        )
        guides.append([*guide, (len(source_spans), len(target_spans))])  # </s> ↔ </s>
    return guides


def guide_tensor(
    guides: list[list[tuple[int, int]]], source_width: int, target_width: int, shift: bool = False
) -> torch.Tensor:
    """(B, T, S) guide: each target row with links spreads 1 evenly over its linked source pieces.

    With `shift`, target token t's links guide row t + 1, the step where t is the decoder's input.
    """
    guide = torch.zeros(len(guides), target_width, source_width)
    for row, links in enumerate(guides):
        for source, target in links:
            target += int(shift)
            if source < source_width and target < target_width:
                guide[row, target, source] = 1.0
    return guide / guide.sum(dim=-1, keepdim=True).clamp_min(1.0)


def guided_alignment_loss(attention: torch.Tensor, guide: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the guide against the attention, averaged over target rows that have links."""
    rows = (guide.sum(dim=-1) > 0).sum().clamp_min(1)
    return -(guide * torch.log(attention.float() + 1e-6)).sum() / rows


def resolve_alignment_head(options: TrainingOptions, config: ModelConfig) -> tuple[int, int | None]:
    layer = options.alignment_layer if options.alignment_layer >= 0 else max(0, config.decoder_layers - 2)
    return layer, (options.alignment_head if options.alignment_head >= 0 else None)


class AlignmentMonitor:
    """Per-epoch attention health: the alignment head's normalized entropy and AER (in domain, gold).

    Warns loudly when the cross-attention goes flat (normalized entropy ≥ FLAT_ENTROPY), the failure
    that left an earlier en→zh model with uniform attention that nothing noticed.
    """

    FLAT_ENTROPY = 0.95
    FLAT_ENCODER = 0.99

    def __init__(
        self, options: TrainingOptions, tokenizer: MarianTokenizer, config: ModelConfig, language: str
    ) -> None:
        from model.training.evaluate_alignment import gold_items, link_items

        self.tokenizer = tokenizer
        source = config.alignment_source()
        self.layer, self.head = source.layer, source.head
        self.shift = config.alignment_shift
        self.sets = {}
        if options.alignment_dev:
            self.sets["dev"] = link_items(options.alignment_dev, language, limit=300)
        if options.alignment_gold:
            self.sets["gold"] = gold_items(options.alignment_gold, language)

    def epoch_report(self, model: Transformer) -> dict:
        from model.training.evaluate_alignment import encoder_position_similarity, forced_maps, mean_entropy, score_head

        record = {}
        if "dev" in self.sets:
            similarity = encoder_position_similarity(model, self.tokenizer, [i.source for i in self.sets["dev"][:100]])
            record["encoder_similarity"] = similarity
            if similarity >= self.FLAT_ENCODER:
                logger.warning(
                    "ENCODER OUTPUTS HAVE COLLAPSED: positions' final states have mean cosine similarity %.3f; "
                    "cross-attention cannot tell source words apart",
                    similarity,
                )
        for name, items in self.sets.items():
            maps = forced_maps(model, self.tokenizer, items)
            record[f"{name}_aer"] = score_head(maps, items, self.layer, self.head, self.shift).as_dict()["aer"]
            record[f"{name}_entropy"] = mean_entropy(maps, self.layer, self.head)
            if record[f"{name}_entropy"] >= self.FLAT_ENTROPY:
                logger.warning(
                    "CROSS-ATTENTION IS FLAT: layer %d head %s has normalized entropy %.3f on %s pairs "
                    "(1.0 = uniform); its alignments and heatmaps will carry no information",
                    self.layer,
                    "mean" if self.head is None else self.head,
                    record[f"{name}_entropy"],
                    name,
                )
        return record
