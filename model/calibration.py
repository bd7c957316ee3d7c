"""A trust score's calibration: the logistic regression on a mode's signals, stored beside the checkpoint as
trust.json, and the measures it is fitted and judged by.

`python -m model.training.calibrate_trust` fits one regression per trust mode (on the signals SCORE_SIGNALS names,
model.trust computes) on labelled development translations, with its L2 strength cross-validated, and stores what
each mode's scores meant on translations the fit never saw (`reliability`). ROC AUC and its paired bootstrap
interval are how scores are compared (bench.trust, bench.trust_heldout).
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

CALIBRATION_NAME = "trust.json"
CALIBRATION_FORMAT = "attention-translate trust calibration 2"  # 1: before source_length, familiarity, DERIVED

# What each mode's score is fitted on, chosen by measurement (python -m bench.trust_heldout, docs/explanations.md):
# the cheapest set of signals whose ROC AUC gain over Seq-Logprob reaches 0.03, its bootstrap interval above 0, on
# every held-out set in both directions. No set did (the richest gained 0.01-0.03 on Tatoeba and HSK, with
# intervals reaching below 0), so both scores are Seq-Logprob calibrated: the probability that a translation with
# this mean token log-probability is adequate. The other signals are still computed and answered, and the flags
# read them.
SCORE_SIGNALS = {"fast": ("forward_logprob",), "full": ("forward_logprob",)}
RELIABILITY_BINS = 10  # equal-count bins of held-out scores, each with the share of its translations that were good


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
