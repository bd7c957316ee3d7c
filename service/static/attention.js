// The cross-attention panel: the T×S heatmap for a chosen layer and head, the alignment lines between the
// two sentences, and the selected target token they all highlight.

import { describeMethod, loadAttributions, methodEntry, renderSourceShare } from "./attributions.js";
import { $, $$, clamp, compact, el, fixed, options, percent, svg } from "./dom.js";
import { t } from "./i18n.js";
import { alignmentSource, languages, range, state } from "./state.js";
import { buildView, displayedRows, headMatrix, isCjk } from "./tokens.js";
import { renderConfidence } from "./translation.js";

/**
 * Colour intensity of an attention weight: an absolute scale (0 → 1, the same for every head, so a head
 * that spreads its attention looks pale), square-rooted so that weights of a long row stay visible.
 */
export function intensity(weight) {
  return Math.sqrt(clamp(weight, 0, 1));
}

/**
 * How a column header is set: short labels level; Chinese wrapped two characters a line (vertical
 * CJK depends on fonts' vertical metrics, which some lack); longer Latin labels turned sideways.
 */
function headerShape(label) {
  const characters = [...label];
  if (characters.some(isCjk)) return " cjk";
  return characters.length <= 3 ? " short" : "";
}

/**
 * The T×S table: one focusable cell per (target, source) pair with data-t, data-s and data-value, from
 * view.heat (an attribution method's matrix; null while it is computed or when it failed: no table) or else
 * view.matrix (attention). With an attribution method a last column gives each row's sum, its source share.
 */
export function renderHeatmap(table, view, { showValues, sourceLang, targetLang }) {
  const matrix = view.heat === undefined ? view.matrix : view.heat;
  table.classList.toggle("values", showValues);
  if (!matrix) {
    table.replaceChildren();
    return;
  }
  const sums = view.method ? matrix.map((row) => row.reduce((a, b) => a + b, 0)) : null;
  const head = el(
    "tr",
    {},
    el("th", { class: "corner", scope: "col" }, el("span", {}, t("corner"))),
    view.source.map((token, s) =>
      el(
        "th",
        { scope: "col", class: `src-head${headerShape(token.label)}`, "data-s": s, title: token.raw, lang: sourceLang },
        el("span", { class: tokenClass(token) }, token.label),
      ),
    ),
    sums && el("th", { scope: "col", class: "sum-head" }, t("sum_column")),
  );
  const rows = view.target.map((token, row) =>
    el(
      "tr",
      { "data-t": row },
      el(
        "th",
        { scope: "row", class: "tgt-head" },
        el(
          "button",
          { type: "button", class: `tok-target ${tokenClass(token)}`, "data-t": row, "aria-pressed": "false", title: token.raw, lang: targetLang },
          token.label,
        ),
      ),
      matrix[row].map((value, s) => {
        const shade = intensity(value);
        return el(
          "td",
          {
            class: `cell${shade > 0.62 ? " hot" : ""}`,
            "data-t": row,
            "data-s": s,
            "data-value": value,
            tabindex: row === 0 && s === 0 ? 0 : -1,
            style: { "--v": shade.toFixed(4) },
          },
          showValues ? compact(value) : "",
        );
      }),
      sums &&
        el(
          "td",
          {
            class: "row-share num",
            "data-t": row,
            "data-value": sums[row],
            "data-tip": t("sum_tip", {
              target: token.label,
              share: percent(sums[row]),
              prefix: percent(Math.max(0, 1 - sums[row])),
              method: t(`method_${view.method}`),
            }),
          },
          percent(sums[row]),
        ),
    ),
  );
  table.replaceChildren(el("thead", {}, head), el("tbody", {}, rows));
}

export function tokenClass(token) {
  return ["tok", token.cont ? "cont" : "", token.special ? "special" : ""].filter(Boolean).join(" ");
}

