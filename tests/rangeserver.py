"""A real HTTP/1.1 server on 127.0.0.1 with exact Range semantics and fault injection.

Used by the remote tests and bench/remote_bench.py. It serves in-memory bytes or
files on disk (big sparse files for the bench) with single byte ranges
(`a-b`, `a-`, `-n`), `If-Range` (ETag or Last-Modified), 416 for unsatisfiable
ranges, keep-alive, and a request log. `fault` switches on one misbehaviour, for the
next `fault_times` requests (None: for all):

    ignore_range         200 + the whole body for every request
    wrong_content_range  206 whose Content-Range is shifted by one byte
    wrong_total          206 whose Content-Range total is one byte too large
    etag_changes         a new ETag on every response
    no_validators        no ETag, no Last-Modified
    drop_mid_body        full headers, half the body, then the connection is cut
    stall                wait `stall_seconds` before answering (or until `release_stalls()`)
    status               answer `status` (e.g. 403, 404, 500) with a small body
    redirect             302 to `redirect_to` (keeps nothing: the client must re-send Range)
    gzip                 claim Content-Encoding: gzip
    no_multirange        200 + the whole body for multi-range requests (as S3 does)

Several ranges in one request get a multipart/byteranges answer (RFC 9110 §14.6).

Example:
    with RangeServer({"/m.pt": data}) as srv:
        HttpSource(srv.url("/m.pt"), guard=UrlGuard(allowlist=("127.0.0.1",)))
"""

from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")
LAST_MODIFIED = "Mon, 02 Nov 2026 10:00:00 GMT"


def serving_thread(httpd: ThreadingHTTPServer) -> threading.Thread:
    """A daemon thread that serves `httpd` until `httpd.shutdown()`. serve_forever checks for
    the shutdown every poll interval (0.5 s by default, paid by every server a test stops)."""
    return threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)


@dataclass
class Logged:
    method: str
    path: str
    range: str | None
    if_range: str | None
    status: int
    headers: dict[str, str] = field(default_factory=dict)


class RangeServer:
    """Start with `with RangeServer(files) as srv:`; `srv.url(path)`; `srv.log`."""

    def __init__(self, files: dict[str, bytes | Path] | None = None) -> None:
        self.files: dict[str, bytes | Path] = dict(files or {})
        self.log: list[Logged] = []
        self.fault: str | None = None
        self.fault_times: int | None = None
        self.fault_paths: set[str] | None = None
        self.status = 500
        self.redirect_to = ""
        self.stall_seconds = 5.0
        self.unstall = threading.Event()   # set: stalled requests (and later ones) answer at once
        self.etag_counter = 0
        self.lock = threading.Lock()
        self._httpd = _QuietServer(("127.0.0.1", 0), _make_handler(self))
        self._httpd.daemon_threads = True
        self._thread = serving_thread(self._httpd)

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"

    def set_fault(self, fault: str | None, times: int | None = None, **kw: Any) -> None:
        with self.lock:
            self.fault, self.fault_times = fault, times
            self.unstall.clear()
            for k, v in kw.items():
                setattr(self, k, v)

    def release_stalls(self) -> None:
        """End the stalls now: a test that no longer needs a read held (its point is made)
        does not wait out `stall_seconds`."""
        self.unstall.set()

    def take_fault(self, path: str) -> str | None:
        with self.lock:
            if self.fault is None or (self.fault_paths is not None and path not in self.fault_paths):
                return None
            if self.fault_times is not None:
                if self.fault_times <= 0:
                    return None
                self.fault_times -= 1
            return self.fault

    @property
    def requests(self) -> int:
        return len(self.log)

    def ranged(self) -> list[str | None]:
        return [entry.range for entry in self.log]

    def start(self) -> RangeServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> RangeServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # clients abandon bodies on purpose (byte caps, speculation)


def _size(obj: bytes | Path) -> int:
    return len(obj) if isinstance(obj, bytes) else os.path.getsize(obj)


def _etag(obj: bytes | Path, salt: int) -> str:
    return f'"{_size(obj):x}-{salt}"'


