"""Legacy `.tar` torch checkpoints (torch <= 0.1.x, FORMATS.md §4.2): refused, still scanned.

Strategy: torch.load on a real file first tries `tarfile.open(f, "r:")`; if the first
header parses, weights_only=True raises at once (CVE-2025-32434 fix, PR #145020) — so
`is_tar` replays exactly the checks of CPython's `TarInfo.frombuf` that decide whether
`tarfile.open` succeeds. The members are then walked with our own bounded header
parser (ustar prefix, GNU long names, pax `path`/`size`), and every pickle inside
`pickle`, `storages` and `tensors` goes through the VM and the threat analysis: a
`weights_only=False` load would execute them.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

from ckptguard.core.errors import Code, LimitExceeded
from ckptguard.core.io.source import ByteSource
from ckptguard.core.judge import scan_pickle
from ckptguard.core.pickle.renames import torch_map
from ckptguard.core.pickle.window import PickleWindow
from ckptguard.core.report import WeightsOnly
from ckptguard.core.state import Analysis
from ckptguard.core.torch.dtypes import ITEMSIZE, storage_dtype
from ckptguard.core.torch.weights_only import UNSAFE_MESSAGE
from ckptguard.core.values import Global

BLOCK = 512
TAR_ERROR = ("Cannot use ``weights_only=True`` with files saved in the legacy .tar format. "
             + UNSAFE_MESSAGE)
_NUMERIC_FIELDS = ((100, 108), (108, 116), (116, 124), (124, 136), (136, 148), (329, 337), (337, 345))
_MEMBERS = ("sys_info", "pickle", "storages", "tensors")
_MAX_HEADERS = 10_000
_MAX_PAX = 1 << 20
_ITEM_WINDOW = 1 << 16
_MAX_CHAIN = 8
_CHAINED = (b"L", b"K", b"x", b"g", b"X")   # GNU long name/link, pax headers


class _Invalid(Exception):
    """tarfile's InvalidHeaderError."""


def _nti(field: bytes) -> int:
    """tarfile.nti: base-256 if the first byte is 0o200/0o377, else NUL-terminated octal."""
    if field[0] in (0o200, 0o377):
        n = int.from_bytes(field[1:], "big")
        return n - 256 ** (len(field) - 1) if field[0] == 0o377 else n
    text = field.split(b"\0", 1)[0]
    try:
        return int(text.decode("ascii").strip() or "0", 8)
    except (UnicodeDecodeError, ValueError) as exc:
        raise _Invalid from exc


def is_tar(head: bytes) -> bool:
    """Would `tarfile.open(fileobj=f, mode="r:")` accept a file starting with `head`?

    Mirrors TarFile.next() at offset 0: a short first block or a bad checksum/number
    field is a ReadError; an all-zero block ends the archive silently (open succeeds);
    GNU long-name and pax headers need a valid header after their data. `head` must
    hold `tar_bytes_needed(head)` bytes (or the whole file) for an exact answer.
    """
    return _probe(head)[0] is True


def tar_bytes_needed(head: bytes) -> int:
    """How many leading bytes `is_tar` must see (more than `len(head)` for header chains)."""
    answer = _probe(head)[0]
    return answer if type(answer) is int else len(head)


def tar_fail_offset(head: bytes, size: int) -> int:
    """Where a failed `tarfile.open` leaves the file position: just after the header block it
    could not parse. torch then checks for a zip magic THERE (serialization.py _legacy_load)."""
    return min(size, _probe(head)[1] + BLOCK)


