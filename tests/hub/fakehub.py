"""A fake model hub on 127.0.0.1: the endpoints app/hub/client.py uses, as the real Hub answers.

- `GET /api/{models|datasets}/{repo}/tree/{rev}?recursive=true&expand=true`: JSON entries
  (`type`, `path`, `size`, `oid`, `lfs: {oid, size, pointerSize}` for large files),
  `page_size` per page, chained by `Link: <...&cursor=N>; rel="next"`.
- `GET /api/{models|datasets}/{repo}/revision/{rev}`: `{"sha": ...}` (refs resolved).
- `GET|HEAD /{repo}/resolve/{rev}/{path}` (datasets under `/datasets/`): 302 to the
  storage server (a tests.rangeserver.RangeServer, another port, Range-capable) with
  `X-Linked-Size` / `X-Linked-Etag` like the Hub's LFS answers.
`rev` may be a commit sha or a ref (`main`, `refs/pr/3` sent as `refs%2Fpr%2F3`).
Every request is logged (raw path + headers); `token` makes the hub require it.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

from tests.rangeserver import RangeServer, serving_thread

LFS_THRESHOLD = 10 * 1024  # the Hub stores larger files (and all binaries) in LFS; small text in git


@dataclass
class HubRequest:
    method: str
    raw_path: str
    headers: dict[str, str]


@dataclass
class FakeHub:
    """`repos[(repo_type, repo)][sha] = {path: bytes}`; `refs[(repo_type, repo)][ref] = sha`."""

    repos: dict[tuple[str, str], dict[str, dict[str, bytes]]] = field(default_factory=dict)
    refs: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)
    page_size: int = 3
    token: str | None = None
    log: list[HubRequest] = field(default_factory=list)
    outage: int = 0   # the next this-many API requests are answered 503 (a hub that is down)

    def __post_init__(self) -> None:
        self.storage = RangeServer({})
        self.lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._httpd.daemon_threads = True
        self._thread = serving_thread(self._httpd)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def add(self, repo_type: str, repo: str, sha: str, files: dict[str, bytes],
            refs: tuple[str, ...] = ()) -> None:
        self.repos.setdefault((repo_type, repo), {})[sha] = dict(files)
        for ref in refs:
            self.refs.setdefault((repo_type, repo), {})[ref] = sha
        for data in files.values():
            self.storage.files[blob_path(data)] = data

    def storage_gets(self, data: bytes) -> int:
        """How many requests the storage server got for this content."""
        return sum(1 for e in self.storage.log if e.path == blob_path(data))

    def start(self) -> FakeHub:
        self.storage.start()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self.storage.stop()

    def __enter__(self) -> FakeHub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def commit(self, repo_type: str, repo: str, rev: str) -> dict[str, bytes] | None:
        commits = self.repos.get((repo_type, repo), {})
        sha = self.refs.get((repo_type, repo), {}).get(rev, rev)
        return commits.get(sha)

    def resolve_sha(self, repo_type: str, repo: str, rev: str) -> str | None:
        sha = self.refs.get((repo_type, repo), {}).get(rev, rev)
        return sha if sha in self.repos.get((repo_type, repo), {}) else None


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def revision_files(n: int) -> dict[str, bytes]:
    """Revision n of a fleet (tests/hub/test_failover.py, bench/hub_bench.py): two checkpoints
    no other revision shares (no report reuse: each is scanned) and a text."""
    return {"model.bin": pickle.dumps({"revision": n, "w": list(range(n % 5 + 2))}, protocol=2),
            "optim.bin": pickle.dumps([n, "state", {"step": n}], protocol=4),
            "README.md": f"# revision {n}\n".encode()}


def sha_of(n: int) -> str:
    """Revision n's commit sha."""
    return f"{n + 1:040x}"


def blob_path(data: bytes) -> str:
    return f"/blobs/{sha256(data)}"


