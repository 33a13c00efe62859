"""Slow request heads and bodies against the real service (uvicorn on 127.0.0.1).

uvicorn itself has no deadline for a request's line and headers (any byte resets its timer),
so a client trickling one header byte at a time would hold a connection and a file
descriptor for ever. app/http_protocol.py gives every head a deadline; app/main.py BodyLimit
gives JSON bodies one. The deadlines here are short (1 s); the bounds asserted are generous.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.e2e.service_server import Server, running_server

pytestmark = pytest.mark.e2e
HEAD_TIMEOUT_S = 1.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running_server(tmp_path_factory.mktemp("heads"), CKPTGUARD_WORKERS="1",
                        CKPTGUARD_HEADER_TIMEOUT_SECONDS=str(HEAD_TIMEOUT_S),
                        CKPTGUARD_BODY_TIMEOUT_SECONDS="1", CKPTGUARD_TEST_HOOKS="true",
                        CKPTGUARD_SCAN_TIMEOUT_SECONDS="3") as srv:
        yield srv


def _connect(server: Server) -> socket.socket:
    host, port = server.url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def _answer_while_trickling(sock: socket.socket, trickle: bytes, within_s: float) -> bytes:
    """Send `trickle` one byte every 0.2 s (never finishing) until the server answers or closes;
    return everything it sent. Fails if it keeps the connection open `within_s` seconds."""
    sock.settimeout(0.2)
    deadline = time.monotonic() + within_s
    received = b""
    for byte in trickle * 1000:
        if time.monotonic() > deadline:
            raise AssertionError(f"connection still open after {within_s} s: {received!r}")
        try:
            sock.sendall(bytes([byte]))
        except OSError:
            break
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except OSError:
            break
        if not chunk:
            break
        received += chunk
    return received


def _status_and_body(raw: bytes) -> tuple[int, dict[str, object]]:
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), json.loads(body)


def test_a_trickling_request_head_is_answered_408_and_closed(server: Server) -> None:
    with _connect(server) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        raw = _answer_while_trickling(sock, b"X-Slow: aaaa\r\n", within_s=HEAD_TIMEOUT_S + 8)
    status, body = _status_and_body(raw)
    assert status == 408 and body["code"] == "HEAD_TIMEOUT"


def test_a_silent_connection_is_closed(server: Server) -> None:
    with _connect(server) as sock:
        started = time.monotonic()
        sock.settimeout(HEAD_TIMEOUT_S + 8)
        raw = sock.recv(65536)          # nothing sent: the server must still hang up
        assert time.monotonic() - started < HEAD_TIMEOUT_S + 8
    assert _status_and_body(raw)[0] == 408


def test_the_second_head_on_a_kept_alive_connection_has_its_own_deadline(server: Server) -> None:
    with _connect(server) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        first = sock.recv(65536)
        assert first.startswith(b"HTTP/1.1 200")
        raw = _answer_while_trickling(sock, b"GET /healthz HTTP/1.1\r\n", within_s=HEAD_TIMEOUT_S + 8)
    assert _status_and_body(raw)[0] == 408


def test_a_trickling_json_body_is_answered_408(server: Server) -> None:
    with _connect(server) as sock:
        sock.sendall(b"POST /scan/url HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 5000\r\n\r\n{\"url\": \"")
        raw = _answer_while_trickling(sock, b"a", within_s=10)
    status, body = _status_and_body(raw)
    assert status == 408 and body["code"] == "REQUEST_TIMEOUT"


def test_a_request_that_runs_longer_than_the_head_deadline_is_not_cut(server: Server) -> None:
    # the head arrived at once; the scan (a worker told to sleep) outlasts the head deadline
    r = httpx.post(f"{server.url}/scan", files={"file": ("a.pkl", b"\x80\x04K\x01.", "x/y")},
                   headers={"X-Ckptguard-Test-Hook": "sleep"}, timeout=60)
    assert r.status_code == 200, r.text
    assert any(f["code"] == "TIMEOUT" for f in r.json()["findings"])   # the sleep ran past 1 s


def test_ordinary_requests_on_one_connection_pass(server: Server) -> None:
    with httpx.Client(base_url=server.url, timeout=10) as client:
        for _ in range(3):
            assert client.get("/healthz").status_code == 200
            time.sleep(HEAD_TIMEOUT_S / 2)
