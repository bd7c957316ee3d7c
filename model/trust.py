"""How far to believe a translation: signals, flags and a calibrated score per hypothesis.

Signals are numbers the decode already has (the forward model's token log-probabilities, the alignment head's rows,
the pieces) and, in the "full" mode, what the reverse model says when forced to write the source back from the
translation (Junczys-Dowmunt 2018's dual conditional cross-entropy). The score is a logistic regression on them,
fitted per model on labelled development translations (`python -m model.training.calibrate_trust`) and stored
beside the checkpoint as trust.json; without one the score is the translation's geometric-mean token probability
(exp of the length-normalised log-probability, HalOmi's most robust single detector) and says it is uncalibrated.

Flags are typed findings about words: `omission` (a source word the alignment head hardly looked at, and in "full"
the reverse model cannot recover from the translation), `addition` (a target word with little source support),
`repetition` (a stretch repeated back to back that the source does not repeat), `untranslated` (source words
copied through) and `truncated` (the length budget ended the hypothesis before </s>).
"""

from __future__ import annotations

import json
import math
import random
import unicodedata
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from model.tokenizer import is_lone_space, is_special_piece, piece_owners, word_groups

CALIBRATION_NAME = "trust.json"
CALIBRATION_FORMAT = "attention-translate trust calibration 2"  # 1: before source_length, familiarity, DERIVED

# The signals each mode computes; the calibration of a mode reads these (and the derived features below).
FAST_SIGNALS = (
    "forward_logprob",  # mean log-probability of the translation's tokens, </s> included (Seq-Logprob)
    "forward_min_logprob",  # the least likely token's log-probability
    "source_coverage",  # share of the source's words the alignment head gives at least COVERED mass
    "target_support",  # mean over target words of the most alignment mass one source word gets from it
    "repetition",  # share of the translation's pieces inside a back-to-back repeat the source does not have
    "length_ratio",  # log(target pieces / source pieces)
    "untranslated",  # share of the translation's words copied verbatim from the source
    "truncated",  # 1 when the hypothesis ended without </s>
    "source_length",  # log(1 + the source's pieces): longer sources come back wrong more often
    "source_familiarity",  # mean unigram log-probability of the source's pieces under its tokenizer (rare: low)
)
FULL_SIGNALS = (*FAST_SIGNALS, "reverse_logprob")  # the reverse model's mean log-probability of the source
# What each mode's score is fitted on, chosen by measurement (python -m bench.trust_heldout, docs/explanations.md):
# the cheapest set of signals whose ROC AUC gain over Seq-Logprob reaches 0.03, its bootstrap interval above 0, on
# every held-out set in both directions. No set did (the richest gained 0.01-0.03 on Tatoeba and HSK, with
# intervals reaching below 0), so both scores are Seq-Logprob calibrated: the probability that a translation with
# this mean token log-probability is adequate. The other signals are still computed and answered, and the flags
# read them.
SCORE_SIGNALS = {"fast": ("forward_logprob",), "full": ("forward_logprob",)}
RELIABILITY_BINS = 10  # equal-count bins of held-out scores, each with the share of its translations that were good

COVERED = 0.2  # column mass (target tokens' worth of attention) above which a source word counts as covered
# An omission: a source word of content (not only the tokenizer's most frequent pieces) no target word links to,
# which in "fast" the alignment head also hardly looks at (column mass below OMITTED) and which in "full" the
# reverse model, forced to write the source back from the translation, finds unlikely (its pieces' mean
# log-probability at most RECOVERED).
OMITTED = 0.3
RECOVERED = math.log(0.3)
SUPPORTED = 0.3  # a target word giving no source word this much of its alignment mass is an addition candidate
UNSUPPORTED_LOGPROB = math.log(0.1)  # … and only if the forward model was this unsure of it
MIN_REPEATS = 3  # a piece repeated this many times back to back (a longer stretch: twice) is a repetition


@dataclass
class TrustFlag:
    kind: str  # one of FLAG_KINDS
    side: str  # "source" or "target": which sentence `words` index
    words: list[int]  # word indices (Translation.source_words / target_words)
    text: list[str]  # those words


