"""Does the trust score know more than the log-probability on sets its calibration never saw?

Each labelled set is held out in turn (model.training.trust_data.held_out_sets: Tatoeba, HSK, long texts, and
TICO-19, which is only ever tested on); the calibration of each mode is refitted on the other sets (TICO-19 never
among them) and scores the held-out one. Reported per direction and held-out set: ROC AUC of good against bad
for Seq-Logprob (forward_logprob, the model's own confidence) and for each mode's score, and each mode's gain
over Seq-Logprob with a paired bootstrap 95 % interval that resamples source groups (a source and its perturbed
copy together). Labels as everywhere for trust: sentence chrF against the reference(s) and the repetition
filter (trust_data.translate_and_label), except TICO-19's, against its own median chrF (out of the models' domain,
almost none reaches the everyday threshold: trust_data.label_by_own_median). The shipped calibration is not used:
every score here is a refit.

    python -m bench.trust_heldout                   # both shipped models; writes bench/results/trust-heldout.json
    python -m bench.trust_heldout --limit 80        # the first 80 sources of each set (a quick look)
    python -m bench.trust_heldout --cache /tmp/th   # resumable: each direction's translations and signals kept
                                                    # there as they are measured, and read back on a rerun
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict
from pathlib import Path

import torch
from torch import Tensor

from bench import SHARED_DATA, close_report, report_command
from bench.trust import directions
from model.calibration import auc_gain_interval, fit_mode, roc_auc
from model.errors import InputTooLongError
from model.explanations.explain import teacher_forcing_inputs
from model.options import DecodingOptions
from model.tokenizer import word_groups
from model.training.trust_data import HELD_OUT_SETS, Item, held_out_sets, label_by_own_median, translate_and_label
from model.translator import Translator
from model.trust import FAST_SIGNALS, FULL_SIGNALS

READ_SIGNALS = ("sent_std", "contrastive_logprob", "alti_t_mean", "alti_t_min")  # read_signals' names
# signals measured for trust, not (yet) in its served score; reverse_*: the same read by the reverse model, the
# translation as its source and the source as its output
CANDIDATES = (
    "sent_std", "contrastive_logprob", "dropout_logprob", "dropout_variance", "alti_t_mean", "alti_t_min",
    *(f"reverse_{name}" for name in READ_SIGNALS), "reverse_dropout_logprob", "reverse_dropout_variance",
    "nbest_margin", "nbest_agreement", "round_trip_chrf",
)
# set before looking at any data: +1 where higher means better, -1 where lower does
ORIENTATION = {
    "sent_std": -1, "contrastive_logprob": 1, "dropout_logprob": 1, "dropout_variance": -1, "alti_t_mean": 1,
    "alti_t_min": 1, "reverse_sent_std": -1, "reverse_contrastive_logprob": 1, "reverse_alti_t_mean": 1,
    "reverse_alti_t_min": 1, "reverse_dropout_logprob": 1, "reverse_dropout_variance": -1, "nbest_margin": 1,
    "nbest_agreement": 1, "round_trip_chrf": 1,
}
BATCH = 32  # texts per decode where a stage decodes
FITTED_ON = ("tatoeba", "hsk", "long")  # the sets a calibration may be fitted on (TICO-19 is test only)


def fitting_sets(held_out: str) -> list[str]:
    return [name for name in FITTED_ON if name != held_out]


def read_signals(model: Translator, source: str, translation: str, prefix: str) -> dict[str, float]:
    """What `model` reads in `translation` of `source`, teacher-forced through the exact model: Sent-Std, the
    spread of its token log-probabilities (Fomicheva et al. 2020); the contrastive log-probability, its mean token
    log-probability from the source less that from an empty source (HalOmi); and ALTI^T, how much of each source
    word the output uses (ALTI+'s contribution of the word's pieces summed over the output tokens, over the output's
    length; Dale et al. 2023), its mean and its minimum over the source's words."""
    given = model.force(source, translation)
    alone = model.force("", translation)
    logprobs = [float(x) for x in given.token_logprobs] or [0.0]
    mean = sum(logprobs) / len(logprobs)
    empty = [float(x) for x in alone.token_logprobs] or [0.0]
    contributions = model.attribute(list(given.source_ids), list(given.target_ids), "alti_plus").source.sum(0)
    used = len(given.target_ids) or 1
    words = [  # source words without the end-of-sentence piece
        [index for index in group if given.source_tokens[index] != "</s>"] for group in word_groups(given.source_tokens)
    ]
    per_word = [float(contributions[group].sum()) / used for group in words if group] or [0.0]
    values = (
        math.sqrt(sum((x - mean) ** 2 for x in logprobs) / len(logprobs)),
        mean - sum(empty) / len(empty),
        sum(per_word) / len(per_word),
        min(per_word),
    )
    return {f"{prefix}{name}": value for name, value in zip(READ_SIGNALS, values, strict=True)}


