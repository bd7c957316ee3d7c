// What the viewer shows: one state object the panels read and write, lookups into the served models, and
// the status line (kept as a key, so switching the interface language can say it again).

import { $ } from "./dom.js";
import { t } from "./i18n.js";

export const state = {
  models: [], // GET /v1/models
  limits: {}, // what POST /v1/translate accepts (api.fetchTranslateLimits)
  translation: null, // the hypothesis on screen: one of `nbest` (null when opened from a link)
  nbest: [], // POST /v1/translate's best translation followed by its alternatives
  explanation: null, // GET /v1/explanations/{id}
  explanationId: null,
  layer: 0,
  head: "avg",
  rows: "predicts", // heatmap row t: "predicts" (the step that predicts token t) or "reads" (the next step, t as input)
  view: "pieces",
  selectedPiece: null, // canonical selection: a target piece index
  current: null, // the token view on screen (see tokens.buildView)
  status: null,
  steps: null, // {request, response}
  method: "attention", // the heatmap's method: "attention" or an attribution method of POST /v1/explain
  attributions: {}, // method → {status: "loading" | "ok" | "error", data?, message?} for the explanation on screen
};

export function modelInfo(id) {
  return state.models.find((m) => m.id === id) ?? {};
}

/** The languages of the explanation on screen, for the `lang` attributes of its tokens. */
export function languages() {
  const info = modelInfo(state.explanation?.model);
  return { sourceLang: info.source_lang ?? "", targetLang: info.target_lang ?? "" };
}

/**
 * The map alignments are read from, as GET /v1/models states it for the model (the explanation carries the
 * same): {layer, head, shift, reason}, head null for the layer's head average, shift true when target token t is read
 * at the step where it is the decoder's input (one step after the step that predicted it).
 */
export function alignmentSource(explanation) {
  const info = modelInfo(explanation.model);
  return {
    layer: info.alignment_layer ?? explanation.alignment_layer,
    head: info.alignment_head !== undefined ? info.alignment_head : explanation.alignment_head ?? null,
    shift: Boolean(info.alignment_shift ?? explanation.alignment_shift),
    reason: info.alignment_source ?? null,
  };
}

/** Beam size and n-best ranges for a model: its own `max_beam_size` when /v1/models states one, else the schema's. */
export function beamLimits(modelId) {
  const { beamSize = {}, nBest = {} } = state.limits;
  const max = modelInfo(modelId).max_beam_size ?? beamSize.max;
  return {
    beamSize: { min: beamSize.min ?? 1, max: max ?? Infinity },
    nBest: { min: nBest.min ?? 1, max: Math.min(nBest.max ?? Infinity, max ?? Infinity) },
  };
}

export function setStatus(key, values = {}, kind = "info", target = "#status") {
  if (target === "#status") state.status = key ? { key, values, kind } : null;
  const node = $(target);
  node.textContent = key ? t(key, values) : "";
  node.dataset.kind = kind;
}

export function range(n) {
  return Array.from({ length: n }, (_, i) => i);
}
