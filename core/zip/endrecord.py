"""Where a zip's end of central directory record is: the bytes miniz searches and the
record it picks. A module of its own, with no parsing around it: both the general path
(core.zip.directory) and the fast lane's reader (core.zip.columns) start here, and a clean
checkpoint's scan loads no more of the zip layer than the lane needs
(tests/core/scan/test_cold_start.py)."""

from __future__ import annotations

from ckptguard.core.errors import Code, FormatError
from ckptguard.core.io.source import ByteSource
from ckptguard.core.zip.layout import EOCD_SIG, EOCD_SIZE, U16_MAX

MINIZ_BLOCK = 4096   # mz_zip_reader_locate_header_sig reads the tail in 4 KiB blocks ...
MINIZ_STEP = 4093    # ... stepping back 4096 - 3 so a signature across blocks is seen


def eocd_search_start(size: int) -> int:
    """First byte miniz's backward EOCD scan ever looks at in a `size`-byte file.

    miniz scans blocks at size-4096-4093k and gives up once it has gone back 64 KiB + 22.
    When the next block would start before byte 0, `cur_file_ofs - (sizeof(buf) - 3)`
    wraps (int64 minus size_t) and the read fails: the scan never reaches the file start.
    Verified with torch 2.13: an archive followed by 65 535 zero bytes is refused, one
    followed by 69 000 is read (tests/core/zip/test_zip_torch.py).
    """
    cur = max(size - MINIZ_BLOCK, 0)
    while cur != 0 and size - cur < U16_MAX + EOCD_SIZE and cur - MINIZ_STEP >= 0:
        cur -= MINIZ_STEP
    return cur


def read_tail(source: ByteSource) -> tuple[bytes, int]:
    """(the bytes miniz searches for the end record, the offset they start at)."""
    start = eocd_search_start(source.size)
    return source.read_at(start, source.size - start), start


def find_eocd(tail: bytes, tail_offset: int) -> int:
    """Absolute offset of the EOCD miniz picks: the last signature whose 22 bytes fit.

    `tail` holds the file from `tail_offset` (= eocd_search_start) to its end.
    """
    pos = tail.rfind(EOCD_SIG, 0, len(tail) - EOCD_SIZE + 4)
    if pos >= 0:
        return tail_offset + pos
    raise FormatError(Code.ZIP_NO_EOCD, "no end-of-central-directory record where miniz looks "
                      "(the last ~64 KiB)", offset=tail_offset)
