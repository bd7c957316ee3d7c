// This service's REST API as the viewer calls it: one fetch wrapper (API key, error messages), the calls
// themselves, the request limits the server states, and a guard that lets only a panel's newest request render.

let onUnauthorizedHandler = () => {};

/** Called on every 401: this deployment wants an API key. */
export function onUnauthorized(handler) {
  onUnauthorizedHandler = handler;
}

async function call(path, { method = "GET", body, signal } = {}) {
  const headers = { Accept: "application/json" };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const key = sessionStorage.getItem("api-key");
  if (key) headers.Authorization = `Bearer ${key}`;
  const response = await fetch(path, { method, headers, signal, body: body === undefined ? undefined : JSON.stringify(body) });
  if (response.status === 401) onUnauthorizedHandler();
  let payload = null;
  try {
    payload = await response.json();
  } catch {
    payload = null;
  }
  if (!response.ok) {
    const detail = payload?.error?.message ?? (typeof payload?.detail === "string" ? payload.detail : null);
    throw new Error(detail || `HTTP ${response.status}`);
  }
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
