"""Write model/pretrained/<name>/README.md (the model card) from training runs' summary.json.

python scripts/model_card.py --work runs/en-zh --command "python -m model.training.train ..." \
    --model model/pretrained/en-zh --source en --target zh --eval-command "..." --dev-scores runs/en-zh-dev.json

A model trained in stages (a run continued with --init-from) gives one --work and one --command per
stage, in order; the card lists each stage and the last stage's selection.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from safetensors import safe_open


def _count(shape: list[int]) -> int:
    total = 1
    for size in shape:
        total *= size
    return total


LANGUAGES = {"en": "English", "zh": "Chinese (Mandarin, mostly simplified)"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", required=True, action="append", help="a training run's --work (once per stage)")
    parser.add_argument("--model", required=True)
    parser.add_argument("--source", required=True)
    parser.add_argument("--target", required=True)
    parser.add_argument("--command", required=True, action="append", help="the exact training command (per stage)")
    parser.add_argument("--eval-command", required=True, help="the exact command that measured the dev scores")
    parser.add_argument("--dev-scores", required=True, help="JSON file written by the evaluation command")
    args = parser.parse_args()

    if len(args.work) != len(args.command):
        parser.error("give one --command per --work")
    model = Path(args.model)
    stages = [json.loads((Path(work) / "summary.json").read_text()) for work in args.work]
    summary = stages[-1]
    config = json.loads((model / "config.json").read_text())
    scores = json.loads(Path(args.dev_scores).read_text())
    size = sum(p.stat().st_size for p in model.iterdir() if p.is_file() and p.name != "README.md")
    with safe_open(str(model / "model.safetensors"), framework="pt") as weights:
        parameters = f"{sum(_count(weights.get_slice(name).get_shape()) for name in weights.keys()):,}"
    name = model.name
    tokenize = "zh" if args.target == "zh" else "13a"
    training = "\n\n".join(
        _stage(number, len(stages), command, stage)
        for number, (command, stage) in enumerate(zip(args.command, stages, strict=True), start=1)
    )
    card = f"""# {name}: {LANGUAGES[args.source]} → {LANGUAGES[args.target]}

A small Transformer translation model trained by this project, shipped as the service's default for
{args.source}→{args.target}. Marian/OPUS-MT directory format: transformers' `MarianMTModel.from_pretrained`
loads it and CTranslate2's converter accepts it (both tested in tests/model/).

## Data
Tatoeba English–Chinese sentence pairs (the manythings.org cmn-eng export of tatoeba.org), licensed
**CC-BY 2.0 (France)**; every sentence's Tatoeba number and contributor is listed in the attribution
column of the training file. Thanks to the Tatoeba contributors. 27,155 training pairs; model selection
on the 1,000-pair dev set (no English dev sentence occurs in training). The data is not redistributed here.

## Architecture and size
The original post-norm Transformer encoder-decoder as Marian shapes it: d_model {config["d_model"]},
{config["encoder_layers"]} encoder + {config["decoder_layers"]} decoder layers,
{config["encoder_attention_heads"]} heads,
FFN {config["encoder_ffn_dim"]}, {config["activation_function"]} activation, sinusoidal positions, scaled embeddings,
one joint vocabulary of {config["vocab_size"]} pieces (separate sentencepiece models per language) tied to the
output projection. {parameters or ""} parameters; {size / 1e6:.1f} MB on disk (float16 safetensors; loading upcasts
to the requested dtype).

## Training
{training}

Checkpoint selection: `{summary["chosen"]}` among the best epoch, the average of the last epochs and the last
weights (greedy BLEU on dev: {json.dumps(summary["candidates"])}).

## Quality on dev
Multi-reference where a dev source has several translations; sacrebleu BLEU with tokenize="{tokenize}", chrF.

| decoding | BLEU | chrF |
|---|---|---|
| greedy | {scores["greedy"]["bleu"]} | {scores["greedy"]["chrf"]} |
| beam 4 | {scores["beam4"]["bleu"]} | {scores["beam4"]["chrf"]} |

Measured with:
```bash
{args.eval_command}
```

## Known limits
Trained on short everyday sentences (Tatoeba): expect reasonable output for short, simple, conversational
sentences and poor output for long, technical or domain-specific text, names it has not seen, and anything
beyond one sentence. It is a demonstration-sized model for explaining attention, not a production-quality
translator; serve an OPUS-MT model (see the top-level README) for real traffic.
"""
    (model / "README.md").write_text(card, encoding="utf-8")


def _stage(number: int, count: int, command: str, summary: dict) -> str:
    guided = any("dev_aer" in r for r in summary["history"])
    columns = ["epoch", "updates", "train loss (label-smoothed)", "dev BLEU (greedy, first 300 sources)", "chrF"]
    if guided:
        columns += [
            "guided-alignment loss",
            "alignment head: entropy (dev)",
            "AER vs eflomal (dev, first 300)",
            "AER vs gold",
        ]
    columns.append("minutes")
    rows = []
    for r in summary["history"]:
        cells = [r["epoch"], r["step"], r["train_loss"], r.get("bleu", ""), r.get("chrf", "")]
        if guided:
            cells += [
                r.get("alignment_loss", ""),
                r.get("dev_entropy", ""),
                r.get("dev_aer", ""),
                r.get("gold_aer", ""),
            ]
        cells.append(r["minutes"])
        rows.append("| " + " | ".join(str(c) for c in cells) + " |")
    title = f"### Stage {number} of {count}\n" if count > 1 else ""
    return f"""{title}```bash
{command}
```
{summary["epochs"]} epochs ({summary["steps"]} updates, {summary["minutes"]} minutes on 2 CPU cores shared with other
work, bf16 autocast).

| {" | ".join(columns)} |
|{"---|" * len(columns)}
{chr(10).join(rows)}"""


if __name__ == "__main__":
    main()
