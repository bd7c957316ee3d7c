// The explanation viewer: translate, fetch the explanation, draw heatmap, alignment and confidence,
// and open one attention head step by step. Talks only to this service's REST API (/v1).

import { cellTip, drawAlignmentLines, onHeatmapKey, renderAlignment, renderHeatmap } from "./attention.js";
import { $, $$, clamp, el, fixed, options, percent } from "./dom.js";
import { defaultLanguage, language, setLanguage, t } from "./i18n.js";
import { renderSteps } from "./steps.js";
import { buildView, headMatrix, pieceLabel } from "./tokens.js";

const state = {
  models: [],
  translation: null, // the hypothesis on screen: one of `nbest` (null when opened from a link)
  nbest: [], // POST /v1/translate's best translation followed by its alternatives
  explanation: null, // GET /v1/explanations/{id}
  explanationId: null,
  layer: 0,
  head: "avg",
  view: "pieces",
  selectedPiece: null, // canonical selection: a target piece index
  current: null, // the token view on screen (see tokens.buildView)
  status: null,
  steps: null, // {request, response}
};

// ---------------------------------------------------------------- API

async function api(path, init = {}) {
  const headers = { Accept: "application/json" };
  if (init.body) headers["Content-Type"] = "application/json";
  const key = sessionStorage.getItem("api-key");
  if (key) headers.Authorization = `Bearer ${key}`;
  const response = await fetch(path, { ...init, headers });
  if (response.status === 401) $("#api-key-control").hidden = false; // this deployment wants an API key
  let body = null;
  try {
    body = await response.json();
  } catch {
    body = null;
  }
  if (!response.ok) {
    const detail = body?.error?.message ?? (typeof body?.detail === "string" ? body.detail : null);
    throw new Error(detail || `HTTP ${response.status}`);
  }
  return body;
}

function setStatus(key, values = {}, kind = "info", target = "#status") {
  if (target === "#status") state.status = key ? { key, values, kind } : null;
  const node = $(target);
  node.textContent = key ? t(key, values) : "";
  node.dataset.kind = kind;
}

// ---------------------------------------------------------------- models

async function loadModels() {
  const select = $("#model-select");
  try {
    const body = await api("v1/models");
    const models = Array.isArray(body) ? body : body.models ?? body.data ?? [];
    state.models = models;
    if (!models.length) throw new Error(t("no_models"));
    const items = models.map((m) => ({
      value: m.id,
      label: m.source_lang && m.target_lang ? `${m.source_lang} → ${m.target_lang}  ·  ${m.id}` : m.id,
    }));
    const preferred = models.find((m) => m.source_lang === "en" && m.target_lang === "zh") ?? models[0];
    options(select, items, state.explanation?.model ?? preferred.id);
  } catch (error) {
    options(select, [{ value: "", label: t("no_models") }]);
    setStatus("error", { message: error.message }, "error");
  }
}

function modelInfo(id) {
  return state.models.find((m) => m.id === id) ?? {};
}

// ---------------------------------------------------------------- translate

async function onTranslate(event) {
  event.preventDefault();
  const text = $("#source-text").value.trim();
  if (!text) {
    setStatus("empty_text", {}, "error");
    $("#source-text").focus();
    return;
  }
  const beamSize = clamp(parseInt($("#beam-size").value, 10) || 1, 1, 8);
  const nBest = clamp(parseInt($("#n-best").value, 10) || 1, 1, beamSize);
  $("#beam-size").value = beamSize;
  $("#n-best").value = nBest;
  const button = $("#translate-button");
  button.disabled = true;
  document.body.setAttribute("aria-busy", "true");
  const started = performance.now();
  try {
    setStatus("translating");
    const request = { texts: [text], beam_size: beamSize, n_best: nBest, attention: "none" };
    const model = $("#model-select").value;
    if (model) request.model = model;
    const response = await api("v1/translate", { method: "POST", body: JSON.stringify(request) });
    const translation = response.translations[0];
    state.nbest = [translation, ...(translation.alternatives ?? [])];
    setStatus("fetching_explanation");
    await explainHypothesis(translation);
    setStatus("done", { ms: Math.round(performance.now() - started) }, "ok");
  } catch (error) {
    setStatus("error", { message: error.message }, "error");
  } finally {
    button.disabled = false;
    document.body.removeAttribute("aria-busy");
  }
}

