// The cross-attention views: the T×S heatmap and the alignment lines between the two sentences.

import { $, $$, clamp, compact, el, fixed, svg } from "./dom.js";
import { t } from "./i18n.js";
import { isCjk } from "./tokens.js";

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

/** The T×S table: one focusable cell per (target, source) pair with data-t, data-s and data-value. */
export function renderHeatmap(table, view, { showValues, sourceLang, targetLang }) {
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
      view.matrix[row].map((value, s) => {
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
    ),
  );
  table.classList.toggle("values", showValues);
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

