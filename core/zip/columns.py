"""A plain torch-writer zip, read as columns (numpy) and proven clean, or Decline.

Strategy (the fast lane, core.lane.torch_zip): core.zip.directory + core.zip.checks build one object per
entry and test every anomaly one entry at a time, ~3 us per entry. Most archives are
exactly what torch's writer makes, so this module proves THAT, with whole-column numpy
comparisons over the central directory and the local headers:

* end records: no comment, nothing appended, the zip64 end record (if any) right before
  its locator, the central directory right before them, one disk;
* central records: found by signature and proven to chain from the first byte of the
  directory to its end (so a signature inside a name cannot fool the parse); stored,
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

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ckptguard.core.errors import CkptError, Decline
from ckptguard.core.io.source import COALESCE_MAX, ByteSource
from ckptguard.core.limits import Limits
from ckptguard.core.zip.directory import _read_tail, find_eocd
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

FLAGS_ALLOWED = FLAG_DESCRIPTOR | FLAG_UTF8   # what torch's writer sets

Ints = npt.NDArray[np.int64]


@dataclass(slots=True)
class PlainArchive:
    """Columns of a clean torch-writer archive, one row per entry in central order."""

    prefix: str
    names: list[str]
    index: dict[str, int]          # exact name -> row
    folded: dict[str, int]         # lower-cased name -> row (no two names fold alike)
    header_offset: Ints
    data_offset: Ints              # from the local header: where torch reads the bytes (-1:
    # not read yet, see place_unread)
    size: Ints                     # stored: compressed == uncompressed
    cd_offset: int
    bytes_read: int                # what this module read (the source counts it too)
    flags: Ints
    locals_read: int               # local headers read (all of them on a local source)
    cd_size: int = 0               # the end records follow the directory, then the file ends

    def place_unread(self, alignment: int) -> None:
        """Rows whose local header was not read get the data offset torch's writer gives
        them (header, name, the "FB" padding field, aligned): `check_tiles` then proves it,
        since every header offset comes from the central directory."""
        unread = np.flatnonzero(self.data_offset < 0)
        if not len(unread):
            return
        start = (self.header_offset[unread] + LOCAL_SIZE + FB_HEADER_SIZE
                 + np.fromiter((len(self.names[r]) for r in unread.tolist()), dtype=np.int64,
                               count=len(unread)))
        if alignment > 1:
            start = -(-start // alignment) * alignment
        self.data_offset[unread] = start

    def check_tiles(self) -> None:
        """The records tile the file from byte 0 to the central directory: header, data,
        data descriptor, next header (no gap, no overlap)."""
        header, data, size = self.header_offset, self.data_offset, self.size
        if (data < 0).any():
            raise Decline("a record without a data offset")
        # a data descriptor follows each record written with bit 3 (zip64-sized: never here)
        has_descriptor = ((self.flags & FLAG_DESCRIPTOR) != 0) & (size > 0)
        end = data + size + np.where(has_descriptor, DESCRIPTOR_SIZE32, 0)
        order = np.argsort(header, kind="stable")
        if header[order[0]] != 0 or not np.array_equal(header[order[1:]], end[order[:-1]]) \
                or end[order[-1]] != self.cd_offset:
            raise Decline("records do not tile the file")


def _u16(buf: npt.NDArray[np.uint8], at: Ints) -> Ints:
    return buf[at].astype(np.int64) | (buf[at + 1].astype(np.int64) << 8)


def _u32(buf: npt.NDArray[np.uint8], at: Ints) -> Ints:
    return _u16(buf, at) | (_u16(buf, at + 2) << 16)


def _signatures(buf: bytes, sig: int) -> Ints:
    """Every offset of a little-endian u32 signature in `buf` (4 aligned views)."""
    hits = []
    for shift in range(4):
        count = (len(buf) - shift) // 4
        if count <= 0:
            continue
        words = np.frombuffer(buf, dtype="<u4", count=count, offset=shift)
        hits.append(np.flatnonzero(words == sig).astype(np.int64) * 4 + shift)
    if not hits:
        return np.zeros(0, dtype=np.int64)
    return np.sort(np.concatenate(hits))


def _end_records(source: ByteSource, limits: Limits) -> tuple[int, int, int]:
    """(entries, cd_offset, cd_size) when the end records are exactly torch's."""
    size = source.size
    if size < EOCD_SIZE:
        raise Decline("too short")
    tail, tail_start = _read_tail(source)
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


def _central(cd: bytes, n_total: int) -> tuple[bytes, Ints, Ints, Ints, Ints]:
    """(names joined by \\n, flags, header offsets, sizes, CRCs) of a torch-shaped directory."""
    at = _signatures(cd, CENTRAL_SIG)
    if len(at) != n_total or at[0] != 0:
        raise Decline("central signatures do not match the entry count")
    buf = np.frombuffer(cd, dtype=np.uint8)
    name_len = _u16(buf, at + 28)
    extra_len = _u16(buf, at + 30) | _u16(buf, at + 32)   # extra field, entry comment
    nxt = at + CENTRAL_SIZE + name_len
    if extra_len.any() or not (np.array_equal(nxt[:-1], at[1:]) and nxt[-1] == len(cd)):
        raise Decline("central records do not chain")
    flags = _u16(buf, at + 8)
    method = _u16(buf, at + 10)
    csize, usize, header = _u32(buf, at + 20), _u32(buf, at + 24), _u32(buf, at + 42)
    if (flags & ~FLAGS_ALLOWED).any() or method.any() or _u16(buf, at + 34).any() \
            or not np.array_equal(csize, usize) or (csize == U32_MAX).any() \
            or (header == U32_MAX).any():
        raise Decline("central record fields")
    return _names(cd, at + CENTRAL_SIZE, name_len), flags, header, csize, _u32(buf, at + 16)


