"""The HTTP ingress: FastAPI routes of REST v1 in front of one translator deployment per model (or of the models
loaded in-process, the colocated layout), and the one place that mounts the LibreTranslate and DeepL routes
(service/compat/). `build_app(args)` is the application builder deploy/serve.yaml names
(`import_path: service.app:build_app`).
"""

import asyncio
import gc
import json
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from functools import partial
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.staticfiles import StaticFiles
from ray import serve
from ray.serve.handle import DeploymentHandle, DeploymentResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import FileResponse, Response, StreamingResponse

from service.coalescing import Coalescer
from service.compat import deepl_documents, deepl_glossaries, deepl_v2, libretranslate
from service.compat.backend import LanguagePair, TranslationBackend
from service.compat.deepl_glossaries import stored
from service.config import (
    ModelSpec,
    ServiceConfig,
    explanation_secret,
    translator_arguments,
    translator_deployment_name,
)
from service.docs import add_offline_docs
from service.documents.jobs import DocumentJobs, worker_name
from service.documents.worker import DocumentWorker
from service.errors import (
    InvalidRequestError,
    ModelNotServedError,
    NotReadyError,
    OverloadedError,
    RequestTimeoutError,
    RouteNotFoundError,
    ServiceError,
    describe,
    exception_response,
    json_response,
    replica_lost,
    route_family,
)
from service.explanations import ExplanationKey, ExplanationNotFoundError, decode_explanation_id
from service.glossaries import Glossaries, checked_entries, owner_of
from service.messages import ExplainView, Rejected, TranslateCall
from service.metrics import (
    MULTIPROCESS_ENV,
    PROMETHEUS_CONTENT_TYPE,
    node_address,
    render_metrics,
    replica_identity,
    serve_node_metrics,
    service_metrics,
)
from service.middleware import ServiceMiddleware, presented_key, route_path
from service.records import TranslationRecord
from service.schemas import (
    ErrorResponse,
    ExplainRequest,
    ExplainResponse,
    ExplanationResponse,
    HealthResponse,
    ModelsResponse,
    ReadyResponse,
    TranslateRequest,
    TranslateResponse,
)
from service.store import Store
from service.text.protected import Protected, model_protections, protect, restore
from service.text.split_texts import assemble, model_texts, plan_texts

logger = logging.getLogger("ray.serve")

STATIC_DIR = Path(__file__).resolve().parent / "static"
INFO_CACHE_S = 10.0


def server_sent_event(event: dict) -> bytes:
    """One SSE message: `event: <type>` and the event as one line of JSON."""
    return f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n".encode()


def protect_texts(body: TranslateRequest, spec: ModelSpec, terms: tuple) -> list[Protected] | None:
    """Each text with its placeholders, URLs and numbers (unless protect is false) and its glossary terms behind
    stand-ins; None when there is nothing to protect."""
    if not body.protect and not terms:
        return None
    return [protect(text, spec.source_lang, spec.target_lang, terms, body.protect) for text in body.texts]


ERRORS = {status: {"model": ErrorResponse} for status in (400, 401, 404, 413, 422, 503, 504)}

# serve.ingress serializes the routes when the class is decorated: every helper they use is
# defined above the class, and annotations are real objects (no `from __future__ import annotations`),
# so FastAPI can still see the pydantic request models.
api = FastAPI(
    title="attention-translate",
    version="1.0.0",
    description="Translation whose answers explain themselves: every translation carries the attention that "
    "produced it, fetchable later by explanation id, and one head's arithmetic can be opened step by step.",
    docs_url=None,  # /docs and /redoc come from service/docs.py, their scripts served locally, not from a CDN
    redoc_url=None,
)
api.add_middleware(ServiceMiddleware)
add_offline_docs(api)  # before /static: its assets live below /static/swagger-ui
api.mount("/static", StaticFiles(directory=STATIC_DIR, check_dir=False), name="static")


def translation_backend(request: Request) -> TranslationBackend:
    """The Ingress serving `request` (Ingress.__init__ puts it in the app's state), as the compatibility routes
    see it."""
    return request.app.state.ingress


