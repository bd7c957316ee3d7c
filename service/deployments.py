"""The translator deployment, one per model: its texts share the replica's one decode loop (the engine's scheduler,
continuous or static); the work after their decodes is done per batch (service/finishing.py), explanations by
forced decoding (service/explaining.py), over what the replica serves with (service/served.py).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import AsyncIterator, Awaitable
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
    Translator,
    TranslatorError,
)
from service.config import ModelSpec, explanation_secret
from service.explaining import Explaining
from service.explanations import ExplanationNotFoundError
from service.finishing import Finisher, FinishItem
from service.messages import ExplainView, Rejected, TranslateCall
from service.metrics import replica_identity, service_metrics
from service.records import TranslationRecord
from service.served import Served

logger = logging.getLogger("ray.serve")

REFUSALS = (TranslatorError, ExplanationNotFoundError)  # the client's fault: answered 4xx, not logged


async def _rejecting(call: Awaitable[Any]) -> Any:
    try:
        return await call
    except REFUSALS as error:
        return Rejected(error)


@serve.deployment  # replicas, max_ongoing_requests and resources: deploy/serve.yaml's `deployments`
class TranslatorDeployment:
    """Serves one model: translate (batched), fetch explanations, explain step by step.

    A request's texts are handed to the replica's decode loop as they come (model.Translator.submit_all; the loop
    runs in its own thread, so the replica keeps accepting requests while it decodes), whose admission is the one
    place texts are batched: concurrent requests share its steps. `scheduler` is the loop's policy: "static"
    batches of up to max_batch_size texts join once the loop is empty (after up to batch_wait_timeout_s for
    company), "continuous" texts join at the next step, up to max_rows rows. Whatever has come out of the loop
    meanwhile is aligned and assessed together, one worker-thread call at a time (service.finishing).

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
        self.spec = spec = ModelSpec.model_validate(spec)
        self.metrics = metrics = service_metrics(metrics_dir)
        self.translator = translator = Translator.from_pretrained(spec.expanded_path, dtype=spec.dtype)
        reverse = None
        if reverse_spec is not None:
            reverse_path = ModelSpec.model_validate(reverse_spec).expanded_path
            reverse = Translator.from_pretrained(reverse_path, device=translator.device)
        deployment, self.replica = replica_identity()
        self.served = Served(spec, translator, reverse, metrics, explanation_secret(explanation_secret_env),
                             self.replica)
        self._rows_task: asyncio.Task | None = None
        self.max_rows = max_rows
        translator.start_loop(
            scheduler,
            max_rows=max_rows,
            max_texts=max_batch_size if scheduler == "static" else None,
            gather_s=batch_wait_timeout_s,
            on_joined=self._batch_joined,
            on_done=self._batch_done,
        )
        self.finisher = Finisher(self.served, max_batch_size)
        self.explaining = Explaining(self.served)
        device, runtime = str(translator.device), translator.runtime_info
        metrics.model_info.labels(
            spec.id, spec.source_lang, spec.target_lang, translator.weights_digest, device, self.replica
        ).set(1)
        metrics.replica_info.labels(deployment, self.replica).set(1)
        metrics.runtime_info.labels(
            spec.id, runtime["runtime"], runtime["precision"], runtime["cpu"], self.replica
        ).set(1)
        self.info_json = self.served.info()
        logger.info("translator %s loaded from %s on %s", spec.id, spec.path, device)
        logger.info(
            "translator %s decodes with the %s runtime (%s): %s",
            spec.id, runtime["runtime"], runtime["precision"], runtime["reason"],
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
        """The request's texts join the decode loop together (at one step, while its rows allow), and each leaves
        it as it finishes."""
        try:
            source_ids = self.translator.encode_source(call.texts)  # fails fast on a text longer than allowed
        except InputTooLongError as error:
            raise InputTooLongError(
                f"{error}. A text is limited both to {call.max_text_chars} characters and to the model's "
                f"{self.translator.config.max_position_embeddings} tokens (max_source_tokens in GET /v1/models); "
                "split long texts into sentences"
            ) from None
        self._check_options(call.options)
        for ids in source_ids:
            self.metrics.source_length.labels(self.spec.id).observe(len(ids))
        self._watch_rows()
        searched = [self._terms(call.options, wanted) for wanted in call.terms or [[] for _ in call.texts]]
        futures = self.translator.submit_all(
            call.texts, call.options, return_attention=call.attention != "none", source_ids=source_ids,
            terms=[terms for terms, _ in searched],
        )
        decodes = [self._finished(future, call, note) for future, (_, note) in zip(futures, searched, strict=True)]
        outcomes = await asyncio.gather(*decodes, return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
        if call.source_share:
            await asyncio.to_thread(self.finisher.add_source_shares, outcomes)
        return outcomes

    async def translate_stream(self, call: TranslateCall) -> AsyncIterator[dict | Rejected]:
        """POST /v1/translate/stream of one text: {"type": "start"} once the text is accepted (or a Rejected
        instead), one {"type": "token"} per token as it is settled (greedy: as it is decoded; beam search: once
        every beam shares it), then {"type": "result", "translation": ...} as /v1/translate would give it. A
        consumer that goes away (the client disconnected) cancels the decode and frees its rows."""
        (text,) = call.texts
        options, attention = call.options, call.attention
        terms, note = self._terms(options, (call.terms or [[]])[0])
        events: asyncio.Queue = asyncio.Queue()
        loop = asyncio.get_running_loop()

        def on_token(token: StreamedToken) -> None:
            event = {"type": "token", "index": token.index, "piece": token.piece, "token_id": token.token_id,
                     "logprob": token.logprob, "attention": token.attention}
            loop.call_soon_threadsafe(events.put_nowait, event)

        self._watch_rows()
        try:
            self._check_options(options)
            future = self.translator.submit(
                text, options, return_attention=attention != "none", on_token=on_token, terms=terms
            )
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
        translation.search_note = note or translation.search_note
        result = await self.finisher.submit(
            FinishItem(translation, options, attention, call.alignment_method, call.trust)
        )
        if call.source_share:
            await asyncio.to_thread(self.finisher.add_source_shares, [result])
        yield {"type": "result", "translation": result}

    def _terms(self, options: DecodingOptions, terms: list[str]) -> tuple[list[str], str | None]:
        """The terms this replica's search enforces, and what its answer says when it cannot enforce them (how the
        search widened its beam for them, the translator says itself)."""
        if not terms:
            return [], None
        if not self.translator.constrains:
            return [], ("glossary terms not enforced: this machine's decoding runtime could not be built (no C++ "
                        "compiler), and the fallback search takes no constraints")
        return terms, None

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

    async def _finished(self, future, call: TranslateCall, note: str | None) -> TranslationRecord:
        """One text's decode (`future`, from the replica's decode loop), then aligned and assessed with whatever
        finished meanwhile; a caller that stops waiting frees its rows."""
        try:
            translation = await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            self._cancel(future)
            raise
        translation.search_note = note or translation.search_note
        return await self.finisher.submit(
            FinishItem(translation, call.options, call.attention, call.alignment_method, call.trust)
        )

    def _batch_joined(self, batch: Batch, waits: list[float]) -> None:
        """A batch joined the decode loop (called from its thread)."""
        self.metrics.batch_size.labels(self.spec.id).observe(batch.size)
        for wait in waits:
            self.metrics.queue_wait.labels(self.spec.id).observe(wait)

    def _batch_done(self, batch: Batch) -> None:
        """A batch's last text left the decode loop (called from its thread)."""
        self.metrics.batch_duration.labels(self.spec.id).observe(time.monotonic() - batch.joined)

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

    # ---- explanations (service/explaining.py) --------------------------------------------
    async def explanation(
        self,
        weights_digest: str,
        source_ids: list[int],
        target_ids: list[int],
        alignment_method: AlignmentMethod = DEFAULT_ALIGNMENT["explanation"],
    ) -> dict | Rejected:
        """Recompute a translation's maps, and its alignment by `alignment_method`, by forced decoding
        (GET /v1/explanations/{id})."""

        async def run() -> dict:
            self.explaining.check_weights(weights_digest)
            return await asyncio.to_thread(
                self.explaining.forced_decode_json, list(source_ids), list(target_ids), "explanation",
                alignment_method,
            )

        return await _rejecting(run())

    async def explain(self, source: str, target: str | None, beam_size: int, view: ExplainView) -> dict | Rejected:
        """Forced decode of (source, target) plus one head's attention step by step (POST /v1/explain), and
        for a view's method other than attention that method's attributions. No target: the model's own
        translation at beam_size."""

        async def run() -> dict:
            pair = await asyncio.to_thread(self.explaining.pair_ids, source, target, beam_size)
            return await asyncio.to_thread(self.explaining.explain_json, *pair, view)

        return await _rejecting(run())

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

        async def run() -> dict:
            self.explaining.check_weights(weights_digest)
            return await asyncio.to_thread(
                self.explaining.explain_json, list(source_ids), list(target_ids), view, alignment_method
            )

        return await _rejecting(run())
