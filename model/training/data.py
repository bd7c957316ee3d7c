"""Parallel text as the trainer and the evaluations read it: TSV pairs, dev sources with their references,
and padded teacher-forcing batches."""

from __future__ import annotations

from collections import OrderedDict

import torch

from model.config import ModelConfig
from model.explain import teacher_forcing_batch


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
    """`model.explain.teacher_forcing_batch` of the examples, and the labels: each target id, -100 past its end."""
    source_ids, source_mask, decoder_input = teacher_forcing_batch(examples, indices, config)
    labels = torch.full(decoder_input.shape, -100, dtype=torch.long)
    for row, index in enumerate(indices):
        target = examples[index][1]
        labels[row, : len(target)] = torch.tensor(target)
    return source_ids, source_mask, decoder_input, labels
