"""Write model/pretrained/<name>/README.md (the model card) from training runs' summary.json.

python scripts/model_card.py --work runs/en-zh --command "python -m model.training.train ..." \
    --model model/pretrained/en-zh --source en --target zh --eval-command "..." --dev-scores runs/en-zh-dev.json

A model trained in stages (a run continued with --init-from) gives one --work and one --command per
stage, in order; the card lists each stage and the last stage's selection.
"""

from __future__ import annotations

import argparse
import json
import re
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
    limit = re.search(r"--epoch-eval-limit (\d+)", command)  # without it the trainer scores every dev source
    sources = f"first {limit.group(1)} sources" if limit else "every source"
    columns = ["epoch", "updates", "train loss (label-smoothed)", f"dev BLEU (greedy, {sources})", "chrF"]
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


# ---- the everyday models: trained on the recipe's mix, warm-started from the Tatoeba-only models ------------
def _judged(judged: dict | None, name: str) -> str:
    """The hand-judged everyday sentences of scripts/everyday_judged.json as a card section ("" without them)."""
    if not judged or name not in judged:
        return ""
    rows = judged[name]
    counts = {verdict: sum(row[2] == verdict for row in rows) for verdict in ("right", "partly", "wrong")}
    table = "\n".join(f"| {s} | {t} | {v} | {why} |" for s, t, v, why in rows)
    return f"""
## Everyday sentences, judged by hand
{judged["how"]} ({judged["date"]}; scripts/everyday_judged.json): {counts["right"]} right, {counts["partly"]} partly,
{counts["wrong"]} wrong of {len(rows)}.

| source | translation | judged | why |
|---|---|---|---|
{table}
"""


def earlier_training(card: str) -> str:
    """An earlier card's training stages (what its "## Training" section holds before its checkpoint selection), for
    a stage continued from that model."""
    start = card.index("## Training\n") + len("## Training\n")
    return card[start : card.index("\nCheckpoint selection:", start)].strip()


