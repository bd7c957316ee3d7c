"""Parallel text as the trainer and the evaluations read it: TSV pairs, dev sources with their references,
and padded teacher-forcing batches."""

from __future__ import annotations

from collections import OrderedDict

import torch

from model.config import ModelConfig


def read_pairs(path: str, source_column: int, target_column: int) -> list[tuple[str, str]]:
    """Read (source, target) pairs from a TSV file; lines missing a column are skipped."""
    pairs = []
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            columns = line.rstrip("\n").split("\t")
            if len(columns) <= max(source_column, target_column):
                continue
            source, target = columns[source_column].strip(), columns[target_column].strip()
            if source and target:
                pairs.append((source, target))
    return pairs


def dev_references(pairs: list[tuple[str, str]]) -> tuple[list[str], list[list[str]]]:
    """Group dev pairs by source: unique sources and, per source, all its reference translations."""
    grouped: OrderedDict[str, list[str]] = OrderedDict()
    for source, target in pairs:
        grouped.setdefault(source, []).append(target)
    return list(grouped), list(grouped.values())


def collate(examples: list[tuple[list[int], list[int]]], indices: list[int], config: ModelConfig):
    pad = config.pad_token_id
    sources = [examples[i][0] for i in indices]
    targets = [examples[i][1] for i in indices]
    source_width = max(map(len, sources))
    target_width = max(map(len, targets))
    source_ids = torch.full((len(indices), source_width), pad, dtype=torch.long)
    decoder_input = torch.full((len(indices), target_width), pad, dtype=torch.long)
    labels = torch.full((len(indices), target_width), -100, dtype=torch.long)
    for row, (source, target) in enumerate(zip(sources, targets)):
        source_ids[row, : len(source)] = torch.tensor(source)
        decoder_input[row, 0] = config.decoder_start_token_id
        decoder_input[row, 1 : len(target)] = torch.tensor(target[:-1])
        labels[row, : len(target)] = torch.tensor(target)
    source_mask = torch.arange(source_width)[None, :] < torch.tensor([len(s) for s in sources])[:, None]
    return source_ids, source_mask, decoder_input, labels
