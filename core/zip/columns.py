"""A plain torch-writer zip, read as columns and proven clean, or Decline.

Strategy (the fast lane, core.lane.torch_zip): core.zip.directory + core.zip.checks build one object per
entry and test every anomaly one entry at a time, ~3 us per entry. Most archives are
exactly what torch's writer makes, so this module proves THAT, with whole-column
comparisons over the central directory and the local headers (columns are lists, each
pass a C loop: `bytes.split`, `struct.iter_unpack`, `map` over `operator` functions, list
equality; no Python statement per entry, and no numpy, whose import alone costs more than
scanning a 10,000-tensor checkpoint):

* end records: no comment, nothing appended, the zip64 end record (if any) right before
  its locator, the central directory right before them, one disk;
* central records: split at their signature and proven to chain from the first byte of
  the directory to its end (so a signature inside a name cannot fool the parse); stored,
  no encryption, no extra or comment fields, no zip64 sentinels, ASCII names, no two
  names equal when lower-cased (miniz looks names up case-insensitively), all under one
  `<prefix>/`, no NUL, backslash, ':' or '..';
* local headers: same name, flags and method as the central record (same sizes and CRC
  when bit 3 does not defer them), and records that tile the file exactly from byte 0 to
  the central directory (header, data, data descriptor, next header). A remote source reads
  only the local headers the general path reads there (REMOTE_LOCALS); the other records
  must tile the file at the offsets torch's writer gives them (`place_unread`).

Any other archive raises `Decline` and is read by the general path, which reports the
finding. So every archive this module accepts is one on which core.zip.checks finds nothing.
"""

from __future__ import annotations

import re
import struct
from bisect import bisect_left
from collections.abc import Sequence
from itertools import accumulate, chain, compress, repeat
from operator import add, gt, itemgetter, sub

from ckptguard.core.errors import CkptError, Decline
from ckptguard.core.io.source import COALESCE_MAX, ByteSource
from ckptguard.core.limits import Limits
from ckptguard.core.records import field, record
from ckptguard.core.zip.endrecord import find_eocd, read_tail
from ckptguard.core.zip.layout import (
    CENTRAL_SIG,
    CENTRAL_SIZE,
    EOCD_SIZE,
    EOCD_STRUCT,
    FLAG_DESCRIPTOR,
    FLAG_UTF8,
    LOCAL_SIG,
    LOCAL_SIZE,
    U32_MAX,
    ZIP64_EOCD_SIZE,
    ZIP64_EOCD_STRUCT,
    ZIP64_LOCATOR_SIZE,
    ZIP64_LOCATOR_STRUCT,
)
from ckptguard.core.zip.offsets import DESCRIPTOR_SIZE32, FB_HEADER_SIZE

TYPE_CHECKING = False   # typing stays unimported at run time (core/typenames.py)
if TYPE_CHECKING:
    from typing import TypeVar

FLAGS_ALLOWED = FLAG_DESCRIPTOR | FLAG_UTF8   # what torch's writer sets

# no proper prefix of a signature is also its suffix: two hits never overlap
_CENTRAL_SIGNATURE = CENTRAL_SIG.to_bytes(4, "little")
_LOCAL_SIGNATURE = LOCAL_SIG.to_bytes(4, "little")
_NAME_AT = CENTRAL_SIZE - len(_CENTRAL_SIGNATURE)   # a record's name, after its signature


if TYPE_CHECKING:
    T = TypeVar("T")


def pick(column: list[T], rows: Sequence[int]) -> list[T]:
    """`column[row]` for each row (a range: one slice)."""
    if isinstance(rows, range) and rows.step == 1:
        return column[rows.start:rows.stop]
    return list(map(column.__getitem__, rows))


def file_order(offsets: list[int]) -> list[int] | None:
    """Rows by ascending offset (stable); None when they already are (torch's writer)."""
    if all(map(gt, offsets[1:], offsets)):
        return None
    return sorted(range(len(offsets)), key=offsets.__getitem__)