def everyday_card(
    model: Path, source: str, target: str, stages: list[tuple[str, dict]], recipe: dict, quality: dict,
    alignment: dict | None, trust: dict | None, lineage: str, judged: dict | None = None, earlier: str = "",
    before_model: str = "the previous shipped model, trained on Tatoeba alone",
    quality_command: str = "python -m bench.quality --baseline-from bench/results/quality-tatoeba-models.json",
) -> str:  # fmt: skip
    """The card of a model trained on `python -m model.training.data build`'s mix (see the module docstring);
    `earlier`: the training stages of the model it continues (earlier_training), kept above its own."""
    name = model.name
    config = json.loads((model / "config.json").read_text())
    size = sum(p.stat().st_size for p in model.iterdir() if p.is_file() and p.name != "README.md")
    with safe_open(str(model / "model.safetensors"), framework="pt") as weights:
        parameters = f"{sum(_count(weights.get_slice(n).get_shape()) for n in weights.keys()):,}"
    rows = []
    for row in recipe["table"]:
        source_info = recipe["sources"][row["source"]]
        removed = ", ".join(f"{k} {v}" for k, v in sorted(row["removed"].items())) or "0"
        rows.append(
            f"| {row['source']} | {source_info['licence']} | {row['read']} | {removed} | {row['kept']} | "
            f"{row['weight']} | {row['lines']} |"
        )
    sources_table = "\n".join(rows)
    credits = "\n".join(f"- **{key}**: {info['credit']}." for key, info in recipe["sources"].items())
    training = "\n\n".join(
        _stage(number, len(stages), command, stage) for number, (command, stage) in enumerate(stages, start=1)
    )
    if earlier:
        training = f"### The model it continues\n{earlier}\n\n### This model's stage\n{training}"
    software = "catalogs" in recipe["sources"]
    domain = "short everyday sentences and software's UI strings" if software else "short everyday sentences"
    software_licence = (
        "\nThe gettext catalogs' translations are licensed by their packages (mostly GPL-2+, GPL-3+, LGPL-2+ and "
        "the PostgreSQL licence; `python -m model.training.catalogs --output DIR` writes catalogs.json, each catalog's "
        "Debian package, version, copyright file and pair counts). Whether trained weights are a work derived from "
        "them is unsettled; OPUS distributes the same catalogs under their packages' licences and the OPUS-MT "
        "models trained on them under CC-BY 4.0. Redistribute these weights with that in mind."
        if software else ""
    )
    software_limit = (
        " UI strings (menus, messages, option help, with `%s`-style placeholders) are the second domain: see the "
        "held-out catalogs row (git, coreutils, dpkg and glib20, never trained on)." if software else ""
    )
    summary = stages[-1][1]
    entry = quality["models"][name]
    quality_rows = []
    for set_name, scores in entry["scores"].items():
        before = entry.get("baseline", {}).get("scores", {}).get(set_name)
        opus = entry.get("opus_mt_bleu", {}).get(set_name, "")
        quality_rows.append(
            f"| {set_name} | {scores['sources']} | {scores['bleu']} / {scores['chrf']} | "
            + (f"{before['bleu']} / {before['chrf']}" if before else "")
            + f" | {opus} |"
        )
    tokenize = "zh" if target == "zh" else "13a"
    judged_text = _judged(judged, model.name)
    alignment_text = ""
    if alignment is not None:
        served = alignment["models"][name]["methods"]
        agreement = served["agreement"]
        eflomal = alignment["eflomal"]
        alignment_text = f"""
## Alignment
AER (lower is better) of the served alignments on the sets' own words: `alignment-tatoeba-zh-en` (65 in-domain
pairs, human gold links) and the newswire gold set `alignment-zh-en` (150 pairs), beside eflomal trained on
Tatoeba with the same pairs aligned alongside (`python -m bench.alignment --no-variants`, bench/results/alignment.json).

| alignment | in-domain gold | newswire gold |
|---|---|---|
| `alignment_method` "agreement" | {agreement["in_domain_gold"]["aer"]} | {agreement["gold"]["aer"]} |
| `alignment_method` "head" | {served["head"]["in_domain_gold"]["aer"]} | {served["head"]["gold"]["aer"]} |
| eflomal (words) | {eflomal["in_domain"]["aer"]} | {eflomal["gold"]["aer"]} |
"""
    trust_text = ""
    if trust is not None and name in trust["models"]:
        overall = trust["models"][name]["categories"]["all"]
        fast, full, seq = (overall.get(k, {}) for k in ("trust.score (fast)", "trust.score (full)", "forward_logprob"))
        trust_text = f"""
## Trust calibration
`trust.json` beside the weights fits the trust score (model.trust) on the "fit" half of the labelled development
set (`python -m model.training.calibrate_trust --model {name} --reverse {"-".join(reversed(name.split("-")))}`). On
the other half (`python -m bench.trust`, {overall["translations"]} translations, {overall["good"]} good): ROC AUC
{fast.get("auc")} ("fast"), {full.get("auc")} ("full"), against {seq.get("auc")} for the length-normalised
log-probability alone.
"""
    return f"""# {name}: {LANGUAGES[source]} → {LANGUAGES[target]}

A small Transformer translation model trained by this project for {domain}, shipped as the
service's default for {source}→{target}. Marian/OPUS-MT directory format: transformers' `MarianMTModel` and
`MarianTokenizer` load it and CTranslate2's converter accepts it (tested in tests/model/).

## Data
Built by `python -m model.training.data build` (model/training/recipe.py; the table it prints):

| source | licence | read | removed (held out / duplicate) | kept | weight | training lines |
|---|---|---|---|---|---|---|
{sources_table}
| total | | | | | | {recipe["train_lines"]} |

{credits}

Development data is carved from the training sources only: Tatoeba's 1,000 dev pairs and 300 HSK pairs
(`dev.tsv`); every pair whose English or Chinese side occurs in a dev or test set (TICO-19, FLORES-200, both gold
alignment sets) was removed from training. Thanks to the Tatoeba contributors, the HSK sentence package's authors
and the CC-CEDICT editors. The data is not redistributed here.

**Licences of the weights.** Tatoeba's pairs are CC-BY 2.0 (France): attribution is owed to its contributors
(every pair's sentence numbers and authors are in the training file's attribution column). The HSK sentences and
CC-CEDICT are CC-BY-SA 4.0, a share-alike licence: if these weights are an adaptation of that material (the
conservative reading, taken here), they are shared under CC-BY-SA 4.0 too, with the attributions above — you may
use, change and redistribute them, commercially too, provided you credit the sources and license what you derive
from the weights under the same terms. (The project's code is separately licensed; this note covers the weights.)
{software_licence}

## Architecture and size
The original post-norm Transformer encoder-decoder as Marian shapes it: d_model {config["d_model"]},
{config["encoder_layers"]} encoder + {config["decoder_layers"]} decoder layers, {config["encoder_attention_heads"]}
heads, FFN {config["encoder_ffn_dim"]}, {config["activation_function"]} activation, sinusoidal positions, scaled
embeddings, one joint vocabulary of {config["vocab_size"]} pieces tied to the output projection: English in
sentencepiece unigram pieces (never across a space), **Chinese one piece per character** (so a piece never spans
two words of jieba's segmentation, or of any other). {parameters} parameters; {size / 1e6:.1f} MB on disk
(float16 safetensors). Alignment head: decoder layer {config.get("alignment_layer")}, head
{config.get("alignment_head")}, read at the input step (`alignment_shift`), trained with guided alignment.

## Training
{lineage}

{training}

Checkpoint selection: `{summary["chosen"]}` among the best epoch, the average of the last epochs and the last
weights (greedy BLEU on dev: {json.dumps(summary["candidates"])}).

## Quality
Beam 4; sacrebleu BLEU (tokenize "{tokenize}") / chrF, multi-reference where a source has several translations;
`{quality_command}` (bench/results/quality.json).
"before": {before_model}. OPUS-MT: the best public model's published BLEU.

| set | sources | this model | before | OPUS-MT BLEU |
|---|---|---|---|---|
{chr(10).join(quality_rows)}
{judged_text}{alignment_text}{trust_text}
## Known limits
Short everyday sentences (phrasebook and HSK-style: shopping, transport, health, work, feelings) are what it
knows. Expect poor output for long, technical or domain-specific text (news, medical, legal: see the TICO-19 and
FLORES-200 rows), names it has not seen, and anything beyond one sentence; every answer's `trust` says how far to
believe it.{software_limit} For news or medical text serve an OPUS-MT model (docs/models-and-training.md).
"""