def _make_handler(server: RangeServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_HEAD(self) -> None:
            self._serve(head=True)

        def do_GET(self) -> None:
            self._serve(head=False)

        def _finish(self, status: int, headers: dict[str, str], body_from: tuple[bytes | Path, int, int]
                    | bytes, *, head: bool, fault: str | None) -> None:
            with server.lock:
                server.log.append(Logged(self.command, self.path, self.headers.get("Range"),
                                         self.headers.get("If-Range"), status, dict(self.headers)))
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.end_headers()
            if head:
                return
            if isinstance(body_from, bytes):
                self.wfile.write(body_from)
                return
            obj, start, nbytes = body_from
            send = nbytes // 2 if fault == "drop_mid_body" else nbytes
            try:
                if isinstance(obj, bytes):
                    self.wfile.write(obj[start : start + send])
                else:
                    with open(obj, "rb") as fh:
                        fh.seek(start)
                        left = send
                        while left > 0:
                            chunk = fh.read(min(left, 1 << 20))
                            if not chunk:
                                break
                            self.wfile.write(chunk)
                            left -= len(chunk)
                self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True
                return
            if fault == "drop_mid_body":
                self.close_connection = True

        def _serve(self, *, head: bool) -> None:
            path = self.path.split("?", 1)[0]
            fault = server.take_fault(path)
            if fault == "stall":
                server.unstall.wait(server.stall_seconds)
            if fault == "status":
                self._finish(server.status, {"Content-Length": "5"}, b"nope\n", head=head, fault=fault)
                return
            if fault == "redirect":
                self._finish(302, {"Location": server.redirect_to, "Content-Length": "0"}, b"",
                             head=head, fault=fault)
                return
            obj = server.files.get(path)
            if obj is None:
                self._finish(404, {"Content-Length": "10"}, b"not found\n", head=head, fault=fault)
                return
            size = _size(obj)
            with server.lock:
                server.etag_counter += 1
                salt = server.etag_counter if fault == "etag_changes" else 0
            etag = _etag(obj, salt)
            headers = {"Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}
            if fault != "no_validators":
                headers["ETag"] = etag
                headers["Last-Modified"] = LAST_MODIFIED
            if fault == "gzip":
                headers["Content-Encoding"] = "gzip"
            rng = self.headers.get("Range")
            if_range = self.headers.get("If-Range")
            if if_range is not None and if_range not in (etag, LAST_MODIFIED):
                rng = None  # RFC 9110 §13.1.5: validator failed -> the whole, current file
            if rng and "," in rng and fault != "ignore_range":
                self._serve_multi(obj, size, rng, headers, head=head, fault=fault)
                return
            m = _RANGE.match(rng.strip()) if rng else None
            if fault == "ignore_range" or m is None or (not m.group(1) and not m.group(2)):
                headers["Content-Length"] = str(size)
                self._finish(200, headers, (obj, 0, size), head=head, fault=fault)
                return
            if m.group(1):
                start = int(m.group(1))
                last = min(int(m.group(2)), size - 1) if m.group(2) else size - 1
            else:
                start, last = max(0, size - int(m.group(2))), size - 1
            if start >= size or last < start:
                headers["Content-Range"] = f"bytes */{size}"
                headers["Content-Length"] = "0"
                self._finish(416, headers, b"", head=head, fault=fault)
                return
            nbytes = last - start + 1
            shown_start, shown_last, shown_total = start, last, size
            if fault == "wrong_content_range":
                shown_start, shown_last = start + 1, last + 1
            if fault == "wrong_total":
                shown_total = size + 1
            headers["Content-Range"] = f"bytes {shown_start}-{shown_last}/{shown_total}"
            headers["Content-Length"] = str(nbytes)
            self._finish(206, headers, (obj, start, nbytes), head=head, fault=fault)

        def _serve_multi(self, obj: bytes | Path, size: int, rng: str, headers: dict[str, str], *,
                         head: bool, fault: str | None) -> None:
            if fault == "no_multirange":
                headers["Content-Length"] = str(size)
                self._finish(200, headers, (obj, 0, size), head=head, fault=fault)
                return
            spans: list[tuple[int, int]] = []
            for spec in rng.strip().removeprefix("bytes=").split(","):
                a, _, b = spec.strip().partition("-")
                if a:
                    start, last = int(a), min(int(b), size - 1) if b else size - 1
                else:
                    start, last = max(0, size - int(b)), size - 1
                if start <= last < size:
                    spans.append((start, last))
            boundary = "CKPTGUARDBOUNDARY"
            body = bytearray()
            for start, last in spans:
                shift = 1 if fault == "wrong_content_range" else 0
                body += (f"\r\n--{boundary}\r\nContent-Type: application/octet-stream\r\n"
                         f"Content-Range: bytes {start + shift}-{last + shift}/{size}\r\n\r\n").encode()
                if isinstance(obj, bytes):
                    body += obj[start : last + 1]
                else:
                    with open(obj, "rb") as fh:
                        fh.seek(start)
                        body += fh.read(last - start + 1)
            body += f"\r\n--{boundary}--\r\n".encode()
            headers["Content-Type"] = f"multipart/byteranges; boundary={boundary}"
            headers["Content-Length"] = str(len(body))
            self._finish(206, headers, (bytes(body), 0, len(body)), head=head, fault=fault)

    return Handler


def main(argv: list[str] | None = None) -> None:
    """`python -m tests.rangeserver [--latency SECONDS] FILE...`: serve files as /<basename>,
    print the port; --latency delays every answer (a far server, for bench/cost_bench.py)."""
    import sys

    args = list(argv if argv is not None else sys.argv[1:])
    latency = 0.0
    if args[:1] == ["--latency"]:
        latency = float(args[1])
        del args[:2]
    paths = [Path(p) for p in args]
    srv = RangeServer({f"/{p.name}": p for p in paths}).start()
    if latency:
        srv.set_fault("stall", stall_seconds=latency)
    print(srv.port, flush=True)
    try:
        sys.stdin.read()  # serve until stdin closes
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
