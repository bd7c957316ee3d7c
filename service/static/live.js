// A translation as it is decoded: POST /v1/translate/stream's token events shown while they arrive (the text,
// each token's confidence and one heatmap row per token), until the result and its explanation replace them.

import { renderHeatmap } from "./attention.js";
import { $ } from "./dom.js";
import { buildView, isSpecial, WORD_BOUNDARY } from "./tokens.js";
import { renderConfidence } from "./translation.js";
import { languages, range, state } from "./state.js";

let live = null; // the stream on screen: {pieces, logprobs, rows}; null before its first token

/** Before a translation: the previous one's token count must not be taken for this one's. */
export function resetLive() {
  live = null;
  delete $("#translation-text").dataset.streamedTokens;
}

/** One event of the stream (the caller has checked it is still the newest request's). */
export function showStreamEvent(event) {
  if (event.type === "token") showToken(event);
}

function showToken(event) {
  if (!live) beginLive();
  live.pieces.push(event.piece);
  live.logprobs.push(event.logprob);
  live.rows.push(event.attention ?? []);
  const text = $("#translation-text");
  text.textContent = pieceText(live.pieces);
  text.lang = languages().targetLang;
  // How many tokens arrived one by one: the translation on screen was streamed, not only answered at the end.
  text.dataset.streamedTokens = String(live.pieces.length);
  const view = liveView();
  renderConfidence(view);
  renderHeatmap($("#heatmap"), view, { showValues: $("#show-values").checked, ...languages() });
}

/**
 * The first token: the panels leave the previous translation (its score, alternatives, alignment and
 * selection belong to another decode) and show the new one as it grows.
 */
function beginLive() {
  live = { pieces: [], logprobs: [], rows: [] };
  state.current = null; // nothing to select until the explanation comes
  state.selectedPiece = null;
  $("#results").hidden = false;
  $("#translation-score").textContent = "";
  $("#alternatives-block").hidden = true;
  $("#align-source").replaceChildren();
  $("#align-target").replaceChildren();
  $("#align-lines").replaceChildren();
  $("#source-share").replaceChildren(); // the shares come with the explanation
  $("#share-summary").textContent = "";
}

/** The decoded text so far: pieces joined, ▁ as spaces, special tokens (</s>) left out. */
function pieceText(pieces) {
  return pieces.filter((piece) => !isSpecial(piece)).join("").replaceAll(WORD_BOUNDARY, " ").trim();
}

/**
 * Rows are the alignment head's at the step that predicted each token, as the events carry them. The source
 * tokens come only with the explanation, so the columns are numbered (the last is the source's </s>).
 */
function liveView() {
  const columns = live.rows.reduce((most, row) => Math.max(most, row.length), 0);
  const matrix = live.rows.map((row) => range(columns).map((s) => row[s] ?? 0));
  return buildView("pieces", range(columns).map((s) => String(s + 1)), live.pieces, matrix, [], live.logprobs);
}