@dataclass
class Trust:
    score: float  # estimated probability that the translation is adequate, in [0, 1]
    flags: list[TrustFlag]
    signals: dict[str, float]
    mode: str  # "fast" or "full"
    calibrated: bool  # False: the score is the uncalibrated default (exp of forward_logprob)
    # What the score meant on translations the fit never saw: the held-out bin it falls in (ModeCalibration.held_out)
    held_out: dict | None = None


# ---- signals ----------------------------------------------------------------------------------------
def _content(word: str) -> bool:
    return any(unicodedata.category(c)[0] in "LN" for c in word)


def _folded(word: str) -> str:
    return unicodedata.normalize("NFKC", word).casefold().strip()


def _groups(tokens: list[str]) -> list[list[int]]:
    """Word groups without special tokens or lone "▁" pieces."""
    groups = []
    for group in word_groups(tokens):
        pieces = [i for i in group if not is_special_piece(tokens[i]) and not is_lone_space(tokens[i])]
        groups.append(pieces)
    return groups


def tandem_repeats(pieces: list[str]) -> list[tuple[int, int]]:
    """(start, end) piece spans that repeat back to back: one piece MIN_REPEATS times or more, a stretch of 2-8
    pieces twice or more. Each span covers the repeats after the first."""
    spans = []
    count = len(pieces)
    index = 0
    while index < count:
        found = None
        for width in range(1, 9):
            unit = pieces[index : index + width]
            if len(unit) < width:
                break
            repeats = 1
            while pieces[index + repeats * width : index + (repeats + 1) * width] == unit:
                repeats += 1
            if repeats >= (MIN_REPEATS if width == 1 else 2) and any(_content(p) for p in unit):
                found = (index + width, index + repeats * width)
                break
        if found:
            spans.append(found)
            index = found[1]
        else:
            index += 1
    return spans


def _repeated_share(pieces: list[str]) -> tuple[float, list[tuple[int, int]]]:
    spans = tandem_repeats(pieces)
    covered = sum(end - start for start, end in spans)
    return (covered / len(pieces) if pieces else 0.0), spans


@dataclass
class _Reading:
    """What the signals and flags of one hypothesis are read from."""

    source_tokens: list[str]
    target_tokens: list[str]
    token_logprobs: list[float]
    rows: Tensor | list[list[float]] | None  # (T, S) alignment-head rows read as the model declares (or as host
    # lists: model.host.matrices_to_lists), or None
    ended: bool  # the hypothesis ends with </s>
    source_words: list[str]
    target_words: list[str]
    reverse_logprobs: list[float] | None = None  # the reverse model's, one per source piece (its own pieces)
    reverse_pieces: list[str] | None = None
    source_text: str = ""
    frequent: frozenset[str] = frozenset()  # the source tokenizer's most frequent pieces: never omission candidates
    linked_source: frozenset[int] = frozenset()  # source words some target word links to (word_alignment)
    piece_scores: dict[str, float] | None = None  # the source tokenizer's unigram log-probability of each piece
    rarest_score: float = 0.0  # … and its least: what a piece it does not have counts as


def piece_scores(processor) -> dict[str, float]:
    """Each piece of a sentencepiece model with its unigram log-probability (character models: log frequency)."""
    return {processor.IdToPiece(i): processor.GetScore(i) for i in range(processor.GetPieceSize())}


def frequent_pieces(processor, count: int = 100) -> frozenset[str]:
    """The `count` pieces a sentencepiece model scores most likely (function words: "▁the", "的", …)."""
    scored = sorted(range(processor.GetPieceSize()), key=processor.GetScore, reverse=True)
    return frozenset(processor.IdToPiece(i) for i in scored[:count])


