// History: recent scans (verdict/format filters, sha256 search); the hub's revisions.
import { api, query } from "./api.js";
import { clear, errorBox, h, num, oneOf, row, scanLink, SEVERITIES, table, verdictBadge, when } from "./dom.js";

const FORMATS = ["torch-zip", "torch-legacy", "torch-tar", "torchscript", "torch-export", "pickle",
  "numpy", "numpy-zip", "safetensors", "unknown"];

// A summary counts findings per severity; an older full report lists them.
function worst(item) {
  const counts = item.counts?.findings;
  if (counts) {
    const sev = SEVERITIES.find((s) => counts[s]);
    return sev ? `${num(counts[sev])} ${sev}` : "none";
  }
  const findings = item.findings || [];
  const sev = SEVERITIES.find((s) => findings.some((f) => f.severity === s));
  return sev ? `${num(findings.filter((f) => f.severity === sev).length)} ${sev}` : "none";
}

function select(id, label, values) {
  return h("label", {}, `${label} `, h("select", { id, name: id }, h("option", { value: "" }, "any"), values.map((v) => h("option", { value: v }, v))));
}

function paged(view, title, form, fetchPage, renderItems) {
  const list = h("div", { class: "list" });
  const more = h("button", { type: "button", hidden: true }, "Load more");
  const status = h("div", { role: "status", "aria-live": "polite" });
  let cursor = null;
  let latest = 0;   // a newer search wins over an answer still on its way
  async function load(reset) {
    const mine = reset ? ++latest : latest;
    try {
      const page = await fetchPage(reset ? null : cursor);
      if (mine !== latest) return;
      if (reset) list.replaceChildren();
      list.append(renderItems(page.items));
      clear(status, page.items.length || !reset ? "" : "Nothing yet.");
      cursor = page.next_cursor;
      more.hidden = !cursor;
    } catch (error) {
      if (mine === latest) clear(status, errorBox(error));
    }
  }
  more.addEventListener("click", () => load(false));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    load(true);
  });
  form.addEventListener("change", () => load(true));
  clear(view, h("h1", {}, title), form, status, list, more);
  return load(true);
}

export function historyView(view) {
  const sha = h("input", { type: "search", id: "sha256", name: "sha256", placeholder: "64 hex digits", pattern: "[0-9a-fA-F]{64}", size: "30" });
  const form = h("form", { class: "filters" },
    select("verdict", "Verdict", ["safe", "suspicious", "unsafe", "invalid"]),
    select("format", "Format", FORMATS),
    h("label", {}, "SHA-256 ", sha), h("button", { type: "submit" }, "Search"));
  const headers = ["Scanned", "File", "Format", "Verdict", "Worst findings", ""];
  return paged(view, "Recent scans", form, (cursor) => {
    const data = new FormData(form);
    return api(`/scans${query({ limit: 50, cursor, verdict: data.get("verdict"), format: data.get("format"), sha256: data.get("sha256") })}`);
  }, (items) => table(headers, items.map((s) => row(headers, [
    when(s.created_at), h("span", { class: "name" }, s.source?.name ?? s.source?.url ?? "—"), String(s.format),
    verdictBadge(s.verdict), worst(s), scanLink(s.id, "Open report")]))));
}

export function hubView(view) {
  const form = h("form", { class: "filters" }, select("state", "State", ["queued", "running", "done", "failed"]));
  const fileHeaders = ["Path", "State", "Verdict", "Report"];
  return paged(view, "Hub revisions", form, (cursor) => {
    const data = new FormData(form);
    return api(`/hub/revisions${query({ limit: 20, cursor, state: data.get("state") })}`);
  }, (items) => items.map((r) => h("section", { class: "revision" },
    h("h2", {}, h("span", { class: "name" }, `${r.repo_type}/${r.repo}`), " @ ", h("code", {}, String(r.revision).slice(0, 12))),
    h("p", {}, verdictBadge(r.verdict), ` ${oneOf(r.state, ["queued", "running", "done", "failed"], "unknown")} · ${r.ref ?? "no ref"} · ${when(r.created_at)}`,
      r.file_count !== undefined ? ` · ${num(r.file_count)} files` : ""),
    r.error ? h("p", { class: "error" }, r.error) : null,
    table(fileHeaders, (r.files || []).map((f) => row(fileHeaders, [
      h("span", { class: "name" }, f.path), String(f.state), f.verdict ? verdictBadge(f.verdict) : "—",
      f.report_id ? scanLink(f.report_id, "Open report") : (f.error ?? "—")])))))) ;
}