export function cellTip(cell, view) {
  const target = view.target[Number(cell.dataset.t)];
  const source = view.source[Number(cell.dataset.s)];
  return t("cell_tip", { target: target.label, source: source.label, value: fixed(Number(cell.dataset.value), 4) });
}

/** Arrow keys, Home/End and PageUp/PageDown walk the cells; Enter or Space selects the row's target token. */
export function onHeatmapKey(event, view, selectTarget) {
  const cell = event.target.closest("td.cell");
  if (!view) return;
  if (!cell) {
    const button = event.target.closest("button.tok-target");
    if (button && event.key === "ArrowRight") {
      event.preventDefault();
      focusCell(Number(button.dataset.t), 0);
    }
    return;
  }
  const row = Number(cell.dataset.t);
  const col = Number(cell.dataset.s);
  const moves = {
    ArrowUp: [row - 1, col],
    ArrowDown: [row + 1, col],
    ArrowLeft: [row, col - 1],
    ArrowRight: [row, col + 1],
    Home: [row, 0],
    End: [row, view.source.length - 1],
    PageUp: [0, col],
    PageDown: [view.target.length - 1, col],
  };
  if (event.key in moves) {
    event.preventDefault();
    const [r, c] = moves[event.key];
    if (col === 0 && event.key === "ArrowLeft") {
      $(`#heatmap button.tok-target[data-t="${row}"]`)?.focus();
      return;
    }
    focusCell(clamp(r, 0, view.target.length - 1), clamp(c, 0, view.source.length - 1));
  } else if (event.key === "Enter" || event.key === " ") {
    event.preventDefault();
    selectTarget(row);
  }
}

function focusCell(row, col) {
  const cell = $(`#heatmap td.cell[data-t="${row}"][data-s="${col}"]`);
  if (!cell) return;
  for (const c of $$("#heatmap td.cell[tabindex='0']")) c.tabIndex = -1;
  cell.tabIndex = 0;
  cell.focus();
}

// ---------------------------------------------------------------- alignment view

export function renderAlignment(view, { sourceLang, targetLang }) {
  $("#align-source").replaceChildren(
    ...view.source.map((token, s) =>
      el("span", { class: `align-token ${tokenClass(token)}`, "data-s": s, title: token.raw, lang: sourceLang }, token.label),
    ),
  );
  $("#align-target").replaceChildren(
    ...view.target.map((token, row) =>
      el(
        "button",
        { type: "button", class: `align-token tok-target ${tokenClass(token)}`, "data-t": row, "aria-pressed": "false", title: token.raw, lang: targetLang },
        token.label,
      ),
    ),
  );
}

/** Lines from each source token to the target tokens aligned with it, thickness by attention. */
export function drawAlignmentLines(view, selected) {
  const lines = $("#align-lines");
  const box = lines.getBoundingClientRect();
  const height = box.height;
  const centre = (node) => {
    const r = node.getBoundingClientRect();
    return r.left + r.width / 2 - box.left;
  };
  const sourceX = $$("#align-source .align-token").map(centre);
  const targetX = $$("#align-target .align-token").map(centre);
  lines.setAttribute("viewBox", `0 0 ${box.width} ${height}`);
  const pairs = view.alignment.map(([s, row]) => ({ s, row, aligned: true }));
  if (selected !== null) {
    // Besides its alignment, the selected token's strongest attention (up to five more lines).
    const alignedHere = new Set(pairs.filter((p) => p.row === selected).map((p) => p.s));
    const row = view.matrix[selected];
    const strongest = Math.max(...row);
    row
      .map((value, s) => [value, s])
      .filter(([value, s]) => !alignedHere.has(s) && value >= 0.35 * strongest)
      .sort((a, b) => b[0] - a[0])
      .slice(0, 5)
      .forEach(([, s]) => pairs.push({ s, row: selected, aligned: false }));
  }
  lines.replaceChildren(
    ...pairs
      .filter(({ s, row }) => sourceX[s] !== undefined && targetX[row] !== undefined)
      .map(({ s, row, aligned }) => {
        const value = view.matrix[row][s];
        const active = selected === null ? "" : row === selected ? " active" : " dim";
        return svg("line", {
          x1: sourceX[s],
          y1: 2,
          x2: targetX[row],
          y2: height - 2,
          class: `align-line${aligned ? " aligned" : " extra"}${active}`,
          "stroke-width": (0.75 + 6 * intensity(value)).toFixed(2),
          "data-s": s,
          "data-t": row,
          "data-value": value,
        });
      }),
  );
}


