"""A small zip writer for hostile test archives: every field can be forced.

Strategy: lay out local records in order (optional gap bytes before each), then the
central directory in `central_order`, then optional zip64 EOCD + locator, then the
EOCD. Every value that a parser might trust is overridable per member.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import BinaryIO

U32 = 0xFFFFFFFF


@dataclass
class Member:
    name: str | bytes
    data: bytes = b""
    method: int = 0                      # 0 stored, 8 deflate (data is compressed here)
    flags: int = 0x0800
    local_name: bytes | None = None      # local header name if different
    local_flags: int | None = None
    local_method: int | None = None
    local_sizes: tuple[int, int] | None = None   # (csize, usize) in the local header
    crc: int | None = None               # central CRC (default: real CRC of the payload)
    local_extra: bytes = b""
    central_extra: bytes = b""
    gap_before: bytes = b""              # bytes written before this local header
    header_offset: int | None = None     # force the central header offset
    zip64_central: bool = False          # sizes + offset through the zip64 extra field
    descriptor: bool = False             # write a 16-byte data descriptor after the payload
    payload: bytes | None = None         # raw stored bytes (default: data, deflated if method 8)
    offset: int = field(default=0, init=False)

    @property
    def raw_name(self) -> bytes:
        return self.name.encode() if isinstance(self.name, str) else self.name


def fb_extra(pad: int) -> bytes:
    return b"FB" + struct.pack("<H", pad) + b"Z" * pad


def build_zip(members: Sequence[Member], *, prepend: bytes = b"", append: bytes = b"",
              comment: bytes = b"", zip64_eocd: bool = False,
              central_order: Sequence[int] | None = None, relative_offsets: bool = False,
              eocd_overrides: dict[str, int] | None = None) -> bytes:
    """Build the archive. `relative_offsets`: offsets count from after `prepend` (SFX style)."""
    out = bytearray(prepend)
    base = len(prepend) if relative_offsets else 0
    payloads: list[bytes] = []
    for m in members:
        out += m.gap_before
        m.offset = len(out) - base
        payload = m.payload
        if payload is None:
            if m.method == 8:
                co = zlib.compressobj(6, zlib.DEFLATED, -15)
                payload = co.compress(m.data) + co.flush()
            else:
                payload = m.data
        payloads.append(payload)
        lname = m.local_name if m.local_name is not None else m.raw_name
        lcs, lus = m.local_sizes if m.local_sizes is not None else (len(payload), len(m.data))
        crc = zlib.crc32(m.data)
        out += struct.pack("<4sHHHHHIIIHH", b"PK\x03\x04", 20,
                           m.local_flags if m.local_flags is not None else m.flags,
                           m.local_method if m.local_method is not None else m.method,
                           0, 0, crc, lcs, lus, len(lname), len(m.local_extra))
        out += lname + m.local_extra + payload
        if m.descriptor:
            out += struct.pack("<4sIII", b"PK\x07\x08", crc, len(payload), len(m.data))
    cd_start = len(out)
    order = central_order if central_order is not None else range(len(members))
    for i in order:
        m, payload = members[i], payloads[i]
        hoff = m.header_offset if m.header_offset is not None else m.offset
        csize, usize, extra = len(payload), len(m.data), m.central_extra
        if m.zip64_central:
            extra = struct.pack("<HHQQQ", 1, 24, usize, csize, hoff) + extra
            csize = usize = hoff = U32
        crc = m.crc if m.crc is not None else zlib.crc32(m.data)
        out += struct.pack("<4sHHHHHHIIIHHHHHII", b"PK\x01\x02", 20, 20, m.flags, m.method, 0, 0,
                           crc, csize, usize, len(m.raw_name), len(extra), 0, 0, 0, 0, hoff)
        out += m.raw_name + extra
    cd_end = len(out)
    n = len(order)
    ov = eocd_overrides or {}
    cd_size, cd_off = cd_end - cd_start, cd_start - base
    if zip64_eocd:
        z64 = len(out) - base
        out += struct.pack("<4sQHHIIQQQQ", b"PK\x06\x06", 44, 45, 45, ov.get("z64_disk", 0), 0,
                           ov.get("z64_n_disk", n), ov.get("z64_n", n), ov.get("z64_cd_size", cd_size),
                           ov.get("z64_cd_offset", cd_off))
        out += struct.pack("<4sIQI", b"PK\x06\x07", 0, ov.get("locator", z64), 1)
        n16, cd_size32, cd_off32 = 0xFFFF, U32, U32
    else:
        n16, cd_size32, cd_off32 = n, cd_size, cd_off
    out += struct.pack("<4sHHHHIIH", b"PK\x05\x06", ov.get("disk", 0), ov.get("cd_disk", 0),
                       ov.get("n_disk", n16), ov.get("n", n16), ov.get("cd_size", cd_size32),
                       ov.get("cd_offset", cd_off32), len(comment))
    out += comment + append
    return bytes(out)


def write_torch_like(f: BinaryIO, prefix: str, records: Sequence[tuple[str, bytes | int]],
                     alignment: int = 64, *, gaps: dict[str, bytes] | None = None) -> None:
    """Write records the way torch's miniz writer lays them out (FORMATS.md §1.2).

    A record given as an int is that many zero bytes left as a sparse hole (CRC 0), so a
    zip64 archive of several GiB costs a few KiB on disk. `gaps` puts bytes before a
    record's local header (a layout torch's writer never produces).
    """
    gaps = gaps or {}
    central: list[tuple[bytes, int, int, int, int]] = []
    pos = 0
    for name, payload in records:
        full = f"{prefix}/{name}".encode()
        size = payload if isinstance(payload, int) else len(payload)
        if name in gaps:
            f.seek(pos)
            f.write(gaps[name])
            pos += len(gaps[name])
        h = pos
        big_size, big_off = size >= U32, h >= U32
        z64 = b""
        if big_size or big_off:
            body = (struct.pack("<QQ", size, size) if big_size else b"") + (
                struct.pack("<Q", h) if big_off else b"")
            z64 = struct.pack("<HH", 1, len(body)) + body
        start = h + 30 + len(full) + len(z64) + 4
        data = -(-start // alignment) * alignment
        extra = z64 + fb_extra(data - start)
        flags = 0x0808 if size else 0x0800
        crc = 0 if isinstance(payload, int) else zlib.crc32(payload)
        f.seek(h)
        f.write(struct.pack("<4sHHHHHIIIHH", b"PK\x03\x04", 0, flags, 0, 0, 0, 0, 0, 0,
                            len(full), len(extra)) + full + extra)
        assert f.tell() == data
        if isinstance(payload, bytes):
            f.write(payload)
        pos = data + size
        if size:
            desc = (struct.pack("<4sIQQ", b"PK\x07\x08", crc, size, size) if big_size or big_off
                    else struct.pack("<4sIII", b"PK\x07\x08", crc, size, size))
            f.seek(pos)
            f.write(desc)
            pos += len(desc)
        central.append((full, h, size, crc, flags))
    cd_start = pos
    f.seek(pos)
    for full, h, size, crc, flags in central:
        fields = b""
        cs = us = size
        ho = h
        if size >= U32:
            fields += struct.pack("<QQ", size, size)
            cs = us = U32
        if h >= U32:
            fields += struct.pack("<Q", h)
            ho = U32
        extra = struct.pack("<HH", 1, len(fields)) + fields if fields else b""
        f.write(struct.pack("<4sHHHHHHIIIHHHHHII", b"PK\x01\x02", 45, 45, flags, 0, 0, 0, crc,
                            cs, us, len(full), len(extra), 0, 0, 0, 0, ho) + full + extra)
    cd_end = f.tell()
    n = len(central)
    f.write(struct.pack("<4sQHHIIQQQQ", b"PK\x06\x06", 44, 45, 45, 0, 0, n, n,
                        cd_end - cd_start, cd_start))
    f.write(struct.pack("<4sIQI", b"PK\x06\x07", 0, cd_end, 1))
    f.write(struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, min(n, 0xFFFF), min(n, 0xFFFF),
                        min(cd_end - cd_start, U32), min(cd_start, U32), 0))