def signals_and_flags(reading: _Reading) -> tuple[dict[str, float], list[TrustFlag]]:
    source_groups = _groups(reading.source_tokens)
    target_groups = _groups(reading.target_tokens)
    logprobs = reading.token_logprobs or [0.0]
    signals: dict[str, float] = {
        "forward_logprob": sum(logprobs) / len(logprobs),
        "forward_min_logprob": min(logprobs),
    }
    flags: list[TrustFlag] = []
    source_content = [w for w, g in enumerate(source_groups) if g and _content(reading.source_words[w])]
    target_content = [w for w, g in enumerate(target_groups) if g and _content(reading.target_words[w])]

    # Alignment: source words' column mass, target words' mass on real source pieces.
    column_mass: dict[int, float] = {}
    support: dict[int, float] = {}
    rows = reading.rows.float().tolist() if isinstance(reading.rows, Tensor) else reading.rows
    if rows and rows[0]:
        # each row normalised to sum 1, in Python lists: a torch call per word cost more than its arithmetic
        rows = [[value / total for value in row] for row, total in ((row, max(sum(row), 1e-9)) for row in rows)]
        width = len(rows[0])
        target_rows = [i for i, t in enumerate(reading.target_tokens) if not is_special_piece(t)]
        columns = [sum(column) for column in zip(*(rows[i] for i in target_rows))] if target_rows else [0.0] * width
        for word in source_content:
            column_mass[word] = sum(columns[p] for p in source_groups[word])
        if source_content:
            # (target tokens, source words): each source word's pieces summed
            by_word = [[sum(row[p] for p in source_groups[word]) for word in source_content] for row in rows]
            for word in target_content:
                pieces = target_groups[word]
                support[word] = max(
                    sum(by_word[t][c] for t in pieces) / len(pieces) for c in range(len(source_content))
                )
    covered = [w for w in source_content if column_mass.get(w, 1.0) >= COVERED]
    signals["source_coverage"] = len(covered) / len(source_content) if source_content else 1.0
    signals["target_support"] = sum(support.values()) / len(support) if support else 1.0

    target_pieces = [t for t in reading.target_tokens if not is_special_piece(t)]
    source_pieces = [t for t in reading.source_tokens if not is_special_piece(t)]
    repeated, spans = _repeated_share(target_pieces)
    source_repeated, _ = _repeated_share(source_pieces)
    signals["repetition"] = max(0.0, repeated - source_repeated)
    signals["length_ratio"] = math.log(max(len(target_pieces), 1) / max(len(source_pieces), 1))
    signals["source_length"] = math.log1p(len(source_pieces))
    scores, rarest = reading.piece_scores or {}, reading.rarest_score
    signals["source_familiarity"] = (
        sum(scores.get(piece, rarest) for piece in source_pieces) / len(source_pieces) if source_pieces else 0.0
    )

    source_set = {_folded(reading.source_words[w]) for w in source_content}
    copied = [
        w
        for w in target_content
        if _folded(reading.target_words[w]) in source_set
        and not _folded(reading.target_words[w]).isdigit()
        and any(unicodedata.category(c)[0] == "L" for c in reading.target_words[w])
    ]
    signals["untranslated"] = len(copied) / len(target_content) if target_content else 0.0
    signals["truncated"] = 0.0 if reading.ended else 1.0

    # Flags.
    recovered = _recovered_words(reading, source_groups) if reading.reverse_logprobs is not None else None
    candidates = [
        w
        for w in source_content
        if w not in reading.linked_source
        and not all(reading.source_tokens[p] in reading.frequent for p in source_groups[w])
    ]
    if recovered is None:
        omitted = [w for w in candidates if column_mass.get(w, 1.0) < OMITTED]
    else:
        omitted = [w for w in candidates if w not in recovered]
    if omitted:
        flags.append(TrustFlag("omission", "source", omitted, [reading.source_words[w] for w in omitted]))
    token_logprob = dict(enumerate(reading.token_logprobs))
    added = [
        w
        for w in target_content
        if support.get(w, 1.0) < SUPPORTED
        and min(token_logprob.get(p, 0.0) for p in target_groups[w]) < UNSUPPORTED_LOGPROB
    ]
    if added:
        flags.append(TrustFlag("addition", "target", added, [reading.target_words[w] for w in added]))
    if spans and signals["repetition"] > 0:
        target_index = [i for i, t in enumerate(reading.target_tokens) if not is_special_piece(t)]
        owner = piece_owners(target_groups, len(reading.target_tokens))
        words = sorted({owner[target_index[p]] for s, e in spans for p in range(s, e)} - {None})
        flags.append(TrustFlag("repetition", "target", words, [reading.target_words[w] for w in words]))
    if target_content and len(copied) * 2 >= len(target_content) and len(source_content) >= 2:
        flags.append(TrustFlag("untranslated", "target", copied, [reading.target_words[w] for w in copied]))
    if not reading.ended:
        last = [w for w, g in enumerate(target_groups) if g][-1:]  # the last word with text (not </s>)
        flags.append(TrustFlag("truncated", "target", last, [reading.target_words[w] for w in last]))
    return signals, flags


