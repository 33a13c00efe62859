"""Write archives exactly as torch's PyTorchStreamWriter lays them out (FORMATS.md §1),
with any data.pkl: the shape the fast lane (core.lane.torch_zip) is built to accept.

Records in order, each local header with flags 0x0808 (sizes and CRC deferred to a
16-byte data descriptor; empty records 0x0800 with the real values and no descriptor),
an "FB" extra field padding the data to the alignment, then the central directory, the
zip64 end record + locator, and the end record.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence

from tests.builders.pickle_asm import asm

META = (("version", b"3\n"), (".format_version", b"1"), (".storage_alignment", b"64"),
        ("byteorder", b"little"))


def torch_layout(prefix: str, data_pkl: bytes, storages: Sequence[tuple[str, bytes]] = (),
                 *, alignment: int = 64, meta: Sequence[tuple[str, bytes]] = META,
                 bare: frozenset[str] = frozenset(), descriptor_signature: bool = True) -> bytes:
    """`bare`: records written with no extra field (as zipfile writes them); the serialization
    id comes last unless `meta` places it. `descriptor_signature=False`: 12-byte data
    descriptors without their PK\\x07\\x08 signature (another writer's, which APPNOTE allows)."""
    records = [("data.pkl", data_pkl), *((f"data/{k}", b) for k, b in storages), *meta]
    if ".data/serialization_id" not in dict(meta):
        records.append((".data/serialization_id", b"0" * 40))
    out = bytearray()
    central = bytearray()
    for rel, payload in records:
        name = f"{prefix}/{rel}".encode()
        offset = len(out)
        crc = zlib.crc32(payload)
        empty = not payload
        flags = 0x0800 if empty else 0x0808
        start = offset + 30 + len(name) + 4
        pad = (-start) % alignment if alignment > 1 else 0
        extra = b"" if rel in bare else b"FB" + struct.pack("<H", pad) + b"Z" * pad
        local_crc, local_size = (crc, 0) if empty else (0, 0)
        out += struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, flags, 0, 0, 0, local_crc,
                           local_size, local_size, len(name), len(extra)) + name + extra
        out += payload
        if not empty:
            signature = struct.pack("<I", 0x08074B50) if descriptor_signature else b""
            out += signature + struct.pack("<III", crc, len(payload), len(payload))
        central += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 0x031E, 20, flags, 0, 0, 0,
                               crc, len(payload), len(payload), len(name), 0, 0, 0, 0, 0,
                               offset) + name
    cd_offset = len(out)
    out += central
    z64 = len(out)
    count = len(records)
    out += struct.pack("<IQHHIIQQQQ", 0x06064B50, 44, 0x031E, 45, 0, 0, count, count,
                       len(central), cd_offset)
    out += struct.pack("<IIQI", 0x07064B50, 0, z64, 1)
    out += struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0)
    return bytes(out)


def v2(key: str, *, numel: int = 2, offset: int = 0, size: Sequence[int] = (2,),
       stride: Sequence[int] = (1,), requires_grad: bool = False,
       storage: str = "FloatStorage") -> list[object]:
    """Opcodes of `_rebuild_tensor_v2(pid, offset, size, stride, rg, OrderedDict())`."""
    return [("GLOBAL", "torch._utils", "_rebuild_tensor_v2"), "MARK",
            "MARK", ("BINUNICODE", "storage"), ("GLOBAL", "torch", storage),
            ("BINUNICODE", key), ("BINUNICODE", "cpu"), _int(numel), "TUPLE", "BINPERSID",
            _int(offset), "MARK", *(_int(n) for n in size), "TUPLE",
            "MARK", *(_int(n) for n in stride), "TUPLE",
            "NEWTRUE" if requires_grad else "NEWFALSE",
            ("GLOBAL", "collections", "OrderedDict"), "EMPTY_TUPLE", "REDUCE",
            "TUPLE", "REDUCE"]


def _int(n: int) -> tuple[str, int]:
    return ("BININT", n) if -(1 << 31) <= n < (1 << 31) else ("LONG1", n)


def state_dict(*items: tuple[str, list[object]], extra: Sequence[object] = ()) -> bytes:
    """`{name: tensor, ...}` as one SETITEMS, `extra` opcodes before STOP."""
    body: list[object] = [("PROTO", 2), "EMPTY_DICT", "MARK"]
    for name, ops in items:
        body += [("BINUNICODE", name), *ops]
    return asm(*body, "SETITEMS", *extra, "STOP")
