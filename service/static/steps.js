// The step-by-step panel: one head's attention for one query, X → Q, K, V → Q·Kᵀ → ÷√d_k, softmax → Σ weights·V,
// drawn from the numbers of POST /v1/explain.

import { el, fixed } from "./dom.js";
import { t } from "./i18n.js";

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

export function renderSteps(container, data) {
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
    data.note && el("p", { class: "note" }, data.note),
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
