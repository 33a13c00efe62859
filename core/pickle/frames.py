"""Where readers of a framed pickle (protocol 4+) disagree: an opcode across a FRAME's end.

Strategy: `pickle.loads(bytes)` and a linear reader (our VM) read the bytes in order and
ignore frame boundaries; pickle.py's unframer refuses a read past the end of a frame; the
C unpickler reading a file (`pickle.load(f)`, `torch.load(weights_only=False)` reading
`data.pkl` from a BytesIO) serves a read that does not fit in the current frame from the
file, after the frame, dropping the rest of the frame. A pickle writer never produces
such a read, and the bytes the C file reader then interprets are not the ones the VM
judged (CPython issue 154848; fickling's `test_frame_boundary_divergence`): a payload
can hide there. So each frame is walked opcode by opcode (argument lengths only, nothing
decoded) and must end on an opcode boundary, with no FRAME before its end.

    frame_divergence(data, [(frame_opcode_pos, start, end)]) -> (pos, message) | None

What the file reader then runs is replayed too: `file_reader_view` serves the bytes as the C
unpickler reading a file without `peek` (a BytesIO: how torch.load(weights_only=False)
reads data.pkl) serves them, opcode by opcode, and returns them as one linear pickle with
the map back to file offsets, so the VM can interpret the hidden opcodes and the threat
analysis name them.
"""

from __future__ import annotations

import bisect
import struct

from ckptguard.core.pickle.opcodes import OPCODES
from ckptguard.core.records import record

_LEN = {  # argument kind -> (bytes of the length prefix, struct format) of length-prefixed args
    "string1": (1, "<B"), "bytes1": (1, "<B"), "unicodestring1": (1, "<B"), "long1": (1, "<B"),
    "string4": (4, "<i"), "bytes4": (4, "<I"), "unicodestring4": (4, "<I"), "long4": (4, "<i"),
    "bytes8": (8, "<Q"), "unicodestring8": (8, "<Q"), "bytearray8": (8, "<Q"),
}
_LINES = {"decimalnl_short": 1, "decimalnl_long": 1, "stringnl": 1, "floatnl": 1,
          "unicodestringnl": 1, "stringnl_noescape": 1, "stringnl_noescape_pair": 2}
_FRAME = 0x95


def frame_divergence(data: bytes, frames: list[tuple[int, int, int]]) -> tuple[int, str] | None:
    """The first opcode (position, reason) where the framing makes readers disagree.

    `frames` are (position of the FRAME opcode, first byte of the frame, end of the frame)
    in the order the VM met them; each frame is walked at most up to the next FRAME, so
    the walks together cost one pass over the data."""
    n = len(data)
    for k, (at, start, end) in enumerate(frames):
        stop = min(end, n, frames[k + 1][0] if k + 1 < len(frames) else n)
        pos = start
        while pos < stop:
            nxt = _next_opcode(data, pos)
            if nxt is None:
                return None           # malformed or truncated: the VM reports that itself
            if data[pos] == _FRAME and pos < end:
                return pos, (f"a FRAME at {pos} starts before the end of the frame opened at "
                             f"{at} (pickle.py refuses it; the C unpickler reads on)")
            if nxt > end:
                name = OPCODES[data[pos]].name  # type: ignore[union-attr]
                return pos, (f"{name} at {pos} runs {nxt - end} bytes past the end of the "
                             f"FRAME opened at {at}: pickle.load(file) reads its argument from "
                             "after the frame, pickle.loads and this scan from inside it")
            pos = nxt
        if k + 1 < len(frames) and frames[k + 1][0] < min(end, n) and pos >= frames[k + 1][0]:
            nxt_at = frames[k + 1][0]
            return nxt_at, (f"a FRAME at {nxt_at} starts before the end of the frame opened at "
                            f"{at} (pickle.py refuses it; the C unpickler reads on)")
    return None


def _next_opcode(data: bytes, pos: int) -> int | None:
    """The position after the opcode at `pos` (its argument included), or None if unknown."""
    info = OPCODES[data[pos]]
    if info is None:
        return None
    kind = info.arg
    if kind is None:
        return pos + 1
    fixed = info.fixed_size
    if fixed:
        return pos + 1 + fixed
    if kind in _LEN:
        width, fmt = _LEN[kind]
        if pos + 1 + width > len(data):
            return None
        size = struct.unpack_from(fmt, data, pos + 1)[0]
        return None if size < 0 else pos + 1 + width + size
    lines = _LINES.get(kind)
    if lines is None:
        return None
    end = pos
    for _ in range(lines):
        end = data.find(b"\n", end + 1)
        if end < 0:
            return None
    return end + 1