// ---------------------------------------------------------------- the panel

/**
 * Open a new explanation on the alignment head (the map the served alignment is read from, as GET /v1/models
 * states it) and on the rows it is read at (the model's alignment_shift), so heatmap and lines agree; a model
 * without an alignment head aligns by its alignment layer's head average.
 */
export function showAttention(explanation) {
  const layers = explanation.cross_attention.length;
  const heads = explanation.cross_attention[0]?.length ?? 0;
  const alignment = alignmentSource(explanation);
  state.layer = clamp(alignment.layer ?? 0, 0, layers - 1);
  state.head = alignment.head ?? "avg";
  state.rows = alignment.shift ? "reads" : "predicts";
  state.selectedPiece = null;
  $("#rows-select").value = state.rows;
  options($("#layer-select"), range(layers).map((l) => ({ value: l, label: `${l + 1} / ${layers}` })), state.layer);
  options(
    $("#head-select"),
    [{ value: "avg", label: t("head_avg") }, ...range(heads).map((h) => ({ value: h, label: `${h + 1} / ${heads}` }))],
    state.head,
  );
  describeAlignmentHead();
  renderAttention();
}

/** One line under the attention controls: which layer and head the alignment is read from, and at which step. */
export function describeAlignmentHead() {
  const e = state.explanation;
  if (!e) return;
  const { layer, head, shift, reason } = alignmentSource(e);
  const note = $("#alignment-head-note");
  if (layer === undefined || layer === null) {
    note.textContent = "";
    return;
  }
  const where = head === null ? t("alignment_head_avg", { layer: layer + 1 }) : t("alignment_head", { layer: layer + 1, head: head + 1 });
  // Why that head, as /v1/models says (alignment_source): declared, Marian's guided-alignment head, or the fallback.
  const why = { declared: "alignment_declared", "marian guided alignment (model card)": "alignment_marian_card", "marian default": "alignment_marian_default", fallback: "alignment_fallback" }[reason];
  const step = shift ? t("alignment_shifted") : t("alignment_predicting");
  // Which alignment the lines are (alignment_method): both models' agreement, or this head's one-best.
  const method = e.alignment_method === "agreement" ? t("alignment_agreement") : t("alignment_head_only");
  const fallback = e.alignment_note ? t("alignment_fallback_note", { note: e.alignment_note }) : "";
  note.textContent = [where, why ? t(why) : "", step, method, fallback].filter(Boolean).join(" ");
}

/** After a language switch: the words of the panel that are not in index.html. */
export function relabelAttention() {
  const headSelect = $("#head-select");
  if (headSelect.options[0]) headSelect.options[0].textContent = t("head_avg");
  describeAlignmentHead();
}

/**
 * Draw the chosen layer and head (or head average) at the chosen rows, as pieces or words: confidence,
 * heatmap, alignment. Cells, tooltips, line widths and the summary all read the displayed rows (view.matrix).
 */
