// Small DOM helpers shared by the viewer's modules.

export const $ = (selector, root = document) => root.querySelector(selector);
export const $$ = (selector, root = document) => [...root.querySelectorAll(selector)];

/** el("td", {class: "cell", "data-t": 3}, "text", child) */
export function el(tag, attributes = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (value === undefined || value === null || value === false) continue;
    if (name === "class") node.className = value;
    else if (name === "style" && typeof value === "object") for (const [k, v] of Object.entries(value)) node.style.setProperty(k, v);
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat()) if (child !== undefined && child !== null && child !== false) node.append(child);
  return node;
}

export function svg(tag, attributes = {}) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, String(value));
  return node;
}

/** 0.4213 → ".42"; 1 → "1"; negative and large numbers keep their sign and scale. */
export function compact(value) {
  if (value >= 0.995) return "1";
  return value.toFixed(2).replace(/^0\./, ".");
}

export function clamp(value, low, high) {
  return Math.min(Math.max(value, low), high);
}

export function fixed(value, digits = 3) {
  return Number(value).toFixed(digits);
}

export function percent(p) {
  return p >= 0.995 ? "100%" : p < 0.001 ? "<0.1%" : `${(p * 100).toFixed(p < 0.1 ? 1 : 0)}%`;
}

export function options(select, items, selected) {
  select.replaceChildren(...items.map(({ value, label }) => el("option", { value }, label)));
  if (selected !== undefined && items.some((i) => String(i.value) === String(selected))) select.value = String(selected);
}
