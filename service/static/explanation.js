// The explanation on screen: translate, choose an alternative or open a link, fetch the explanation and hand
// it to every panel. All three share one request guard, so only the newest choice ever reaches the screen.

import { fetchExplanation, LatestRequest, translate, translateStream } from "./api.js";
import { loadExplanationAttributions, showAttention } from "./attention.js";
import { resetAttributions } from "./attributions.js";
import { $ } from "./dom.js";
import { resetLive, showStreamEvent } from "./live.js";
import { setStatus, state } from "./state.js";
import { resetSteps } from "./steps.js";
import { beamSettings, renderTranslation } from "./translation.js";

const explanationRequests = new LatestRequest();
let translationsInFlight = 0; // Ctrl+Enter submits even while the button is disabled

const LINK = /^#explanation=(.+)$/;

/** The explanation id in the address bar, if any. */
export function linkedExplanationId() {
  const match = location.hash.match(LINK);
  return match ? decodeURIComponent(match[1]) : null;
}

function show(explanation, id, translation) {
  state.explanation = explanation;
  state.explanationId = id;
  state.translation = translation;
  resetAttributions();
  $("#results").hidden = false;
  renderTranslation();
  showAttention(explanation);
  loadExplanationAttributions();
  resetSteps();
  history.replaceState(null, "", `#explanation=${encodeURIComponent(id)}`);
}

export async function onTranslate(event) {
  event.preventDefault();
  const text = $("#source-text").value.trim();
  if (!text) {
    setStatus("empty_text", {}, "error");
    $("#source-text").focus();
    return;
  }
  const { beamSize, nBest } = beamSettings();
  const pending = explanationRequests.begin();
  const button = $("#translate-button");
  translationsInFlight += 1;
  button.disabled = true;
  document.body.setAttribute("aria-busy", "true");
  const started = performance.now();
  resetLive();
  try {
    setStatus("translating");
    // One decode to explain: the viewer sends the text whole (/v1 would otherwise split it into sentences).
    // The better alignment for the lines (both models' agreement, where the reverse model is served); the
    // explanation id remembers it, so the fetched explanation and a permalink draw the same lines.
    const request = { texts: [text], beam_size: beamSize, n_best: nBest, attention: "none", split_sentences: false, alignment_method: "agreement" };
    const model = $("#model-select").value;
    if (model) request.model = model;
    const translation = await translateText(request, pending);
    if (!pending.current()) return;
    setStatus("fetching_explanation");
    const explanation = await fetchExplanation(translation.explanation_id, pending.signal);
    if (!pending.current()) return;
    state.nbest = [translation, ...(translation.alternatives ?? [])];
    show(explanation, translation.explanation_id, translation);
    setStatus("done", { ms: Math.round(performance.now() - started) }, "ok");
  } catch (error) {
    if (pending.current()) setStatus("error", { message: error.message }, "error");
  } finally {
    pending.done();
    translationsInFlight -= 1;
    if (!translationsInFlight) {
      button.disabled = false;
      document.body.removeAttribute("aria-busy");
    }
  }
}

/**
 * The translation of `request`. Greedy decoding (beam size 1) is streamed, so the text grows on screen token
 * by token; beam search asks /v1/translate once (the API streams its settled tokens too, but the page shows
 * a beam's n-best list, which only the end of the search gives).
 * Events of a request that is no longer the newest are dropped, like its answer.
 */
async function translateText(request, pending) {
  if (request.beam_size !== 1) return (await translate(request, pending.signal)).translations[0];
  return translateStream(request, pending.signal, (event) => {
    if (pending.current()) showStreamEvent(event);
  });
}

/** Explain hypothesis `rank` of the n-best list on screen. */
export async function onChooseHypothesis(rank) {
  const hypothesis = state.nbest[rank];
  if (!hypothesis) return;
  if (hypothesis === state.translation) {
    // Back to the one on screen: it is the newest choice, so an answer still on its way must not replace it.
    if (explanationRequests.inFlight) {
      explanationRequests.cancel();
      setStatus(null);
    }
    return;
  }
  const pending = explanationRequests.begin();
  try {
    setStatus("fetching_explanation");
    const explanation = await fetchExplanation(hypothesis.explanation_id, pending.signal);
    if (!pending.current()) return;
    show(explanation, hypothesis.explanation_id, hypothesis);
    setStatus(null);
    $(`#alternatives button[data-rank="${rank}"]`)?.focus();
  } catch (error) {
    if (pending.current()) setStatus("error", { message: error.message }, "error");
  } finally {
    pending.done();
  }
}

/** Open the explanation the address bar names (a link to it, or the back button). */
export async function openFromLink() {
  const id = linkedExplanationId();
  if (!id) return;
  const pending = explanationRequests.begin();
  try {
    setStatus("fetching_explanation");
    const explanation = await fetchExplanation(id, pending.signal);
    if (!pending.current()) return;
    $("#source-text").value = explanation.source ?? "";
    if ([...$("#model-select").options].some((o) => o.value === explanation.model)) $("#model-select").value = explanation.model;
    state.nbest = [];
    show(explanation, id, null);
    setStatus(null);
  } catch (error) {
    if (pending.current()) setStatus("error", { message: error.message }, "error");
  } finally {
    pending.done();
  }
}
