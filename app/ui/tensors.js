// Tensor table: paged by the server (GET /scans/{id}/tensors), filter by name and dtype,
// sort by size or offset, totals per dtype.
import { api, query } from "./api.js";
import { bytes, clear, h, num, row, table } from "./dom.js";

const SORTS = [["index", "File order"], ["-nbytes", "Largest first"], ["nbytes", "Smallest first"],
  ["data_offset", "Offset, ascending"], ["-data_offset", "Offset, descending"]];
const HEADERS = ["#", "Name", "dtype", "Shape", "Stride", "Storage offset", "Data offset", "Bytes"];

export async function tensorView(view, id) {
  const state = { name: "", dtype: "", sort: "index", limit: 100, cursors: [null] };
  const nameInput = h("input", { type: "search", id: "tensor-name", placeholder: "part of a name", autocomplete: "off" });
  const dtypeSelect = h("select", { id: "tensor-dtype" }, h("option", { value: "" }, "all dtypes"));
  const sortSelect = h("select", { id: "tensor-sort" }, SORTS.map(([v, label]) => h("option", { value: v }, label)));
  const limitSelect = h("select", { id: "tensor-limit" }, [50, 100, 500, 1000].map((n) => h("option", { value: String(n), selected: n === 100 }, String(n))));
  const prev = h("button", { type: "button", id: "tensor-prev" }, "Previous");
  const next = h("button", { type: "button", id: "tensor-next" }, "Next");
  const info = h("p", { id: "tensor-info", role: "status", "aria-live": "polite" });
  const body = h("div", { id: "tensor-table" });
  const totals = h("div", { id: "dtype-totals" });
  let dtypesKnown = false;
  let loading = 0;

  async function load() {
    loading += 1;
    const mine = loading;
    const cursor = state.cursors[state.cursors.length - 1];
    const page = await api(`/scans/${id}/tensors${query({ cursor, limit: state.limit, name: state.name, dtype: state.dtype, sort: state.sort })}`);
    if (mine !== loading) return;
    const first = (state.cursors.length - 1) * state.limit;
    clear(info, page.total ? `Rows ${num(first + 1)}–${num(first + page.items.length)} of ${num(page.total)}` : "No tensor matches.");
    clear(body, table(HEADERS, page.items.map((t) => row(HEADERS, [
      num(t.index), h("span", { class: "name" }, t.name), t.dtype, `[${(t.shape || []).join(", ")}]`,
      `[${(t.stride || []).join(", ")}]`, num(t.storage_offset), num(t.data_offset), num(t.nbytes)])),
    { className: "tensors" }));
    prev.disabled = state.cursors.length <= 1;
    next.disabled = !page.next_cursor;
    next.onclick = () => {
      state.cursors.push(page.next_cursor);
      load();
    };
    if (!dtypesKnown && Array.isArray(page.dtypes)) {
      dtypesKnown = true;
      for (const d of page.dtypes) dtypeSelect.append(h("option", { value: d.dtype }, `${d.dtype} (${num(d.count)})`));
      const headers = ["dtype", "Tensors", "Bytes"];
      clear(totals, table(headers, page.dtypes.map((d) => row(headers, [d.dtype, num(d.count), bytes(d.nbytes)])), { caption: "Totals per dtype" }));
    }
  }

  const restart = () => {
    state.cursors = [null];
    load();
  };
  let timer = null;
  nameInput.addEventListener("input", () => {
    clearTimeout(timer);
    timer = setTimeout(() => {
      state.name = nameInput.value;
      restart();
    }, 250);
  });
  dtypeSelect.addEventListener("change", () => {
    state.dtype = dtypeSelect.value;
    restart();
  });
  sortSelect.addEventListener("change", () => {
    state.sort = sortSelect.value;
    restart();
  });
  limitSelect.addEventListener("change", () => {
    state.limit = Number(limitSelect.value);
    restart();
  });
  prev.addEventListener("click", () => {
    if (state.cursors.length > 1) state.cursors.pop();
    load();
  });

  clear(view,
    h("h1", {}, "Tensors"),
    h("p", {}, h("a", { href: `/ui/scans/${id}`, "data-nav": true }, "← Back to the report")),
    h("form", { class: "filters", onsubmit: (event) => event.preventDefault() },
      h("label", {}, "Name ", nameInput), h("label", {}, "dtype ", dtypeSelect),
      h("label", {}, "Sort ", sortSelect), h("label", {}, "Rows ", limitSelect)),
    totals, info, h("div", { class: "pager" }, prev, next), body);
  await load();
}
