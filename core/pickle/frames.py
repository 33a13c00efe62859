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
"""

from __future__ import annotations

import struct

from ckptguard.core.pickle.opcodes import OPCODES

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
