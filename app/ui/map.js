// The map of the file: one bar from byte 0 to the end, a box per region, anomalies on top.
import { clear, h, num, row, severityBadge, table } from "./dom.js";

export const KINDS = {
  pickle: "pickle", tensor_data: "tensor data", metadata: "metadata record", record: "record",
  records: "records (merged)", header: "format header", local_header: "zip local header",
  data_descriptor: "zip data descriptor", central_directory: "zip central directory",
  end_records: "zip end records", prepended: "prepended bytes", appended: "appended bytes",
  unreferenced_data: "bytes no entry accounts for", overlap: "overlapping entries",
  unreferenced_record: "unreferenced record", trailing_data: "trailing bytes",
};
export const ANOMALOUS = ["prepended", "appended", "unreferenced_data", "overlap", "unreferenced_record", "trailing_data"];
const BULK = ["local_header", "data_descriptor", "tensor_data", "metadata", "record", "records"];

const kindOf = (region) => (Object.hasOwn(KINDS, region.kind) ? region.kind : "record");
const span = (offset, length) => `bytes ${num(offset)} to ${num(offset + length)} (${num(length)} bytes)`;

export function drawMap(regions, size, { regionsOmitted, findings, tensorsIn }) {
  const total = Math.max(size, ...regions.map((r) => r.offset + r.length), 1);
  const percent = (n) => `${(Math.min(Math.max(n, 0), total) / total) * 100}%`;
  const bar = h("div", { class: "map-bar", id: "map-bar", role: "group", "aria-label": `Map of the file: ${num(total)} bytes` });
  const hover = h("p", { class: "map-hover", "aria-live": "polite" }, "Hover over or focus a region to see its bytes.");
  const detail = h("div", { class: "map-detail", id: "map-detail" });
  const mark = h("div", { class: "map-hl", id: "map-hl", hidden: true });
  const focusable = regions.length <= 400;
  const boxes = [];

  // bulk first, anomalies last: later boxes are drawn over earlier ones
  const ordered = [...regions].sort((a, b) => ANOMALOUS.includes(kindOf(a)) - ANOMALOUS.includes(kindOf(b)));
  for (const region of ordered) {
    const kind = kindOf(region);
    const anomalous = ANOMALOUS.includes(kind);
    const label = `${KINDS[kind]}: ${region.name}, ${span(region.offset, region.length)}`;
    const box = h("button", {
      type: "button", class: `region kind-${kind}${anomalous ? " anomalous" : ""}`, title: label, "aria-label": label,
      tabindex: focusable || !BULK.includes(kind) ? "0" : "-1",
    });
    box.style.left = percent(region.offset);
    box.style.width = percent(region.length);
    box.addEventListener("mouseenter", () => clear(hover, label));
    box.addEventListener("focus", () => clear(hover, label));
    box.addEventListener("click", () => pick(region, box));
    boxes.push([region, box]);
    bar.append(box);
  }
  bar.append(mark);

  async function pick(region, box) {
    for (const [, other] of boxes) other.classList.remove("selected");
    box.classList.add("selected");
    const end = region.offset + region.length;
    const touching = findings.filter((f) => f.offset !== null && f.offset !== undefined
      && f.offset < end && f.offset + Math.max(f.length || 0, 1) > region.offset);
    clear(detail, h("h3", {}, `${KINDS[kindOf(region)]}: `, h("span", { class: "name" }, region.name)),
      h("p", {}, span(region.offset, region.length)),
      touching.length
        ? table(["Severity", "Code", "Message"], touching.map((f) => row(["Severity", "Code", "Message"], [severityBadge(f.severity), h("code", {}, f.code), f.message])), { caption: "Findings in this region" })
        : h("p", { class: "muted" }, "No finding in this region."),
      h("p", { class: "muted" }, "Looking for tensors…"));
    const tensors = await tensorsIn(region).catch(() => []);
    detail.lastChild.remove();
    if (tensors.length) {
      const headers = ["Tensor", "dtype", "Shape", "Data offset", "Bytes"];
      detail.append(table(headers, tensors.map((t) => row(headers, [t.name, t.dtype, `[${(t.shape || []).join(", ")}]`, num(t.data_offset), num(t.nbytes)])),
        { caption: `Tensors whose data starts here (${tensors.length >= 200 ? "first 200" : num(tensors.length)})` }));
    } else {
      detail.append(h("p", { class: "muted" }, "No tensor data starts in this region."));
    }
  }

  function highlight(finding) {
    const length = Math.max(finding.length || 0, 1);
    mark.hidden = false;
    mark.style.left = percent(finding.offset);
    mark.style.width = percent(length);
    mark.setAttribute("title", `${finding.code}: ${span(finding.offset, length)}`);
    clear(hover, `Highlighted ${finding.code}: ${span(finding.offset, length)}`);
    for (const [region, box] of boxes) {
      const hit = region.offset < finding.offset + length && finding.offset < region.offset + region.length;
      box.classList.toggle("selected", hit && (ANOMALOUS.includes(kindOf(region)) || length > 1));
    }
    bar.scrollIntoView({ block: "center", behavior: "instant" });
  }

  const present = [...new Set(regions.map(kindOf))];
  const legend = h("ul", { class: "legend", "aria-label": "Legend" },
    present.map((kind) => h("li", {}, h("span", { class: `swatch kind-${kind}` }), KINDS[kind])));
  const element = h("div", { class: "map" },
    regions.length ? null : h("p", { class: "muted" }, "This report has no map (scanned by an older version or nothing to draw)."),
    h("div", { class: "map-axis" }, h("span", {}, "0"), h("span", {}, `${num(total)} bytes`)),
    bar, hover, legend,
    regionsOmitted ? h("p", { class: "muted" }, `${num(regionsOmitted)} more regions were not listed by the scanner.`) : null,
    detail);
  return { element, highlight };
}