/** Fetch the explanation of one hypothesis of the n-best list and put it on screen. */
async function explainHypothesis(hypothesis) {
  const id = hypothesis.explanation_id;
  const explanation = await api(`v1/explanations/${encodeURIComponent(id)}`);
  show(explanation, id, hypothesis);
  history.replaceState(null, "", `#explanation=${encodeURIComponent(id)}`);
}

async function onChooseHypothesis(rank) {
  const hypothesis = state.nbest[rank];
  if (!hypothesis || hypothesis === state.translation) return;
  try {
    setStatus("fetching_explanation");
    await explainHypothesis(hypothesis);
    setStatus(null);
    $(`#alternatives button[data-rank="${rank}"]`)?.focus();
  } catch (error) {
    setStatus("error", { message: error.message }, "error");
  }
}

async function openFromLink() {
  const match = location.hash.match(/^#explanation=(.+)$/);
  if (!match) return;
  try {
    setStatus("fetching_explanation");
    const id = decodeURIComponent(match[1]);
    const explanation = await api(`v1/explanations/${encodeURIComponent(id)}`);
    $("#source-text").value = explanation.source ?? "";
    if ([...$("#model-select").options].some((o) => o.value === explanation.model)) $("#model-select").value = explanation.model;
    state.nbest = [];
    show(explanation, id, null);
    setStatus(null);
  } catch (error) {
    setStatus("error", { message: error.message }, "error");
  }
}

function show(explanation, id, translation) {
  state.explanation = explanation;
  state.explanationId = id;
  state.translation = translation;
  state.steps = null;
  const layers = explanation.cross_attention.length;
  const heads = explanation.cross_attention[0]?.length ?? 0;
  // Open on the alignment head (the map the served alignment is read from) so heatmap and lines agree;
  // a model without one aligns by its alignment layer's head average.
  state.layer = clamp(explanation.alignment_layer ?? layers - 2, 0, layers - 1);
  state.head = explanation.alignment_head ?? "avg";
  state.selectedPiece = null;
  options($("#layer-select"), range(layers).map((l) => ({ value: l, label: `${l + 1} / ${layers}` })), state.layer);
  options(
    $("#head-select"),
    [{ value: "avg", label: t("head_avg") }, ...range(heads).map((h) => ({ value: h, label: `${h + 1} / ${heads}` }))],
    state.head,
  );
  describeAlignmentHead();
  $("#results").hidden = false;
  $("#steps").hidden = true;
  $("#steps").replaceChildren();
  setStatus(null, {}, "info", "#steps-status");
  renderTranslation();
  renderAttention();
  fillStepControls();
}

/** One line under the attention controls: which layer and head the alignment is read from. */
function describeAlignmentHead() {
  const e = state.explanation;
  if (!e) return;
  const layer = (e.alignment_layer ?? 0) + 1;
  const note = e.alignment_head == null
    ? t("alignment_head_avg", { layer })
    : t("alignment_head", { layer, head: e.alignment_head + 1 });
  $("#alignment-head-note").textContent = note;
}

// ---------------------------------------------------------------- translation, confidence, alternatives

function targetLanguage() {
  const info = modelInfo(state.explanation?.model);
  return info.target_lang ?? "";
}

function renderTranslation() {
  const e = state.explanation;
  const tr = state.translation;
  $("#translation-text").textContent = tr?.text ?? e.translation ?? "";
  $("#translation-text").lang = targetLanguage();
  const scores = tr?.token_scores ?? e.token_scores ?? [];
  const score = tr?.score ?? scores.reduce((a, b) => a + b, 0);
  $("#translation-score").textContent = fixed(score, 3);
  $("#translation-model").textContent = e.model ?? tr?.model ?? "";
  $("#permalink").href = `#explanation=${encodeURIComponent(state.explanationId ?? "")}`;
  $("#alternatives-block").hidden = state.nbest.length < 2;
  $("#alternatives").replaceChildren(
    ...state.nbest.map((hypothesis, rank) => {
      const probabilities = (hypothesis.token_scores ?? []).map(Math.exp);
      const mean = probabilities.length ? probabilities.reduce((a, b) => a + b, 0) / probabilities.length : null;
      const shown = hypothesis === tr;
      return el(
        "li",
        { class: shown ? "shown" : "" },
        el(
          "button",
          {
            type: "button",
            class: "alt-choice",
            "data-rank": rank,
            "aria-pressed": String(shown),
            disabled: !hypothesis.explanation_id,
            lang: targetLanguage(),
          },
          hypothesis.text,
        ),
        el("span", { class: "alt-score num" }, t("alt_score", { score: fixed(hypothesis.score, 3) })),
        mean !== null && el("span", { class: "alt-score num" }, `· ⌀ ${percent(mean)}`),
      );
    }),
  );
}

function renderConfidence(view) {
  const list = $("#confidence");
  if (!view.logprobs) {
    list.replaceChildren();
    return;
  }
  list.replaceChildren(
    ...view.target.map((token, index) => {
      const p = Math.exp(view.logprobs[index]);
      const level = p >= 0.7 ? "high" : p >= 0.35 ? "mid" : "low";
      return el(
        "li",
        {},
        el(
          "button",
          {
            type: "button",
            class: `conf-token tok-target ${level}`,
            "data-t": index,
            "data-prob": p,
            "data-logprob": view.logprobs[index],
            "aria-pressed": "false",
            "data-tip": `${token.raw}: ${t("prob", { p: fixed(p, 4) })}`,
            lang: targetLanguage(),
          },
          el("span", { class: `tok-label${token.special ? " special" : ""}` }, token.label),
          el("span", { class: "conf-bar", style: { "--p": p.toFixed(4) } }),
          el("span", { class: "conf-value num" }, percent(p)),
        ),
      );
    }),
  );
}

// ---------------------------------------------------------------- heatmap

function languages() {
  const info = modelInfo(state.explanation?.model);
  return { sourceLang: info.source_lang ?? "", targetLang: info.target_lang ?? "" };
}

function renderAttention() {
  const e = state.explanation;
  const matrix = headMatrix(e.cross_attention, state.layer, state.head);
  const view = buildView(state.view, e.source_tokens, e.target_tokens, matrix, e.alignment ?? [], e.token_scores ?? state.translation?.token_scores);
  // The word alignment the server computed (the same on a permalink as on the fresh translation).
  const words = e.word_alignment ?? state.translation?.word_alignment;
  const targetWords = e.target_words ?? state.translation?.target_words;
  if (state.view === "words" && words && targetWords?.length === view.target.length) view.alignment = words;
  state.current = view;
  renderConfidence(view);
  drawHeatmap();
  renderAlignment(view, languages());
  applySelection();
}

function drawHeatmap() {
  renderHeatmap($("#heatmap"), state.current, { showValues: $("#show-values").checked, ...languages() });
}

function redrawLines() {
  if (state.current && !$("#results").hidden) drawAlignmentLines(state.current, selectedRow());
}

// ---------------------------------------------------------------- selection

function selectedRow() {
  if (state.selectedPiece === null || !state.current) return null;
  const row = state.current.target.findIndex((token) => token.pieces.includes(state.selectedPiece));
  return row < 0 ? null : row;
}

function selectTarget(row) {
  const token = state.current?.target[row];
  if (!token) return;
  state.selectedPiece = token.pieces[0];
  applySelection();
  syncStepsToSelection();
}

function applySelection() {
  const view = state.current;
  const row = selectedRow();
  const aligned = new Set(row === null ? [] : view.alignment.filter(([, r]) => r === row).map(([s]) => s));
  for (const node of $$(".tok-target")) {
    const on = row !== null && Number(node.dataset.t) === row;
    node.classList.toggle("selected", on);
    node.setAttribute("aria-pressed", String(on));
  }
  for (const tr of $$("#heatmap tbody tr")) tr.classList.toggle("selected", row !== null && Number(tr.dataset.t) === row);
  for (const cell of $$("#heatmap td.cell")) {
    const on = row !== null && Number(cell.dataset.t) === row && aligned.has(Number(cell.dataset.s));
    cell.classList.toggle("aligned", on);
    if (on) cell.dataset.aligned = "true";
    else delete cell.dataset.aligned;
  }
  for (const th of $$("#heatmap th.src-head")) th.classList.toggle("aligned", aligned.has(Number(th.dataset.s)));
  const max = row === null ? 1 : Math.max(1e-9, ...view.matrix[row]);
  for (const chip of $$("#align-source .align-token")) {
    const s = Number(chip.dataset.s);
    chip.classList.toggle("aligned", aligned.has(s));
    if (row === null) chip.style.removeProperty("--w");
    else chip.style.setProperty("--w", (view.matrix[row][s] / max).toFixed(3));
    chip.classList.toggle("weighted", row !== null);
    if (aligned.has(s)) chip.dataset.aligned = "true";
    else delete chip.dataset.aligned;
  }
  redrawLines();
  const summary = $("#selection-summary");
  if (row === null) {
    summary.textContent = t("select_hint");
    return;
  }
  const quote = (s) => `“${view.source[s].label}”`;
  const top = view.matrix[row]
    .map((value, s) => [value, s])
    .sort((a, b) => b[0] - a[0])
    .slice(0, 3)
    .map(([value, s]) => `${quote(s)} (${fixed(value, 2)})`)
    .join(", ");
  summary.textContent = t("selection", { target: view.target[row].label, aligned: [...aligned].map(quote).join(", ") || "—", top });
}

// ---------------------------------------------------------------- step by step

function encoderShape() {
  const info = modelInfo(state.explanation.model);
  const fromSteps = state.steps?.response?.encoder_self_attention;
  return {
    layers: info.encoder_layers ?? fromSteps?.length ?? state.explanation.cross_attention.length,
    heads: info.encoder_attention_heads ?? fromSteps?.[0]?.length ?? state.explanation.cross_attention[0].length,
  };
}

function fillStepControls() {
  const e = state.explanation;
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

function syncStepsToSelection() {
  if (state.selectedPiece === null) return;
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

let stepsGeneration = 0;

async function loadSteps(event) {
  event?.preventDefault();
  const e = state.explanation;
  if (!e) return;
  const request = {
    explanation_id: state.explanationId, // exactly the tokens the decoder wrote
    kind: $("#steps-kind").value,
    layer: Number($("#steps-layer").value),
    head: Number($("#steps-head").value),
    position: Number($("#steps-position").value),
  };
  const generation = ++stepsGeneration;
  setStatus("computing", {}, "info", "#steps-status");
  $("#steps-button").disabled = true;
  try {
    const response = await api("v1/explain", { method: "POST", body: JSON.stringify(request) });
    if (generation !== stepsGeneration) return;
    state.steps = { request, response };
    drawSteps();
    setStatus(null, {}, "info", "#steps-status");
  } catch (error) {
    if (generation === stepsGeneration) {
      state.steps = null;
      $("#steps").hidden = true;
      $("#steps").replaceChildren(); // never leave the numbers of another query on screen
      setStatus("error", { message: error.message }, "error", "#steps-status");
    }
  } finally {
    if (generation === stepsGeneration) $("#steps-button").disabled = false;
  }
}

function drawSteps() {
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
    sourceLang: modelInfo(e.model).source_lang ?? "",
    targetLang: targetLanguage(),
    map: (request.kind === "cross" ? response.cross_attention : response.encoder_self_attention)?.[request.layer]?.[request.head],
    mapLabels: (request.kind === "cross" ? targetTokens : sourceTokens).map(pieceLabel),
  });
}

// ---------------------------------------------------------------- tooltip

function showTip(node) {
  const tip = $("#tooltip");
  const text = node.matches("td.cell") ? cellTip(node, state.current) : node.dataset.tip;
  if (!text) return;
  if (node.matches("td.cell")) node.setAttribute("aria-label", text); // screen readers hear what the eye sees
  tip.textContent = text;
  tip.hidden = false;
  const r = node.getBoundingClientRect();
  const w = tip.offsetWidth;
  const h = tip.offsetHeight;
  let left = r.left + r.width / 2 - w / 2;
  left = clamp(left, 4, window.innerWidth - w - 4);
  let top = r.top - h - 8;
  if (top < 4) top = r.bottom + 8;
  tip.style.left = `${left + window.scrollX}px`;
  tip.style.top = `${top + window.scrollY}px`;
}

function hideTip() {
  $("#tooltip").hidden = true;
}

function tipTarget(event) {
  return event.target.closest?.("td.cell, [data-tip]");
}

// ---------------------------------------------------------------- wiring

function range(n) {
  return Array.from({ length: n }, (_, i) => i);
}

function applyLanguage(lang) {
  const chosen = setLanguage(lang);
  $("#ui-lang").textContent = t("other_lang");
  $("#ui-lang").lang = chosen === "zh" ? "en" : "zh-CN";
  if (state.status) setStatus(state.status.key, state.status.values, state.status.kind);
  if (state.explanation) {
    const headSelect = $("#head-select");
    if (headSelect.options[0]) headSelect.options[0].textContent = t("head_avg");
    describeAlignmentHead();
    renderTranslation();
    renderAttention();
    drawSteps();
  }
}

function init() {
  applyLanguage(defaultLanguage());
  $("#ui-lang").addEventListener("click", () => {
    const next = language() === "zh" ? "en" : "zh";
    localStorage.setItem("ui-lang", next);
    applyLanguage(next);
  });
  $("#translate-form").addEventListener("submit", onTranslate);
  $("#api-key").value = sessionStorage.getItem("api-key") ?? "";
  $("#api-key-control").hidden = !$("#api-key").value;
  $("#api-key").addEventListener("change", (event) => {
    sessionStorage.setItem("api-key", event.target.value.trim());
    if (!state.models.length) loadModels().then(() => setStatus(null));
  });
  $("#source-text").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) $("#translate-form").requestSubmit();
  });
  $("#beam-size").addEventListener("change", () => {
    $("#n-best").max = $("#beam-size").value;
  });
  $("#layer-select").addEventListener("change", (event) => {
    state.layer = Number(event.target.value);
    renderAttention();
  });
  $("#head-select").addEventListener("change", (event) => {
    state.head = event.target.value === "avg" ? "avg" : Number(event.target.value);
    renderAttention();
  });
  for (const radio of $$("input[name=view]"))
    radio.addEventListener("change", (event) => {
      state.view = event.target.value;
      renderAttention();
    });
  $("#show-values").addEventListener("change", () => {
    if (!state.current) return;
    drawHeatmap();
    applySelection();
  });
  document.addEventListener("click", (event) => {
    const target = event.target.closest("button.tok-target");
    if (target) selectTarget(Number(target.dataset.t));
  });
  $("#alternatives").addEventListener("click", (event) => {
    const choice = event.target.closest("button.alt-choice");
    if (choice) onChooseHypothesis(Number(choice.dataset.rank));
  });
  $("#heatmap").addEventListener("keydown", (event) => onHeatmapKey(event, state.current, selectTarget));
  $("#heatmap").addEventListener("dblclick", (event) => {
    const cell = event.target.closest("td.cell");
    if (cell) selectTarget(Number(cell.dataset.t));
  });
  $("#steps-form").addEventListener("submit", loadSteps);
  $("#steps-kind").addEventListener("change", () => {
    fillStepControls();
    syncStepsToSelection();
  });
  document.addEventListener("mouseover", (event) => {
    const node = tipTarget(event);
    if (node) showTip(node);
    else hideTip();
  });
  document.addEventListener("focusin", (event) => {
    const node = tipTarget(event);
    if (node) showTip(node);
    else hideTip();
  });
  document.addEventListener("keydown", (event) => event.key === "Escape" && hideTip());
  new ResizeObserver(redrawLines).observe($("#alignment-wrap"));
  document.fonts?.ready.then(redrawLines);
  window.addEventListener("hashchange", () => {
    const id = location.hash.match(/^#explanation=(.+)$/)?.[1];
    if (id && decodeURIComponent(id) !== state.explanationId) openFromLink();
  });
  loadModels().then(openFromLink);
}

init();
