"""Slow clients against the real service (uvicorn on 127.0.0.1): an upload that trickles is
cut with 408 by its minimum rate and leaves no spool file; uploads in flight are capped
(503 + Retry-After), so a crowd of tricklers cannot exhaust connections and files."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.service_server import Server, running_server

pytestmark = pytest.mark.e2e
BOUNDARY = "slowclient"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running_server(tmp_path_factory.mktemp("slow"), CKPTGUARD_WORKERS="1",
                        CKPTGUARD_UPLOAD_GRACE_SECONDS="1", CKPTGUARD_UPLOAD_MIN_RATE="1000",
                        CKPTGUARD_MAX_UPLOADS_IN_FLIGHT="1") as srv:
        yield srv


def _start_trickle(server: Server) -> socket.socket:
    """Headers and the part's head sent at once; the body then arrives one byte at a time."""
    host, port = server.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    head = (f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.pkl\"\r\n"
            "Content-Type: application/octet-stream\r\n\r\n").encode()
    sock.sendall(b"POST /scan HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary="
                 + BOUNDARY.encode() + b"\r\nContent-Length: 100000\r\n\r\n" + head)
    return sock


def _read_status(sock: socket.socket, deadline: float) -> int:
    sock.settimeout(0.1)
    data = b""
    while time.monotonic() < deadline:
        try:
            sock.sendall(b"\0")
        except OSError:
            pass
        try:
            data += sock.recv(4096)
        except TimeoutError:
            continue
        except OSError:
            break
        if b"\r\n" in data:
            return int(data.split(b" ", 2)[1])
    raise AssertionError(f"no answer in time: {data!r}")


def test_a_trickling_upload_is_cut_and_leaves_no_spool_file(server: Server) -> None:
    sock = _start_trickle(server)
    try:
        assert _read_status(sock, time.monotonic() + 20) == 408
    finally:
        sock.close()
    spool = Path(server.log.parent) / "uploads"
    time.sleep(0.5)
    assert spool.is_dir()                      # the upload was spooled here ...
    assert not list(spool.glob("upload-*"))    # ... and its file is gone


def test_uploads_in_flight_are_capped(server: Server) -> None:
    sock = _start_trickle(server)        # holds the only slot for about a second
    try:
        time.sleep(0.3)
        r = httpx.post(f"{server.url}/scan", files={"file": ("b.pkl", b"\x80\x04K\x01.", "x/y")},
                       timeout=30)
        assert r.status_code == 503 and r.json()["code"] == "UPLOADS_BUSY"
        assert r.headers["retry-after"] == "5"
    finally:
        sock.close()
    time.sleep(2)   # the trickler is cut (408): its slot is free again
    r = httpx.post(f"{server.url}/scan", files={"file": ("b.pkl", b"\x80\x04K\x01.", "x/y")}, timeout=30)
    assert r.status_code == 200 and r.json()["verdict"] == "safe"


def test_a_client_that_disconnects_is_one_info_line(server: Server) -> None:
    before = len(server.log_lines())
    sock = _start_trickle(server)
    sock.sendall(b"\0" * 5000)
    time.sleep(0.3)
    sock.close()
    time.sleep(1.0)
    new = [json.loads(line) for line in server.log_lines()[before:] if line.strip()]
    assert [e["msg"] for e in new if e.get("event") == "disconnect"] == \
        ["client disconnected during the upload"]
    assert not [e for e in new if e["level"] == "error" or "exc" in e]