api.include_router(libretranslate.router(translation_backend))  # LibreTranslate's API: /translate, /detect, ...
api.include_router(deepl_glossaries.router(translation_backend))  # DeepL's v2 glossaries
api.include_router(deepl_documents.router(translation_backend))  # DeepL's v2 documents
api.include_router(deepl_v2.router(translation_backend))  # DeepL's v2 shape: /v2/translate, /v2/languages, /v2/usage


@api.exception_handler(RequestValidationError)
@api.exception_handler(StarletteHTTPException)
@api.exception_handler(ServiceError)
async def _handle_error(request: Request, error: Exception) -> Response:
    family = route_family(route_path(request.scope))
    return exception_response(error, request.app.state.ingress.config.retry_after_s, family)


@serve.deployment  # replicas, max_ongoing_requests and resources: deploy/serve.yaml's `deployments`
@serve.ingress(api)
class Ingress:
    """Routes, model selection, backpressure and timeouts; the models run in the translator deployments (or, in
    the colocated layout, in this replica, `translators` None).

    It is also the TranslationBackend of the compatibility routes (service/compat/backend.py)."""

    def __init__(self, config: dict, translators: dict[str, DeploymentHandle] | None) -> None:
        self.config = ServiceConfig.model_validate(config)
        if translators is None:  # the colocated layout: the models load here (service/colocated.py)
            from service.colocated import colocated_translators

            translators = colocated_translators(translator_arguments(self.config))
        self.metrics = service_metrics(self.config.metrics_dir)
        self.metrics_dir = os.environ[MULTIPROCESS_ENV]
        if self.config.node_metrics_port:  # this node's own scrape target (a multi-node cluster)
            serve_node_metrics(self.metrics_dir, node_address(), self.config.node_metrics_port)
        self.api_keys = self.config.resolved_api_keys()
        self.secret = explanation_secret(self.config.explanation_secret_env)
        self.specs: dict[str, ModelSpec] = {spec.id: spec for spec in self.config.models}
        self.translators = translators
        # One coalescer per model: concurrent translate requests share translator calls (service/coalescing.py).
        self.coalescers = {
            model: Coalescer(
                partial(self._send_translations, model),
                size=lambda call: len(call.texts),
                # continuous decoding takes every request at once: holding calls back would make a short
                # request wait behind a long one, which is what the scheduler exists to prevent; an in-process
                # call costs nothing to share, and the decode loop's admission batches them anyway
                max_calls=0 if self.config.scheduler == "continuous" or self.config.layout == "colocated"
                else self.config.coalesce_max_calls,
                max_items=self.config.max_batch_size,
            )
            for model in translators
        }
        store = Store(self.config.resolved_store_url())
        self._glossaries = Glossaries(store)
        documents = self.config.documents
        self._documents = DocumentJobs(
            store, documents.queue, retention_s=documents.retention_s, lease_s=documents.lease_s,
            max_attempts=documents.max_attempts, max_file_bytes=documents.max_file_bytes,
            max_characters=documents.max_characters,
        )
        self._document_worker = DocumentWorker(
            self._documents, self, worker_name(), documents.workers_per_replica, documents.poll_s,
        )
        if documents.workers_per_replica:  # the constructor runs on the replica's event loop
            self._worker_task = asyncio.get_running_loop().create_task(self._document_worker.run())
        self.in_flight = 0
        self._info: list[dict] | None = None
        self._info_at = 0.0
        self.metrics.replica_info.labels(*replica_identity()).set(1)
        api.state.ingress = self
        gc.freeze()  # the imports and the app, loaded for the replica's life, out of the collector's generations

    # ---- model calls -------------------------------------------------------------------
    def pick_model(self, model: str | None, source_lang: str | None, target_lang: str | None) -> str:
        available = ", ".join(f"{s.id} ({s.source_lang}→{s.target_lang})" for s in self.specs.values())
        if model is not None:
            spec = self.specs.get(model)
            if spec is None:
                raise ModelNotServedError(f"no model {model!r}; available: {available}")
            if (source_lang and source_lang != spec.source_lang) or (target_lang and target_lang != spec.target_lang):
                raise InvalidRequestError(f"model {model} translates {spec.source_lang}→{spec.target_lang}")
            return model
        if source_lang is None and target_lang is None and len(self.specs) == 1:
            return next(iter(self.specs))
        if source_lang is None or target_lang is None:
            raise InvalidRequestError("give either model, or both source_lang and target_lang")
        for spec in self.specs.values():
            if spec.source_lang == source_lang and spec.target_lang == target_lang:
                return spec.id
        raise ModelNotServedError(f"no model translates {source_lang}→{target_lang}; available: {available}")

    async def call(self, start: Callable[[], Any], limited: bool = True) -> Any:
        """Run start() (a translator call, or a coalesced request) within the in-flight limit and the timeout.

        A call whose replica was lost (killed, its node gone) is started once more, on whichever replica the
        router picks, within the same timeout; a second loss answers 503 (service/errors.py). limited=False:
        a call that costs the model nothing (its info) is neither refused at the limit nor counted in it."""
        if limited and self.in_flight >= self.config.max_in_flight_requests:
            raise OverloadedError(self.config.retry_after_s)
        self.in_flight += int(limited)
        deadline = time.monotonic() + self.config.request_timeout_s
        try:
            for attempt in (1, 2):
                work = start()
                try:
                    result = await asyncio.wait_for(work, max(0.0, deadline - time.monotonic()))
                    break
                except asyncio.TimeoutError:
                    if isinstance(work, DeploymentResponse):
                        work.cancel()  # a coalesced request is given up by cancelling its wait (service/coalescing.py)
                    raise RequestTimeoutError(self.config.request_timeout_s) from None
                except Exception as error:
                    if attempt == 2 or not replica_lost(error):
                        raise
                    self.metrics.replica_retries.inc()
                    logger.warning("a replica was lost during a call (%s); sending it again", type(error).__name__)
        finally:
            self.in_flight -= int(limited)
        if isinstance(result, Rejected):
            raise result.error  # mapped to its status in service/errors.py like any other error
        return result

    async def translate_call(self, model: str, call: TranslateCall) -> list[TranslationRecord]:
        """One translation per text of `call`, through the model's coalescer, within the in-flight limit and timeout."""
        return await self.call(partial(self.coalescers[model].submit, call))

    def _send_translations(self, model: str, requests: list) -> DeploymentResponse:
        self.metrics.call_requests.labels(model).observe(len(requests))
        return self.translators[model].translate.remote(requests)

    async def model_infos(self) -> list[dict]:
        if self._info is None or time.monotonic() - self._info_at > INFO_CACHE_S:
            handles = [self.translators[model] for model in self.specs]
            # not held back by the in-flight limit: a service at capacity is still ready (a readiness probe
            # failing under load would take the replica out of rotation and pile its work on the others)
            self._info = list(await asyncio.gather(*(self.call(h.info.remote, limited=False) for h in handles)))
            self._info_at = time.monotonic()
        return self._info

    # ---- the compatibility routes' view (TranslationBackend) ----------------------------------
    def language_pairs(self) -> list[LanguagePair]:
        return [LanguagePair(spec.id, spec.source_lang, spec.target_lang) for spec in self.specs.values()]

    @property
    def keys_required(self) -> bool:
        return bool(self.api_keys)

    @property
    def request_timeout_s(self) -> float:
        return self.config.request_timeout_s

    @property
    def glossaries(self) -> Glossaries:
        return self._glossaries

    @property
    def documents(self) -> DocumentJobs:
        return self._documents

    def wake_documents(self) -> None:
        self._document_worker.wake()

    def owner(self, request: Request) -> str:
        return owner_of(presented_key(dict(request.scope["headers"]))) if self.api_keys else ""

    async def terms(self, body: TranslateRequest, spec: ModelSpec, request: Request) -> tuple[tuple[str, str], ...]:
        """The glossary a /v1 request names: inline, or stored (its language pair must be the model's)."""
        if body.glossary is not None:
            return checked_entries(list(body.glossary.items()))
        if body.glossary_id is None:
            return ()
        owner = self.owner(request)
        glossary = await stored(lambda: self._glossaries.get(owner, body.glossary_id))
        if (glossary.source_lang, glossary.target_lang) != (spec.source_lang, spec.target_lang):
            raise InvalidRequestError(
                f"glossary {body.glossary_id} is {glossary.source_lang}→{glossary.target_lang}, "
                f"model {spec.id} translates {spec.source_lang}→{spec.target_lang}"
            )
        return glossary.entries

    def explanation_key(self, explanation_id: str) -> ExplanationKey:
        """Verify an explanation id and check that its model is served here."""
        key = decode_explanation_id(explanation_id, self.secret)
        if key.model_id not in self.specs:
            raise ExplanationNotFoundError(f"model {key.model_id!r} of this explanation is not served")
        return key

    # ---- routes ------------------------------------------------------------------------
    @api.post("/v1/translate", response_model=TranslateResponse, responses=ERRORS, summary="Translate texts")
    async def translate(self, body: TranslateRequest, request: Request) -> Response:
        model = self.pick_model(body.model, body.source_lang, body.target_lang)
        spec = self.specs[model]
        protections = protect_texts(body, spec, await self.terms(body, spec, request))
        inputs = [protected.text for protected in protections] if protections else body.texts
        plans = plan_texts(inputs, spec.source_lang, body.split_sentences)
        texts = model_texts(inputs, plans)
        parts = model_protections(protections, plans) if protections else None
        call = TranslateCall(
            texts=texts,
            options=body.decoding_options(),
            attention=body.attention,
            source_share=body.source_share,
            alignment_method=body.alignment_method,
            trust=body.trust,
            terms=[part.term_targets for part in parts] if parts else None,
        )
        outcomes = await self.translate_call(model, call)
        if parts:
            outcomes = [restore(part, outcome, spec.target_lang) for part, outcome in zip(parts, outcomes, strict=True)]
        translations = assemble(outcomes, plans, spec.target_lang)
        return json_response({"model": model, "translations": [translation.json() for translation in translations]})

    @api.post(
        "/v1/translate/stream",
        responses={**ERRORS, 200: {"content": {"text/event-stream": {}}}},
        summary="Translate one text, streamed as Server-Sent Events",
    )
    async def translate_stream(self, body: TranslateRequest, request: Request) -> Response:
        """One text, split into sentences as /v1/translate splits it and decoded one sentence after another.
        Events: `start` ({model, streams_tokens, sentences}); one `token` per settled token ({sentence, index, piece,
        token_id, logprob, attention: the alignment head's weights over the source tokens at the step that
        predicted it}): under greedy decoding as each is decoded, under beam search once every beam still running
        shares it, so no token is ever taken back; after
        each sentence of a text of several, `sentence` ({sentence, translation}); then `result` ({translation}:
        the object /v1/translate returns for the text), or `error` ({error: {code, message}}) if a model call
        failed after the first event (before it, the answer is the usual JSON error). A client that disconnects
        stops the decode."""
        if len(body.texts) != 1:
            raise InvalidRequestError(f"stream one text per request, not {len(body.texts)}")
        model = self.pick_model(body.model, body.source_lang, body.target_lang)
        spec = self.specs[model]
        protections = protect_texts(body, spec, await self.terms(body, spec, request))  # as /v1/translate does
        inputs = [protected.text for protected in protections] if protections else body.texts
        plans = plan_texts(inputs, spec.source_lang, body.split_sentences)
        sentences = model_texts(inputs, plans)
        parts = model_protections(protections, plans) if protections else None
        handle = self.translators[model].options(stream=True)

        options = body.decoding_options()

        def first_event(index: int) -> Callable[[], Any]:
            call = TranslateCall(
                texts=[sentences[index]],
                options=options,
                attention=body.attention,
                source_share=body.source_share,
                alignment_method=body.alignment_method,
                trust=body.trust,
                terms=[parts[index].term_targets] if parts is not None else None,
            )

            async def start() -> tuple[Any, Any]:
                stream = handle.translate_stream.remote(call)
                try:
                    return await stream.__anext__(), stream
                except BaseException:  # timed out, or its replica lost: self.call gives up or starts it again
                    stream.cancel()
                    raise

            return start

        first, stream = await self.call(first_event(0))  # nothing sent yet: safe to retry
        if isinstance(first, Rejected):
            raise first.error

        async def events() -> AsyncIterator[bytes]:
            self.in_flight += 1
            current = stream
            try:
                yield server_sent_event({**first, "sentences": len(sentences)})
                outcomes = []
                try:
                    for index in range(len(sentences)):
                        if index:  # admitted already: not refused at the in-flight limit halfway through
                            opened, current = await self.call(first_event(index), limited=False)
                            if isinstance(opened, Rejected):
                                raise opened.error
                        async for event in current:
                            if event["type"] == "token":
                                yield server_sent_event({**event, "sentence": index})
                            elif event["type"] == "result":
                                outcome = event["translation"]
                                if parts is not None:
                                    outcome = restore(parts[index], outcome, spec.target_lang)
                                outcomes.append(outcome)
                                if len(sentences) > 1:
                                    yield server_sent_event(
                                        {"type": "sentence", "sentence": index, "translation": outcome.json()}
                                    )
                    (translation,) = assemble(outcomes, plans, spec.target_lang)
                    yield server_sent_event({"type": "result", "translation": translation.json()})
                except Exception as error:  # the answer has begun (200): the failure is its last event
                    _, code, message, _ = describe(error, self.config.retry_after_s)
                    yield server_sent_event({"type": "error", "error": {"code": code, "message": message}})
            finally:
                self.in_flight -= 1
                current.cancel()  # a client gone mid-stream: the translator stops decoding

        return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    @api.get(
        "/v1/explanations/{explanation_id}",
        response_model=ExplanationResponse,
        responses=ERRORS,
        summary="Fetch the attention maps of a translation by its explanation id",
    )
    async def explanation(self, explanation_id: str) -> Response:
        key = self.explanation_key(explanation_id)
        handle = self.translators[key.model_id]
        fetch = partial(
            handle.explanation.remote, key.weights_digest, key.source_ids, key.target_ids, key.alignment_method
        )
        return json_response(await self.call(fetch))

    @api.post("/v1/explain", response_model=ExplainResponse, responses=ERRORS, summary="Explain one head step by step")
    async def explain(self, body: ExplainRequest) -> Response:
        view = ExplainView(
            body.kind, body.layer, body.head, body.position, body.method, body.steps, body.alignment_method
        )
        if body.explanation_id is not None:
            key = self.explanation_key(body.explanation_id)
            handle = self.translators[key.model_id]
            call = partial(
                handle.explain_ids.remote, key.weights_digest, key.source_ids, key.target_ids, view,
                key.alignment_method,
            )  # fmt: skip
        else:
            handle = self.translators[self.pick_model(body.model, body.source_lang, body.target_lang)]
            call = partial(handle.explain.remote, body.source, body.target, body.beam_size, view)
        return json_response(await self.call(call))

    @api.get("/v1/models", response_model=ModelsResponse, responses=ERRORS, summary="Served models")
    async def models(self) -> Response:
        return json_response({"models": await self.model_infos()})

    @api.get("/healthz", response_model=HealthResponse, summary="Liveness")
    async def healthz(self) -> Response:
        return json_response({"status": "ok"})

    @api.get("/readyz", response_model=ReadyResponse, responses=ERRORS, summary="Readiness: every model loaded")
    async def readyz(self) -> Response:
        try:
            infos = await self.model_infos()
        except Exception:
            raise NotReadyError(retry_after_s=5) from None
        return json_response({"status": "ready", "models": [info["id"] for info in infos]})

    @api.get("/metrics", summary="Prometheus metrics of every replica on this node", response_class=Response)
    async def metrics(self) -> Response:
        body = await asyncio.to_thread(render_metrics, self.metrics_dir)
        return Response(body, media_type=PROMETHEUS_CONTENT_TYPE)

    @api.get("/", include_in_schema=False)
    async def viewer(self) -> Response:
        index = STATIC_DIR / "index.html"
        if not index.is_file():
            raise RouteNotFoundError("the viewer is not installed")
        return FileResponse(index, media_type="text/html")


def build_app(args: dict[str, Any] | None = None) -> serve.Application:
    """The Ray Serve application: the ingress plus, in the per_model layout, one translator deployment per
    configured model; in the colocated layout the ingress loads the models itself."""
    config = ServiceConfig.model_validate(args or {})
    if config.layout == "colocated":
        return Ingress.bind(config.model_dump(), None)
    # here, not at the top: the ingress's replicas import this module, and the translator's imports torch
    from service.deployments import TranslatorDeployment

    translators = {
        model: TranslatorDeployment.options(name=translator_deployment_name(model)).bind(**arguments)
        for model, arguments in translator_arguments(config).items()
    }
    return Ingress.bind(config.model_dump(), translators)