def add_candidates(model: Translator, reverse: Translator, items: list[Item]) -> None:
    """The candidate signals of each translation read by the model (read_signals) and, the other way round, by the
    reverse model. A translation re-tokenized past a model's positions gives no evidence: its signals are 0."""
    for item in items:
        for reader, source, output, prefix in ((model, item.source, item.translation, ""),
                                               (reverse, item.translation, item.source, "reverse_")):
            try:
                item.signals.update(read_signals(reader, source, output, prefix))
            except InputTooLongError:
                item.signals.update({f"{prefix}{name}": 0.0 for name in READ_SIGNALS})


def dropout_means(model: Translator, source_ids: list[int], target_ids: list[int], copies: int) -> Tensor:
    """The mean token log-probability of `target_ids` after `source_ids` in each of `copies` teacher-forced passes of
    the exact model, batched as copies (its dropout on: the caller's train mode and seed)."""
    network = model.exact_model
    source, mask, decoder_input = teacher_forcing_inputs(network, source_ids, target_ids)
    encoder = network.encode(source.repeat(copies, 1), mask.repeat(copies, 1))
    hidden, _ = network.decode(decoder_input.repeat(copies, 1), encoder)
    logprobs = torch.log_softmax(network.logits(hidden).float(), dim=-1)
    chosen = logprobs.gather(2, torch.tensor(target_ids)[None, :, None].expand(copies, -1, 1))[..., 0]
    return chosen.mean(1).double()


def add_dropout_signals(
    model: Translator, items: list[Item], copies: int, seed: int, reverse: Translator | None = None
) -> None:
    """D-TP and D-Var (Fomicheva et al. 2020): the mean and the variance, over `copies` teacher-forced passes of
    the exact model with its dropout on (one batch of copies per translation, seeded), of the translation's mean
    token log-probability. With `reverse`: the same of the source read back by the reverse model from the
    translation (reverse_dropout_*; 0 where the translation is past its positions). The model is put back in eval
    mode after (bench use only: not thread-safe)."""
    reader, prefix = (model, "") if reverse is None else (reverse, "reverse_")
    network = reader.exact_model
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        with torch.no_grad():
            for item in items:
                if reverse is None:
                    source_ids, target_ids = item.ids
                else:
                    try:
                        forced = reverse.force(item.translation, item.source)
                    except InputTooLongError:
                        item.signals.update({f"{prefix}dropout_logprob": 0.0, f"{prefix}dropout_variance": 0.0})
                        continue
                    source_ids, target_ids = list(forced.source_ids), list(forced.target_ids)
                network.train()
                means = dropout_means(reader, source_ids, target_ids, copies)
                network.eval()
                item.signals[f"{prefix}dropout_logprob"] = float(means.mean())
                item.signals[f"{prefix}dropout_variance"] = float(means.var(unbiased=False))
    finally:
        network.eval()
        torch.random.set_rng_state(generator_state)


def add_nbest_signals(model: Translator, items: list[Item], beam_size: int = 4) -> None:
    """What the beam search itself says beside its best hypothesis, at no extra decode in a service (the beam's
    other finished hypotheses are already there): nbest_margin, the best hypothesis's mean token log-probability
    less the runner-up's; nbest_agreement, the mean sentence chrF of the best against each other hypothesis (the
    n-best form of Fomicheva et al. 2020's lexical similarity of dropout hypotheses). Decoded again with
    n_best = beam_size; the best must be the translation labelled (batch-invariant decoding)."""
    import sacrebleu  # a training-time dependency only

    options = DecodingOptions(beam_size=beam_size, n_best=beam_size)
    for first in range(0, len(items), BATCH):
        chunk = items[first : first + BATCH]
        translations = model.translate([item.source for item in chunk], options)
        for item, best in zip(chunk, translations, strict=True):
            if list(best.target_ids) != item.ids[1]:
                raise RuntimeError(f"the n-best decode's best differs from the translation of {item.source!r}")
            others = best.alternatives
            mean = sum(best.token_logprobs) / max(1, len(best.token_logprobs))
            runner_up = (
                sum(others[0].token_logprobs) / max(1, len(others[0].token_logprobs)) if others else mean - 10.0
            )
            item.signals["nbest_margin"] = float(mean - runner_up)
            item.signals["nbest_agreement"] = (
                sum(sacrebleu.sentence_chrf(other.text, [best.text]).score for other in others) / len(others)
                if others else 100.0
            )


