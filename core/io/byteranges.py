"""HTTP range answers (RFC 9110 §14): `Content-Range` and multipart/byteranges bodies,
each checked against what was asked for."""

from __future__ import annotations

import re

from ckptguard.core.errors import Code, SourceError

CONTENT_RANGE = re.compile(r"^\s*bytes\s+(\d+)-(\d+)/(\d+)\s*$", re.IGNORECASE)


def multipart_boundary(ctype: str) -> bytes:
    m = re.search(r'boundary\s*=\s*"?([^";]+)"?', ctype, re.IGNORECASE)
    if m is None or len(m.group(1)) > 200:
        raise SourceError(Code.SOURCE_HTTP, f"multipart/byteranges without a boundary: {ctype!r}")
    return m.group(1).encode("latin-1", "replace")


def parse_byteranges(body: bytes, boundary: bytes, size: int, starts: set[int],
                     ends: set[int]) -> tuple[list[tuple[int, bytes]], bool]:
    """Parts of a multipart/byteranges body (RFC 9110 §14.6), each checked against the request.

    A part must start where a requested range starts and end where one ends (servers may
    merge adjacent ranges), and its total must be the file size. Returns the parts and
    whether the body was complete (a cut body keeps the parts that arrived whole).
    """
    delim = b"--" + boundary
    pos = body.find(delim)
    out: list[tuple[int, bytes]] = []
    while pos >= 0:
        pos += len(delim)
        if body[pos : pos + 2] == b"--":
            return out, True
        head_end = body.find(b"\r\n\r\n", pos)
        if head_end < 0:
            return out, False
        first = last = total = None
        for line in body[pos:head_end].split(b"\r\n"):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-range":
                m = CONTENT_RANGE.match(value.decode("latin-1"))
                if m is not None:
                    first, last, total = (int(g) for g in m.groups())
        if first is None or last is None or total is None:
            raise SourceError(Code.SOURCE_HTTP, "multipart part without a valid Content-Range")
        if total != size:
            raise SourceError(Code.SOURCE_CHANGED, f"file size changed from {size} to {total} bytes")
        if first not in starts or last + 1 not in ends or last < first:
            raise SourceError(Code.SOURCE_HTTP, f"multipart part {first}-{last}/{total} answers none "
                              "of the requested ranges", offset=first)
        data_at = head_end + 4
        data = body[data_at : data_at + last - first + 1]
        if len(data) != last - first + 1:
            return out, False
        out.append((first, data))
        pos = body.find(delim, data_at + len(data))
    return out, False
