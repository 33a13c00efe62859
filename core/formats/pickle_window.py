"""Pickles that sit back to back inside a larger file, read without reading the file.

Strategy: a legacy torch stream (and each member of a legacy tar) holds pickles followed
by raw storage bytes. Where a pickle ends is only known by interpreting it, so the
window over the file starts at 1 MiB and doubles until the pickle reaches STOP (the VM
stops at the first truncation, so the total work stays linear), never past the cap.
"""

from __future__ import annotations

from core.analysis import Analysis
from core.errors import Code, LimitExceeded
from core.source import ByteSource
from core.vm import run_vm

FIRST_WINDOW = 1 << 20


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
        """Position (in buf) after the STOP of the pickle at `pos`; None if it never completes."""
        while True:
            vm = run_vm(self.buf, start=pos, base_offset=self.start, limits=an.options.limits)
            if vm.complete:
                return vm.end
            if vm.error is None or vm.error.code != Code.PICKLE_TRUNCATED:
                return None
            if not self.grow():
                if self.start + len(self.buf) < self.stop:
                    raise LimitExceeded(Code.LIMIT_PICKLE_SIZE,
                                        f"pickles exceed {self.cap} bytes", offset=self.start + pos)
                return None
