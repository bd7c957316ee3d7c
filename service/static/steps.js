// The step-by-step panel: one head's attention for one query, X → Q, K, V → Q·Kᵀ → ÷√d_k, softmax → Σ weights·V,
// drawn from the numbers of POST /v1/explain.

import { explain, LatestRequest } from "./api.js";
import { $, clamp, el, fixed, options } from "./dom.js";
import { t } from "./i18n.js";
import { languages, modelInfo, range, setStatus, state } from "./state.js";
import { pieceLabel } from "./tokens.js";

const MAX_COLUMNS = 48; // vectors wider than this are shown by their first dimensions

/** A matrix of coloured cells (diverging: blue negative, orange positive); the value is in data-value and the tooltip. */
function matrixView(rows, labels, name, { maxColumns = MAX_COLUMNS, lang = "", highlightRow = -1 } = {}) {
  const width = rows[0]?.length ?? 0;
  const shown = Math.min(width, maxColumns);
  const scale = Math.max(1e-9, ...rows.map((row) => Math.max(...row.slice(0, shown).map(Math.abs))));
  const grid = el("div", { class: "matrix", role: "img", "aria-label": `${name}: ${rows.length} × ${width}`, style: { "--cols": shown } });
  rows.forEach((row, r) => {
    grid.append(el("span", { class: `m-label${r === highlightRow ? " current" : ""}`, lang, title: labels[r] }, labels[r]));
    for (let j = 0; j < shown; j++) {
      const value = row[j];
      grid.append(
        el("span", {
          class: `m-cell ${value < 0 ? "neg" : "pos"}`,
          style: { "--a": (Math.abs(value) / scale).toFixed(3) },
          "data-value": value,
          "data-tip": `${name}[${labels[r]}][${j}] = ${fixed(value, 4)}`,
        }),
      );
    }
    grid.append(el("span", { class: "m-more", "aria-hidden": "true" }, shown < width ? "…" : ""));
  });
  return el("figure", { class: "matrix-figure" }, el("figcaption", {}, el("span", { class: name.length > 12 ? "caption-text" : "math" }, name), ` ${rows.length}×${width}`), el("div", { class: "scroll-x" }, grid));
}

function bar(value, low, high, kind) {
  const span = high - low || 1;
  const zero = ((0 - low) / span) * 100;
  const end = ((value - low) / span) * 100;
  const left = Math.min(zero, end);
  const width = Math.abs(end - zero);
  return el("span", { class: `bar ${kind}${value < 0 ? " negative" : ""}` }, el("span", { class: "bar-fill", style: { left: `${left.toFixed(2)}%`, width: `${Math.max(width, 0.5).toFixed(2)}%` } }));
}

/** One row per key position: token, the numbers `cells` makes, a bar; each row carries data-s and data-value. */
function barTable(id, rowClass, headings, values, keys, lang, cells) {
  const heading = (text) => el("th", { scope: "col" }, text);
  return el(
    "table",
    { class: "bars", id },
    el("thead", {}, el("tr", {}, heading(t("col_token")), headings.map(heading), heading(""))),
    el(
      "tbody",
      {},
      values.map((value, s) =>
        el("tr", { class: rowClass, "data-s": s, "data-value": value }, el("th", { scope: "row", lang }, keys[s]), cells(value, s)),
      ),
    ),
  );
}

function step(id, title, formula, text, ...body) {
  return el(
    "section",
    { class: "step", "data-step": id, "aria-label": title },
    el("h3", {}, title),
    el("p", { class: "formula math" }, formula),
    el("p", { class: "help" }, text),
    ...body,
  );
}

