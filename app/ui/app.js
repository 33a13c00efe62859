// The page's router: one shell, client-side views, shareable links.
import { forgetKey, hasKey, onKeyNeeded } from "./api.js";
import { clear, errorBox, h } from "./dom.js";
import { historyView, hubView } from "./lists.js";
import { reportView } from "./report.js";
import { scanView } from "./scan.js";
import { tensorView } from "./tensors.js";

const view = document.getElementById("view");

const ROUTES = [
  [/^\/ui\/?$/, () => scanView(view, navigate)],
  [/^\/ui\/scans\/([0-9a-f]{32})$/, (m) => reportView(view, m[1])],
  [/^\/ui\/scans\/([0-9a-f]{32})\/tensors$/, (m) => tensorView(view, m[1])],
  [/^\/ui\/history$/, () => historyView(view)],
  [/^\/ui\/hub$/, () => hubView(view)],
];

let generation = 0;

async function render() {
  generation += 1;
  const mine = generation;
  const path = location.pathname;
  for (const link of document.querySelectorAll("header nav a")) {
    link.toggleAttribute("aria-current", link.getAttribute("href") === path);
  }
  document.getElementById("forget-key").hidden = !hasKey();
  for (const [pattern, show] of ROUTES) {
    const match = pattern.exec(path);
    if (!match) continue;
    try {
      await show(match);
    } catch (error) {
      if (mine === generation) clear(view, h("h1", {}, "Something went wrong"), errorBox(error));
    }
    document.getElementById("forget-key").hidden = !hasKey();
    return;
  }
  clear(view, h("h1", {}, "Not found"), h("p", {}, "No page here."));
}

export function navigate(path) {
  history.pushState(null, "", path);
  render();
  view.focus();
}

document.addEventListener("click", (event) => {
  const link = event.target instanceof Element ? event.target.closest("a[data-nav]") : null;
  if (!link || event.ctrlKey || event.metaKey || event.shiftKey || event.button !== 0) return;
  event.preventDefault();
  navigate(link.getAttribute("href"));
});
window.addEventListener("popstate", render);

// The key dialog: asked once per session (sessionStorage), never put in a URL.
const dialog = document.getElementById("key-dialog");
const input = document.getElementById("key-input");
onKeyNeeded((retry) => new Promise((resolve) => {
  document.getElementById("key-message").textContent = retry
    ? "That key was refused. Enter a valid API key."
    : "This service needs an API key. It is kept for this browser tab only and sent as a Bearer token.";
  input.value = "";
  const done = (value) => {
    dialog.removeEventListener("close", onClose);
    resolve(value);
  };
  const onClose = () => done(dialog.returnValue === "ok" && input.value ? input.value : null);
  dialog.addEventListener("close", onClose);
  dialog.showModal();
  input.focus();
}));
document.getElementById("key-cancel").addEventListener("click", () => dialog.close("cancel"));
document.getElementById("forget-key").addEventListener("click", () => {
  forgetKey();
  render();
});

render();