export function renderAttention() {
  const e = state.explanation;
  if (!e) return;
  // Shift the piece rows before any word merging, as the service does before it groups pieces into words.
  const matrix = displayedRows(headMatrix(e.cross_attention, state.layer, state.head), state.rows);
  const view = buildView(state.view, e.source_tokens, e.target_tokens, matrix, e.alignment ?? [], e.token_scores ?? state.translation?.token_scores);
  // The word alignment the server computed (the same on a permalink as on the fresh translation).
  const words = e.word_alignment ?? state.translation?.word_alignment;
  const targetWords = e.target_words ?? state.translation?.target_words;
  if (state.view === "words" && words && targetWords?.length === view.target.length) view.alignment = words;
  // Another method colours the heatmap alone; the alignment below stays attention's (it is read from attention).
  const entry = methodEntry();
  if (entry) {
    view.method = state.method;
    view.heat = entry.status === "ok" ? buildView(state.view, e.source_tokens, e.target_tokens, entry.data.source, [], null).matrix : null;
    view.prefix = entry.status === "ok" ? prefixParts(view, entry.data.target) : null;
  }
  state.current = view;
  describeMethod();
  renderConfidence(view);
  renderSourceShare(view);
  renderHeatmap($("#heatmap"), view, { showValues: $("#show-values").checked, ...languages() });
  renderAlignment(view, languages());
  applySelection();
}

/**
 * The heatmap's method: attention draws at once; another method draws when its attributions arrive (asked
 * for once per explanation), with a status line meanwhile.
 */
export function chooseMethod(method) {
  state.method = method;
  loadAttributions(method, onAttributions);
  renderAttention();
}

/** Attributions for the explanation on screen: the heatmap's own method's, and ALTI+'s for the source share. */
export function loadExplanationAttributions() {
  loadAttributions("alti_plus", onAttributions);
  loadAttributions(state.method, onAttributions);
}

function onAttributions(method) {
  if (method === state.method) renderAttention();
  else renderSourceShare(state.current);
}

/**
 * The target-prefix part of an attribution method, per row of `view`: its share (the row's target sum, a
 * word's the mean of its pieces') and the prefix token credited most. Column 0 of `target` is the decoder's
 * start token, column j the target piece j − 1, credited to the token of the view that holds it.
 */
function prefixParts(view, target) {
  const tokenOf = new Map();
  view.target.forEach((token, row) => token.pieces.forEach((piece) => tokenOf.set(piece, row)));
  return view.target.map((token) => {
    const totals = new Map(); // view row (−1: the start token) → its share
    for (const piece of token.pieces)
      target[piece].forEach((value, j) => {
        const key = j === 0 ? -1 : tokenOf.get(j - 1);
        totals.set(key, (totals.get(key) ?? 0) + value / token.pieces.length);
      });
    const share = [...totals.values()].reduce((a, b) => a + b, 0);
    const [key, value] = [...totals].reduce((best, item) => (item[1] > best[1] ? item : best), [-1, -Infinity]);
    return { share, top: key === -1 ? t("start_token") : view.target[key].label, value };
  });
}

/** Redraw the heatmap alone (numbers on or off), keeping the selection. */
export function redrawHeatmap() {
  if (!state.current) return;
  renderHeatmap($("#heatmap"), state.current, { showValues: $("#show-values").checked, ...languages() });
  applySelection();
}

export function redrawLines() {
  if (state.current && !$("#results").hidden) drawAlignmentLines(state.current, selectedRow());
}

// ---------------------------------------------------------------- selection

function selectedRow() {
  if (state.selectedPiece === null || !state.current) return null;
  const row = state.current.target.findIndex((token) => token.pieces.includes(state.selectedPiece));
  return row < 0 ? null : row;
}

/** Select the target token of a row of the view on screen; false when there is none. */
export function selectTarget(row) {
  const token = state.current?.target[row];
  if (!token) return false;
  state.selectedPiece = token.pieces[0];
  applySelection();
  return true;
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
  const prefix = view.prefix?.[row];
  if (prefix) {
    const values = { method: t(`method_${view.method}`), prefix: percent(prefix.share), top: `“${prefix.top}” (${percent(prefix.value)})` };
    summary.append(" ", el("span", { id: "prefix-summary" }, t("selection_prefix", values)));
  }
}