def add_round_trip(reverse: Translator, items: list[Item], beam_size: int = 4) -> None:
    """round_trip_chrf: sentence chrF of the reverse model's translation of the translation (beam `beam_size`)
    against the source (Moon et al. 2020's round-trip quality estimation); 0 past the reverse model's positions."""
    import sacrebleu  # a training-time dependency only

    options = DecodingOptions(beam_size=beam_size)
    for first in range(0, len(items), BATCH):
        chunk = items[first : first + BATCH]
        fits = []
        for item in chunk:
            try:
                fits.append(reverse.encode_source([item.translation])[0])
            except InputTooLongError:
                fits.append(None)
        readable = [item for item, ids in zip(chunk, fits, strict=True) if ids is not None]
        back = reverse.translate(
            [item.translation for item in readable], options, source_ids=[ids for ids in fits if ids is not None]
        )
        for item in chunk:
            item.signals["round_trip_chrf"] = 0.0
        for item, translation in zip(readable, back, strict=True):
            item.signals["round_trip_chrf"] = sacrebleu.sentence_chrf(translation.text, [item.source]).score


# Candidate stages: name → (the signals it adds, what measures them from (model, reverse, items, copies, seed))
STAGES = {
    "read": (
        (*READ_SIGNALS, *(f"reverse_{name}" for name in READ_SIGNALS)),
        lambda model, reverse, items, copies, seed: add_candidates(model, reverse, items),
    ),
    "dropout": (
        ("dropout_logprob", "dropout_variance"),
        lambda model, reverse, items, copies, seed: add_dropout_signals(model, items, copies, seed),
    ),
    "reverse_dropout": (
        ("reverse_dropout_logprob", "reverse_dropout_variance"),
        lambda model, reverse, items, copies, seed: add_dropout_signals(model, items, copies, seed, reverse),
    ),
    "nbest": (
        ("nbest_margin", "nbest_agreement"),
        lambda model, reverse, items, copies, seed: add_nbest_signals(model, items),
    ),
    "round_trip": (
        ("round_trip_chrf",),
        lambda model, reverse, items, copies, seed: add_round_trip(reverse, items),
    ),
}


def load_items(path: Path, digests: list[str]) -> list[Item] | None:
    """The items a previous run kept at `path`, if made by the same weights (both directions' digests)."""
    if not path.exists():
        return None
    kept = json.loads(path.read_text())
    if kept.get("digests") != digests:
        return None
    items = [Item(**fields) for fields in kept["items"]]
    for item in items:
        item.ids = tuple(item.ids) if item.ids is not None else None
    return items


def keep_items(path: Path | None, digests: list[str], items: list[Item]) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps({"digests": digests, "items": [asdict(item) for item in items]}))
        temporary.replace(path)


def signal_sets(candidates: bool) -> dict[str, tuple[tuple[str, ...], str]]:
    """The signal sets a calibration is refitted on: name → (signals, the set scoring a translation the reverse
    model could not read back)."""
    sets = {"fast": (FAST_SIGNALS, "fast"), "full": (FULL_SIGNALS, "fast")}
    if candidates:
        for name in CANDIDATES:
            sets[f"fast + {name}"] = ((*FAST_SIGNALS, name), f"fast + {name}")
        sets["fast + all"] = ((*FAST_SIGNALS, *CANDIDATES), "fast + all")
        sets["full + all"] = ((*FULL_SIGNALS, *CANDIDATES), "fast + all")
    return sets


