"""The zip format's byte layout (APPNOTE 4.3), written once for every zip reader here.

Pure spec data and two tolerant peeks: signatures, record sizes, the `struct` layouts of
the end records, central and local headers, the general-purpose flag bits — and the hints
the remote source uses to speculate which bytes a scan will want (each one validated for
real by core.zip.directory afterwards). Imports nothing of ours but the limits, so every
layer may use it (the HTTP source included).
"""

from __future__ import annotations

import struct

from ckptguard.core.limits import Limits

EOCD_SIG = b"PK\x05\x06"
ZIP64_EOCD_SIG = b"PK\x06\x06"
ZIP64_LOCATOR_SIG = b"PK\x06\x07"
CENTRAL_SIG = 0x02014B50
LOCAL_SIG = 0x04034B50
EOCD_SIZE = 22
ZIP64_EOCD_SIZE = 56
ZIP64_LOCATOR_SIZE = 20
CENTRAL_SIZE = 46
LOCAL_SIZE = 30
U16_MAX = 0xFFFF
U32_MAX = 0xFFFFFFFF
ZIP64_EXTRA_ID = 0x0001
FLAG_UTF8 = 0x0800

EOCD_STRUCT = struct.Struct("<4sHHHHIIH")
ZIP64_EOCD_STRUCT = struct.Struct("<4sQHHIIQQQQ")
ZIP64_LOCATOR_STRUCT = struct.Struct("<4sIQI")
CENTRAL_STRUCT = struct.Struct("<I6H3I5H2I")
LOCAL_STRUCT = struct.Struct("<I5H3I2H")
EXTRA_HEAD_STRUCT = struct.Struct("<HH")
U64_STRUCT = struct.Struct("<Q")

# general-purpose bit flags
FLAG_ENCRYPTED = 0x0001
FLAG_DESCRIPTOR = 0x0008
FLAG_PATCHED = 0x0020      # "compressed patched data": miniz's "unsupported feature"
FLAG_STRONG_ENCRYPTION = 0x0040
FLAG_MASKED_HEADER = 0x2000
# what miniz refuses as "unsupported encryption" (bit 13: the whole archive, at open)
ENCRYPTION_FLAGS = FLAG_ENCRYPTED | FLAG_STRONG_ENCRYPTION | FLAG_MASKED_HEADER
# the DOS directory attribute in a central record's external attributes
DOS_DIRECTORY = 0x10


def miniz_directory(name_bytes: bytes, external_attr: int) -> bool:
    """miniz takes an entry for a directory (mz_zip_reader_is_file_a_directory) when its
    name ends with "/" or its DOS directory attribute is set, whatever the host byte says;
    its extract then returns at once, writing nothing (torch reads an uninitialized buffer)."""
    return name_bytes.endswith(b"/") or bool(external_attr & DOS_DIRECTORY)


# --- hints for a remote reader's speculation (validated for real by core.zip.directory) ---

def peek_central_directory(tail: bytes, tail_offset: int, size: int,
                           limits: Limits) -> tuple[int, int, int] | None:
    """(start, end, entries) of the central directory if the tail shows one, else None."""
    pos = tail.rfind(EOCD_SIG)
    if pos < 0 or pos + EOCD_STRUCT.size > len(tail):
        return None
    _sig, _disk, _cd_disk, _n_disk, entries, cd_size, cd_offset, _clen = \
        EOCD_STRUCT.unpack_from(tail, pos)
    if entries == U16_MAX or U32_MAX in (cd_size, cd_offset):
        loc = pos - ZIP64_LOCATOR_STRUCT.size
        if loc < 0 or tail[loc : loc + 4] != ZIP64_LOCATOR_SIG:
            return None
        z64_at = ZIP64_LOCATOR_STRUCT.unpack_from(tail, loc)[2] - tail_offset
        if (z64_at < 0 or z64_at + ZIP64_EOCD_STRUCT.size > len(tail)
                or tail[z64_at : z64_at + 4] != ZIP64_EOCD_SIG):
            return None
        fields = ZIP64_EOCD_STRUCT.unpack_from(tail, z64_at)
        entries, cd_size, cd_offset = fields[7], fields[8], fields[9]
    if cd_offset + cd_size > size or cd_size > limits.max_central_dir_bytes:
        return None
    return cd_offset, cd_offset + cd_size, entries


def peek_first_local_header(head: bytes) -> tuple[bytes, int] | None:
    """(name, data start) of the record at offset 0 if it is a stored local header."""
    if len(head) < LOCAL_STRUCT.size or not head.startswith(b"PK\x03\x04"):
        return None
    fields = LOCAL_STRUCT.unpack_from(head, 0)
    method, n, m = fields[3], fields[9], fields[10]
    name = head[LOCAL_STRUCT.size : LOCAL_STRUCT.size + n]
    if method != 0 or len(name) != n:
        return None
    return name, LOCAL_STRUCT.size + n + m


def peek_first_central_entry(cd: bytes) -> tuple[bytes, int, int, int] | None:
    """(name, header offset, method, compressed size) of the first central entry."""
    if len(cd) < CENTRAL_STRUCT.size or not cd.startswith(b"PK\x01\x02"):
        return None
    f = CENTRAL_STRUCT.unpack_from(cd, 0)
    method, csize, n, m, offset = f[4], f[8], f[10], f[11], f[16]
    name = cd[CENTRAL_STRUCT.size : CENTRAL_STRUCT.size + n]
    extra = cd[CENTRAL_STRUCT.size + n : CENTRAL_STRUCT.size + n + m]
    if len(name) != n or len(extra) != m:
        return None
    if 0xFFFFFFFF in (csize, offset):  # zip64 extra: usize, csize, offset as needed
        vals: list[int] = []
        pos = 0
        while pos + 4 <= len(extra):
            tag, ln = struct.unpack_from("<HH", extra, pos)
            if tag == 1:
                vals = [v for (v,) in struct.iter_unpack("<Q", extra[pos + 4 : pos + 4 + ln - ln % 8])]
            pos += 4 + ln
        usize = f[9]
        it = iter(vals)
        if usize == 0xFFFFFFFF:
            next(it, None)
        if csize == 0xFFFFFFFF:
            csize = next(it, -1)
        if offset == 0xFFFFFFFF:
            offset = next(it, -1)
        if csize < 0 or offset < 0:
            return None
    return name, offset, method, csize
