// The explanation viewer's entry point: wires the page's controls to the panels and starts it. Talks only to
// this service's REST API (api.js); what is on screen lives in state.js; each panel has its own module:
// translation.js (form, translation, confidence, alternatives), attention.js (heatmap, alignment),
// attributions.js (the heatmap's other methods, the source-share bar), steps.js (one head step by step);
// explanation.js fetches an explanation and hands it to all of them.

import { onUnauthorized } from "./api.js";
import { chooseMethod, onHeatmapKey, redrawHeatmap, redrawLines, relabelAttention, renderAttention, selectTarget } from "./attention.js";
import { $, $$ } from "./dom.js";
import { linkedExplanationId, onChooseHypothesis, onTranslate, openFromLink } from "./explanation.js";
import { defaultLanguage, language, setLanguage, t } from "./i18n.js";
import { setStatus, state } from "./state.js";
import { drawSteps, fillStepControls, loadSteps, syncStepsToSelection } from "./steps.js";
import { installTooltip } from "./tooltip.js";
import { applyFormLimits, loadModels, renderTranslation } from "./translation.js";

function applyLanguage(lang) {
  const chosen = setLanguage(lang);
  $("#ui-lang").textContent = t("other_lang");
  $("#ui-lang").lang = chosen === "zh" ? "en" : "zh-CN";
  if (state.status) setStatus(state.status.key, state.status.values, state.status.kind);
  if (state.explanation) {
    relabelAttention();
    renderTranslation();
    renderAttention();
    drawSteps();
  }
}

/** A target token chosen in any panel: highlight it everywhere, and open it step by step. */
function chooseTarget(row) {
  if (selectTarget(row)) syncStepsToSelection();
}

function init() {
  applyLanguage(defaultLanguage());
  onUnauthorized(() => {
    $("#api-key-control").hidden = false;
  });
  $("#ui-lang").addEventListener("click", () => {
    const next = language() === "zh" ? "en" : "zh";
    localStorage.setItem("ui-lang", next);
    applyLanguage(next);
  });

  // the form
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
  $("#model-select").addEventListener("change", applyFormLimits);
  $("#beam-size").addEventListener("change", applyFormLimits);

  // translation and attention
  $("#alternatives").addEventListener("click", (event) => {
    const choice = event.target.closest("button.alt-choice");
    if (choice) onChooseHypothesis(Number(choice.dataset.rank));
  });
  $("#method-select").value = state.method; // not a choice the browser restored from an earlier visit
  $("#method-select").addEventListener("change", (event) => chooseMethod(event.target.value));
  $("#layer-select").addEventListener("change", (event) => {
    state.layer = Number(event.target.value);
    renderAttention();
  });
  $("#head-select").addEventListener("change", (event) => {
    state.head = event.target.value === "avg" ? "avg" : Number(event.target.value);
    renderAttention();
  });
  $("#rows-select").addEventListener("change", (event) => {
    state.rows = event.target.value;
    renderAttention();
  });
  for (const radio of $$("input[name=view]"))
    radio.addEventListener("change", (event) => {
      state.view = event.target.value;
      renderAttention();
    });
  $("#show-values").addEventListener("change", redrawHeatmap);
  document.addEventListener("click", (event) => {
    const target = event.target.closest("button.tok-target");
    if (target) chooseTarget(Number(target.dataset.t));
  });
  $("#heatmap").addEventListener("keydown", (event) => onHeatmapKey(event, state.current, chooseTarget));
  $("#heatmap").addEventListener("dblclick", (event) => {
    const cell = event.target.closest("td.cell");
    if (cell) chooseTarget(Number(cell.dataset.t));
  });
  new ResizeObserver(redrawLines).observe($("#alignment-wrap"));
  document.fonts?.ready.then(redrawLines);

  // step by step
  $("#steps-form").addEventListener("submit", loadSteps);
  $("#steps-kind").addEventListener("change", () => {
    fillStepControls();
    syncStepsToSelection();
  });

  installTooltip();
  window.addEventListener("hashchange", () => {
    const id = linkedExplanationId();
    if (id && id !== state.explanationId) openFromLink();
  });
  loadModels().then(openFromLink);
}

init();