def evaluate(items: list[Item], rounds: int, seed: int, candidates: bool = False) -> dict:
    """Per held-out set: counts, Seq-Logprob's AUC and each candidate's alone, and for each signal set its
    refitted AUC and gain over Seq-Logprob with its interval."""
    sets = signal_sets(candidates)
    rows = {}
    for held_out in HELD_OUT_SETS:
        test = [item for item in items if item.set == held_out]
        fit = [item for item in items if item.set in fitting_sets(held_out)]
        labels = [item.good for item in test]
        if not test or len(set(labels)) < 2:
            continue
        baseline = [item.signals["forward_logprob"] for item in test]
        groups = [item.group for item in test]
        row: dict = {
            "translations": len(test),
            "bad": len(test) - sum(labels),
            "fitted_on": fitting_sets(held_out),
            "fit_translations": len(fit),
            "seq_logprob_auc": round(roc_auc(baseline, labels), 4),
        }
        if candidates:
            row["alone"] = {
                name: round(roc_auc([ORIENTATION[name] * item.signals[name] for item in test], labels), 4)
                for name in CANDIDATES
            }
        calibrations: dict = {}
        for set_name, (names, fallback) in sets.items():
            fitted = [item for item in fit if all(name in item.signals for name in names)]
            calibrations[set_name] = fit_mode([item.signals for item in fitted], [item.good for item in fitted], names)
            scores = [  # as served: one the reverse model cannot read back (too long for it) is scored without it
                calibrations[set_name if all(name in item.signals for name in names) else fallback].probability(
                    item.signals
                )
                for item in test
            ]
            auc = roc_auc(scores, labels)
            low, high = auc_gain_interval(groups, labels, scores, baseline, rounds, seed)
            row[set_name] = {
                "auc": round(auc, 4),
                "gain": round(auc - row["seq_logprob_auc"], 4),
                "gain_95": [round(low, 4), round(high, 4)],
            }
        rows[held_out] = row
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=str(SHARED_DATA))
    parser.add_argument("--models", nargs="*", default=["en-zh", "zh-en"], help="NAME or NAME=DIRECTORY")
    parser.add_argument("--limit", type=int, help="the first N sources of each set")
    parser.add_argument("--rounds", type=int, default=1000, help="bootstrap resamples")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--dtype", default="auto", help="how the models decode (default auto: as served)")
    parser.add_argument(
        "--candidates",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also the candidate signals (CANDIDATES), alone and added to the served ones",
    )
    parser.add_argument("--dropout-copies", type=int, default=8, help="D-TP's passes with dropout on (N)")
    parser.add_argument("--cache", help="a folder keeping each direction's labelled translations and signals")
    parser.add_argument("--output")
    args = parser.parse_args(argv)
    report: dict = {"command": report_command("bench.trust_heldout"), "models": {}}
    for name, path, model, reverse in directions(args.models, args.dtype):
        source_language, target_language = name.split("-")
        digests = [model.weights_digest, reverse.weights_digest]
        cache = Path(args.cache) / f"{name}-{args.limit or 'all'}-{args.seed}.json" if args.cache else None
        items = load_items(cache, digests) if cache else None
        timing = {"seconds": None}
        if items is None:
            items = held_out_sets(args.data, source_language, target_language, model, args.seed, args.limit)
            timing = translate_and_label(items, model, reverse, target_language)
            keep_items(cache, digests, items)
        thresholds = label_by_own_median(items)
        if args.candidates:
            for names, measure in STAGES.values():
                if not all(signal in item.signals for item in items for signal in names):
                    measure(model, reverse, items, args.dropout_copies, args.seed)
                    keep_items(cache, digests, items)
        report["models"][name] = {
            "path": str(path),
            "weights_digest": model.weights_digest,
            "own_median_chrf": {name: round(value, 2) for name, value in thresholds.items()},
            "held_out": evaluate(items, args.rounds, args.seed, args.candidates),
            "seconds": timing["seconds"],
        }
    return close_report(report, args.output, "trust-heldout.json", format_table)


def format_table(report: dict) -> str:
    """One line per direction, held-out set and scorer: Seq-Logprob, each candidate alone, each refitted set."""
    lines = [
        "",
        "| direction | held out (bad / all) | fitted on | scored by | AUC | gain over Seq-Logprob [95 %] |",
        "|---|---|---|---|---|---|",
    ]
    for name, result in report["models"].items():
        for held_out, row in result["held_out"].items():
            first = [name, f"{held_out} ({row['bad']} / {row['translations']})", ", ".join(row["fitted_on"])]
            lines.append("| " + " | ".join([*first, "Seq-Logprob", f"{row['seq_logprob_auc']:.3f}", ""]) + " |")
            for signal, auc in row.get("alone", {}).items():
                gain = auc - row["seq_logprob_auc"]
                lines.append("| " + " | ".join([*first, f"{signal} alone", f"{auc:.3f}", f"{gain:+.3f}"]) + " |")
            for set_name, value in row.items():
                if isinstance(value, dict) and "gain_95" in value:
                    low, high = value["gain_95"]
                    cells = [*first, set_name, f"{value['auc']:.3f}", f"{value['gain']:+.3f} [{low:+.3f}, {high:+.3f}]"]
                    lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
