// Report view: verdict banner, findings, globals, weights-only answer and the map of the file.
import { api, query } from "./api.js";
import { bytes, clear, h, num, oneOf, row, scanLink, SEVERITIES, severityBadge, table, VERDICTS, when } from "./dom.js";
import { drawMap } from "./map.js";

const WORDS = {
  safe: "Safe: torch's weights-only load accepts it and nothing is anomalous.",
  suspicious: "Suspicious: not weights-only loadable, or structurally odd. Review before loading.",
  unsafe: "Unsafe: evidence of code execution or of an attack on scanners. Do not load.",
  invalid: "Invalid: the file could not be parsed or a resource limit was hit.",
};
// The findings that name what would run: shown in the banner.
const EVIDENCE = ["PICKLE_DANGEROUS_CALL", "PICKLE_NESTED_DESERIALIZER", "PICKLE_DANGEROUS_GLOBAL",
  "PT2_UNSAFE_TARGET", "PT2_SYMPY_EVAL", "PICKLE_GLOBAL_MUTATION"];

const rank = (severity) => {
  const i = SEVERITIES.indexOf(severity);
  return i < 0 ? SEVERITIES.length : i;
};

export function sortFindings(findings) {
  return [...findings].sort((a, b) => rank(a.severity) - rank(b.severity) || (a.offset ?? Infinity) - (b.offset ?? Infinity));
}

function banner(report) {
  const verdict = oneOf(report.verdict, VERDICTS, "invalid");
  const wo = report.weights_only || {};
  const torch = wo.loadable
    ? "torch.load(weights_only=True) would load this file."
    : `torch.load(weights_only=True) would refuse this file: ${wo.error ?? "no reason given"}`;
  const evidence = sortFindings((report.findings || []).filter((f) => EVIDENCE.includes(f.code)))
    .sort((a, b) => EVIDENCE.indexOf(a.code) - EVIDENCE.indexOf(b.code)).slice(0, 3);
  return h("section", { class: `banner verdict-${verdict}`, "aria-label": "Verdict", id: "verdict" },
    h("p", { class: "verdict-word" }, verdict.toUpperCase()),
    h("p", {}, WORDS[verdict]),
    h("p", { class: "torch" }, torch),
    evidence.length ? h("ul", { class: "evidence" }, evidence.map((f) => h("li", {}, h("code", {}, f.code), " ", f.message))) : null);
}

function facts(report) {
  const src = report.source || {};
  const items = [
    ["File", src.name ?? src.url ?? "—"], ["Size", bytes(src.size)], ["SHA-256", src.sha256 ?? "—"],
    ["Format", report.format], ["Scanned", when(report.created_at)],
    ["Scanner", `${report.scanner?.name ?? ""} ${report.scanner?.version ?? ""} (${report.scanner?.policy ?? ""})`],
  ];
  return h("dl", { class: "facts" }, items.map(([k, v]) => [h("dt", {}, k), h("dd", {}, String(v))]));
}

function copyButton(text) {
  const note = h("span", { class: "muted", role: "status" });
  const button = h("button", { type: "button" }, "Copy");
  button.addEventListener("click", async () => {
    try {
      await navigator.clipboard.writeText(text);
      note.textContent = "Copied.";
    } catch {
      note.textContent = "Select the line and copy it.";
    }
  });
  return [button, note];
}

function weightsOnly(report) {
  const wo = report.weights_only || {};
  const parts = [h("h2", {}, "What torch.load(weights_only=True) does")];
  parts.push(h("p", {}, wo.loadable ? "Loads the file." : "Raises ", wo.loadable ? null : h("code", {}, wo.error_type ?? "an error"), wo.loadable ? null : ":"));
  if (!wo.loadable && wo.error) parts.push(h("pre", { class: "torch-error" }, wo.error));
  if (wo.unsafe_globals && wo.unsafe_globals.length) {
    parts.push(h("p", {}, "Globals torch refuses (get_unsafe_globals_in_checkpoint):"),
      h("ul", { class: "plain" }, wo.unsafe_globals.map((g) => h("li", {}, h("code", {}, g)))));
  }
  if (wo.safe_globals_hint) {
    parts.push(h("p", {}, "To allow the commonly benign ones (check them first):"),
      h("div", { class: "copy-line" }, h("code", { id: "safe-globals" }, wo.safe_globals_hint), ...copyButton(wo.safe_globals_hint)));
  }
  return h("section", { "aria-label": "Weights-only load" }, ...parts);
}