def writer_data_offsets(header: list[int], name_len: Sequence[int], alignment: int) -> list[int]:
    """core.zip.offsets.record_data_offset, per record below 4 GiB (no zip64 field): header,
    name, the "FB" padding field, rounded up to the alignment."""
    start = map(add, header, map(add, name_len, repeat(LOCAL_SIZE + FB_HEADER_SIZE)))
    if alignment <= 1:
        return list(start)
    return [offset + (-offset % alignment) for offset in start]   # rounded up


@record(slots=True)
class PlainArchive:
    """Columns of a clean torch-writer archive, one row per entry in central order."""

    prefix: str
    names: list[str]
    index: dict[str, int]          # exact name -> row
    folded: dict[str, int]         # lower-cased name -> row (no two names fold alike)
    header_offset: list[int]
    data_offset: list[int]         # from the local header: where torch reads the bytes (-1:
    # not read yet, see place_unread)
    size: list[int]                # stored: compressed == uncompressed
    cd_offset: int
    bytes_read: int                # what this module read (the source counts it too)
    flags: list[int]
    locals_read: int               # local headers read (all of them on a local source)
    cd_size: int = 0               # the end records follow the directory, then the file ends
    name_len: list[int] = field(default_factory=list)   # bytes of each name (ASCII)
    order: list[int] | None = None   # rows by header offset (file_order); None: in that order

    def place_unread(self, alignment: int) -> None:
        """Rows whose local header was not read get the data offset torch's writer gives
        them (header, name, the "FB" padding field, aligned): `check_tiles` then proves it,
        since every header offset comes from the central directory."""
        data = self.data_offset
        if -1 not in data:
            return
        unread = [row for row, offset in enumerate(data) if offset < 0]
        placed = writer_data_offsets(pick(self.header_offset, unread),
                                     pick(self.name_len, unread), alignment)
        for row, offset in zip(unread, placed, strict=True):
            data[row] = offset

    def check_tiles(self) -> None:
        """The records tile the file from byte 0 to the central directory: header, data,
        data descriptor, next header (no gap, no overlap)."""
        header, data, size = self.header_offset, self.data_offset, self.size
        if min(data) < 0:
            raise Decline("a record without a data offset")
        # a data descriptor follows each record written with bit 3 (zip64-sized: never here)
        end = [offset + n + (DESCRIPTOR_SIZE32 if flag & FLAG_DESCRIPTOR and n else 0)
               for offset, n, flag in zip(data, size, self.flags, strict=True)]
        if self.order is not None:
            header, end = pick(header, self.order), pick(end, self.order)
        if header[0] != 0 or header[1:] != end[:-1] or end[-1] != self.cd_offset:
            raise Decline("records do not tile the file")


def _end_records(source: ByteSource, limits: Limits) -> tuple[int, int, int]:
    """(entries, cd_offset, cd_size) when the end records are exactly torch's."""
    size = source.size
    if size < EOCD_SIZE:
        raise Decline("too short")
    tail, tail_start = read_tail(source)
    try:
        eocd = find_eocd(tail, tail_start)
    except CkptError as exc:
        raise Decline(exc.message) from exc
    (_, disk, cd_disk, n_disk, n_total, cd_size, cd_offset,
     comment_len) = EOCD_STRUCT.unpack_from(tail, eocd - tail_start)
    if comment_len or eocd + EOCD_SIZE != size or disk or cd_disk or n_disk != n_total:
        raise Decline("end record: comment, appended bytes or disks")
    end_of_cd = eocd
    loc_at = eocd - ZIP64_LOCATOR_SIZE
    if loc_at >= ZIP64_EOCD_SIZE and loc_at >= tail_start \
            and tail[loc_at - tail_start: loc_at - tail_start + 4] == b"PK\x06\x07":
        _, loc_disk, z64_at, n_disks = ZIP64_LOCATOR_STRUCT.unpack_from(tail, loc_at - tail_start)
        if z64_at != loc_at - ZIP64_EOCD_SIZE or z64_at < tail_start or n_disks != 1 or loc_disk:
            raise Decline("zip64 locator")
        (sig, rec_size, _, _, disk, cd_disk, n_disk, n_total, cd_size,
         cd_offset) = ZIP64_EOCD_STRUCT.unpack_from(tail, z64_at - tail_start)
        if sig != b"PK\x06\x06" or rec_size != ZIP64_EOCD_SIZE - 12 or disk or cd_disk \
                or n_disk != n_total:
            raise Decline("zip64 end record")
        end_of_cd = z64_at
    if not 0 < n_total <= limits.max_zip_entries or cd_size > limits.max_central_dir_bytes:
        raise Decline("entry count or directory size past the caps")
    if cd_offset + cd_size != end_of_cd or cd_size < n_total * CENTRAL_SIZE:
        raise Decline("central directory does not end at the end records")
    return n_total, cd_offset, cd_size



