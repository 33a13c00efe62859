// DOM helpers. Everything shown comes from the scanned file, so text goes in as text nodes
// only: no innerHTML, no insertAdjacentHTML, no data in attributes other than title/aria.

export function h(tag, props = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") el.className = value;
    else if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  append(el, children);
  return el;
}

export function append(el, children) {
  for (const child of [children].flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

export function clear(el, ...children) {
  el.replaceChildren();
  return append(el, children);
}

const NUMBER = new Intl.NumberFormat("en-US");
export const num = (n) => (n === null || n === undefined ? "—" : NUMBER.format(n));

export function bytes(n) {
  if (n === null || n === undefined) return "—";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = n;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return unit === 0 ? `${NUMBER.format(n)} B` : `${value.toFixed(1)} ${units[unit]} (${NUMBER.format(n)} B)`;
}

export function when(iso) {
  if (!iso) return "—";
  const date = new Date(iso);
  return Number.isNaN(date.getTime()) ? String(iso) : date.toISOString().replace("T", " ").slice(0, 19) + " UTC";
}

// Values used in class names come from closed lists only.
export function oneOf(value, allowed, fallback) {
  return allowed.includes(value) ? value : fallback;
}

export const VERDICTS = ["safe", "suspicious", "unsafe", "invalid"];
export const SEVERITIES = ["critical", "high", "medium", "low", "info"];
export const SCAN_ID = /^[0-9a-f]{32}$/;

export function verdictBadge(verdict) {
  const v = oneOf(verdict, VERDICTS, "unknown");
  return h("span", { class: `badge verdict-${v}` }, v === "unknown" ? String(verdict ?? "—") : v.toUpperCase());
}

export function severityBadge(severity) {
  const s = oneOf(severity, SEVERITIES, "info");
  return h("span", { class: `badge sev-${s}` }, s);
}

export function scanLink(id, text) {
  return SCAN_ID.test(String(id)) ? h("a", { href: `/ui/scans/${id}`, "data-nav": true }, text) : String(text);
}

export function table(headers, rows, { caption, className } = {}) {
  return h("div", { class: "table-wrap" },
    h("table", { class: className ?? "" },
      caption ? h("caption", {}, caption) : null,
      h("thead", {}, h("tr", {}, headers.map((label) => h("th", { scope: "col" }, label)))),
      h("tbody", {}, rows)));
}

// A row for stacked (narrow) layouts: every cell carries its column's name.
export function row(headers, cells, props = {}) {
  return h("tr", props, cells.map((cell, i) => h("td", { "data-label": headers[i] }, cell)));
}

export function errorBox(error) {
  const problem = error && error.problem;
  const code = problem && typeof problem.code === "string" ? problem.code : null;
  const detail = problem && typeof problem.detail === "string" ? problem.detail : String(error && error.message || error);
  return h("div", { class: "error", role: "alert" }, code ? h("strong", {}, code, ": ") : null, detail);
}
