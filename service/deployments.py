"""The translator deployment, one per model: its texts share the replica's one decode loop (the engine's scheduler,
continuous or static), the work after their decodes is done per batch (service/batching.py), it recomputes
explanations by forced decoding and explains one head.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, replace
from typing import Any

from ray import serve

from model import (
    DEFAULT_ALIGNMENT,
    AlignmentMethod,
    Batch,
    DecodingOptions,
    InputTooLongError,
    InvalidInputError,
    StreamedToken,
    Translation,
    Translator,
    TranslatorError,
)
from service.batching import BatchQueue
from service.config import ModelSpec, explanation_secret
from service.explanations import ExplanationKey, ExplanationNotFoundError, decode_explanation_id, encode_explanation_id
from service.messages import ExplainView, Rejected, TranslateCall
from service.metrics import replica_identity, service_metrics
from service.records import TranslationRecord
from service.results import attributions_json, explanation_json, steps_json, translation_record
from service.schemas import V1_MAX_TEXT_CHARS

logger = logging.getLogger("ray.serve")

REFUSALS = (TranslatorError, ExplanationNotFoundError)  # the client's fault: answered 4xx, not logged


async def _rejecting(call: Awaitable[Any]) -> Any:
    try:
        return await call
    except REFUSALS as error:
        return Rejected(error)


@dataclass
class FinishItem:
    """A decoded text on its way to its answer: aligned and assessed with the others of its batch."""

    translation: Translation
    options: DecodingOptions  # as decoded (the batch's: items are grouped by their options)
    attention: str  # "none" | "summary" | "full": only changes what is returned
    alignment_method: AlignmentMethod = DEFAULT_ALIGNMENT["translate"]  # AGREEMENT: realigned after the decode
    trust: str = "off"  # "fast" | "full": assessed after the decode (model.trust)


@serve.deployment  # replicas, max_ongoing_requests and resources: deploy/serve.yaml's `deployments`
class TranslatorDeployment:
    """Serves one model: translate (batched), fetch explanations, explain step by step.

    Each text of each request joins the replica's decode loop on its own (model.Translator.submit; the loop runs
    in its own thread, so the replica keeps accepting requests while it decodes), so a request's texts spread
    over batches and concurrent requests share them. `scheduler` is the loop's policy: "static" batches of up to
    max_batch_size texts join once the loop is empty (after up to batch_wait_timeout_s for company),
    "continuous" texts join at the next step, up to max_rows rows. The texts that come out of the loop meanwhile
    are aligned and assessed together, one batch per worker-thread call (service/batching.py).

    Its arguments are service.config.ServiceConfig's (build_app passes them on), which holds their defaults;
    reverse_spec: the served model translating the other way, loaded here too (float32, forced decodes only) for
    the "agreement" alignment, or None (the head's one-best is given, and the answer says why)."""

    def __init__(
        self,
        spec: dict,
        *,
        max_batch_size: int,
        batch_wait_timeout_s: float,
        explanation_secret_env: str,
        metrics_dir: str | None,
        scheduler: str,
        max_rows: int,
        reverse_spec: dict | None = None,
    ) -> None:
        self.spec = ModelSpec.model_validate(spec)
        self.metrics = service_metrics(metrics_dir)
        self.translator = Translator.from_pretrained(self.spec.expanded_path, dtype=self.spec.dtype)
        self.reverse: Translator | None = None
        self.no_reverse_note = (
            f"no model translating {self.spec.target_lang}→{self.spec.source_lang} is served: the head's one-best"
        )
        if reverse_spec is not None:
            reverse = ModelSpec.model_validate(reverse_spec)
            self.reverse = Translator.from_pretrained(reverse.expanded_path, device=self.translator.device)
        self._rows_task: asyncio.Task | None = None
        self.max_rows = max_rows
        self.translator.start_loop(
            scheduler,
            max_rows=max_rows,
            max_texts=max_batch_size if scheduler == "static" else None,
            gather_s=batch_wait_timeout_s,
            on_joined=self._batch_joined,
            on_done=self._batch_done,
        )
        self.secret = explanation_secret(explanation_secret_env)
        self.finishing: BatchQueue[FinishItem] = BatchQueue(self._finish_batch, max_batch_size, wait_s=0.0)
        config = self.translator.config
        deployment, replica = replica_identity()
        self.replica = replica
        self.metrics.model_info.labels(
            self.spec.id,
            self.spec.source_lang,
            self.spec.target_lang,
            self.translator.weights_digest,
            str(self.translator.device),
            replica,
        ).set(1)
        self.metrics.replica_info.labels(deployment, replica).set(1)
        runtime = self.translator.runtime_info
        self.metrics.runtime_info.labels(
            self.spec.id, runtime["runtime"], runtime["precision"], runtime["cpu"], replica
        ).set(1)
        self.info_json = {
            "id": self.spec.id,
            "source_lang": self.spec.source_lang,
            "target_lang": self.spec.target_lang,
            "weights_digest": self.translator.weights_digest,
            "device": str(self.translator.device),
            "precision": self.translator.precision,
            "explanation_precision": self.translator.explanation_precision,
            "steps_precision": self.translator.steps_precision,
            "runtime": runtime,
            "encoder_layers": config.encoder_layers,
            "decoder_layers": config.decoder_layers,
            "encoder_attention_heads": config.encoder_attention_heads,
            "decoder_attention_heads": config.decoder_attention_heads,
            "d_model": config.d_model,
            "alignment_layer": self.translator.alignment_layer,
            "alignment_head": self.translator.alignment_head[1],
            "alignment_shift": self.translator.alignment_shift,
            "alignment_source": self.translator.alignment.reason,
            "alignment_methods": ["agreement", "head"] if self.reverse is not None else ["head"],
            "trust": {**self.translator.trust_info, "full_available": self.reverse is not None},
            "max_source_tokens": config.max_position_embeddings,
            "max_text_characters": V1_MAX_TEXT_CHARS,  # /v1's limit
        }
        logger.info("translator %s loaded from %s on %s", self.spec.id, self.spec.path, self.translator.device)
        logger.info(
            "translator %s decodes with the %s runtime (%s): %s",
            self.spec.id,
            runtime["runtime"],
            runtime["precision"],
            runtime["reason"],
        )
        # what is loaded now lives as long as the replica: out of the collector's generations, so that a decode's
        # collections no longer walk the model and the imports (3 % of a 16-text int8 decode; docs/performance.md)
        gc.freeze()

    def info(self) -> dict[str, Any]:
        return self.info_json

    # ---- translate -----------------------------------------------------------------------
    async def translate(self, requests: list[TranslateCall]) -> list[list[TranslationRecord] | Rejected]:
        """Translate the requests the ingress coalesced into this call (POST /v1/translate).

        One outcome per request: its translations, or why it was refused. A request's failure
        never touches the others in the call.
        """
        outcomes = await asyncio.gather(*(self._translate(request) for request in requests), return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, BaseException) and not isinstance(outcome, Exception):
                raise outcome  # cancellation or shutdown: not one request's fault
            if isinstance(outcome, Exception) and not isinstance(outcome, REFUSALS):
                logger.error("translation request failed", exc_info=outcome)
        return [Rejected(o) if isinstance(o, Exception) else o for o in outcomes]

    async def _translate(self, call: TranslateCall) -> list[TranslationRecord]:
        """Each text joins the batch queue on its own, so one request's texts spread over the batch."""
        texts, options, attention, method = call.texts, call.options, call.attention, call.alignment_method
        trust = call.trust
        try:
            source_ids = self.translator.encode_source(texts)  # fails fast on a text longer than the model allows
        except InputTooLongError as error:
            raise InputTooLongError(
                f"{error}. A text is limited both to {call.max_text_chars} characters and to the model's "
                f"{self.translator.config.max_position_embeddings} tokens (max_source_tokens in GET /v1/models); "
                "split long texts into sentences"
            ) from None
        self._check_options(options)
        for ids in source_ids:
            self.metrics.source_length.labels(self.spec.id).observe(len(ids))
        decodes = [
            self._decode(text, ids, options, attention, method, trust)
            for text, ids in zip(texts, source_ids, strict=True)
        ]
        outcomes = await asyncio.gather(*decodes, return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
        if call.source_share:
            await asyncio.to_thread(self._add_source_shares, outcomes)
        return outcomes

    def _add_source_shares(self, translations: list[TranslationRecord]) -> None:
        """token_source_shares (ALTI+, and so source_share) on each translation and alternative, from the tokens
        its explanation id names; a blank text (no id, nothing decoded) gets [] (and a null source_share)."""
        for translation in translations:
            for hypothesis in [translation, *translation.alternatives]:
                shares: list[float] = []
                if hypothesis.explanation_id is not None:
                    key = decode_explanation_id(hypothesis.explanation_id, self.secret)
                    attributions = self.translator.attribute(list(key.source_ids), list(key.target_ids), "alti_plus")
                    shares = attributions.source_share.tolist()
                    self.metrics.forced_decodes.labels(self.spec.id, "source_share").inc()
                hypothesis.token_source_shares = shares

    async def translate_stream(self, call: TranslateCall) -> AsyncIterator[dict | Rejected]:
        """POST /v1/translate/stream of one text: {"type": "start"} once the text is accepted (or a Rejected
        instead), one {"type": "token"} per token as it is settled (greedy: as it is decoded; beam search: once
        every beam shares it), then {"type": "result", "translation": ...} as /v1/translate would give it. A
        consumer that goes away (the client disconnected) cancels the decode and frees its rows."""
        (text,) = call.texts
        options, attention = call.options, call.attention
        events: asyncio.Queue = asyncio.Queue()
        loop = asyncio.get_running_loop()

        def on_token(token: StreamedToken) -> None:
            event = {
                "type": "token",
                "index": token.index,
                "piece": token.piece,
                "token_id": token.token_id,
                "logprob": token.logprob,
                "attention": token.attention,
            }
            loop.call_soon_threadsafe(events.put_nowait, event)

        self._watch_rows()
        try:
            self._check_options(options)
            future = self.translator.submit(text, options, return_attention=attention != "none", on_token=on_token)
        except REFUSALS as error:
            yield Rejected(error)
            return
        future.add_done_callback(lambda _: loop.call_soon_threadsafe(events.put_nowait, None))
        yield {"type": "start", "model": self.spec.id, "streams_tokens": True}
        try:
            while (event := await events.get()) is not None:
                yield event
            translation = future.result()
        except (asyncio.CancelledError, GeneratorExit):
            self._cancel(future)
            raise
        item = FinishItem(translation, options, attention, call.alignment_method, call.trust)
        result = await self.finishing.submit(item, options)
        if call.source_share:
            await asyncio.to_thread(self._add_source_shares, [result])
        yield {"type": "result", "translation": result}

    def _check_options(self, options: DecodingOptions) -> None:
        limit = self.translator.config.max_position_embeddings
        if options.max_new_tokens is not None and options.max_new_tokens > limit:
            raise InputTooLongError(f"max_length must be at most {limit} for model {self.spec.id}")
        if options.min_new_tokens > limit:
            raise InputTooLongError(f"min_length must be at most {limit} for model {self.spec.id}")
        if options.beam_size > self.max_rows:
            raise InvalidInputError(
                f"beam_size must be at most {self.max_rows} for model {self.spec.id} (its decoder rows, max_rows)"
            )

    async def _decode(
        self, text: str, source_ids: list[int], options: DecodingOptions, attention: str, method: str, trust: str
    ) -> TranslationRecord:
        """One text (its ids, tokenized once by the caller) through the replica's decode loop, then aligned and
        assessed with the others that finished meanwhile; a caller that stops waiting frees its rows."""
        self._watch_rows()
        future = self.translator.submit(text, options, return_attention=attention != "none", source_ids=source_ids)
        try:
            translation = await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            self._cancel(future)
            raise
        return await self.finishing.submit(FinishItem(translation, options, attention, method, trust), options)

    async def _finish_batch(self, items: list[FinishItem], _waits: list[float]) -> list[TranslationRecord]:
        """The work after the decodes of texts with equal options, together (see BatchQueue): their alignments
        (the reverse model's forced decodes shared), their trust, their JSON."""

        def finish() -> list[Translation]:
            translations = self._aligned_all(
                [item.translation for item in items], [item.alignment_method for item in items]
            )
            self._assessed_all(translations, [item.trust for item in items], items[0].options)
            return translations

        translations = await asyncio.to_thread(finish)
        return [self._translation_record(t, item.attention) for t, item in zip(translations, items, strict=True)]

    def _batch_joined(self, batch: Batch, waits: list[float]) -> None:
        """A batch joined the decode loop (called from its thread)."""
        self.metrics.batch_size.labels(self.spec.id).observe(batch.size)
        for wait in waits:
            self.metrics.queue_wait.labels(self.spec.id).observe(wait)

    def _batch_done(self, batch: Batch) -> None:
        """A batch's last text left the decode loop (called from its thread)."""
        self.metrics.batch_duration.labels(self.spec.id).observe(time.monotonic() - batch.joined)

    def _assessed_all(self, translations: list[Translation], modes: list[str], options: DecodingOptions) -> None:
        """Set each translation's trust as its mode asks (model.trust): "full" ones share the reverse model's
        forced decodes (without a reverse model "full" is "fast", and the trust's `mode` says so)."""
        for mode in ("fast", "full"):
            chosen = [t for t, m in zip(translations, modes, strict=True) if m == mode]
            if chosen:
                self.translator.assess(chosen, mode, self.reverse, options)
                if mode == "full" and self.reverse is not None:
                    hypotheses = sum(1 + len(t.alternatives) for t in chosen if t.target_ids)
                    self.metrics.forced_decodes.labels(self.spec.id, "trust").inc(hypotheses)

    def _aligned_all(self, translations: list[Translation], methods: list[str]) -> list[Translation]:
        """Each translation with the alignment its `method` asks for: decodes share batches whatever their method,
        and "agreement" is computed afterwards for those that ask, the reverse model's forced decodes of all of
        them sharing batches (Translator.with_agreements)."""
        wanted = [i for i, method in enumerate(methods) if method == AlignmentMethod.AGREEMENT]
        if not wanted:
            return translations
        results = list(translations)
        if self.reverse is None:
            for i in wanted:
                results[i] = self._noted(translations[i])
            return results
        hypotheses = sum(1 + len(translations[i].alternatives) for i in wanted if translations[i].target_ids)
        self.metrics.forced_decodes.labels(self.spec.id, "agreement").inc(hypotheses)
        agreed = self.translator.with_agreements([translations[i] for i in wanted], self.reverse)
        for i, translation in zip(wanted, agreed, strict=True):
            results[i] = translation
        return results

    def _noted(self, translation: Translation) -> Translation:
        return replace(
            translation,
            alignment_note=self.no_reverse_note if translation.target_ids else None,
            alternatives=[self._noted(alternative) for alternative in translation.alternatives],
        )

    def _cancel(self, future) -> None:
        """The caller went away: stop the decode; counted when it was still running (compute saved)."""
        if not future.done():
            self.translator.cancel(future)
            self.metrics.cancelled_texts.labels(self.spec.id).inc()

    def _watch_rows(self) -> None:
        """Keep translation_decoder_rows current (every 0.2 s) once the loop has work."""
        if self._rows_task is None:
            self._rows_task = asyncio.get_running_loop().create_task(self._report_rows())

    async def _report_rows(self) -> None:
        gauge = self.metrics.decoder_rows.labels(self.spec.id, self.replica)
        while True:
            gauge.set(self.translator.decoder_rows)
            await asyncio.sleep(0.2)

    def _translation_record(self, translation: Translation, attention: str) -> TranslationRecord:
        self.metrics.texts.labels(self.spec.id, self.replica).inc()
        self.metrics.source_tokens.labels(self.spec.id).inc(len(translation.source_ids))
        self.metrics.target_tokens.labels(self.spec.id).inc(len(translation.target_ids))
        if translation.trust is not None:
            self.metrics.trust_score.labels(self.spec.id, translation.trust.mode).observe(translation.trust.score)
            for flag in translation.trust.flags:
                self.metrics.trust_flags.labels(self.spec.id, flag.kind).inc()
        head, shift = self.translator.alignment_head, self.translator.alignment_shift
        result = translation_record(translation, self._translation_id(translation), attention, head, shift)
        result.alternatives = [
            translation_record(alternative, self._translation_id(alternative), attention, head, shift)
            for alternative in translation.alternatives
        ]
        return result

    def _translation_id(self, translation: Translation) -> str | None:
        return self._explanation_id(translation.source_ids, translation.target_ids, translation.alignment_method)

    def _explanation_id(self, source_ids: list[int], target_ids: list[int], alignment_method: str) -> str | None:
        """The id of (source, target) with the alignment given: a fetch gives the same alignment."""
        if not source_ids:
            return None  # a blank text: nothing was decoded, nothing to explain
        key = ExplanationKey(
            self.spec.id, self.translator.weights_digest, tuple(source_ids), tuple(target_ids), alignment_method
        )
        return encode_explanation_id(key, self.secret)

    # ---- explanations --------------------------------------------------------------------
    async def explanation(
        self,
        weights_digest: str,
        source_ids: list[int],
        target_ids: list[int],
        alignment_method: AlignmentMethod = DEFAULT_ALIGNMENT["explanation"],
    ) -> dict | Rejected:
        """Recompute a translation's maps, and its alignment by `alignment_method`, by forced decoding
        (GET /v1/explanations/{id})."""
        return await _rejecting(self._explanation(weights_digest, source_ids, target_ids, alignment_method))

    async def _explanation(
        self, weights_digest: str, source_ids: list[int], target_ids: list[int], alignment_method: str
    ) -> dict:
        self._check_weights(weights_digest)
        return await asyncio.to_thread(
            self._forced_decode_json, list(source_ids), list(target_ids), "explanation", alignment_method
        )

    def _check_weights(self, weights_digest: str) -> None:
        if weights_digest != self.translator.weights_digest:
            raise ExplanationNotFoundError(
                f"this explanation was made with weights {weights_digest}; model {self.spec.id} now serves "
                f"{self.translator.weights_digest}"
            )

    def _forced_decode_json(self, source_ids: list[int], target_ids: list[int], kind: str, method: str) -> dict:
        """The explanation object with the alignment `method` asks for; with kind "explain" also the encoder
        self-attention."""
        reverse = self.reverse if method == AlignmentMethod.AGREEMENT else None
        explained = self.translator.explain(
            source_ids, target_ids, encoder_attention=kind == "explain", reverse=reverse
        )
        self.metrics.forced_decodes.labels(self.spec.id, kind).inc()
        if reverse is not None:
            self.metrics.forced_decodes.labels(self.spec.id, "agreement").inc()
        result = explanation_json(
            explained, self.spec.id, self._explanation_id(source_ids, target_ids, explained.alignment_method)
        )
        if method == AlignmentMethod.AGREEMENT and reverse is None:
            result["alignment_note"] = self.no_reverse_note
        return result

    async def explain(self, source: str, target: str | None, beam_size: int, view: ExplainView) -> dict | Rejected:
        """Forced decode of (source, target) plus one head's attention step by step (POST /v1/explain), and
        for a view's method other than attention that method's attributions. No target: the model's own
        translation at beam_size."""
        return await _rejecting(self._explain(source, target, beam_size, view))

    async def _explain(self, source: str, target: str | None, beam_size: int, view: ExplainView) -> dict:
        source_ids = self.translator.encode_source([source])[0]
        if target is None:  # the model's own translation: its ids straight from the decode (head alignment: cheap)
            options = DecodingOptions(beam_size=beam_size)
            (own,) = await asyncio.to_thread(self.translator.translate, [source], options)
            target_ids = list(own.target_ids)
        else:
            target_ids = self.translator.tokenizer.encode_target(target)
            limit = self.translator.config.max_position_embeddings
            if len(target_ids) > limit:
                raise InputTooLongError(f"target has {len(target_ids)} tokens; this model accepts at most {limit}")
        return await asyncio.to_thread(self._explain_json, source_ids, target_ids, view)

    async def explain_ids(
        self,
        weights_digest: str,
        source_ids: list[int],
        target_ids: list[int],
        view: ExplainView,
        alignment_method: AlignmentMethod = DEFAULT_ALIGNMENT["explanation"],
    ) -> dict | Rejected:
        """POST /v1/explain of an explanation id: exactly the tokens the model decoded, aligned as the id says
        unless the view asks for another method."""
        if view.alignment_method is None:
            view = replace(view, alignment_method=alignment_method)

        async def run() -> dict:
            self._check_weights(weights_digest)
            return await asyncio.to_thread(self._explain_json, list(source_ids), list(target_ids), view)

        return await _rejecting(run())

    def _explain_json(self, source_ids: list[int], target_ids: list[int], view: ExplainView) -> dict:
        attributions = None
        if view.method != "attention":  # first: a pair too long for attributions answers 413 before any other work
            attributions = self.translator.attribute(source_ids, target_ids, view.method, view.steps)
            self.metrics.forced_decodes.labels(self.spec.id, view.method).inc()
        method = view.alignment_method or DEFAULT_ALIGNMENT["explain"]
        result = self._forced_decode_json(source_ids, target_ids, "explain", method)
        steps = self.translator.attention_steps(source_ids, target_ids, view.kind, view.layer, view.head, view.position)
        result["steps"] = steps_json(steps)
        if attributions is not None:
            result["attributions"] = attributions_json(attributions)
        return result