def _recovered_words(reading: _Reading, source_groups: list[list[int]]) -> set[int]:
    """Source words whose characters the reverse model, forced to write the source from the translation, finds
    likely (mean log-probability of the reverse pieces overlapping the word above RECOVERED)."""
    from model.explanations.agreement import piece_offsets

    text = reading.source_text
    forward_spans = piece_offsets(text, reading.source_tokens)
    reverse_spans = piece_offsets(text, reading.reverse_pieces or [])
    recovered = set()
    for word, pieces in enumerate(source_groups):
        spans = [forward_spans[p] for p in pieces if forward_spans[p][0] < forward_spans[p][1]]
        if not spans:
            continue
        start, end = min(s for s, _ in spans), max(e for _, e in spans)
        overlapping = [
            reading.reverse_logprobs[i]
            for i, (s, e) in enumerate(reverse_spans)
            if s < end and start < e and i < len(reading.reverse_logprobs)
        ]
        if overlapping and sum(overlapping) / len(overlapping) > RECOVERED:
            recovered.add(word)
    return recovered


# ---- calibration ------------------------------------------------------------------------------------
# The regression's derived inputs, each a product of two signals (a name twice: its square), beside the signals:
# too short and too long are both bad (length_ratio²), and how much a log-probability says depends on how long
# the sentence is and on how sure the model is at all (measured: bench.trust's AUC rose by 0.01-0.02 with them).
DERIVED = (
    ("length_ratio", "length_ratio"),
    ("forward_logprob", "forward_logprob"),
    ("forward_logprob", "source_length"),
    ("forward_min_logprob", "source_length"),
)
DERIVED_FULL = (
    ("reverse_logprob", "reverse_logprob"),
    ("reverse_logprob", "source_length"),
    ("forward_logprob", "reverse_logprob"),
)


