// The API client: same origin only, the key from sessionStorage as a Bearer token (never in a
// URL), asked for once per session when the service answers 401.

const KEY = "ckptguard.apiKey";

export class ApiError extends Error {
  constructor(status, problem) {
    super(problem && typeof problem.detail === "string" ? problem.detail : `HTTP ${status}`);
    this.status = status;
    this.problem = problem;
  }
}

let askKey = null;
export function onKeyNeeded(fn) {
  askKey = fn;
}

export function hasKey() {
  return sessionStorage.getItem(KEY) !== null;
}

export function forgetKey() {
  sessionStorage.removeItem(KEY);
}

function authHeaders() {
  const key = sessionStorage.getItem(KEY);
  return key ? { Authorization: `Bearer ${key}` } : {};
}

async function newKey(retry) {
  if (!askKey) return false;
  const key = await askKey(retry);
  if (!key) return false;
  sessionStorage.setItem(KEY, key);
  return true;
}

export async function api(path, { method = "GET", json } = {}) {
  for (let attempt = 0; ; attempt += 1) {
    const headers = { Accept: "application/json", ...authHeaders() };
    const init = { method, headers, credentials: "omit", cache: "no-store", redirect: "error" };
    if (json !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(json);
    }
    const response = await fetch(path, init);
    if (response.status === 401 && attempt < 3 && (await newKey(attempt > 0 || hasKey()))) continue;
    if (response.status === 204) return null;
    const body = await response.json().catch(() => null);
    if (!response.ok) throw new ApiError(response.status, body);
    return body;
  }
}

// Make sure a key works (or none is needed) before a long upload starts.
export async function ensureAccess() {
  await api("/scans?limit=1");
}

// POST /scan with progress and cancel: { promise, abort }.
export function upload(file, onProgress) {
  const xhr = new XMLHttpRequest();
  const promise = new Promise((resolve, reject) => {
    xhr.open("POST", "/scan");
    for (const [name, value] of Object.entries(authHeaders())) xhr.setRequestHeader(name, value);
    xhr.setRequestHeader("Accept", "application/json");
    xhr.responseType = "json";
    xhr.upload.addEventListener("progress", (event) => {
      if (event.lengthComputable) onProgress(event.loaded, event.total);
    });
    xhr.addEventListener("load", () => {
      if (xhr.status >= 200 && xhr.status < 300) resolve(xhr.response);
      else reject(new ApiError(xhr.status, xhr.response));
    });
    xhr.addEventListener("error", () => reject(new ApiError(0, { detail: "the upload failed (network error)" })));
    xhr.addEventListener("abort", () => reject(new ApiError(0, { code: "CANCELLED", detail: "the upload was cancelled" })));
    const form = new FormData();
    form.append("file", file, file.name);
    xhr.send(form);
  });
  return { promise, abort: () => xhr.abort() };
}

export function query(params) {
  const search = new URLSearchParams();
  for (const [name, value] of Object.entries(params)) {
    if (value !== null && value !== undefined && value !== "") search.set(name, String(value));
  }
  const text = search.toString();
  return text ? `?${text}` : "";
}
