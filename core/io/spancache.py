"""Byte spans of a remote file already fetched: disjoint, sorted, merged as they arrive."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from operator import le


class SpanCache:
    """Disjoint, sorted byte spans of the file; adjacent and overlapping spans merge."""

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._data: list[bytes] = []

    def __len__(self) -> int:
        return len(self._starts)

    @property
    def nbytes(self) -> int:
        return sum(len(d) for d in self._data)

    def add(self, start: int, data: bytes) -> None:
        if not data:
            return
        end = start + len(data)
        lo = bisect.bisect_left(self._starts, start)
        if lo > 0 and self._starts[lo - 1] + len(self._data[lo - 1]) >= start:
            lo -= 1
        hi = lo
        while hi < len(self._starts) and self._starts[hi] <= end:
            hi += 1
        if lo == hi:
            self._starts.insert(lo, start)
            self._data.insert(lo, data)
            return
        new_start = min(start, self._starts[lo])
        new_end = max(end, self._starts[hi - 1] + len(self._data[hi - 1]))
        buf = bytearray(new_end - new_start)
        for s, d in zip(self._starts[lo:hi], self._data[lo:hi], strict=True):
            buf[s - new_start : s - new_start + len(d)] = d
        buf[start - new_start : end - new_start] = data
        self._starts[lo:hi] = [new_start]
        self._data[lo:hi] = [bytes(buf)]

    def get(self, start: int, end: int) -> bytes | None:
        """The bytes of [start, end) if one cached span covers them, else None."""
        i = bisect.bisect_right(self._starts, start) - 1
        if i < 0:
            return None
        s, d = self._starts[i], self._data[i]
        if end <= s + len(d):
            return d[start - s : end - s]
        return None

    def touching(self, spans: Sequence[tuple[int, int]]) -> list[bool]:
        """For each (offset, nbytes) span, whether it shares a byte with a cached span.

        A scan's tens of thousands of local-header reads come in file order and rarely
        touch the few spans kept: then only the spans that start near a kept one are
        looked at (a bisect per kept span); spans out of order get a bisect each."""
        starts = self._starts
        ends = [s + len(d) for s, d in zip(starts, self._data, strict=True)]
        offs = [s[0] for s in spans]
        if all(map(le, offs[:-1], offs[1:])):
            return self._touching_in_order(spans, offs, starts, ends)
        count = len(starts)
        bisect_right = bisect.bisect_right
        out: list[bool] = []
        for off, n in spans:
            i = bisect_right(starts, off)   # cached spans [0, i) start at or before off
            out.append(n > 0 and ((i > 0 and ends[i - 1] > off)
                                  or (i < count and starts[i] < off + n)))
        return out

    @staticmethod
    def _touching_in_order(spans: Sequence[tuple[int, int]], offs: list[int],
                           starts: list[int], ends: list[int]) -> list[bool]:
        out = [False] * len(spans)
        longest = max(n for _, n in spans) if spans else 0
        for start, end in zip(starts, ends, strict=True):
            # a span sharing a byte with [start, end) begins in (start - longest, end)
            lo = bisect.bisect_right(offs, start - longest)
            for i in range(lo, bisect.bisect_left(offs, end)):
                off, n = spans[i]
                if n > 0 and off < end and start < off + n:
                    out[i] = True
        return out

    def missing(self, start: int, end: int) -> list[tuple[int, int]]:
        """The uncovered parts of [start, end) as [start, end) pairs."""
        out: list[tuple[int, int]] = []
        pos = start
        i = max(bisect.bisect_right(self._starts, start) - 1, 0)
        while pos < end and i < len(self._starts):
            s, e = self._starts[i], self._starts[i] + len(self._data[i])
            if e <= pos:
                i += 1
                continue
            if s >= end:
                break
            if s > pos:
                out.append((pos, s))
            pos = max(pos, e)
            i += 1
        if pos < end:
            out.append((pos, end))
        return out


def coalesce(spans: Sequence[tuple[int, int]], gap: int) -> list[tuple[int, int]]:
    """Merge [start, end) spans whose gap is at most `gap` bytes (one request each)."""
    out: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if out and start - out[-1][1] <= gap:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out