def _derived(names: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """The products of DERIVED (and DERIVED_FULL) whose two factors are both among `names`."""
    return tuple((a, b) for a, b in (*DERIVED, *DERIVED_FULL) if a in names and b in names)


def _gap(names: tuple[str, ...]) -> bool:
    return "reverse_logprob" in names and "forward_logprob" in names


def features(signals: dict[str, float], names: tuple[str, ...]) -> list[float]:
    """The regression's inputs: the signals named, their products in DERIVED and DERIVED_FULL whose factors are
    named too and, with both directions' log-probabilities, the gap between them."""
    row = [float(signals[name]) for name in names]
    row += [float(signals[a]) * float(signals[b]) for a, b in _derived(names)]
    if _gap(names):
        row.append(abs(float(signals["forward_logprob"]) - float(signals["reverse_logprob"])))
    return row


def feature_names(names: tuple[str, ...]) -> list[str]:
    derived = [f"{a}^2" if a == b else f"{a}*{b}" for a, b in _derived(names)]
    return [*names, *derived, *(["direction_gap"] if _gap(names) else [])]


@dataclass
class ModeCalibration:
    """σ(bias + Σ weight · (feature − mean) / scale), fitted on labelled translations."""

    signals: tuple[str, ...]
    mean: list[float]
    scale: list[float]
    weights: list[float]
    bias: float
    l2: float | None = None  # the regularisation it was fitted with (cross-validated)
    reliability: list[dict] | None = None  # `reliability` bins of this score on held-out translations

    def probability(self, signals: dict[str, float]) -> float:
        row = features(signals, self.signals)
        z = self.bias + sum(w * (x - m) / s for w, x, m, s in zip(self.weights, row, self.mean, self.scale))
        return 1.0 / (1.0 + math.exp(-max(min(z, 40.0), -40.0)))

    def held_out(self, score: float) -> dict | None:
        """The held-out bin `score` falls in ({low, high, answers, adequate}: of `answers` held-out translations
        scored from low to high, the share `adequate` was labelled good), or None without reliability bins."""
        if not self.reliability:
            return None
        for found in self.reliability:
            if score <= found["high"]:
                return dict(found)
        return dict(self.reliability[-1])


def reliability(scores: list[float], labels: list[int], bins: int = RELIABILITY_BINS) -> list[dict]:
    """What scores meant on labelled translations: sorted by score and cut into `bins` bins of (nearly) equal count,
    each bin's lowest and highest score, its count and the share labelled good (1). Ties stay in one bin."""
    ranked = sorted(zip(scores, labels, strict=True))
    found: list[dict] = []
    start = 0
    for index in range(1, bins + 1):
        end = round(index * len(ranked) / bins)
        while 0 < end < len(ranked) and ranked[end][0] == ranked[end - 1][0]:
            end += 1  # a score on a bin's edge: its ties join it
        if end <= start:
            continue
        chunk = ranked[start:end]
        found.append({
            "low": round(chunk[0][0], 4),
            "high": round(chunk[-1][0], 4),
            "answers": len(chunk),
            "adequate": round(sum(label for _, label in chunk) / len(chunk), 4),
        })
        start = end
    return found


@dataclass
class Calibration:
    modes: dict[str, ModeCalibration]
    fitted_on: dict  # what it was fitted on: model digest, counts, labels, the command
    mismatch: str | None = None  # why it does not apply to the weights loaded (then the default score is used)

    def to_json(self) -> dict:
        return {
            "format": CALIBRATION_FORMAT,
            "modes": {
                mode: {
                    "signals": list(c.signals),
                    "features": feature_names(c.signals),
                    "mean": c.mean,
                    "scale": c.scale,
                    "weights": c.weights,
                    "bias": c.bias,
                    "l2": c.l2,
                    "reliability": c.reliability,
                }
                for mode, c in self.modes.items()
            },
            "fitted_on": self.fitted_on,
        }

    def save(self, directory: str | Path) -> Path:
        path = Path(directory) / CALIBRATION_NAME
        path.write_text(json.dumps(self.to_json(), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        return path

    @classmethod
    def load(cls, directory: str | Path, weights_digest: str | None = None) -> Calibration | None:
        """trust.json of `directory`, or None; fitted on other weights than `weights_digest`: `mismatch` says so."""
        path = Path(directory) / CALIBRATION_NAME
        if not path.is_file():
            return None
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("format") != CALIBRATION_FORMAT:
            calibration = cls({}, data.get("fitted_on", {}))
            calibration.mismatch = (
                f"{CALIBRATION_NAME} is in the format {data.get('format')!r}, not {CALIBRATION_FORMAT!r} (other "
                "signals): refit it with python -m model.training.calibrate_trust"
            )
            return calibration
        modes = {
            mode: ModeCalibration(
                tuple(c["signals"]), c["mean"], c["scale"], c["weights"], float(c["bias"]), c.get("l2"),
                c.get("reliability"),
            )
            for mode, c in data["modes"].items()
        }
        calibration = cls(modes, data.get("fitted_on", {}))
        fitted = calibration.fitted_on.get("weights_digest")
        if weights_digest is not None and fitted != weights_digest:
            calibration.mismatch = (
                f"{CALIBRATION_NAME} was fitted on weights {fitted}, not these ({weights_digest}): "
                "refit it with python -m model.training.calibrate_trust"
            )
        return calibration


L2_CHOICES = (1e-3, 3e-3, 1e-2, 3e-2)  # the regularisation fit_mode picks from by cross-validation
FOLDS = 5


def _fit(x: Tensor, y: Tensor, l2: float) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    mean = x.mean(0)
    scale = x.std(0).clamp(min=1e-6)
    z = (x - mean) / scale
    weights = torch.zeros(z.size(1), dtype=torch.float64, requires_grad=True)
    bias = torch.zeros((), dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS([weights, bias], max_iter=200, line_search_fn="strong_wolfe")

    def closure():
        optimizer.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(z @ weights + bias, y) + l2 * weights.square().sum()
        loss.backward()
        return loss

    optimizer.step(closure)
    return mean, scale, weights.detach(), bias.detach()


def cross_validated_l2(x: Tensor, y: Tensor) -> float:
    """The L2_CHOICES value of best mean held-out AUC over FOLDS interleaved folds of the fitting data."""
    folds = [list(range(k, len(y), FOLDS)) for k in range(FOLDS)]
    best, chosen = -1.0, L2_CHOICES[len(L2_CHOICES) // 2]
    for l2 in L2_CHOICES:
        aucs = []
        for held in folds:
            kept = sorted(set(range(len(y))) - set(held))
            mean, scale, weights, bias = _fit(x[kept], y[kept], l2)
            scores = (((x[held] - mean) / scale) @ weights + bias).tolist()
            auc = roc_auc(scores, [int(v) for v in y[held].tolist()])
            if not math.isnan(auc):
                aucs.append(auc)
        score = sum(aucs) / len(aucs) if aucs else -1.0
        if score > best:
            best, chosen = score, l2
    return chosen


def fit_mode(rows: list[dict[str, float]], labels: list[int], names: tuple[str, ...], l2: float | None = None):
    """Logistic regression of labels (1 good, 0 bad) on the features of `rows`, L2-regularised (None: the
    strength cross-validated on `rows`), by L-BFGS."""
    x = torch.tensor([features(r, names) for r in rows], dtype=torch.float64)
    y = torch.tensor(labels, dtype=torch.float64)
    if l2 is None:
        l2 = cross_validated_l2(x, y)
    mean, scale, weights, bias = _fit(x, y, l2)
    return ModeCalibration(names, mean.tolist(), scale.tolist(), weights.tolist(), float(bias), l2)


def uncalibrated_score(signals: dict[str, float]) -> float:
    """exp(mean token log-probability): the geometric-mean probability of the translation's tokens."""
    return math.exp(signals["forward_logprob"])


def roc_auc(scores: list[float], labels: list[int]) -> float:
    """Probability that a random good item scores above a random bad one (ties count half)."""
    order = sorted(range(len(scores)), key=lambda i: scores[i])
    ranks = [0.0] * len(scores)
    index = 0
    while index < len(order):
        end = index
        while end + 1 < len(order) and scores[order[end + 1]] == scores[order[index]]:
            end += 1
        for k in range(index, end + 1):
            ranks[order[k]] = (index + end) / 2 + 1
        index = end + 1
    good = [r for r, label in zip(ranks, labels) if label]
    bad = len(labels) - len(good)
    if not good or not bad:
        return float("nan")
    return (sum(good) - len(good) * (len(good) + 1) / 2) / (len(good) * bad)


def auc_gain_interval(
    groups: list[int], labels: list[int], scores: list[float], baseline: list[float], rounds: int = 1000,
    seed: int = 7,
) -> tuple[float, float]:
    """Paired bootstrap 95 % interval of roc_auc(scores) − roc_auc(baseline): `rounds` resamples of whole groups
    (items sharing a group, e.g. a source and its perturbed copy, are drawn together), with replacement."""
    members: dict[int, list[int]] = {}
    for index, group in enumerate(groups):
        members.setdefault(group, []).append(index)
    keys = list(members)
    rng = random.Random(seed)
    gains = []
    for _ in range(rounds):
        chosen = [i for _ in keys for i in members[rng.choice(keys)]]
        picked = [labels[i] for i in chosen]
        gain = roc_auc([scores[i] for i in chosen], picked) - roc_auc([baseline[i] for i in chosen], picked)
        if not math.isnan(gain):  # the resample held both classes
            gains.append(gain)
    if not gains:
        return float("nan"), float("nan")
    gains.sort()
    return gains[int(0.025 * (len(gains) - 1))], gains[int(0.975 * (len(gains) - 1))]
