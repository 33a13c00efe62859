"""A torch checkpoint whose report is large and whose file is small: `count` tensor views of a
few storages, every repeated object memoized (as torch's pickler does), so each view costs
~40 bytes of pickle and ~250 bytes of report. Views differ in name, dtype, offset and size,
so the manifest has something to filter and sort on. Built without torch."""

from __future__ import annotations

import struct

from tests.builders.pickle_asm import asm
from tests.builders.torchlayout import torch_layout

# (storage key, torch storage class, element size): three dtypes to filter on
STORAGES = (("0", "FloatStorage", 4), ("1", "HalfStorage", 2), ("2", "LongStorage", 8))
NUMEL = 4096


def _small_int(n: int) -> bytes:
    return asm(("BININT1", n)) if n < 256 else asm(("BININT2", n)) if n < 65536 else asm(("BININT", n))


def view_name(i: int) -> str:
    return f"block{i // 100}.view{i % 100}"


def many_views_checkpoint(count: int) -> bytes:
    """torch.save-layout bytes of `{view_name(i): view i}` for i < count."""
    # the first use of a global or a storage's persistent id writes it and BINPUTs it,
    # later uses BINGET it (memo 0: the rebuild function, 1: OrderedDict, 2..: storages)
    first = [asm(("GLOBAL", "torch._utils", "_rebuild_tensor_v2"), ("BINPUT", 0))]
    later = [asm(("BINGET", 0))]
    for slot, (key, cls, _size) in enumerate(STORAGES, start=2):
        first.append(asm("MARK", ("BINUNICODE", "storage"), ("GLOBAL", "torch", cls),
                         ("BINUNICODE", key), ("BINUNICODE", "cpu"), ("BININT2", NUMEL), "TUPLE",
                         ("BINPUT", slot)))
        later.append(asm(("BINGET", slot)))
    dict_first = asm(("GLOBAL", "collections", "OrderedDict"), ("BINPUT", 1))
    ints = [_small_int(n) for n in range(NUMEL)]
    stride = asm("TUPLE1", ("BININT1", 1), "TUPLE1", "NEWFALSE")
    tail = asm("EMPTY_TUPLE", "REDUCE", "TUPLE", "REDUCE")
    body = bytearray(asm(("PROTO", 2), "EMPTY_DICT", "MARK"))
    for i in range(count):
        storage = i % len(STORAGES)
        used = i >= len(STORAGES)
        name = view_name(i).encode()
        body += b"X" + struct.pack("<I", len(name)) + name
        body += (later if i else first)[0] + b"(" + (later if used else first)[1 + storage] + b"Q"
        body += ints[(i * 7) % (NUMEL - 64)] + ints[1 + i % 50] + stride
        body += (asm(("BINGET", 1)) if i else dict_first) + tail
        if i % 1000 == 999:
            body += asm("SETITEMS", "MARK")
    body += asm("SETITEMS", "STOP")
    storages = [(key, bytes(NUMEL * size)) for key, _cls, size in STORAGES]
    return torch_layout("archive", bytes(body), storages)
