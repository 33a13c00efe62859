"""A local HTTP server that answers a Range request with an honest 206 and then trickles the
body, a byte every `every` seconds: the slow upstream of issue 15 (tests/hostile, bench)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager


def _serve(conn: socket.socket, size: int, every: float, stop: threading.Event) -> None:
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
        start = size - int(last) if not first else int(first)
        end = size - 1 if not first or not last else min(int(last), size - 1)
        conn.sendall(b"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes %d-%d/%d\r\n"
                     b"Content-Length: %d\r\nETag: \"x\"\r\n\r\n" % (start, end, size, end - start + 1))
        for _ in range(end - start + 1):
            if stop.wait(every):
                return
            try:
                conn.sendall(b"\0")
            except OSError:
                return


@contextmanager
def trickling_server(size: int = 1 << 20, every: float = 0.2,
                     connected: threading.Event | None = None) -> Iterator[str]:
    """The URL of a `size`-byte file served a byte every `every` s; stopped on exit.
    `connected` is set when a client first connects."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            if connected is not None:
                connected.set()
            threading.Thread(target=_serve, args=(conn, size, every, stop), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/model.pt"
    finally:
        stop.set()
        listener.close()