function renderSteps(container, data) {
  const { steps, keys, query, kind, sourceLang } = data;
  const dK = steps.d_k ?? steps.q.length;
  const sqrt = Math.sqrt(dK);
  const xQuery = steps.x_query ?? null;
  const labelled = keys.map((k, s) => `${s + 1} ${k}`);
  const dModel = steps.x[0]?.length ?? 0;

  // 1 · X
  const xRows = xQuery ? [xQuery, ...steps.x] : steps.x;
  const xLabels = xQuery ? [`x_q · ${query}`, ...labelled] : labelled;
  const stepX = step(
    "x",
    t("step_x"),
    kind === "cross" ? "x_q = decoder state(t),   X = encoder output  ∈ ℝ^(S×d_model)" : "X = layer input  ∈ ℝ^(S×d_model),   x_q = X[i]",
    t(kind === "cross" ? "step_x_cross" : "step_x_self", { query }),
    matrixView(xRows, xLabels, "X", { lang: sourceLang }),
    el("p", { class: "note" }, t("step_x_dims", { shown: Math.min(dModel, MAX_COLUMNS), total: dModel })),
  );

  // 2 · Q, K, V
  const stepQkv = step(
    "qkv",
    t("step_qkv"),
    "q = x_q·W_Q + b_Q,   K = X·W_K + b_K,   V = X·W_V + b_V",
    t("step_qkv_text", { dk: dK }),
    el(
      "div",
      { class: "qkv" },
      matrixView([steps.q], [query], "q", { maxColumns: 64 }),
      matrixView(steps.k, labelled, "K", { maxColumns: 64, lang: sourceLang }),
      matrixView(steps.v, labelled, "V", { maxColumns: 64, lang: sourceLang }),
    ),
  );

  // 3 · scores
  const low = Math.min(0, ...steps.scores);
  const high = Math.max(0, ...steps.scores);
  const stepScores = step(
    "scores",
    t("step_scores"),
    "scoreₛ = q · kₛ = Σⱼ qⱼ kₛⱼ",
    t("step_scores_text"),
    barTable("step-scores", "score-row", [t("col_score")], steps.scores, keys, sourceLang, (value) => [
      el("td", { class: "num" }, fixed(value, 3)),
      el("td", { class: "bar-cell" }, bar(value, low, high, "diverging")),
    ]),
  );

  // 4 · scale and softmax
  const total = steps.weights.reduce((a, b) => a + b, 0);
  const stepSoftmax = step(
    "softmax",
    t("step_softmax"),
    `weightₛ = softmax(scoreₛ / √d_k) = exp(scoreₛ/${fixed(sqrt, 2)}) / Σᵣ exp(scoreᵣ/${fixed(sqrt, 2)})`,
    t("step_softmax_text", { sqrt: fixed(sqrt, 3), sum: fixed(total, 4) }),
    barTable("step-weights", "weight-row", [t("col_scaled"), t("col_weight")], steps.weights, keys, sourceLang, (value, s) => [
      el("td", { class: "num" }, fixed(steps.scaled_scores[s], 3)),
      el("td", { class: "num strong" }, fixed(value, 4)),
      el("td", { class: "bar-cell" }, bar(value, 0, 1, "weight")),
    ]),
  );

  // The same weights, read from the attention map of the same forced decode: the two must agree.
  const mapRow = data.map?.[data.position];
  if (mapRow) {
    const difference = Math.max(...steps.weights.map((w, s) => Math.abs(w - (mapRow[s] ?? NaN))));
    const agrees = difference < 1e-4;
    stepSoftmax.append(
      el("p", { class: `map-check ${agrees ? "ok" : "bad"}`, "data-difference": difference }, t(agrees ? "map_agrees" : "map_differs", { difference: difference.toExponential(1) })),
      matrixView(data.map, data.mapLabels.map((label, i) => `${i + 1} ${label}`), t("map_caption"), { maxColumns: 64, highlightRow: data.position }),
    );
  }

  // 5 · weighted sum
  const contributions = steps.weights.map((w, s) => steps.v[s].map((x) => w * x));
  const top = steps.weights
    .map((w, s) => [w, s])
    .sort((a, b) => b[0] - a[0])
    .slice(0, 3)
    .map(([w, s]) => `“${keys[s]}” ${fixed(w, 2)}`)
    .join(", ");
  const stepOutput = step(
    "output",
    t("step_output"),
    "output = Σₛ weightₛ · vₛ",
    t("step_output_text", { top }),
    el(
      "div",
      { class: "qkv" },
      matrixView(contributions, labelled, "weightₛ·vₛ", { maxColumns: 64, lang: sourceLang }),
      matrixView([steps.output], [`Σ → ${query}`], "output", { maxColumns: 64 }),
    ),
  );

  const arrow = () => el("div", { class: "step-arrow", "aria-hidden": "true" }, "↓");
  container.replaceChildren(
    el("p", { class: "steps-caption" }, `${kind === "cross" ? t("kind_cross") : t("kind_self")} · ${t("layer")} ${data.layer + 1} · ${t("head")} ${data.head + 1} · ${t("query_token")} “${query}” · d_k = ${dK}`),
    stepX,
    arrow(),
    stepQkv,
    arrow(),
    stepScores,
    arrow(),
    stepSoftmax,
    arrow(),
    stepOutput,
  );
}

// ---------------------------------------------------------------- the panel

const stepsRequests = new LatestRequest();

