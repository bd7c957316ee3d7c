// The one tooltip of the page: a heatmap cell's weight, or any element's data-tip, on hover and on focus.

import { cellTip } from "./attention.js";
import { $, clamp } from "./dom.js";
import { state } from "./state.js";

function show(node) {
  const tip = $("#tooltip");
  const text = node.matches("td.cell") ? cellTip(node, state.current) : node.dataset.tip;
  if (!text) return;
  if (node.matches("td.cell")) node.setAttribute("aria-label", text); // screen readers hear what the eye sees
  tip.textContent = text;
  tip.hidden = false;
  const r = node.getBoundingClientRect();
  const w = tip.offsetWidth;
  const h = tip.offsetHeight;
  const left = clamp(r.left + r.width / 2 - w / 2, 4, window.innerWidth - w - 4);
  let top = r.top - h - 8;
  if (top < 4) top = r.bottom + 8;
  tip.style.left = `${left + window.scrollX}px`;
  tip.style.top = `${top + window.scrollY}px`;
}

function hide() {
  $("#tooltip").hidden = true;
}

function follow(event) {
  const node = event.target.closest?.("td.cell, [data-tip]");
  if (node && (!node.matches("td.cell") || state.current)) show(node);
  else hide();
}

export function installTooltip() {
  document.addEventListener("mouseover", follow);
  document.addEventListener("focusin", follow);
  document.addEventListener("keydown", (event) => event.key === "Escape" && hide());
}
