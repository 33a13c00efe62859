// Scan: drop or choose a file (progress, cancel), or paste a URL; the report opens when done.
import { api, ensureAccess, upload } from "./api.js";
import { bytes, clear, errorBox, h } from "./dom.js";

export function scanView(view, navigate) {
  const status = h("div", { class: "status", role: "status", "aria-live": "polite" });
  const progress = h("progress", { max: "100", value: "0", hidden: true });
  const cancel = h("button", { type: "button", hidden: true }, "Cancel upload");
  const fileInput = h("input", { type: "file", id: "file-input", class: "visually-hidden" });
  const chooser = h("label", { for: "file-input", class: "button primary" }, "Choose a file");
  let current = null;

  const done = (report) => {
    if (report && typeof report.id === "string") navigate(`/ui/scans/${report.id}`);
  };

  async function send(file) {
    if (current) return;
    clear(status, `Checking access…`);
    try {
      await ensureAccess();
    } catch (error) {
      clear(status, errorBox(error));
      return;
    }
    current = upload(file, (loaded, total) => {
      progress.value = Math.round((loaded / total) * 100);
      clear(status, `Uploading ${file.name}: ${bytes(loaded)} of ${bytes(total)}`);
      if (loaded === total) clear(status, `Scanning ${file.name}…`);
    });
    progress.hidden = false;
    progress.value = 0;
    cancel.hidden = false;
    clear(status, `Uploading ${file.name}…`);
    try {
      done(await current.promise);
    } catch (error) {
      clear(status, errorBox(error));
    } finally {
      current = null;
      progress.hidden = true;
      cancel.hidden = true;
    }
  }

  cancel.addEventListener("click", () => current && current.abort());
  fileInput.addEventListener("change", () => {
    if (fileInput.files.length) send(fileInput.files[0]);
    fileInput.value = "";
  });

  const zone = h("div", { class: "dropzone", id: "dropzone" },
    h("p", {}, "Drop a checkpoint here"), h("p", { class: "muted" }, "or"), chooser, fileInput);
  zone.addEventListener("dragover", (event) => {
    event.preventDefault();
    zone.classList.add("over");
  });
  zone.addEventListener("dragleave", () => zone.classList.remove("over"));
  zone.addEventListener("drop", (event) => {
    event.preventDefault();
    zone.classList.remove("over");
    const file = event.dataTransfer && event.dataTransfer.files[0];
    if (file) send(file);
  });

  const urlInput = h("input", { type: "url", id: "url-input", name: "url", placeholder: "URL of a checkpoint (http or https)", required: true });
  const urlForm = h("form", { class: "url-form" },
    h("label", { for: "url-input" }, "Or scan a URL (read with HTTP Range requests)"),
    h("div", { class: "inline" }, urlInput, h("button", { type: "submit", class: "primary" }, "Scan URL")));
  urlForm.addEventListener("submit", async (event) => {
    event.preventDefault();
    clear(status, "Scanning the URL…");
    try {
      done(await api("/scan/url", { method: "POST", json: { url: urlInput.value } }));
    } catch (error) {
      clear(status, errorBox(error));
    }
  });

  clear(view,
    h("h1", {}, "Scan a checkpoint"),
    h("p", { class: "muted" }, "Nothing in the file is executed: ckptguard reads it as bytes and says what torch.load would do."),
    zone, h("div", { class: "upload" }, progress, cancel), status, urlForm);
}