@record(frozen=True, slots=True)
class FileView:
    """The opcodes pickle.load(file) runs, in its order, FRAMEs left out: a linear pickle."""

    data: bytes
    starts: tuple[int, ...]      # view position where each run of contiguous file bytes begins
    files: tuple[int, ...]       # ... and the file position it was served from
    diverges_at: int             # view position of the first opcode read across a cut

    def file_offset(self, pos: int) -> int:
        """The position in the pickle's data of view position `pos`."""
        k = max(bisect.bisect_right(self.starts, pos) - 1, 0)
        return self.files[k] + pos - self.starts[k]


class _FileReader:
    """CPython's C unpickler's input over a file without peek (`_Unpickler_Read`,
    `_Unpickler_Readline`, `load_frame` in Modules/_pickle.c): a read that does not fit in
    the current buffer (a frame) is served from the file, whose position is the buffer's end,
    and the rest of the buffer is dropped. What is served (FRAMEs aside) is kept, in order."""

    def __init__(self, data: bytes, start: int) -> None:
        self.data, self.fpos, self.cur, self.end = data, start, start, start
        self.out = bytearray()
        self.starts: list[int] = []
        self.files: list[int] = []
        self.cut = False                 # a read since the last reset dropped buffered bytes

    def keep(self, lo: int, hi: int) -> None:
        if not self.files or self.files[-1] + len(self.out) - self.starts[-1] != lo:
            self.starts.append(len(self.out))
            self.files.append(lo)
        self.out += self.data[lo:hi]

    def read(self, n: int) -> int | None:
        """Serve `n` bytes; their position in `data`, or None past the end."""
        if self.cur + n <= self.end:
            self.cur += n
            return self.cur - n
        if self.fpos + n > len(self.data):
            return None
        self.cut |= self.cur != self.end
        self.fpos = self.cur = self.end = self.fpos + n
        return self.fpos - n

    def readline(self) -> int | None:
        """Serve one line; where it starts (it ends at `self.cur`), or None without one."""
        nl = self.data.find(b"\n", self.cur, self.end)
        if nl >= 0:
            lo, self.cur = self.cur, nl + 1
            return lo
        nl = self.data.find(b"\n", self.fpos)
        if nl < 0:
            return None
        self.cut |= self.cur != self.end
        lo, self.fpos = self.fpos, nl + 1
        self.cur = self.end = self.fpos
        return lo

    def frame(self, size: int) -> bool:
        """load_frame: the frame's bytes become the buffer (read from the file unless they
        already are in it, as a frame inside a frame is)."""
        if self.cur + size <= self.end:
            return True
        if self.fpos + size > len(self.data):
            return False
        self.cut |= self.cur != self.end
        self.cur, self.end = self.fpos, self.fpos + size
        self.fpos += size
        return True


def file_reader_view(data: bytes, start: int = 0) -> FileView | None:
    """What pickle.load(file) runs of the pickle at `data[start:]`, or None where it reads
    exactly what a linear reader (pickle.loads, the VM) reads. One pass over the opcodes."""
    reader = _FileReader(data, start)
    diverges_at = -1
    while True:
        at = len(reader.out)
        reader.cut = False
        pos = reader.read(1)
        info = OPCODES[data[pos]] if pos is not None else None
        if pos is None or info is None:
            break
        if data[pos] == _FRAME:
            size = reader.read(8)
            if size is None or not reader.frame(struct.unpack_from("<Q", data, size)[0]):
                break
        else:
            reader.keep(pos, pos + 1)
            if not _read_argument(reader, info.arg, info.fixed_size):
                break
        if reader.cut and diverges_at < 0:
            diverges_at = at
        if data[pos] == 0x2E:   # STOP
            break
    if diverges_at < 0:
        return None
    return FileView(bytes(reader.out), tuple(reader.starts), tuple(reader.files), diverges_at)


def _read_argument(reader: _FileReader, kind: str | None, fixed: int | None) -> bool:
    """Serve (and keep) one opcode's argument as the C unpickler reads it."""
    if kind is None:
        return True
    if fixed:
        lo = reader.read(fixed)
        if lo is None:
            return False
        reader.keep(lo, lo + fixed)
        return True
    if kind in _LEN:
        width, fmt = _LEN[kind]
        lo = reader.read(width)
        if lo is None:
            return False
        reader.keep(lo, lo + width)
        size = struct.unpack_from(fmt, reader.data, lo)[0]
        if size < 0:
            return False
        body = reader.read(size)
        if body is None:
            return False
        reader.keep(body, body + size)
        return True
    for _ in range(_LINES.get(kind, 0) or -1):
        lo = reader.readline()
        if lo is None:
            return False
        reader.keep(lo, reader.cur)
    return kind in _LINES
