"""Multipart uploads streamed to a temporary file: bounded memory, size cap, SHA-256.

Strategy: the request body is fed chunk by chunk (`request.stream()`) to
python-multipart's push parser; the bytes of the `file` part go straight to a
`NamedTemporaryFile` in the upload directory and through `hashlib.sha256` on the way.
Nothing is buffered beyond one chunk, so a 2 GB upload costs no more memory than a
1 KB one. Past `max_bytes` the upload stops with 413. The client's filename is kept
as metadata only (sanitised, never joined to a path).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, BinaryIO

from python_multipart.multipart import MultipartParser, parse_options_header

from ckptguard.app.problems import AppError
from ckptguard.core.records import record

FIELD = "file"
MAX_HEADER_BYTES = 16 * 1024    # per part: multipart headers are tiny in practice
MAX_PARTS = 16
MAX_BOUNDARY = 200              # RFC 2046 allows 70; clients never exceed it, parsers choke past 256
_UNSAFE_NAME = re.compile(r"[\x00-\x1f\x7f]")


@record(slots=True)
class Upload:
    path: Path                   # the temporary file; the caller deletes it (`discard`)
    size: int
    sha256: str
    filename: str | None

    def discard(self) -> None:
        self.path.unlink(missing_ok=True)


def clean_filename(raw: str | None) -> str | None:
    """The client's name for the file, for reports only: last path segment, no controls."""
    if not raw:
        return None
    name = _UNSAFE_NAME.sub("", raw.replace("\\", "/").rsplit("/", 1)[-1]).strip()
    return name[:255] or None


class _Receiver:
    """python-multipart callbacks: route the `file` part's bytes into the temp file."""

    def __init__(self, out: BinaryIO, max_bytes: int) -> None:
        self.out = out
        self.max_bytes = max_bytes
        self.hasher = hashlib.sha256()
        self.size = 0
        self.filename: str | None = None
        self.found = False
        self.parts = 0
        self._in_file = False
        self._header_field = bytearray()
        self._header_value = bytearray()
        self._headers: dict[bytes, bytes] = {}
        self._header_bytes = 0
        self.complete = False      # the closing boundary was seen

    def callbacks(self) -> dict[str, Any]:
        return {
            "on_part_begin": self.on_part_begin, "on_part_data": self.on_part_data,
            "on_part_end": self.on_part_end, "on_header_field": self.on_header_field,
            "on_header_value": self.on_header_value, "on_header_end": self.on_header_end,
            "on_headers_finished": self.on_headers_finished, "on_end": self.on_end,
        }

    def on_end(self) -> None:
        self.complete = True

    def on_part_begin(self) -> None:
        self.parts += 1
        if self.parts > MAX_PARTS:
            raise AppError("BAD_MULTIPART", 400, f"more than {MAX_PARTS} multipart parts")
        self._headers = {}
        self._header_bytes = 0
        self._in_file = False

    def _count_header(self, n: int) -> None:
        self._header_bytes += n
        if self._header_bytes > MAX_HEADER_BYTES:
            raise AppError("BAD_MULTIPART", 400, "multipart part headers are too large")

    def on_header_field(self, data: bytes, start: int, end: int) -> None:
        self._count_header(end - start)
        self._header_field += data[start:end]

    def on_header_value(self, data: bytes, start: int, end: int) -> None:
        self._count_header(end - start)
        self._header_value += data[start:end]

    def on_header_end(self) -> None:
        self._headers[bytes(self._header_field).lower()] = bytes(self._header_value)
        self._header_field.clear()
        self._header_value.clear()

    def on_headers_finished(self) -> None:
        _, params = parse_options_header(self._headers.get(b"content-disposition", b""))
        if params.get(b"name") == FIELD.encode():
            if self.found:
                raise AppError("BAD_MULTIPART", 400, f"more than one '{FIELD}' part")
            self.found = self._in_file = True
            raw = params.get(b"filename")
            self.filename = clean_filename(raw.decode("utf-8", "replace")) if raw else None

    def on_part_data(self, data: bytes, start: int, end: int) -> None:
        if not self._in_file:
            return  # other fields are ignored (and bounded by the request cap)
        chunk = data[start:end]
        self.size += len(chunk)
        if self.size > self.max_bytes:
            raise AppError("PAYLOAD_TOO_LARGE", 413, f"the upload exceeds {self.max_bytes} bytes",
                           max_bytes=self.max_bytes)
        self.hasher.update(chunk)
        self.out.write(chunk)

    def on_part_end(self) -> None:
        self._in_file = False


