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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from ckptguard.core.errors import Code, SourceError


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
    # False when scattered small reads are expensive (HTTP): readers then skip optional
    # scattered reads (e.g. every zip local header) and say so in the report.
    random_access_cheap: bool

    @property
    def size(self) -> int: ...

    def read_at(self, offset: int, nbytes: int) -> bytes:
        """Exactly `nbytes` bytes from `offset`; SourceError if they are not all there."""
        ...

    def read_many(self, spans: Sequence[tuple[int, int]]) -> list[bytes]:
        """Several (offset, nbytes) spans at once; remote sources coalesce them."""
        ...


# Spans closer than this are read together: one syscall instead of thousands for the local
# headers of a many-tensor checkpoint, while the weights between big storages stay unread.
COALESCE_GAP = 64 * 1024
COALESCE_MAX = 8 * 1024 * 1024


def coalesce(spans: Sequence[tuple[int, int]], *, gap: int = COALESCE_GAP,
             max_span: int = COALESCE_MAX) -> list[tuple[int, int, list[int]]]:
    """Group (offset, nbytes) spans into reads: [(offset, nbytes, [indices of spans])].

    >>> coalesce([(0, 10), (20, 5), (10**6, 4)])
    [(0, 25, [0, 1]), (1000000, 4, [2])]
    """
    order = sorted(range(len(spans)), key=lambda i: spans[i][0])
    groups: list[tuple[int, int, list[int]]] = []
    for i in order:
        off, n = spans[i]
        if groups:
            g_off, g_n, members = groups[-1]
            end = max(g_off + g_n, off + n)
            if off <= g_off + g_n + gap and end - g_off <= max_span:
                members.append(i)
                groups[-1] = (g_off, end - g_off, members)
                continue
        groups.append((off, n, [i]))
    return groups


def read_coalesced(read_at: Callable[[int, int], bytes],
                   spans: Sequence[tuple[int, int]]) -> list[bytes]:
    """Serve many spans with as few `read_at` calls as `coalesce` allows."""
    out: list[bytes] = [b""] * len(spans)
    for g_off, g_n, members in coalesce(spans):
        if len(members) == 1:
            off, n = spans[members[0]]
            out[members[0]] = read_at(off, n)
            continue
        block = memoryview(read_at(g_off, g_n))
        for i in members:
            off, n = spans[i]
            out[i] = bytes(block[off - g_off: off - g_off + n])
    return out


def check_span(size: int, offset: int, nbytes: int) -> None:
    """Raise SourceError unless [offset, offset+nbytes) lies inside a file of `size` bytes."""
    if offset < 0 or nbytes < 0 or offset + nbytes > size:
        raise SourceError(Code.SOURCE_SHORT_READ,
                          f"read of {nbytes} bytes at {offset} past end of {size}-byte input",
                          offset=offset)


class BytesSource:
    """An in-memory source (tests, small uploads)."""

    random_access_cheap = True

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

    random_access_cheap = True

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
        for off, n in spans:
            check_span(self._size, off, n)
        return read_coalesced(self.read_at, spans)

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