def _probe(head: bytes) -> tuple[bool | int, int]:
    """(True/False, or the byte count still needed; position of the last header read)."""
    pos = 0
    for depth in range(_MAX_CHAIN):
        if len(head) < pos + BLOCK:
            return (pos + BLOCK if depth else False), pos
        block = head[pos:pos + BLOCK]
        if block.count(0) == BLOCK:
            return depth == 0, pos   # at offset 0: empty archive; later: SubsequentHeaderError
        if not _valid_block(block):
            return False, pos
        if block[156:157] not in _CHAINED:
            return True, pos
        pos += BLOCK + -(-max(0, _nti(block[124:136])) // BLOCK) * BLOCK
    return False, pos


def _valid_block(block: bytes) -> bool:
    """TarInfo.frombuf's checks: checksum (unsigned or signed) and every number field."""
    try:
        chksum = _nti(block[148:156])
        unsigned = 256 + sum(struct.unpack_from("148B8x356B", block))
        signed = 256 + sum(struct.unpack_from("148b8x356b", block))
        if chksum not in (unsigned, signed):
            return False
        for lo, hi in _NUMERIC_FIELDS:
            _nti(block[lo:hi])
    except _Invalid:
        return False
    return True


@dataclass(frozen=True, slots=True)
class TarMember:
    name: str
    type: bytes
    data_offset: int
    size: int


def read_members(source: ByteSource, an: Analysis) -> list[TarMember]:
    """The archive's members (bounded walk; stops at the end block or the first bad header)."""
    members: list[TarMember] = []
    offset, size = 0, source.size
    long_name: str | None = None
    pax: dict[str, str] = {}
    for _ in range(_MAX_HEADERS):
        if offset + BLOCK > size:
            break
        block = source.read_at(offset, BLOCK)
        if block.count(0) == BLOCK or not _valid_block(block):
            break
        name = block[0:100].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
        if block[257:262] == b"ustar":
            prefix = block[345:500].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
            name = f"{prefix}/{name}" if prefix else name
        kind = block[156:157]
        length = _nti(block[124:136])
        data_offset = offset + BLOCK
        if length < 0 or data_offset + length > size:
            an.add(Code.TORCH_BAD_LEGACY_STREAM, f"tar member {name!r} runs past the end",
                   offset=offset)
            break
        if kind in (b"L", b"x", b"g") and length <= _MAX_PAX:
            body = source.read_at(data_offset, length)
            if kind == b"L":
                long_name = body.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
            elif kind == b"x":
                pax = _pax_records(body)
        else:
            name = pax.get("path", long_name or name)
            length = int(pax["size"]) if pax.get("size", "").isdigit() else length
            members.append(TarMember(name, kind, data_offset, length))
            long_name, pax = None, {}
        offset = data_offset + -(-length // BLOCK) * BLOCK
    else:
        raise LimitExceeded(Code.LIMIT_ENTRIES, f"more than {_MAX_HEADERS} tar headers")
    return members


def _pax_records(body: bytes) -> dict[str, str]:
    out: dict[str, str] = {}
    for m in re.finditer(rb"(\d+) ([^=\n]+)=", body):
        n, key = int(m.group(1)), m.group(2).decode("utf-8", "replace")
        value = body[m.end(): m.start() + n - 1]
        out[key] = value.decode("utf-8", "replace")
    return out


def analyze_tar(source: ByteSource, an: Analysis) -> None:
    """Refuse like torch, then scan every pickle the tar holds for threats."""
    an.add(Code.TORCH_LEGACY_TAR, "legacy .tar checkpoint: torch refuses it with weights_only=True "
           "and would run its pickles without it", offset=0)
    an.weights_only = WeightsOnly(loadable=False, error=TAR_ERROR, error_type="RuntimeError")
    an.add(Code.TORCH_WEIGHTS_ONLY_FAILED, TAR_ERROR, offset=0)
    for member in read_members(source, an):
        base = member.name.rsplit("/", 1)[-1]
        if base not in _MEMBERS or member.type not in (b"0", b"\0", b"7"):
            continue
        if base == "pickle":
            _scan_pickle_at(source, an, member, 0)
        elif base in ("storages", "tensors"):
            _scan_counted(source, an, member, base)


def _scan_pickle_at(source: ByteSource, an: Analysis, member: TarMember,
                    pos: int) -> tuple[object, int | None]:
    """Scan the pickle at `pos` inside `member`: (its value per the VM, position after it)."""
    window = PickleWindow(source, an.options.limits.max_pickle_bytes, start=member.data_offset + pos,
                          end=member.data_offset + member.size, first=_ITEM_WINDOW)
    end = window.pickle_end(0, an)
    scan = scan_pickle(window.buf, an, record=member.name, base_offset=window.start, legacy=True,
                       check_trailing=False)
    return scan.vm.root, (pos + end if end is not None else None)


def _scan_counted(source: ByteSource, an: Analysis, member: TarMember, kind: str) -> None:
    """`storages`/`tensors`: a pickled count, then per item a pickle and a binary part
    (storage: i64 count + data, skipped unread; tensor: i32 ndim, pad, sizes, strides, offset)."""
    n, pos = _scan_pickle_at(source, an, member, 0)
    if type(n) is not int or n < 0 or pos is None:
        return
    if n > an.options.limits.max_tensors:
        raise LimitExceeded(Code.LIMIT_TENSORS, f"{n} {kind} in a legacy tar", offset=member.data_offset)
    for _ in range(n):
        if pos is None or pos + 1 > member.size:
            return
        header, end = _scan_pickle_at(source, an, member, pos)
        if end is None or end + 8 > member.size:
            return
        raw = source.read_at(member.data_offset + end, 8)
        pos = end + _binary_size(raw, kind, header)
    if kind == "storages" and pos is not None and pos < member.size:
        _scan_pickle_at(source, an, member, pos)     # the storage views list


def _binary_size(raw: bytes, kind: str, header: object) -> int:
    if kind == "storages":
        count: int = struct.unpack_from("<q", raw)[0]
        itemsize = 1
        if type(header) is tuple and len(header) == 3 and type(header[2]) is Global:
            dtype = storage_dtype(*torch_map(header[2].module, header[2].name))
            itemsize = ITEMSIZE[dtype] if dtype else 1
        return 8 + max(0, count) * itemsize
    ndim: int = struct.unpack_from("<i", raw)[0]
    return 8 + 16 * max(0, ndim) + 8