def _names(cd: bytes, start: Ints, length: Ints) -> bytes:
    """The names, with the checks torch's names pass (ASCII; no NUL, newline, backslash)."""
    joined = b"\n".join([cd[s:e] for s, e in zip(start.tolist(), (start + length).tolist(),
                                                   strict=True)])
    if not joined.isascii() or b"\x00" in joined or b"\\" in joined \
            or joined.count(b"\n") != len(start) - 1:
        raise Decline("name bytes: non-ASCII, NUL, newline or backslash")
    return joined


def _chunks(header: Ints, span: Ints, size: int) -> list[tuple[int, int]]:
    """Reads covering [header, header + span) of every entry: only spans that touch or overlap
    share a read, so what is read is the local headers and nothing between them, whatever the
    sizes of the records (a checkpoint of many small tensors is not read whole; a local pread
    is cheap, and a remote source reads only a few headers)."""
    order = np.argsort(header, kind="stable")
    starts = header[order]
    ends = np.minimum(starts + span[order], size)
    reach = np.maximum.accumulate(ends)
    breaks = np.flatnonzero(starts[1:] > reach[:-1]) + 1
    los = np.concatenate(([0], breaks))
    his = np.concatenate((breaks, [len(starts)]))
    firsts = starts[los]
    extents = reach[his - 1] - firsts
    out: list[tuple[int, int]] = list(zip(firsts.tolist(), extents.tolist(), strict=True))
    long_runs = np.flatnonzero(extents > COALESCE_MAX)
    if not len(long_runs):
        return out
    split: list[tuple[int, int]] = []
    done = 0
    for g in long_runs.tolist():   # split a long run so no read passes COALESCE_MAX (+ one header)
        split.extend(out[done:g])
        done = g + 1
        lo, hi = int(los[g]), int(his[g])
        while lo < hi:
            first = int(starts[lo])
            cut = int(np.searchsorted(starts[lo:hi], first + COALESCE_MAX, side="left")) + lo
            cut = max(cut, lo + 1)
            split.append((first, int(reach[cut - 1]) - first))
            lo = cut
    split.extend(out[done:])
    return split


def _gather(source: ByteSource, chunks: Sequence[tuple[int, int]], at: Ints
            ) -> tuple[npt.NDArray[np.uint8], Ints]:
    """Read the chunks; return one buffer and, for each file offset in `at`, its index in it."""
    bufs = source.read_many(list(chunks))
    starts = np.array([c[0] for c in chunks], dtype=np.int64)
    base = np.cumsum([0] + [len(b) for b in bufs[:-1]]).astype(np.int64)
    which = np.searchsorted(starts, at, side="right") - 1
    return np.frombuffer(b"".join(bufs), dtype=np.uint8), at - starts[which] + base[which]


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
    joined, flags, header, size, crc = _central(cd, n_total)
    first = joined[:joined.find(b"\n")] if n_total > 1 else joined
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
    name_len = np.fromiter(map(len, names), dtype=np.int64, count=len(names))
    if getattr(source, "random_access_cheap", False):
        read_rows = np.arange(n_total, dtype=np.int64)
    else:
        pre = prefix.decode("ascii")
        read_rows = np.array(sorted({row for r in REMOTE_LOCALS
                                     if (row := folded.get(f"{pre}/{r}".lower())) is not None}),
                             dtype=np.int64)
    r_header, r_name_len, r_flags = header[read_rows], name_len[read_rows], flags[read_rows]
    chunks = _chunks(r_header, LOCAL_SIZE + r_name_len, source.size)
    buf, at = _gather(source, chunks, r_header)
    limit = len(buf)
    if (at + LOCAL_SIZE + r_name_len > limit).any():
        raise Decline("local header past the end")
    if (_u32(buf, at) != LOCAL_SIG).any():
        raise Decline("local header signature")
    l_flags, l_method = _u16(buf, at + 6), _u16(buf, at + 8)
    l_name, l_extra = _u16(buf, at + 26), _u16(buf, at + 28)
    if not (np.array_equal(l_flags, r_flags) and np.array_equal(l_name, r_name_len)) \
            or l_method.any():
        raise Decline("local header disagrees with the central directory")
    eager = np.flatnonzero((r_flags & FLAG_DESCRIPTOR) == 0)   # torch: empty records
    if len(eager):   # bit 3 clear: the local header carries the real CRC and sizes
        e_at, e_rows = at[eager], read_rows[eager]
        if not (np.array_equal(_u32(buf, e_at + 14), crc[e_rows])
                and np.array_equal(_u32(buf, e_at + 18), size[e_rows])
                and np.array_equal(_u32(buf, e_at + 22), size[e_rows])):
            raise Decline("local sizes or CRC differ")
    total = int(r_name_len.sum())
    rel = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(r_name_len) - r_name_len,
                                                       r_name_len)
    local_names = buf[np.repeat(at + LOCAL_SIZE, r_name_len) + rel]
    central_names = np.frombuffer(b"".join(names[r].encode("ascii") for r in read_rows.tolist())
                                  if len(read_rows) < n_total else joined.replace(b"\n", b""),
                                  dtype=np.uint8)
    if not np.array_equal(local_names, central_names):
        raise Decline("local name differs")
    data = np.full(n_total, -1, dtype=np.int64)
    data[read_rows] = r_header + LOCAL_SIZE + l_name + l_extra
    read = EOCD_SIZE + cd_size + sum(n for _, n in chunks)
    return PlainArchive(prefix.decode("ascii"), names, index, folded, header, data, size,
                        cd_offset, read, flags, len(read_rows), cd_size)
