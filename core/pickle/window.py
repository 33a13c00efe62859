"""Pickles that sit back to back inside a larger file, read without reading the file.

Strategy: a legacy torch stream (and each member of a legacy tar) holds pickles followed
by raw storage bytes. Where a pickle ends is only known by walking its opcodes, so the
window over the file starts small and doubles until the walk reaches STOP, never past
the cap. The walk reads argument lengths only (no values) and resumes at the opcode
that ran past the window, so finding the end costs O(pickle) however often it grows.
"""

from __future__ import annotations

import struct

from ckptguard.core.errors import Code, LimitExceeded
from ckptguard.core.io.source import ByteSource
from ckptguard.core.pickle.opcodes import OPCODES
from ckptguard.core.state import Analysis

FIRST_WINDOW = 1 << 20

# Opcode byte -> how its argument is laid out: fixed byte count (int), "line"/"line2"
# (one/two newline-terminated lines) or a struct format for a length prefix.
_PREFIX = {"long1": "<B", "string1": "<B", "bytes1": "<B", "unicodestring1": "<B",
           "long4": "<i", "string4": "<i", "bytes4": "<I", "unicodestring4": "<I",
           "bytes8": "<Q", "bytearray8": "<Q", "unicodestring8": "<Q"}
_LAYOUT: list[int | str | None] = []
for _info in OPCODES:
    if _info is None:
        _LAYOUT.append(None)
    elif _info.fixed_size is not None:
        _LAYOUT.append(_info.fixed_size)
    elif _info.arg == "stringnl_noescape_pair":
        _LAYOUT.append("line2")
    elif _info.arg in _PREFIX:
        _LAYOUT.append(_PREFIX[_info.arg])
    else:
        _LAYOUT.append("line")
_STOP = ord(".")
_STRUCTS = {fmt: struct.Struct(fmt) for fmt in set(_PREFIX.values())}


def skip_pickle(buf: bytes, pos: int) -> tuple[str, int]:
    """Walk opcodes (lengths only, no values) from `pos`: ("end", after STOP),
    ("more", start of the opcode that runs past `buf`) or ("bad", offending opcode)."""
    n = len(buf)
    layout = _LAYOUT
    while pos < n:
        op = buf[pos]
        kind = layout[op]
        start = pos
        pos += 1
        if kind is None:
            return "bad", start
        if op == _STOP:
            return "end", pos
        if type(kind) is int:
            pos += kind
        elif kind == "line":
            pos = buf.find(b"\n", pos) + 1
            if pos == 0:
                return "more", start
        elif kind == "line2":
            first = buf.find(b"\n", pos)
            pos = buf.find(b"\n", first + 1) + 1 if first >= 0 else 0
            if pos == 0:
                return "more", start
        else:
            prefix = _STRUCTS[str(kind)]
            size = prefix.size
            if pos + size > n:
                return "more", start
            length = prefix.unpack_from(buf, pos)[0]
            if length < 0:
                return "bad", start
            pos += size + length
        if pos > n:
            return "more", start
    return "more", pos


class PickleWindow:
    """Bytes [start, start + len(buf)) of `source`, grown on demand up to `cap` bytes or `end`."""

    def __init__(self, source: ByteSource, cap: int, *, start: int = 0, end: int | None = None,
                 first: int = FIRST_WINDOW) -> None:
        self.source = source
        self.start = start
        self.stop = min(source.size if end is None else end, source.size)
        self.cap = max(0, min(self.stop - start, cap))
        self.first = first
        self.buf = source.read_at(start, min(self.cap, first))

    def grow(self) -> bool:
        have = len(self.buf)
        if have >= self.cap:
            return False
        more = min(self.cap, max(2 * have, self.first)) - have
        self.buf += self.source.read_at(self.start + have, more)
        return True

    def ensure(self, pos: int) -> bool:
        """Make buf[:pos] available; False if the region or the cap ends first."""
        while len(self.buf) < pos:
            if not self.grow():
                return False
        return True

    def pickle_end(self, pos: int, an: Analysis) -> int | None:
        """Position (in buf) after the STOP of the pickle at `pos`; None if it never completes.

        The walk resumes where it ran out of bytes, so growing the window costs O(total)."""
        at = pos
        while True:
            status, at = skip_pickle(self.buf, at)
            if status == "end":
                return at
            if status == "bad":
                return None
            if not self.grow():
                if self.start + len(self.buf) < self.stop:
                    raise LimitExceeded(Code.LIMIT_PICKLE_SIZE,
                                        f"pickles exceed {self.cap} bytes", offset=self.start + pos)
                return None