class _Records:
    """Records of one size joined in one buffer, read a field at a time: a field's k-th bytes
    of every record are one strided slice (a C loop, no object per record)."""

    __slots__ = ("buf", "count", "size")

    def __init__(self, buf: bytes, size: int) -> None:
        if len(buf) % size:
            raise Decline("a record cut short")
        self.buf, self.size, self.count = buf, size, len(buf) // size

    def field(self, at: int, width: int) -> list[bytes]:
        """Byte k of the field at `at`, of every record, for each k."""
        return [self.buf[at + k::self.size] for k in range(width)]

    def is_zero(self, at: int, width: int) -> bool:
        return all(column.count(0) == self.count for column in self.field(at, width))

    def rows(self, rows: Sequence[int]) -> _Records:
        """These records, only the given rows (all of them, in order: itself)."""
        if rows == range(self.count):
            return self
        size, buf = self.size, self.buf
        return _Records(b"".join(buf[row * size:(row + 1) * size] for row in rows), size)

    def uints(self, at: int, width: int) -> list[int]:
        """The field as little-endian unsigned ints (width 2 or 4)."""
        lanes = bytearray(width * self.count)
        for k, column in enumerate(self.field(at, width)):
            lanes[k::width] = column
        return list(struct.unpack(f"<{self.count}{_UINT[width]}", lanes))


_UINT = {2: "H", 4: "I"}
# the values each byte of the flags may take (no bit outside FLAGS_ALLOWED): what is left
# of a flags byte column once they are deleted is a flag torch's writer does not set
_FLAG_BYTES = [bytes(v for v in range(256) if not v & ~(FLAGS_ALLOWED >> 8 * k)) for k in (0, 1)]
_HAS_DESCRIPTOR = bytes(1 if v & FLAG_DESCRIPTOR else 0 for v in range(256))   # flags' low byte
# field offsets in a central record after its signature (CENTRAL_STRUCT's, less 4) and in a
# local header
(_C_FLAGS, _C_METHOD, _C_CRC, _C_SIZE, _C_USIZE, _C_NAME_LEN, _C_EXTRA_LEN, _C_DISK,
 _C_EXTERNAL, _C_HEADER) = (4, 6, 12, 16, 20, 24, 26, 30, 34, 38)
_L_FLAGS, _L_METHOD, _L_CRC, _L_NAME_LEN, _L_EXTRA_LEN = 6, 8, 14, 26, 28


def _central(cd: bytes, n_total: int) -> tuple[list[bytes], _Records, list[int], list[int],
                                                list[int], list[int]]:
    """(names, the fixed fields of each record after its signature, flags, header offsets,
    sizes, name lengths) of a torch-shaped directory, its fields checked."""
    records = cd.split(_CENTRAL_SIGNATURE)   # [b"", each record after its signature]
    if len(records) != n_total + 1 or records[0]:
        raise Decline("central signatures do not match the entry count")
    del records[0]
    lengths = list(map(len, records))
    if min(lengths) < _NAME_AT:
        raise Decline("central records do not chain")
    fixed = _Records(b"".join(map(itemgetter(slice(_NAME_AT)), records)), _NAME_AT)
    # each record is its fixed fields and its name, up to the next signature or the end;
    # no extra field, no entry comment (their lengths: 4 bytes)
    name_len = fixed.uints(_C_NAME_LEN, 2)
    if not fixed.is_zero(_C_EXTRA_LEN, 4) or lengths != list(map(add, name_len, repeat(_NAME_AT))):
        raise Decline("central records do not chain")
    # stored, one disk, compressed size == uncompressed, no zip64 sentinel
    flags, header, size = fixed.uints(_C_FLAGS, 2), fixed.uints(_C_HEADER, 4), \
        fixed.uints(_C_SIZE, 4)
    if any(map(bytes.translate, fixed.field(_C_FLAGS, 2), repeat(None), _FLAG_BYTES)) \
            or not fixed.is_zero(_C_METHOD, 2) \
            or not fixed.is_zero(_C_DISK, 2) \
            or not fixed.is_zero(_C_EXTERNAL, 4) \
            or fixed.field(_C_SIZE, 4) != fixed.field(_C_USIZE, 4) \
            or U32_MAX in size or U32_MAX in header:
        raise Decline("central record fields")
    return list(map(itemgetter(slice(_NAME_AT, None)), records)), fixed, flags, header, size, \
        name_len


