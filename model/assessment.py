"""Trust's pass over finished translations, for Translator.assess: model.trust's signals and flags read from each
hypothesis's decode (its token log-probabilities and alignment rows, all a batch's rows in one host read) and, in
"full", from the reverse model forced over each pair; then the score the model's calibration gives them, and what
that score meant held out. Translator delegates here; model.trust holds the arithmetic, model.calibration the score.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from model.agreeing import Aligner, ReverseReading
from model.calibration import Calibration, uncalibrated_score
from model.choices import TRUST_MODES
from model.decoding.search import length_budget
from model.errors import InvalidInputError
from model.host import matrices_to_lists
from model.options import DecodingOptions
from model.tokenizer import MarianTokenizer
from model.trust import Trust, _Reading, frequent_pieces, piece_scores, signals_and_flags

if TYPE_CHECKING:
    from model.results import Translation


def calibration_fit(calibration: Calibration | None, mode: str):
    """The calibration's fit of `mode` ("fast", "full"), or None (no trust.json, or one fitted on other weights):
    the score is then the uncalibrated default."""
    if calibration is None or calibration.mismatch:
        return None
    return calibration.modes.get(mode)


def calibration_info(calibration: Calibration | None) -> dict:
    """What GET /v1/models says of a model's trust score."""
    if calibration is None or calibration.mismatch:
        return {
            "calibrated": False,
            "note": calibration.mismatch if calibration is not None else "no trust.json beside the weights",
            "modes": list(TRUST_MODES),
            "score": "uncalibrated default: exp(mean token log-probability); fit one with "
            "python -m model.training.calibrate_trust",
            "score_signals": {mode: ["forward_logprob"] for mode in TRUST_MODES if mode != "off"},
        }
    modes = calibration.modes
    return {
        "calibrated": True,
        "modes": list(TRUST_MODES),
        "score_signals": {mode: list(fit.signals) for mode, fit in modes.items()},
        "reliability": {mode: fit.reliability for mode, fit in modes.items() if fit.reliability},
        "fitted_on": calibration.fitted_on,
    }


class Assessor:
    """One translator's trust pass, with what it reads of the source tokenizer once (its most frequent pieces, each
    piece's unigram score)."""

    def __init__(self, tokenizer: MarianTokenizer, aligner: Aligner, max_positions: int) -> None:
        self.tokenizer, self.aligner, self.max_positions = tokenizer, aligner, max_positions

    @functools.cached_property
    def frequent(self) -> frozenset[str]:
        return frequent_pieces(self.tokenizer.source_spm)

    @functools.cached_property
    def piece_scores(self) -> dict[str, float]:
        return piece_scores(self.tokenizer.source_spm)

    @functools.cached_property
    def rarest(self) -> float:
        return min(self.piece_scores.values(), default=0.0)

    def assess(
        self,
        translations: list[Translation],
        mode: str,
        reverse: Aligner | None,
        options: DecodingOptions | None,
        calibration: Calibration | None,
        reading: ReverseReading | None = None,
    ) -> None:
        """Translator.assess (`reverse`: the reverse model's Aligner; `calibration`: this model's)."""
        if mode not in TRUST_MODES:
            raise InvalidInputError(f"trust must be one of {', '.join(TRUST_MODES)}")
        if mode == "off":
            return
        hypotheses = [h for t in translations if t.target_ids for h in (t, *t.alternatives)]
        if mode == "full" and reverse is None:
            mode = "fast"
        texts = [(self.tokenizer.source_text(h.source_ids), h.text) for h in hypotheses]
        backward: dict[int, tuple[list[int], list[int]]] = {}
        if mode == "full":
            reading = reading if reading is not None else ReverseReading(reverse, rows=False, logprobs=True)
            for index, (source_text, translation) in enumerate(texts):
                pair, _ = reading.pair(source_text, translation)
                if pair is not None:
                    backward[index] = pair
        reverse_scores = dict(zip(backward, reading.logprobs(list(backward.values())) if backward else []))
        eos = self.tokenizer.eos_id
        # At the length budget the search ends a hypothesis with </s> (Marian's forced_eos_token_id), so a
        # hypothesis that long with </s> last was cut; one without </s> (a client's target) never ended.
        budget, limit = options or DecodingOptions(), self.max_positions
        # every hypothesis's rows on the host in one read (the trust signals are Python over those lists)
        with_rows = [i for i, h in enumerate(hypotheses) if h.alignment_rows is not None]
        read = matrices_to_lists([self.aligner.read_rows(hypotheses[i].alignment_rows) for i in with_rows])
        host_rows = dict(zip(with_rows, read, strict=True))
        for index, hypothesis in enumerate(hypotheses):
            reading = _Reading(
                source_tokens=hypothesis.source_tokens,
                target_tokens=hypothesis.target_tokens,
                token_logprobs=list(hypothesis.token_logprobs),
                rows=host_rows.get(index),
                ended=bool(hypothesis.target_ids)
                and hypothesis.target_ids[-1] == eos
                and len(hypothesis.target_ids) < length_budget(len(hypothesis.source_ids), budget, limit),
                source_words=hypothesis.source_words,
                target_words=hypothesis.target_words,
                source_text=texts[index][0],
                frequent=self.frequent,
                linked_source=frozenset(s for s, _ in hypothesis.word_alignment),
                piece_scores=self.piece_scores,
                rarest_score=self.rarest,
                forced=list(hypothesis.forced),
            )
            if index in reverse_scores:
                reading.reverse_logprobs = reverse_scores[index]
                reading.reverse_pieces = reverse.tokenizer.target_tokens(backward[index][1])
            signals, flags = signals_and_flags(reading)
            used = "full" if index in reverse_scores else "fast"  # "full" where the reverse model read the pair
            if used == "full":
                logprobs = reverse_scores[index]
                signals["reverse_logprob"] = sum(logprobs) / len(logprobs)
            fit = calibration_fit(calibration, used)
            score = fit.probability(signals) if fit is not None else uncalibrated_score(signals)
            held_out = fit.held_out(score) if fit is not None else None
            hypothesis.trust = Trust(round(score, 4), flags, signals, used, fit is not None, held_out)