def everyday_main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Write an everyday model's card (see everyday_card).")
    parser.add_argument("--model", required=True)
    parser.add_argument("--source", required=True)
    parser.add_argument("--target", required=True)
    parser.add_argument("--work", action="append", required=True)
    parser.add_argument("--command", action="append", required=True)
    parser.add_argument("--recipe", required=True, help="recipe.json of the training mix")
    parser.add_argument("--quality", required=True)
    parser.add_argument("--alignment")
    parser.add_argument("--trust")
    parser.add_argument("--lineage", default="")
    parser.add_argument("--judged", help="scripts/everyday_judged.json: everyday sentences judged by hand")
    parser.add_argument("--continues", help="the card of the model this stage continued: its stages are kept")
    parser.add_argument("--before", default="the previous shipped model, trained on Tatoeba alone",
                        help="what the quality table's `before` column is")
    parser.add_argument("--quality-command", default="python -m bench.quality --baseline-from "
                        "bench/results/quality-tatoeba-models.json", help="the command that wrote --quality")
    args = parser.parse_args(argv)
    stages = [
        (c, json.loads((Path(w) / "summary.json").read_text())) for c, w in zip(args.command, args.work, strict=True)
    ]
    load = lambda path: json.loads(Path(path).read_text()) if path else None  # noqa: E731
    card = everyday_card(
        Path(args.model), args.source, args.target, stages, load(args.recipe), load(args.quality),
        load(args.alignment), load(args.trust), args.lineage, load(args.judged),
        earlier_training(Path(args.continues).read_text(encoding="utf-8")) if args.continues else "", args.before,
        args.quality_command,
    )  # fmt: skip
    (Path(args.model) / "README.md").write_text(card, encoding="utf-8")


if __name__ == "__main__":
    import sys

    everyday_main(sys.argv[2:]) if sys.argv[1:2] == ["everyday"] else main()
