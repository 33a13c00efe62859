"""A remote server that answers 206 and then trickles its body: the transfer is cut by the
minimum-rate deadline (Limits.min_transfer_rate after Limits.transfer_grace_seconds), not
held until the worker's wall-clock limit. The per-read timeout alone never fires there."""

from __future__ import annotations

import dataclasses
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from ckptguard.core.errors import Code, SourceError
from ckptguard.core.io.http import HttpSource
from ckptguard.core.limits import Limits

SIZE = 1 << 20


@pytest.fixture
def trickling_server() -> Iterator[str]:
    """206 with honest headers, then one body byte every 0.2 s."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    stop = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn:
            request = b""
            while b"\r\n\r\n" not in request:
                part = conn.recv(4096)
                if not part:
                    return
                request += part
            spec = next((line.split(b"=", 1)[1] for line in request.split(b"\r\n")
                         if line.lower().startswith(b"range:")), b"0-")
            first, _, last = spec.partition(b"-")
            start = SIZE - int(last) if not first else int(first)
            end = SIZE - 1 if not first or not last else min(int(last), SIZE - 1)
            conn.sendall(b"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes %d-%d/%d\r\n"
                         b"Content-Length: %d\r\nETag: \"x\"\r\n\r\n" % (start, end, SIZE, end - start + 1))
            for _ in range(end - start + 1):
                if stop.wait(0.2):
                    return
                try:
                    conn.sendall(b"\0")
                except OSError:
                    return

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}/model.pt"
    stop.set()
    listener.close()


def test_a_trickling_body_is_cut_by_the_minimum_rate(trickling_server: str) -> None:
    limits = dataclasses.replace(Limits(), transfer_grace_seconds=1.0, min_transfer_rate=1024)
    started = time.monotonic()
    with pytest.raises(SourceError) as caught:
        HttpSource(trickling_server, limits=limits, retries=0, timeout=30.0, speculate=False)
    elapsed = time.monotonic() - started
    assert caught.value.code is Code.SOURCE_HTTP and "minimum rate" in caught.value.message
    assert elapsed < 10, elapsed      # far below the 30 s per-read timeout it never hit
