// The translate form and the translation panel: models and limits from the server, the translation with
// its score, each token's confidence and the n-best alternatives.

import { fetchModels, fetchTranslateLimits, LatestRequest } from "./api.js";
import { $, clamp, el, fixed, options, percent } from "./dom.js";
import { t } from "./i18n.js";
import { beamLimits, languages, modelInfo, setStatus, state } from "./state.js";

const modelRequests = new LatestRequest();

/** Fill the language pair list from GET /v1/models, and the form's limits from the server's schema. */
export async function loadModels() {
  const select = $("#model-select");
  const request = modelRequests.begin();
  try {
    const [models, limits] = await Promise.all([fetchModels(request.signal), fetchTranslateLimits().catch(() => ({}))]);
    if (!request.current()) return;
    state.models = models;
    state.limits = limits;
    if (!models.length) throw new Error(t("no_models"));
    const items = models.map((m) => ({
      value: m.id,
      label: m.source_lang && m.target_lang ? `${m.source_lang} → ${m.target_lang}  ·  ${m.id}` : m.id,
    }));
    const preferred = models.find((m) => m.source_lang === "en" && m.target_lang === "zh") ?? models[0];
    options(select, items, state.explanation?.model ?? preferred.id);
    applyFormLimits();
  } catch (error) {
    if (!request.current()) return;
    options(select, [{ value: "", label: t("no_models") }]);
    setStatus("error", { message: error.message }, "error");
  } finally {
    request.done();
  }
}

function setRange(input, { min, max }) {
  input.min = String(min);
  if (Number.isFinite(max)) input.max = String(max);
  else input.removeAttribute("max");
}

/**
 * The form takes the limits the server states for the chosen model (GET /v1/models, else the request schema):
 * beam size and n-best ranges, n-best ≤ beam size, the longest text.
 */
export function applyFormLimits() {
  const { beamSize, nBest } = beamLimits($("#model-select").value);
  setRange($("#beam-size"), beamSize);
  const beam = parseInt($("#beam-size").value, 10);
  setRange($("#n-best"), { min: nBest.min, max: Number.isFinite(beam) ? Math.min(nBest.max, beam) : nBest.max });
  const textChars = modelInfo($("#model-select").value).max_text_characters ?? state.limits.textChars;
  if (Number.isFinite(textChars)) $("#source-text").maxLength = textChars;
  else $("#source-text").removeAttribute("maxlength");
}

/** The form's beam size and n-best, brought into range (and shown as sent). */
export function beamSettings() {
  const limits = beamLimits($("#model-select").value);
  const beamSize = clamp(parseInt($("#beam-size").value, 10) || limits.beamSize.min, limits.beamSize.min, limits.beamSize.max);
  const nBest = clamp(parseInt($("#n-best").value, 10) || limits.nBest.min, limits.nBest.min, Math.min(limits.nBest.max, beamSize));
  $("#beam-size").value = beamSize;
  $("#n-best").value = nBest;
  return { beamSize, nBest };
}

/**
 * The translation with what it kept marked (protected spans and glossary terms, by their target spans), and the
 * list of them: each span's text and kind, each term's source and target.
 */
function renderKept(translation, text) {
  const kept = [
    ...(translation?.protected ?? []).map((span) => ({ ...span, label: t(`kept_${span.kind}`) })),
    ...(translation?.terms ?? []).map((term) => ({ ...term, text: term.target, kind: "term", label: t("kept_term", term) })),
  ].sort((a, b) => a.target_span[0] - b.target_span[0]);
  const parts = [];
  let cursor = 0;
  for (const item of kept) {
    const [start, end] = item.target_span;
    if (start < cursor || end > text.length) continue; // never split what is already drawn
    parts.push(text.slice(cursor, start), el("mark", { class: `kept kept-${item.kind}`, title: item.label }, text.slice(start, end)));
    cursor = end;
  }
  parts.push(text.slice(cursor));
  $("#translation-text").replaceChildren(...parts.filter((part) => part !== ""));
  $("#kept-block").hidden = kept.length === 0;
  $("#kept-spans").replaceChildren(
    ...kept.map((item) => el("li", { class: `kept-${item.kind}` }, el("code", {}, item.text), " ", el("span", { class: "meta" }, item.label))),
  );
}

