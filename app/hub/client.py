"""The model-hub HTTP client: list a revision's files, resolve URLs, scan one file.

Strategy: follows the Hugging Face Hub's conventions so a real hub works unchanged.
- Listing: `GET {endpoint}/api/{models|datasets}/{repo}/tree/{rev}?recursive=true&expand=true`,
  the revision URL-encoded as one path segment (`refs%2Fpr%2F3`), pages chained by
  `Link: <...>; rel="next"`. A next link must stay on the endpoint's origin (the token
  goes with it), and the total is capped (`max_files`).
- Downloads: `{endpoint}/{repo}/resolve/{rev}/{path}` (datasets: `/datasets/{repo}/...`),
  read by core.io.http.HttpSource: Range requests with `Accept-Encoding: identity`,
  redirects followed by hand with the Range header kept and every hop checked by the
  service's URL guard, the Authorization header sent to the hub's origin only.
- Which files: by content, never by name. `sniff_remote` reads the head and tail (one
  round trip) and core.sniff classifies them; only what can hold pickles or tensors is
  scanned (the service does that in its sandboxed pool; `scan_remote_file` sniffs and
  scans in-process for library use); the rest is `skipped`. The LFS sha256 from the listing (the value the hub
  also sends as `X-Linked-Etag`) names the content for report reuse.
This module does blocking I/O: the job runner calls it in a thread.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, urljoin

import httpx

from ckptguard.core.errors import Code, SourceError
from ckptguard.core.io.http import HttpSource, origin_of
from ckptguard.core.io.urlguard import UrlGuard
from ckptguard.core.limits import Limits
from ckptguard.core.records import record
from ckptguard.core.report import SourceInfo
from ckptguard.core.sniff import HEAD_BYTES, Sniffed, sniff
from ckptguard.core.state import ScanOptions

RepoType = str  # "model" | "dataset"
API_KIND = {"model": "models", "dataset": "datasets"}
USER_AGENT = "ckptguard-hub-client"
MAX_PAGES = 1000
MIN_SCAN_BYTES = 8          # nothing shorter can hold a pickle with a global or a tensor header
SCANNED = frozenset({"zip", "torch-legacy", "torch-tar", "pickle", "numpy", "safetensors"})
_LINK_NEXT = re.compile(r'<([^>]+)>\s*;\s*rel="?next"?', re.IGNORECASE)
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


@record(frozen=True, slots=True)
class TreeFile:
    path: str
    size: int
    lfs_sha256: str | None = None


@record(frozen=True, slots=True)
class FileScan:
    """What scanning one file gave: its container and the report (None when skipped)."""

    container: str
    report: dict[str, Any] | None
    detail: str = ""


def repo_prefix(repo_type: RepoType, repo: str) -> str:
    """The path of a repository on the hub's web side (`datasets/` for datasets)."""
    name = quote(repo, safe="/")
    return name if repo_type == "model" else f"{API_KIND[repo_type]}/{name}"