def _joined_names(names: list[bytes]) -> bytes:
    """The names joined by \\n, with the checks torch's names pass (ASCII; no NUL, newline,
    backslash)."""
    joined = b"\n".join(names)
    if not joined.isascii() or b"\x00" in joined or b"\\" in joined \
            or joined.count(b"\n") != len(names) - 1:
        raise Decline("name bytes: non-ASCII, NUL, newline or backslash")
    return joined


def _reads(starts: list[int], ends: list[int]) -> tuple[Sequence[int], list[int]]:
    """Reads covering [start, end) of every entry, in file order: only spans that touch or
    overlap share a read, so what is read is the local headers and nothing between them,
    whatever the sizes of the records (a checkpoint of many small tensors is not read whole;
    a local pread is cheap, and a remote source reads only a few headers).

    Returns (the first entry of each read, the end offset of each read)."""
    if all(map(gt, starts[1:], ends)):   # no header touches the one before: a read each
        return range(len(starts)), ends
    reach = list(accumulate(ends, max))
    firsts = [0, *compress(range(1, len(starts)), map(gt, starts[1:], reach))]
    lasts = [*firsts[1:], len(starts)]   # exclusive
    read_ends = pick(reach, list(map(sub, lasts, repeat(1))))
    if max(map(sub, read_ends, pick(starts, firsts))) <= COALESCE_MAX:
        return firsts, read_ends
    split_firsts: list[int] = []
    split_ends: list[int] = []
    for lo, hi, end in zip(firsts, lasts, read_ends, strict=True):
        if end - starts[lo] <= COALESCE_MAX:
            split_firsts.append(lo)
            split_ends.append(end)
            continue
        while lo < hi:   # split a long run so no read passes COALESCE_MAX (+ one header)
            cut = max(bisect_left(starts, starts[lo] + COALESCE_MAX, lo, hi), lo + 1)
            split_firsts.append(lo)
            split_ends.append(reach[cut - 1])
            lo = cut
    return split_firsts, split_ends


def _local_headers(source: ByteSource, header: list[int], span: list[int], order: list[int] | None
                   ) -> tuple[list[bytes], int]:
    """[header, header + span) of every entry, in the entries' order (`order`: file_order), and
    the bytes read."""
    starts = header if order is None else pick(header, order)
    spans = span if order is None else pick(span, order)
    ends = list(map(add, starts, spans))
    if max(ends) > source.size:
        raise Decline("local header past the end")
    firsts, read_ends = _reads(starts, ends)
    read_starts = starts if len(firsts) == len(starts) else pick(starts, firsts)
    bufs = source.read_many(list(zip(read_starts, map(sub, read_ends, read_starts), strict=True)))
    heads = bufs   # each read is one header, unless headers touch or overlap: then cut them
    if len(bufs) != len(starts):   # an entry's position: its offset, shifted by its read's
        shift = map(sub, accumulate(map(len, bufs), initial=0), read_starts)
        counts = map(sub, [*firsts[1:], len(starts)], firsts)
        pos = list(map(add, starts, chain.from_iterable(map(repeat, shift, counts))))
        joined = b"".join(bufs)
        heads = list(map(joined.__getitem__, map(slice, pos, map(add, pos, spans))))
    if order is not None:   # back to the entries' order
        heads = pick(heads, sorted(range(len(order)), key=order.__getitem__))
    return heads, sum(map(len, bufs))


