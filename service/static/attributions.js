// Attributions beyond attention: the heatmap's method switch (gradient methods, ALTI+) and the per-token
// source-share bar, both from POST /v1/explain with a `method` for the explanation on screen. Each method is
// asked once per explanation (the bar's ALTI+ answer serves an ALTI+ heatmap too); an answer that arrives
// after another explanation came on screen is dropped, and a refusal (413 for a pair too long) is said on
// the page, never left as a blank.

import { explain } from "./api.js";
import { $, el, fixed, percent } from "./dom.js";
import { t } from "./i18n.js";
import { languages, setStatus, state } from "./state.js";

const SHARE_METHOD = "alti_plus";

let controller = new AbortController(); // of the explanation on screen's requests

/** A new explanation is on screen: forget the attributions of the last one and stop computing them. */
export function resetAttributions() {
  controller.abort();
  controller = new AbortController();
  state.attributions = {};
}

/**
 * Ask for `method`'s attributions of the explanation on screen unless they are there or on their way;
 * `onSettled(method)` runs when they arrive or fail, if that explanation is still the one on screen.
 */
export async function loadAttributions(method, onSettled) {
  if (method === "attention" || !state.explanationId) return;
  const entries = state.attributions;
  if (entries[method] && entries[method].status !== "error") return; // a refusal is asked again when chosen again
  entries[method] = { status: "loading" };
  const { signal } = controller;
  try {
    const response = await explain({ explanation_id: state.explanationId, method }, signal);
    if (!response?.attributions) throw new Error(t("no_attributions"));
    entries[method] = { status: "ok", data: response.attributions };
  } catch (error) {
    entries[method] = { status: "error", message: error.message };
  }
  if (entries === state.attributions && !signal.aborted) onSettled(method);
}

/** The chosen method's state for the explanation on screen: {status, data?, message?}, or null for attention. */
export function methodEntry() {
  if (state.method === "attention") return null;
  return state.attributions[state.method] ?? { status: "loading" };
}

/** The status line under the method switch: what is being computed, or why there is no heatmap. */
export function describeMethod() {
  const entry = methodEntry();
  const method = t(`method_${state.method}`);
  if (!entry || entry.status === "ok") setStatus(null, {}, "info", "#method-status");
  else if (entry.status === "loading") setStatus("computing_method", { method }, "info", "#method-status");
  else setStatus("error", { message: entry.message }, "error", "#method-status");
  const attention = state.method === "attention";
  // The texts that say what a cell means follow the method (data-i18n, so a language switch keeps them).
  setText($("#attention-heading"), attention ? "attention" : "attributions_title");
  setText($("#heatmap-help"), attention ? "heatmap_help" : "heatmap_help_attr");
  setText($("#legend-note"), attention ? "legend_note" : "legend_note_attr");
  const note = $("#method-note");
  note.hidden = attention;
  if (!attention) setText(note, `method_note_${state.method}`);
}

function setText(node, key) {
  node.dataset.i18n = key;
  node.textContent = t(key);
}

/**
 * Per target token of `view` (pieces or words), its source share: ALTI+'s source_share, a word's the mean of
 * its pieces' (as its heatmap row is the mean of theirs). One button per token. No token is marked as suspect:
 * on this service's own translations the share tells wrong from right far worse than the trust score (bench.trust).
 */
export function renderSourceShare(view) {
  const list = $("#source-share");
  const entry = state.attributions?.[SHARE_METHOD];
  const summary = $("#share-summary");
  if (!entry || entry.status === "loading") setStatus(state.explanationId ? "computing_share" : null, {}, "info", "#share-status");
  else if (entry.status === "error") setStatus("share_error", { message: entry.message }, "error", "#share-status");
  else setStatus(null, {}, "info", "#share-status");
  if (entry?.status !== "ok" || !view) {
    list.replaceChildren();
    summary.textContent = "";
    return;
  }
  const pieceShares = entry.data.source_share;
  const { targetLang } = languages();
  const shares = view.target.map((token) => token.pieces.reduce((sum, i) => sum + pieceShares[i], 0) / token.pieces.length);
  list.replaceChildren(
    ...view.target.map((token, index) => {
      const share = shares[index];
      const values = { token: token.raw, share: percent(share), prefix: percent(Math.max(0, 1 - share)) };
      return el(
        "li",
        {},
        el(
          "button",
          {
            type: "button",
            class: "conf-token share-token tok-target",
            "data-t": index,
            "data-share": share,
            "aria-pressed": "false",
            "data-tip": t("share_tip", values),
            lang: targetLang,
          },
          el("span", { class: `tok-label${token.special ? " special" : ""}` }, token.label),
          el("span", { class: "conf-bar", style: { "--p": Math.min(1, Math.max(0, share)).toFixed(4) } }),
          el("span", { class: "conf-value num" }, percent(share)),
        ),
      );
    }),
  );
  const mean = pieceShares.length ? pieceShares.reduce((a, b) => a + b, 0) / pieceShares.length : 0;
  summary.textContent = t("share_summary", { mean: fixed(mean, 3), total: shares.length });
}
