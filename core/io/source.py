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
from itertools import compress, repeat
from operator import add, lt, not_

from ckptguard.core.errors import Code, SourceError
from ckptguard.core.io.spancache import SpanCache
from ckptguard.core.records import record
from ckptguard.core.typenames import Protocol


@record(slots=True)
class IoStats:
    """What a source has read so far: bytes and read requests (HTTP requests for URLs)."""

    bytes_read: int = 0
    requests: int = 0


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


# Remote sources: spans closer than this are fetched together (a round trip costs more than
# the bytes). Local sources only join spans that touch: a pread is cheap, and a checkpoint of
# tensors smaller than the gap would otherwise be read whole.
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
                   spans: Sequence[tuple[int, int]], *, gap: int = COALESCE_GAP) -> list[bytes]:
    """Serve many spans with as few `read_at` calls as `coalesce` allows."""
    out: list[bytes] = [b""] * len(spans)
    for g_off, g_n, members in coalesce(spans, gap=gap):
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


class WindowSource:
    """A byte range of another source seen as a whole source (an npz member, a zip inside a
    region): offsets are relative to `base`, reads and counts go to the outer source."""

    def __init__(self, source: ByteSource, base: int, size: int, name: str) -> None:
        self._source, self._base, self._size = source, base, size
        self.name = name
        self.stats: IoStats = source.stats
        self.random_access_cheap: bool = getattr(source, "random_access_cheap", True)

    @property
    def size(self) -> int:
        return self._size

    def read_at(self, offset: int, nbytes: int) -> bytes:
        check_span(self._size, offset, nbytes)
        return self._source.read_at(self._base + offset, nbytes)

    def read_many(self, spans: Sequence[tuple[int, int]]) -> list[bytes]:
        for off, n in spans:
            check_span(self._size, off, n)
        return self._source.read_many([(self._base + off, n) for off, n in spans])


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
        """One pread a span (a pread is cheap locally); spans that overlap or touch are read
        together, so no byte is read twice and no byte between them is read at all.

        The usual call, a scan's tens of thousands of local headers in file order, runs
        its checks and preads in C loops (map), not a Python statement per span."""
        if not spans:
            return []
        offs = [s[0] for s in spans]
        sizes = [s[1] for s in spans]
        ends = list(map(add, offs, sizes))
        if min(offs) < 0 or min(sizes) < 0 or max(ends) > self._size \
                or not all(map(lt, ends[:-1], offs[1:])):   # out of bounds, or not in order
            return self._read_unordered(spans)
        try:
            out = list(map(os.pread, repeat(self._fd, len(offs)), sizes, offs))
        except OSError:
            out = None
        if out is None or list(map(len, out)) != sizes:   # an error or a short read
            return self._read_one_by_one(spans)
        self.stats.requests += len(spans)
        self.stats.bytes_read += sum(sizes)
        return out

    def _read_unordered(self, spans: Sequence[tuple[int, int]]) -> list[bytes]:
        size = self._size
        reach = -1
        for off, n in sorted(spans):
            if off < 0 or n < 0 or off + n > size:
                check_span(size, off, n)
            if off <= reach:
                return read_coalesced(self.read_at, spans, gap=0)
            reach = off + n
        return self._read_one_by_one(spans)

    def _read_one_by_one(self, spans: Sequence[tuple[int, int]]) -> list[bytes]:
        out: list[bytes] = []
        pread, fd, stats = os.pread, self._fd, self.stats
        for off, n in spans:
            try:
                got = pread(fd, n, off)
            except OSError:
                got = b""
            if len(got) != n:   # a short read or an error: read_at retries and reports it
                got = self.read_at(off, n)
                stats.requests -= 1
                stats.bytes_read -= n
            out.append(got)
        stats.requests += len(spans)
        stats.bytes_read += sum(n for _, n in spans)
        return out

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


class ReadOnce:
    """A scan's view of a local source: the few small spans read first (the sniff's head and
    tail, the end records, the pickle) are kept, and a later read that overlaps them reads
    only what is missing. So no byte is read twice, while the thousands of local-header
    reads of a many-tensor checkpoint pass straight through (they never overlap)."""

    random_access_cheap = True

    def __init__(self, inner: ByteSource, *, max_spans: int = 64, max_span: int = 1 << 20) -> None:
        self.inner = inner
        self.name = inner.name
        self.stats = inner.stats
        self._cache = SpanCache()
        self._adds_left = max_spans
        self._max_span = max_span

    @property
    def size(self) -> int:
        return self.inner.size

    def read_at(self, offset: int, nbytes: int) -> bytes:
        return self.read_many([(offset, nbytes)])[0]

    def read_many(self, spans: Sequence[tuple[int, int]]) -> list[bytes]:
        cache = self._cache
        touched = cache.touching(spans) if len(cache) else []
        if not any(touched):   # nothing kept is asked for again (the inner source checks spans)
            plain = self.inner.read_many(spans)
            self._keep(spans, plain)
            return plain
        # the few spans that share bytes with kept ones are pieced together; the others (a
        # scan's thousands of local headers) go to the inner source as they are, in the same
        # call as the missing pieces, so no byte is read twice
        hit = list(compress(range(len(spans)), touched))
        fresh = list(compress(range(len(spans)), map(not_, touched)))
        todo = [spans[i] for i in fresh]
        wanted: list[list[tuple[int, int]]] = []
        for i in hit:
            off, n = spans[i]
            check_span(self.size, off, n)
            gaps = cache.missing(off, off + n)
            wanted.append(gaps)
            todo.extend((s, e - s) for s, e in gaps)
        got = self.inner.read_many(todo) if todo else []
        out: list[bytes] = [b""] * len(spans)
        for i, data in zip(fresh, got, strict=False):
            out[i] = data
        pieces = iter(got[len(fresh):])
        for i, gaps in zip(hit, wanted, strict=True):
            off, n = spans[i]
            if not gaps:
                out[i] = cache.get(off, off + n) or b""
                continue
            buf = bytearray(n)
            for s, e in cache_parts(off, off + n, gaps):
                buf[s - off:e - off] = cache.get(s, e) or b""
            for s, e in gaps:
                buf[s - off:e - off] = next(pieces)
            out[i] = bytes(buf)
        self._keep(spans, out)
        return out

    def _keep(self, spans: Sequence[tuple[int, int]], out: list[bytes]) -> None:
        for (off, n), data in zip(spans, out, strict=True):
            if self._adds_left <= 0:
                return
            if 0 < n <= self._max_span:
                self._adds_left -= 1
                self._cache.add(off, data)


def cache_parts(start: int, end: int, gaps: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The parts of [start, end) that are not in `gaps` (so are in the cache)."""
    parts: list[tuple[int, int]] = []
    pos = start
    for s, e in gaps:
        if s > pos:
            parts.append((pos, s))
        pos = e
    if pos < end:
        parts.append((pos, end))
    return parts
