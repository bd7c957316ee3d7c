"""A translator replica's work after a decode, once per batch of whatever texts finished meanwhile: each one's
alignment as its method asks (the "agreement" ones sharing the reverse model's forced decodes), its trust as its
mode asks (the "full" ones sharing the same forced decodes: one model.ReverseReading per batch forces each pair back
once), then the records that cross Ray, and, where asked, each hypothesis's source shares.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace

from model import DEFAULT_ALIGNMENT, AlignmentMethod, DecodingOptions, ReverseReading, Translation
from service.batching import BatchQueue
from service.explanations import decode_explanation_id
from service.records import TranslationRecord
from service.results import translation_record
from service.served import Served


@dataclass
class FinishItem:
    """A decoded text on its way to its answer: aligned and assessed with the others of its batch."""

    translation: Translation
    options: DecodingOptions  # as asked (its length budget says whether a hypothesis was cut)
    attention: str  # "none" | "summary" | "full": only changes what is returned
    alignment_method: AlignmentMethod = DEFAULT_ALIGNMENT["translate"]  # AGREEMENT: realigned after the decode
    trust: str = "off"  # "fast" | "full": assessed after the decode (model.trust)


class Finisher:
    """One replica's finishing: `submit(item)` → its TranslationRecord, built with whatever else finished meanwhile
    (one worker-thread call per batch of up to `max_batch` items)."""

    def __init__(self, served: Served, max_batch: int) -> None:
        self.served = served
        self.queue: BatchQueue[FinishItem] = BatchQueue(self._batch, max_batch)

    async def submit(self, item: FinishItem) -> TranslationRecord:
        return await self.queue.submit(item)

    async def _batch(self, items: list[FinishItem]) -> list[TranslationRecord]:
        def finish() -> list[Translation]:
            reverse = self.served.reverse
            agree = [item.alignment_method == AlignmentMethod.AGREEMENT for item in items]
            full = [item.trust == "full" for item in items]
            reading = reverse.reverse_reading(rows=any(agree), logprobs=any(full)) if reverse is not None else None
            translations = self._aligned([item.translation for item in items], agree, reading)
            aligned = reading.forced if reading is not None else 0
            self._assessed(translations, items, reading)
            if reading is not None:  # the reverse model's forced decodes as run: trust reuses what agreement forced
                metrics, model_id = self.served.metrics, self.served.spec.id
                metrics.forced_decodes.labels(model_id, "agreement").inc(aligned)
                metrics.forced_decodes.labels(model_id, "trust").inc(reading.forced - aligned)
            return translations

        translations = await asyncio.to_thread(finish)
        return [self._record(t, item.attention) for t, item in zip(translations, items, strict=True)]

    def _aligned(
        self, translations: list[Translation], agree: list[bool], reading: ReverseReading | None
    ) -> list[Translation]:
        """Each translation with the alignment its method asks for: "agreement" is computed after the decode, the
        reverse model's forced decodes of all of them sharing batches (Translator.with_agreements)."""
        wanted = [i for i, yes in enumerate(agree) if yes]
        if not wanted:
            return translations
        served, results = self.served, list(translations)
        if served.reverse is None:
            for i in wanted:
                results[i] = self._noted(translations[i])
            return results
        agreed = served.translator.with_agreements([translations[i] for i in wanted], served.reverse, reading)
        for i, translation in zip(wanted, agreed, strict=True):
            results[i] = translation
        return results

    def _assessed(
        self, translations: list[Translation], items: list[FinishItem], reading: ReverseReading | None
    ) -> None:
        """Each translation's trust as its mode asks (model.trust), those asked with equal options together: "full"
        ones read the reverse model's forced decodes (those the agreement made, where it made them); without a
        reverse model "full" is "fast"."""
        served = self.served
        groups: dict[tuple[str, DecodingOptions], list[Translation]] = {}
        for translation, item in zip(translations, items, strict=True):
            if item.trust in ("fast", "full"):
                groups.setdefault((item.trust, item.options), []).append(translation)
        for (mode, options), chosen in groups.items():
            served.translator.assess(chosen, mode, served.reverse, options, reading)

    def _noted(self, translation: Translation) -> Translation:
        return replace(
            translation,
            alignment_note=self.served.no_reverse_note if translation.target_ids else None,
            alternatives=[self._noted(alternative) for alternative in translation.alternatives],
        )

    def _record(self, translation: Translation, attention: str) -> TranslationRecord:
        served = self.served
        model_id, metrics = served.spec.id, served.metrics
        metrics.texts.labels(model_id, served.replica).inc()
        metrics.source_tokens.labels(model_id).inc(len(translation.source_ids))
        metrics.target_tokens.labels(model_id).inc(len(translation.target_ids))
        if translation.trust is not None:
            metrics.trust_score.labels(model_id, translation.trust.mode).observe(translation.trust.score)
            for flag in translation.trust.flags:
                metrics.trust_flags.labels(model_id, flag.kind).inc()
        head, shift = served.translator.alignment_head, served.translator.alignment_shift

        def record(hypothesis: Translation) -> TranslationRecord:
            explanation_id = served.explanation_id(
                hypothesis.source_ids, hypothesis.target_ids, hypothesis.alignment_method
            )
            return translation_record(hypothesis, explanation_id, attention, head, shift)

        result = record(translation)
        result.alternatives = [record(alternative) for alternative in translation.alternatives]
        return result

    def add_source_shares(self, translations: list[TranslationRecord]) -> None:
        """token_source_shares (ALTI+, and so source_share) on each translation and alternative, from the tokens
        its explanation id names; a blank text (no id, nothing decoded) gets [] (and a null source_share)."""
        served = self.served
        for translation in translations:
            for hypothesis in [translation, *translation.alternatives]:
                shares: list[float] = []
                if hypothesis.explanation_id is not None:
                    key = decode_explanation_id(hypothesis.explanation_id, served.secret)
                    attributions = served.translator.attribute(list(key.source_ids), list(key.target_ids), "alti_plus")
                    shares = attributions.source_share.tolist()
                    served.metrics.forced_decodes.labels(served.spec.id, "source_share").inc()
                hypothesis.token_source_shares = shares
