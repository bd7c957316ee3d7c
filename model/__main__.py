"""Command line: `python -m model translate --model DIR "text" ...` (training: `python -m model.training.train`)."""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys

from wcwidth import wcswidth

from model.errors import TranslatorError
from model.loading import pretrained_names
from model.translator import Translator


def _translation_json(translation, with_attention: bool) -> dict:
    result = {
        "text": translation.text,
        "source_tokens": translation.source_tokens,
        "target_tokens": translation.target_tokens,
        "score": translation.score,
        "token_scores": translation.token_logprobs,
        "alignment": [list(pair) for pair in translation.alignment],
        "word_alignment": [list(pair) for pair in translation.word_alignment],
        "source_words": translation.source_words,
        "target_words": translation.target_words,
    }
    if with_attention and translation.cross_attention is not None:
        result["cross_attention"] = translation.cross_attention.tolist()
    if translation.alternatives:
        result["alternatives"] = [_translation_json(t, False) for t in translation.alternatives]
    return result


def pad(text: str, width: int) -> str:
    """Left-justify by display width: a Chinese character takes two terminal columns, not one."""
    shown = wcswidth(text)
    return text + " " * max(0, width - (shown if shown >= 0 else len(text)))


def _print_table(translation) -> None:
    print(translation.text)
    print(f"  score {translation.score:.3f}")
    print(f"  {'#':>3}  {pad('target token', 16)} {'p':>6}  aligned source token")
    for (source_index, target_index), logprob in zip(translation.alignment, translation.token_logprobs, strict=True):
        target = translation.target_tokens[target_index]
        source = translation.source_tokens[source_index]
        print(f"  {target_index:>3}  {pad(target, 16)} {math.exp(logprob):6.3f}  {source} (#{source_index})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m model", description="Translate with a Marian-format model.")
    commands = parser.add_subparsers(dest="command", required=True)
    translate = commands.add_parser("translate", help="translate texts given as arguments or on standard input")
    translate.add_argument(
        "--model", required=True, help=f"model directory or shipped name ({', '.join(pretrained_names()) or 'none'})"
    )
    translate.add_argument("--beam-size", type=int, default=4)
    translate.add_argument("--n-best", type=int, default=1)
    translate.add_argument("--max-new-tokens", type=int, default=None)
    translate.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    translate.add_argument("--json", action="store_true", help="print everything, attention included, as JSON")
    translate.add_argument("texts", nargs="*", help="texts to translate (default: one per line on stdin)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)

    texts = args.texts or [line.rstrip("\n") for line in sys.stdin if line.strip()]
    try:
        translator = Translator.from_pretrained(args.model, device=args.device)
        results = translator.translate(
            texts,
            beam_size=args.beam_size,
            num_return_sequences=args.n_best,
            max_new_tokens=args.max_new_tokens,
            return_attention=args.json,
        )
    except TranslatorError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps([_translation_json(t, True) for t in results], ensure_ascii=False))
    else:
        for translation in results:
            _print_table(translation)
            for alternative in translation.alternatives:
                print(f"  alternative ({alternative.score:.3f}): {alternative.text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