/** The trust block: the score, its findings, and both sentences' words with the flagged ones marked. */
export function renderTrust(translation) {
  const block = $("#trust-block");
  const trust = translation?.trust;
  block.hidden = !trust;
  if (!trust) return;
  const { sourceLang, targetLang } = languages();
  $("#trust-score").textContent = percent(trust.score);
  $("#trust-score").dataset.score = String(trust.score);
  $("#trust-note").textContent = t(trust.calibrated ? "trust_calibrated" : "trust_uncalibrated", { mode: trust.mode });
  // What such a score meant on held-out sentences (the calibration's reliability bin), in words.
  const heldOut = trust.held_out;
  const meaning = $("#trust-meaning");
  meaning.hidden = !heldOut;
  meaning.textContent = heldOut
    ? t("trust_meaning", { count: Math.round(heldOut.adequate * 10), answers: heldOut.answers })
    : "";
  const flags = trust.flags ?? [];
  $("#trust-flags").replaceChildren(
    ...(flags.length
      ? flags.map((flag) =>
          el(
            "li",
            { class: `trust-flag flag-${flag.kind}`, "data-kind": flag.kind },
            el("strong", {}, t(`flag_${flag.kind}`)),
            " ",
            el("span", { lang: flag.side === "source" ? sourceLang : targetLang }, flag.text.join(" ")),
          ),
        )
      : [el("li", { class: "trust-flag none" }, t("trust_none"))]),
  );
  for (const [side, id, words, lang] of [
    ["source", "#trust-source", translation.source_words ?? [], sourceLang],
    ["target", "#trust-target", translation.target_words ?? [], targetLang],
  ]) {
    const kinds = new Map();
    for (const flag of flags) {
      if (flag.side !== side) continue;
      for (const index of flag.words) kinds.set(index, [...(kinds.get(index) ?? []), flag.kind]);
    }
    const container = $(id);
    container.lang = lang;
    container.replaceChildren(
      ...words.flatMap((word, index) => {
          if (word === "</s>") return [];
          const marked = kinds.get(index);
          const node = marked
            ? el("mark", { class: `flagged ${marked.map((k) => `flag-${k}`).join(" ")}`, "data-w": index, "data-flags": marked.join(" ") }, word)
            : el("span", { "data-w": index }, word);
          return /[\u3000-\u9fff\uff00-\uffef]/.test(word) ? [node] : [node, " "]; // Chinese runs on without spaces
        }),
    );
  }
}

export function renderTranslation() {
  const e = state.explanation;
  const tr = state.translation;
  const { targetLang } = languages();
  renderKept(tr, tr?.text ?? e.translation ?? "");
  $("#translation-text").lang = targetLang;
  const scores = tr?.token_scores ?? e.token_scores ?? [];
  const score = tr?.score ?? scores.reduce((a, b) => a + b, 0);
  $("#translation-score").textContent = fixed(score, 3);
  $("#translation-model").textContent = e.model ?? tr?.model ?? "";
  renderTrust(tr);
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
            lang: targetLang,
          },
          hypothesis.text,
        ),
        el("span", { class: "alt-score num" }, t("alt_score", { score: fixed(hypothesis.score, 3) })),
        mean !== null && el("span", { class: "alt-score num" }, `· ⌀ ${percent(mean)}`),
      );
    }),
  );
}

/** One button per target token of `view` (pieces or words): its probability, exp(log-probability). */
export function renderConfidence(view) {
  const list = $("#confidence");
  if (!view.logprobs) {
    list.replaceChildren();
    return;
  }
  const { targetLang } = languages();
  const glossary = new Set(state.translation?.glossary_tokens ?? []); // pieces a glossary term set
  list.replaceChildren(
    ...view.target.map((token, index) => {
      const p = Math.exp(view.logprobs[index]);
      const level = p >= 0.7 ? "high" : p >= 0.35 ? "mid" : "low";
      const set = token.pieces.some((i) => glossary.has(i));
      return el(
        "li",
        {},
        el(
          "button",
          {
            type: "button",
            class: `conf-token tok-target ${level}${set ? " glossary" : ""}`,
            "data-t": index,
            "data-prob": p,
            "data-logprob": view.logprobs[index],
            "aria-pressed": "false",
            "data-tip": `${token.raw}: ${t("prob", { p: fixed(p, 4) })}${set ? ` · ${t("glossary_token")}` : ""}`,
            lang: targetLang,
          },
          el("span", { class: `tok-label${token.special ? " special" : ""}` }, token.label),
          el("span", { class: "conf-bar", style: { "--p": p.toFixed(4) } }),
          el("span", { class: "conf-value num" }, percent(p)),
        ),
      );
    }),
  );
}