function findingsTable(findings, onPick) {
  const headers = ["Severity", "Code", "Message", "Bytes"];
  const rows = sortFindings(findings).map((f) => {
    const where = f.offset === null || f.offset === undefined ? "—"
      : f.length ? `${num(f.offset)} + ${num(f.length)}` : `at ${num(f.offset)}`;
    const tr = row(headers, [severityBadge(f.severity), h("code", {}, f.code), f.message, where]);
    if (f.offset !== null && f.offset !== undefined) {
      tr.tabIndex = 0;
      tr.classList.add("pickable");
      tr.setAttribute("aria-label", `Show on the map: ${f.code} at byte ${f.offset}`);
      tr.addEventListener("click", () => onPick(f, tr));
      tr.addEventListener("keydown", (event) => {
        if (event.key === "Enter" || event.key === " ") {
          event.preventDefault();
          onPick(f, tr);
        }
      });
    }
    return tr;
  });
  return table(headers, rows, { className: "findings" });
}

function globalsTable(globals) {
  const headers = ["Global", "Status", "Uses", "Why"];
  return table(headers, globals.map((g) => row(headers, [
    h("code", {}, `${g.module}.${g.name}`),
    h("span", { class: `badge status-${oneOf(g.status, ["allowed", "benign", "unknown", "dangerous"], "unknown")}` }, String(g.status)),
    num(g.count), g.reason ?? "—"])), { className: "globals" });
}

export async function reportView(view, id) {
  clear(view, h("p", { class: "muted" }, "Loading the report…"));
  const report = await api(`/scans/${id}${query({ manifest: "false" })}`);
  const findings = report.findings || [];
  const tensorCount = report.tensor_count ?? (report.tensors ? report.tensors.length : 0);
  const size = report.source?.size ?? 0;
  const map = drawMap(report.regions || [], size, {
    regionsOmitted: report.regions_omitted || 0,
    findings,
    tensorsIn: (region) => tensorsIn(id, report, region),
  });
  clear(view,
    h("h1", {}, "Report"),
    banner(report),
    facts(report),
    h("p", {}, tensorCount ? h("a", { href: `/ui/scans/${id}/tensors`, "data-nav": true, class: "button" }, `Tensor table (${num(tensorCount)} tensors)`) : "No tensors.",
      " ", scanLink(id, "Permalink")),
    h("section", { "aria-labelledby": "map-title" }, h("h2", { id: "map-title" }, "Map of the file"), map.element),
    h("section", { "aria-labelledby": "findings-title" },
      h("h2", { id: "findings-title" }, `Findings (${num(findings.length)})`),
      findings.length ? h("p", { class: "muted" }, "Select a finding with bytes to highlight them on the map.") : null,
      findings.length ? findingsTable(findings, (f, tr) => {
        for (const other of view.querySelectorAll("tr.picked")) other.classList.remove("picked");
        tr.classList.add("picked");
        map.highlight(f);
      }) : h("p", {}, "None.")),
    weightsOnly(report),
    h("section", { "aria-labelledby": "globals-title" },
      h("h2", { id: "globals-title" }, `Globals (${num((report.globals || []).length)})`),
      (report.globals || []).length ? globalsTable(report.globals) : h("p", {}, "The pickles import nothing.")));
}

// The tensors whose first byte lies in `region`: from the report when it holds the manifest,
// else from the tensor endpoint sorted by data offset (a few pages at most).
async function tensorsIn(id, report, region) {
  const end = region.offset + region.length;
  const inside = (t) => t.data_offset !== null && t.data_offset >= region.offset && t.data_offset < end;
  if (Array.isArray(report.tensors)) return report.tensors.filter(inside).slice(0, 200);
  const found = [];
  let cursor = null;
  for (let page = 0; page < 10 && found.length < 200; page += 1) {
    const got = await api(`/scans/${id}/tensors${query({ sort: "data_offset", limit: 1000, cursor })}`);
    for (const t of got.items) if (inside(t)) found.push(t);
    const last = got.items[got.items.length - 1];
    if (!got.next_cursor || (last && last.data_offset !== null && last.data_offset >= end)) break;
    cursor = got.next_cursor;
  }
  return found.slice(0, 200);
}
