// This service's REST API as the viewer calls it: one fetch wrapper (API key, error messages), the calls
// themselves, the request limits the server states, and a guard that lets only a panel's newest request render.

import { t } from "./i18n.js";

let onUnauthorizedHandler = () => {};

/** Called on every 401: this deployment wants an API key. */
export function onUnauthorized(handler) {
  onUnauthorizedHandler = handler;
}

function send(path, { method = "GET", body, signal, accept = "application/json" } = {}) {
  const headers = { Accept: accept };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const key = sessionStorage.getItem("api-key");
  if (key) headers.Authorization = `Bearer ${key}`;
  return fetch(path, { method, headers, signal, body: body === undefined ? undefined : JSON.stringify(body) });
}

async function jsonOf(response) {
  try {
    return await response.json();
  } catch {
    return null;
  }
}

/** The message of a failed answer: the service's {"error": {message}}, else the HTTP status. */
function failure(response, payload) {
  const detail = payload?.error?.message ?? (typeof payload?.detail === "string" ? payload.detail : null);
  return new Error(detail || `HTTP ${response.status}`);
}

async function call(path, options = {}) {
  const response = await send(path, options);
  if (response.status === 401) onUnauthorizedHandler();
  const payload = await jsonOf(response);
  if (!response.ok) throw failure(response, payload);
  return payload;
}

/** GET /v1/models: the served models with their shapes, alignment layer and head, and limits. */
export async function fetchModels(signal) {
  const body = await call("v1/models", { signal });
  return Array.isArray(body) ? body : body.models ?? body.data ?? [];
}

/** POST /v1/translate. */
export function translate(request, signal) {
  return call("v1/translate", { method: "POST", body: request, signal });
}

/**
 * POST /v1/translate/stream (one text): calls `onEvent` with each Server-Sent Event as it arrives ("start",
 * "token"s, "result") and resolves with the result's translation. fetch, not EventSource: the request is a
 * POST. Errors before the stream starts are the usual JSON answers and reject like every other call.
 */
export async function translateStream(request, signal, onEvent = () => {}) {
  const response = await send("v1/translate/stream", { method: "POST", body: request, signal, accept: "text/event-stream" });
  if (response.status === 401) onUnauthorizedHandler();
  if (!response.ok) throw failure(response, await jsonOf(response));
  let translation = null;
  for await (const event of serverSentEvents(response.body, signal)) {
    onEvent(event);
    if (event.type === "result") translation = event.translation;
  }
  // The decode failed after the stream began (its status was already sent): the connection just ends.
  if (!translation) throw new Error(t("stream_unfinished"));
  return translation;
}

/** The events of an SSE body, each its `data:` line parsed as JSON (the service sends one JSON line each). */
async function* serverSentEvents(body, signal) {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      buffer += decoder.decode(value ?? new Uint8Array(), { stream: !done });
      // Messages end at a blank line; a chunk may end mid-message, so the tail waits for the next one.
      const messages = buffer.replaceAll("\r\n", "\n").split("\n\n");
      buffer = done ? "" : messages.pop();
      for (const message of messages) {
        const data = message.split("\n").filter((line) => line.startsWith("data:")).map((line) => line.slice(5).trimStart());
        if (data.length) yield JSON.parse(data.join("\n"));
      }
      if (done) return;
    }
  } finally {
    // A newer request (or a consumer that stopped reading) closes the connection: the service stops decoding.
    if (!signal?.aborted) reader.cancel().catch(() => {});
  }
}

/** GET /v1/explanations/{id}: the attention maps of one translation. */
export function fetchExplanation(explanationId, signal) {
  return call(`v1/explanations/${encodeURIComponent(explanationId)}`, { signal });
}

/** POST /v1/explain: one head's arithmetic, step by step. */
export function explain(request, signal) {
  return call("v1/explain", { method: "POST", body: request, signal });
}

/** The JSON schema of POST /v1/translate's body, read from /openapi.json (references resolved one level). */
async function translateRequestSchema() {
  const openapi = await call("openapi.json");
  const resolve = (schema) => {
    const ref = schema?.$ref;
    if (!ref?.startsWith("#/")) return schema;
    return ref.slice(2).split("/").reduce((node, name) => node?.[name], openapi);
  };
  return resolve(openapi.paths?.["/v1/translate"]?.post?.requestBody?.content?.["application/json"]?.schema) ?? {};
}

/**
 * What POST /v1/translate accepts, as its schema in /openapi.json states it (never copied here): the beam
 * size and n-best ranges and the longest text. A limit the server does not state is undefined.
 */
export async function fetchTranslateLimits() {
  const schema = await translateRequestSchema();
  const field = (name) => schema.properties?.[name] ?? {};
  return {
    beamSize: { min: field("beam_size").minimum, max: field("beam_size").maximum },
    nBest: { min: field("n_best").minimum, max: field("n_best").maximum },
    textChars: field("texts").items?.maxLength,
  };
}

/**
 * One panel's requests: starting one aborts the one before, and only the newest may render, so a slow
 * answer never replaces a newer one on screen. `begin()` returns {signal, current(), done()}; call done()
 * when the request has settled.
 */
export class LatestRequest {
  #sequence = 0;
  #controller = null; // of the request in flight, if any

  begin() {
    this.cancel();
    const controller = new AbortController();
    this.#controller = controller;
    const sequence = this.#sequence;
    return {
      signal: controller.signal,
      current: () => sequence === this.#sequence,
      done: () => {
        if (this.#controller === controller) this.#controller = null;
      },
    };
  }

  get inFlight() {
    return this.#controller !== null;
  }

  /** Forget the request in flight: its answer, if it still comes, is not for the screen. */
  cancel() {
    this.#sequence += 1;
    this.#controller?.abort();
    this.#controller = null;
  }
}
