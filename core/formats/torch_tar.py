"""Legacy `.tar` torch checkpoints (torch <= 0.1.x, FORMATS.md §4.2): refused, still scanned.

Strategy: torch.load on a real file first tries `tarfile.open(f, "r:")`; if the first
header parses, weights_only=True raises at once (CVE-2025-32434 fix, PR #145020) — so
`core.sniff.is_tar` replays exactly the checks of CPython's `TarInfo.frombuf` that decide whether
`tarfile.open` succeeds. The members are then walked with our own bounded header
parser (ustar prefix, GNU long names, pax `path`/`size`), and every pickle inside
`pickle`, `storages` and `tensors` goes through the VM and the threat analysis: a
`weights_only=False` load would execute them.
"""

from __future__ import annotations

import re
import struct

from ckptguard.core.errors import Code, LimitExceeded
from ckptguard.core.io.source import ByteSource
from ckptguard.core.judge import scan_pickle
from ckptguard.core.limits import Limits
from ckptguard.core.pickle.renames import torch_map
from ckptguard.core.pickle.window import PickleWindow
from ckptguard.core.records import record
from ckptguard.core.regions.region import declare
from ckptguard.core.report import WeightsOnly
from ckptguard.core.sniff import TAR_BLOCK as BLOCK
from ckptguard.core.sniff import tar_number as _nti
from ckptguard.core.sniff import tar_probe
from ckptguard.core.sniff import valid_tar_block as _valid_block
from ckptguard.core.state import Analysis
from ckptguard.core.torch.rules import storage_itemsize
from ckptguard.core.torch.torch_error import UNSAFE_MESSAGE

TAR_ERROR = ("Cannot use ``weights_only=True`` with files saved in the legacy .tar format. "
             + UNSAFE_MESSAGE)
_ITEM_WINDOW = 1 << 16


@record(frozen=True, slots=True)
class TarMember:
    name: str
    type: bytes
    data_offset: int
    size: int


def tarfile_accepts(source: ByteSource, limits: Limits) -> tuple[bool | None, bytes]:
    """Whether `tarfile.open(f, "r:")`, torch.load's first try on a real file, accepts this
    one, and the head read to tell (`core.sniff.tar_probe`'s bytes, re-read as a header chain
    asks for more). None: it cannot be told within `Limits.max_tar_probe_bytes`, or pax
    records make it depend on the Python version; the caller judges both readings."""
    cap = min(source.size, limits.max_tar_probe_bytes)
    head = source.read_at(0, min(source.size, BLOCK))
    while True:
        answer, _ = tar_probe(head)
        if answer is None or isinstance(answer, bool):
            return answer, head
        if answer > source.size:   # the chain runs past the end: no member header follows
            return False, head
        if answer > cap:
            return None, head
        head = source.read_at(0, answer)


def read_members(source: ByteSource, an: Analysis) -> list[TarMember]:
    """The archive's members (bounded walk; stops at the end block or the first bad header)."""
    members: list[TarMember] = []
    offset, size = 0, source.size
    long_name: str | None = None
    pax: dict[str, str] = {}
    limits = an.options.limits
    for _ in range(limits.max_tar_headers):
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
        if kind in (b"L", b"x", b"g") and length <= limits.max_tar_pax_bytes:
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
        raise LimitExceeded(Code.LIMIT_ENTRIES, f"more than {limits.max_tar_headers} tar headers")
    return members


def _pax_records(body: bytes) -> dict[str, str]:
    out: dict[str, str] = {}
    for m in re.finditer(rb"(\d{1,20}) ([^=\n]+)=", body):   # (no int of 4,300 digits)
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
        if member.type not in (b"0", b"\0", b"7"):
            continue
        if base not in ("pickle", "storages", "tensors"):   # sys_info and any extra file
            declare(an.regions, "tar member", member.data_offset, member.size, record=member.name)
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
        if type(header) is tuple and len(header) == 3:
            itemsize = storage_itemsize(header[2], torch_map)
        return 8 + max(0, count) * itemsize
    ndim: int = struct.unpack_from("<i", raw)[0]
    return 8 + 16 * max(0, ndim) + 8