class HubClient:
    """Blocking client for one hub endpoint (CKPTGUARD_HUB_ENDPOINT, optional token)."""

    def __init__(self, endpoint: str, *, token: str | None = None, timeout: float = 30.0,
                 max_files: int = 10000, transport: httpx.BaseTransport | None = None) -> None:
        self.endpoint = endpoint.rstrip("/")
        self.token = token
        self.max_files = max_files
        self._client = httpx.Client(timeout=httpx.Timeout(timeout), follow_redirects=False,
                                    trust_env=False, transport=transport,
                                    headers={"User-Agent": USER_AGENT, **self.auth_headers})

    @property
    def auth_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def close(self) -> None:
        self._client.close()

    def api_url(self, repo_type: RepoType, repo: str, what: str, revision: str) -> str:
        rev = quote(revision, safe="")  # refs/pr/3 -> refs%2Fpr%2F3 (one path segment)
        return f"{self.endpoint}/api/{API_KIND[repo_type]}/{quote(repo, safe='/')}/{what}/{rev}"

    def resolve_url(self, repo_type: RepoType, repo: str, revision: str, path: str) -> str:
        rev = quote(revision, safe="")
        return f"{self.endpoint}/{repo_prefix(repo_type, repo)}/resolve/{rev}/{quote(path, safe='/')}"

    def head_sha(self, repo_type: RepoType, repo: str, revision: str = "main") -> str:
        """The commit a branch/tag/PR ref points at now (`GET /api/models/{repo}/revision/{rev}`)."""
        body = self._get_json(self.api_url(repo_type, repo, "revision", revision))
        sha = body.get("sha") if isinstance(body, dict) else None
        if not isinstance(sha, str) or not re.fullmatch(r"[0-9a-f]{40}", sha):
            raise SourceError(Code.SOURCE_HTTP, "the hub's revision answer has no commit sha")
        return sha

    def list_tree(self, repo_type: RepoType, repo: str, revision: str) -> list[TreeFile]:
        """Every file of the repository at `revision` (directories dropped), all pages."""
        url: str | None = self.api_url(repo_type, repo, "tree", revision) + "?recursive=true&expand=true"
        files: list[TreeFile] = []
        pages = 0
        while url is not None:
            pages += 1
            if pages > MAX_PAGES:
                raise SourceError(Code.SOURCE_HTTP, f"the tree listing has more than {MAX_PAGES} pages")
            resp = self._get(url)
            try:
                entries = resp.json()
            except ValueError as exc:
                raise SourceError(Code.SOURCE_HTTP, "the tree listing is not JSON") from exc
            if not isinstance(entries, list):
                raise SourceError(Code.SOURCE_HTTP, "the tree listing is not a JSON array")
            files.extend(f for f in map(_tree_file, entries) if f is not None)
            if len(files) > self.max_files:
                raise SourceError(Code.SOURCE_HTTP, f"the revision has more than {self.max_files} files")
            url = self._next_link(url, resp.headers.get("link", ""))
        return files

    def _next_link(self, current: str, header: str) -> str | None:
        match = _LINK_NEXT.search(header)
        if match is None:
            return None
        nxt: str = urljoin(current, match.group(1))
        if origin_of(nxt) != origin_of(self.endpoint):  # the token must not leave the hub
            raise SourceError(Code.SOURCE_URL_REFUSED, "the tree listing's next page is on another host")
        return nxt

    def _get(self, url: str) -> httpx.Response:
        try:
            resp = self._client.get(url)
        except httpx.HTTPError as exc:
            raise SourceError(Code.SOURCE_HTTP, f"hub request failed: {type(exc).__name__}") from exc
        if resp.status_code != 200:
            raise SourceError(Code.SOURCE_HTTP, f"hub answered HTTP {resp.status_code} for {url}")
        return resp

    def _get_json(self, url: str) -> Any:
        try:
            return self._get(url).json()
        except ValueError as exc:
            raise SourceError(Code.SOURCE_HTTP, "the hub's answer is not JSON") from exc


def _tree_file(entry: object) -> TreeFile | None:
    if not isinstance(entry, dict) or entry.get("type") != "file":
        return None
    path, size = entry.get("path"), entry.get("size")
    if not isinstance(path, str) or not path or len(path) > 1024 or not isinstance(size, int) or size < 0:
        return None
    lfs = entry.get("lfs")
    oid = lfs.get("oid") if isinstance(lfs, dict) else None
    sha = oid.lower() if isinstance(oid, str) and _SHA256.match(oid.lower()) else None
    return TreeFile(path=path, size=size, lfs_sha256=sha)


def _sniff_open(source: HttpSource) -> Sniffed:
    size = source.size
    # HttpSource's open already cached the head and tail: these reads cost no request
    head = source.read_at(0, min(size, HEAD_BYTES))
    tail_len = min(size, 65535 + 22)
    return sniff(head, source.read_at(size - tail_len, tail_len), size)


def sniff_remote(url: str, *, headers: Mapping[str, str], guard: UrlGuard, limits: Limits) -> Sniffed:
    """The container kind of a remote file from its head and tail (one round trip)."""
    with HttpSource(url, headers=headers, guard=guard, limits=limits, speculate=False) as source:
        return _sniff_open(source)


def scan_remote_file(url: str, *, headers: Mapping[str, str], guard: UrlGuard, options: ScanOptions,
                     name: str, sha256: str | None) -> FileScan:
    """Sniff and scan in this process (no sandbox pool): open once, scan if it can hold
    pickles or tensors. The service prefers `sniff_remote` + the pool's `scan_url`."""
    from ckptguard.core.scan import scan_source  # the scanner pulls in every format parser

    with HttpSource(url, headers=headers, guard=guard, limits=options.limits, name=name) as source:
        sniffed = _sniff_open(source)
        if sniffed.container not in SCANNED:
            return FileScan(sniffed.container, None, sniffed.detail)
        info = SourceInfo(kind="hub", name=name, url=url, size=source.size, sha256=sha256)
        report = scan_source(source, options=options, info=info)
        return FileScan(sniffed.container, report.to_json(), sniffed.detail)
