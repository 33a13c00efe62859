"""Byte sources: where scanned bytes come from, counted.

Parsers never open files or sockets; they ask a `ByteSource` for exact byte
ranges. Every source counts what it reads (`IoStats`) so the report can show that
a 2 GB checkpoint was judged from a few hundred kilobytes.

Example:
    >>> src = BytesSource(b"PK\\x03\\x04rest", name="x.pt")
    >>> src.read_at(0, 4)
    b'PK\\x03\\x04'
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from core.errors import Code, SourceError


@dataclass(slots=True)
class IoStats:
    """What a source has read so far: bytes and read requests (HTTP requests for URLs)."""

    bytes_read: int = 0
    requests: int = 0


@runtime_checkable
class ByteSource(Protocol):
    """Random access to an immutable byte string of known size."""

    name: str
    stats: IoStats

    @property
    def size(self) -> int: ...

    def read_at(self, offset: int, nbytes: int) -> bytes:
        """Exactly `nbytes` bytes from `offset`; SourceError if they are not all there."""
        ...

    def read_many(self, spans: Sequence[tuple[int, int]]) -> list[bytes]:
        """Several (offset, nbytes) spans at once; remote sources coalesce them."""
        ...


def check_span(size: int, offset: int, nbytes: int) -> None:
    """Raise SourceError unless [offset, offset+nbytes) lies inside a file of `size` bytes."""
    if offset < 0 or nbytes < 0 or offset + nbytes > size:
        raise SourceError(Code.SOURCE_SHORT_READ,
                          f"read of {nbytes} bytes at {offset} past end of {size}-byte input",
                          offset=offset)


class BytesSource:
    """An in-memory source (tests, small uploads)."""

    def __init__(self, data: bytes | bytearray | memoryview, *, name: str = "<bytes>") -> None:
        self._data = bytes(data)
        self.name = name
        self.stats = IoStats()

    @property
    def size(self) -> int:
        return len(self._data)

    def read_at(self, offset: int, nbytes: int) -> bytes:
        check_span(len(self._data), offset, nbytes)
        self.stats.requests += 1
        self.stats.bytes_read += nbytes
        return self._data[offset : offset + nbytes]

    def read_many(self, spans: Sequence[tuple[int, int]]) -> list[bytes]:
        return [self.read_at(off, n) for off, n in spans]


class FileSource:
    """A local file read with `os.pread`: no shared file position, safe across threads."""

    def __init__(self, path: str | os.PathLike[str], *, name: str | None = None) -> None:
        self.path = os.fspath(path)
        self.name = name if name is not None else os.path.basename(self.path)
        self.stats = IoStats()
        try:
            self._fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
            self._size = os.fstat(self._fd).st_size
        except OSError as exc:
            raise SourceError(Code.SOURCE_IO, f"cannot open {self.name}: {exc.strerror}") from exc

    @property
    def size(self) -> int:
        return self._size

    def read_at(self, offset: int, nbytes: int) -> bytes:
        check_span(self._size, offset, nbytes)
        self.stats.requests += 1
        chunks: list[bytes] = []
        got = 0
        while got < nbytes:
            try:
                chunk = os.pread(self._fd, nbytes - got, offset + got)
            except OSError as exc:
                raise SourceError(Code.SOURCE_IO, f"read failed: {exc.strerror}",
                                  offset=offset + got) from exc
            if not chunk:  # the file shrank under us
                raise SourceError(Code.SOURCE_SHORT_READ, "file ended early", offset=offset + got)
            chunks.append(chunk)
            got += len(chunk)
        self.stats.bytes_read += nbytes
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def read_many(self, spans: Sequence[tuple[int, int]]) -> list[bytes]:
        return [self.read_at(off, n) for off, n in spans]

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> FileSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: S110 - interpreter shutdown
            pass
