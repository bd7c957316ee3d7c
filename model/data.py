"""Parallel text as the trainer and the evaluations read it: TSV pairs, dev sources with their references."""

from __future__ import annotations

from collections import OrderedDict


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