# The records whose local headers a remote scan reads, as the general path does
# (core.formats.torch_zip.analyze_zip): the pickle, the first storage and torch's metadata
# records (its META_RECORDS and SERIALIZATION_ID, which the lane reads too: keep them equal).
REMOTE_LOCALS = ("data.pkl", "data/0", "version", ".data/version", "byteorder",
                 ".format_version", ".storage_alignment", ".data/serialization_id")


def read_plain_archive(source: ByteSource, limits: Limits) -> PlainArchive:
    """Columns of a torch-writer archive, its local headers checked; Decline otherwise. The
    caller then calls `place_unread` and `check_tiles` (the alignment is in a record).

    A local source has every local header read. A remote one (round trips cost more than
    bytes) has only REMOTE_LOCALS's: the other rows' data offsets stay -1 until
    `place_unread` gives them the writer's."""
    n_total, cd_offset, cd_size = _end_records(source, limits)
    cd = source.read_at(cd_offset, cd_size)
    name_bytes, central, flags, header, size, name_len = _central(cd, n_total)
    joined = _joined_names(name_bytes)
    first = name_bytes[0]
    slash = first.find(b"/")
    prefix = first[:slash]
    if slash <= 0 or b":" in prefix or b".." in joined \
            or joined.count(b"\n" + prefix + b"/") != n_total - 1:
        raise Decline("prefix or name components")
    names = joined.decode("ascii").split("\n")
    index = dict(zip(names, range(n_total), strict=True))
    lowered = joined.lower()
    # miniz compares names case-insensitively: no two may fold alike
    folded = index if lowered == joined else dict(
        zip(lowered.decode("ascii").split("\n"), range(n_total), strict=True))
    if len(folded) != n_total:
        raise Decline("names equal when lower-cased")
    read_rows: Sequence[int]
    if getattr(source, "random_access_cheap", False):
        read_rows = range(n_total)
    else:
        pre = prefix.decode("ascii")
        read_rows = sorted({row for r in REMOTE_LOCALS
                            if (row := folded.get(f"{pre}/{r}".lower())) is not None})
    r_header = pick(header, read_rows)
    span = list(map(add, pick(name_len, read_rows), repeat(LOCAL_SIZE)))
    if not r_header:
        raise Decline("no local header to read")
    order = file_order(header)
    heads, read = _local_headers(source, r_header, span,
                                 order if len(read_rows) == n_total else file_order(r_header))
    local = _Records(b"".join(map(itemgetter(slice(LOCAL_SIZE)), heads)), LOCAL_SIZE)
    if local.field(0, 4) != [bytes([c]) * len(heads) for c in _LOCAL_SIGNATURE]:
        raise Decline("local header signature")
    c_read = central.rows(read_rows)
    if local.field(_L_FLAGS, 2) != c_read.field(_C_FLAGS, 2) or not local.is_zero(_L_METHOD, 2) \
            or local.field(_L_NAME_LEN, 2) != c_read.field(_C_NAME_LEN, 2):
        raise Decline("local header disagrees with the central directory")
    # bit 3 clear (torch: empty records): the local header carries the real CRC and sizes
    deferred = local.field(_L_FLAGS, 1)[0].translate(_HAS_DESCRIPTOR)
    for i in (m.start() for m in re.finditer(b"\x00", deferred)):
        at, c_at = i * LOCAL_SIZE + _L_CRC, i * _NAME_AT + _C_CRC   # CRC and sizes: 12 bytes
        if local.buf[at:at + 12] != c_read.buf[c_at:c_at + 12]:
            raise Decline("local sizes or CRC differ")
    if list(map(itemgetter(slice(LOCAL_SIZE, None)), heads)) != pick(name_bytes, read_rows):
        raise Decline("local name differs")
    placed = list(map(add, map(add, r_header, span), local.uints(_L_EXTRA_LEN, 2)))
    if len(read_rows) == n_total:
        data = placed
    else:
        data = [-1] * n_total
        for row, offset in zip(read_rows, placed, strict=True):
            data[row] = offset
    return PlainArchive(prefix.decode("ascii"), names, index, folded, header, data, size,
                        cd_offset, EOCD_SIZE + cd_size + read, flags, len(read_rows), cd_size,
                        name_len, order)