/** A new explanation is on screen: forget the steps of the last one (and any still being computed). */
export function resetSteps() {
  stepsRequests.cancel();
  state.steps = null;
  $("#steps").hidden = true;
  $("#steps").replaceChildren();
  $("#steps-button").disabled = false;
  setStatus(null, {}, "info", "#steps-status");
  fillStepControls();
}

function encoderShape() {
  const info = modelInfo(state.explanation.model);
  const fromSteps = state.steps?.response?.encoder_self_attention;
  return {
    layers: info.encoder_layers ?? fromSteps?.length ?? state.explanation.cross_attention.length,
    heads: info.encoder_attention_heads ?? fromSteps?.[0]?.length ?? state.explanation.cross_attention[0].length,
  };
}

/** Layer, head and query choices for the chosen kind of attention, keeping what was chosen where it still exists. */
export function fillStepControls() {
  const e = state.explanation;
  if (!e) return;
  const kind = $("#steps-kind").value;
  const shape = kind === "cross" ? { layers: e.cross_attention.length, heads: e.cross_attention[0].length } : encoderShape();
  const layer = clamp(Number($("#steps-layer").value || state.layer), 0, shape.layers - 1);
  const head = clamp(Number($("#steps-head").value || (state.head === "avg" ? 0 : state.head)), 0, shape.heads - 1);
  options($("#steps-layer"), range(shape.layers).map((l) => ({ value: l, label: `${l + 1} / ${shape.layers}` })), layer);
  options($("#steps-head"), range(shape.heads).map((h) => ({ value: h, label: `${h + 1} / ${shape.heads}` })), head);
  const pieces = kind === "cross" ? e.target_tokens : e.source_tokens;
  const previous = Number($("#steps-position").value || 0);
  options(
    $("#steps-position"),
    pieces.map((p, i) => ({ value: i, label: `${i + 1}: ${pieceLabel(p)}` })),
    clamp(previous, 0, pieces.length - 1),
  );
}

/** Follow the token selected in the other panels: its position (cross) or the source piece aligned with it. */
export function syncStepsToSelection() {
  if (state.selectedPiece === null || !state.explanation) return;
  const kind = $("#steps-kind").value;
  let position = state.selectedPiece;
  if (kind === "encoder_self") {
    const pair = (state.explanation.alignment ?? []).find(([, tgt]) => tgt === state.selectedPiece);
    position = pair ? pair[0] : 0;
  } else {
    $("#steps-layer").value = String(state.layer);
    if (state.head !== "avg") $("#steps-head").value = String(state.head);
  }
  $("#steps-position").value = String(position);
  if (!$("#steps").hidden) loadSteps();
}

export async function loadSteps(event) {
  event?.preventDefault();
  if (!state.explanation) return;
  const request = {
    explanation_id: state.explanationId, // exactly the tokens the decoder wrote
    kind: $("#steps-kind").value,
    layer: Number($("#steps-layer").value),
    head: Number($("#steps-head").value),
    position: Number($("#steps-position").value),
  };
  const pending = stepsRequests.begin();
  setStatus("computing", {}, "info", "#steps-status");
  $("#steps-button").disabled = true;
  try {
    const response = await explain(request, pending.signal);
    if (!pending.current()) return;
    state.steps = { request, response };
    drawSteps();
    setStatus(null, {}, "info", "#steps-status");
  } catch (error) {
    if (!pending.current()) return;
    state.steps = null;
    $("#steps").hidden = true;
    $("#steps").replaceChildren(); // never leave the numbers of another query on screen
    setStatus("error", { message: error.message }, "error", "#steps-status");
  } finally {
    pending.done();
    if (pending.current()) $("#steps-button").disabled = false;
  }
}

/** Draw the steps on screen again (after a language switch too). */
export function drawSteps() {
  if (!state.steps) return;
  const { request, response } = state.steps;
  const e = state.explanation;
  const sourceTokens = response.source_tokens ?? e.source_tokens;
  const targetTokens = response.target_tokens ?? e.target_tokens;
  const keys = sourceTokens.map(pieceLabel);
  const query = request.kind === "cross" ? targetTokens[request.position] : sourceTokens[request.position];
  const container = $("#steps");
  container.hidden = false;
  renderSteps(container, {
    kind: request.kind,
    layer: request.layer,
    head: request.head,
    position: request.position,
    query: query === undefined ? "?" : pieceLabel(query),
    keys,
    steps: response.steps,
    ...languages(),
    map: (request.kind === "cross" ? response.cross_attention : response.encoder_self_attention)?.[request.layer]?.[request.head],
    mapLabels: (request.kind === "cross" ? targetTokens : sourceTokens).map(pieceLabel),
  });
}