def sweep_stale(upload_dir: Path, max_age_s: float = 3600.0) -> int:
    """Delete upload temp files a crashed process left behind; returns how many.

    Only our own names (`upload-*.bin`), and only old ones: a live upload keeps its file's
    mtime fresh, and a scan never outlives the wall-clock limit.
    """
    if not upload_dir.is_dir():
        return 0
    cutoff = time.time() - max_age_s
    removed = 0
    for path in upload_dir.glob("upload-*.bin"):
        try:
            if path.is_file() and path.stat().st_mtime < cutoff:
                path.unlink()
                removed += 1
        except OSError:
            continue
    return removed


async def paced(body: AsyncIterator[bytes], *, min_rate: int, grace_s: float) -> AsyncIterator[bytes]:
    """`body`, cut with 408 when it falls behind `min_rate` bytes/s after `grace_s` seconds:
    the next chunk must arrive by start + grace + received / min_rate. A client that
    trickles (or stalls) would otherwise hold a connection and a spool file for ever."""
    started = time.monotonic()
    received = 0
    chunks = aiter(body)
    while True:
        allowed = started + grace_s + received / min_rate - time.monotonic()
        try:
            chunk = await asyncio.wait_for(anext(chunks), timeout=max(allowed, 0.001))
        except StopAsyncIteration:
            return
        except TimeoutError as exc:
            raise AppError("UPLOAD_TOO_SLOW", 408, f"the upload fell below {min_rate} bytes/s "
                           f"({received} bytes in {time.monotonic() - started:.0f} s)") from exc
        received += len(chunk)
        yield chunk


async def receive_upload(content_type: str | None, content_length: str | None,
                         body: AsyncIterator[bytes], *, upload_dir: Path, max_bytes: int) -> Upload:
    """Stream the multipart body into a temp file in `upload_dir`; AppError on bad input."""
    ctype, params = parse_options_header(content_type or "")
    if ctype != b"multipart/form-data" or not params.get(b"boundary"):
        raise AppError("UNSUPPORTED_MEDIA_TYPE", 415,
                       f"send multipart/form-data with the checkpoint in field '{FIELD}'")
    if len(params[b"boundary"]) > MAX_BOUNDARY:
        raise AppError("BAD_MULTIPART", 400, f"the multipart boundary is longer than {MAX_BOUNDARY} "
                       "characters (RFC 2046 allows 70)")
    slack = MAX_PARTS * MAX_HEADER_BYTES  # multipart framing around the file bytes
    if content_length is not None:
        try:
            declared = int(content_length)
        except ValueError as exc:
            raise AppError("BAD_REQUEST", 400, "invalid Content-Length") from exc
        if declared > max_bytes + slack:
            raise AppError("PAYLOAD_TOO_LARGE", 413, f"the upload exceeds {max_bytes} bytes",
                           max_bytes=max_bytes)
    upload_dir.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix="upload-", suffix=".bin", dir=upload_dir)
    path = Path(name)
    try:
        with os.fdopen(fd, "wb") as out:
            receiver = _Receiver(out, max_bytes)
            parser = MultipartParser(params[b"boundary"], receiver.callbacks())  # type: ignore[arg-type]
            total = 0
            async for chunk in body:
                total += len(chunk)
                if total > max_bytes + slack:
                    raise AppError("PAYLOAD_TOO_LARGE", 413, f"the upload exceeds {max_bytes} bytes",
                                   max_bytes=max_bytes)
                try:
                    parser.write(chunk)
                except AppError:
                    raise
                except Exception as exc:  # python-multipart's MultipartParseError and friends
                    raise AppError("BAD_MULTIPART", 400, "the multipart body is malformed") from exc
            parser.finalize()
        if not receiver.complete:
            # a cut body: what arrived of the file may be a prefix, never judged as the file
            raise AppError("BAD_MULTIPART", 400, "the multipart body ends before its closing boundary")
        if not receiver.found:
            raise AppError("MISSING_FILE", 422, f"no multipart field named '{FIELD}'")
        return Upload(path=path, size=receiver.size, sha256=receiver.hasher.hexdigest(),
                      filename=receiver.filename)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