def tree_entry(path: str, data: bytes) -> dict[str, Any]:
    entry: dict[str, Any] = {"type": "file", "path": path, "size": len(data),
                             "oid": hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()}
    if len(data) >= LFS_THRESHOLD or not _is_text(data):
        entry["lfs"] = {"oid": sha256(data), "size": len(data), "pointerSize": 134}
    return entry


def _is_text(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            self._serve(head=False)

        def do_HEAD(self) -> None:
            self._serve(head=True)

        def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None,
                  *, head: bool = False) -> None:
            self.send_response(status)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not head:
                self.wfile.write(body)

        def _json(self, obj: Any, headers: dict[str, str] | None = None) -> None:
            self._send(200, json.dumps(obj).encode(), {"Content-Type": "application/json", **(headers or {})})

        def _serve(self, *, head: bool) -> None:
            with hub.lock:
                hub.log.append(HubRequest(self.command, self.path, dict(self.headers)))
                down = hub.outage > 0
                hub.outage -= down
            if down:
                self._send(503, b'{"error":"unavailable"}', head=head)
                return
            if hub.token is not None and self.headers.get("Authorization") != f"Bearer {hub.token}":
                self._send(401, b'{"error":"unauthorized"}', head=head)
                return
            parts = urlsplit(self.path)
            segments = parts.path.split("/")[1:]   # still percent-encoded: a rev is ONE segment
            query = parse_qs(parts.query)
            if segments[:1] == ["api"] and len(segments) >= 6:
                kind = {"models": "model", "datasets": "dataset"}.get(segments[1])
                repo = unquote("/".join(segments[2:4]))
                what, rev = segments[4], unquote(segments[5])
                if kind is None or len(segments) != 6:
                    self._send(404, b"{}")
                elif what == "tree":
                    self._tree(kind, repo, rev, query)
                elif what == "revision":
                    sha = hub.resolve_sha(kind, repo, rev)
                    if sha is None:
                        self._send(404, b"{}")
                    else:
                        self._json({"id": repo, "sha": sha})
                else:
                    self._send(404, b"{}")
                return
            kind = "model"
            if segments[:1] == ["datasets"]:
                kind, segments = "dataset", segments[1:]
            if len(segments) >= 5 and segments[2] == "resolve":
                repo, rev = unquote("/".join(segments[:2])), unquote(segments[3])
                path = unquote("/".join(segments[4:]))
                files = hub.commit(kind, repo, rev)
                data = None if files is None else files.get(path)
                if data is None:
                    self._send(404, b"Entry not found", head=head)
                    return
                entry = tree_entry(path, data)
                etag = f'"{entry["lfs"]["oid"] if "lfs" in entry else entry["oid"]}"'
                self._send(302, b"", {"Location": hub.storage.url(blob_path(data)),
                                      "X-Linked-Size": str(len(data)), "X-Linked-Etag": etag,
                                      "ETag": etag, "X-Repo-Commit": hub.resolve_sha(kind, repo, rev) or ""},
                           head=head)
                return
            self._send(404, b"not found", head=head)

        def _tree(self, kind: str, repo: str, rev: str, query: dict[str, list[str]]) -> None:
            files = hub.commit(kind, repo, rev)
            if files is None:
                self._send(404, b'{"error":"Invalid rev id"}')
                return
            entries: list[dict[str, Any]] = []
            dirs = sorted({p.rsplit("/", 1)[0] for p in files if "/" in p})
            entries += [{"type": "directory", "path": d, "size": 0, "oid": "0" * 40} for d in dirs]
            entries += [tree_entry(p, files[p]) for p in sorted(files)]
            start = int(query.get("cursor", ["0"])[0])
            page = entries[start : start + hub.page_size]
            headers = {}
            if start + hub.page_size < len(entries):
                nxt = (f"{hub.url}/api/{kind}s/{quote(repo, safe='/')}/tree/{quote(rev, safe='')}"
                       f"?recursive=true&expand=true&cursor={start + hub.page_size}")
                headers["Link"] = f'<{nxt}>; rel="next"'
            self._json(page, headers)

    return Handler
