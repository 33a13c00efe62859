"""Forensic checks over a parsed zip directory -> findings.

Strategy: every check reads only what core.zip.directory already parsed (central entries, the
local headers the caller fetched, EOCD positions); nothing here reads the source except
`verify_crcs`, which the caller runs only when asked (ScanOptions.verify_crc), and the
comparison of entries that share a name (only when an archive has such entries). Each code
is capped at MAX_PER_CODE findings plus one summary, so a hostile 1M-entry archive yields
a bounded report.

What torch 2.13 does with each anomaly (verified in tests/core/zip/test_zip_torch.py):
* duplicate names: loads whichever entry miniz's heap sort + binary search lands on,
  case-insensitively (zipdir.torch_names) - neither reliably first nor last; so the
  duplicates are read and compared (within `Limits.max_duplicate_bytes`): byte-identical
  ones are a note (ZIP_DUPLICATE_IDENTICAL), any others evidence (ZIP_DUPLICATE_NAME);
* local header name/sizes/flags/method: ignored, the central directory wins; only the
  local name and extra lengths move the data offset. Other readers differ: Info-ZIP unzip
  takes method and sizes from the local header, Java's ZipInputStream the name too
  (tests/core/zip/test_local_central_readers.py). A difference in such a field is evidence
  (ZIP_LOCAL_CENTRAL_MISMATCH); one in the CRC or in flags no reader locates or decodes
  the bytes by is a note (ZIP_LOCAL_CENTRAL_COSMETIC);
* CRC-32: never checked; gaps between records and appended bytes: ignored;
* prepended bytes with absolute offsets: miniz reads the archive; torch.load takes the
  zip path only if the file still starts with `PK\\x03\\x04` (polyglot), else legacy;
* encrypted entries, methods other than 0/8: "unsupported encryption"/"unsupported method";
  deflated entries load;
* any entry outside `<prefix>/` (incl. `../x`): "file in archive is not in a subdirectory".
"""

from __future__ import annotations

import zlib
from collections import defaultdict
from collections.abc import Mapping

from ckptguard.core.errors import CkptError, Code
from ckptguard.core.io.source import ByteSource
from ckptguard.core.regions.region import declare, declare_entry
from ckptguard.core.state import Analysis
from ckptguard.core.zip.directory import (
    LocalHeader,
    ZipDirectory,
    ZipEntry,
    fold_name,
    read_entry,
    read_record,
)
from ckptguard.core.zip.layout import (
    DOS_DIRECTORY,
    ENCRYPTION_FLAGS,
    FLAG_DESCRIPTOR,
    FLAG_PATCHED,
    FLAG_UTF8,
    LOCAL_SIZE,
    U32_MAX,
    ZIP64_EOCD_SIZE,
    ZIP64_LOCATOR_SIZE,
)
from ckptguard.core.zip.offsets import descriptor_size
from ckptguard.core.zip.spans import zip_spans_of

KNOWN_METHODS = {0: "stored", 8: "deflate"}


class _Capped:
    """Adds findings to an Analysis, at most `max_zip_findings_per_code` per code, then one
    summary each."""

    def __init__(self, an: Analysis) -> None:
        self.an = an
        self.cap = an.options.limits.max_zip_findings_per_code
        self.counts: dict[Code, int] = defaultdict(int)

    def add(self, code: Code, message: str, *, record: str | None = None,
            offset: int | None = None) -> None:
        self.counts[code] += 1
        if self.counts[code] <= self.cap:
            self.an.add(code, message, record=record, offset=offset)

    def close(self) -> None:
        for code, n in self.counts.items():
            if n > self.cap:
                self.an.add(code, f"... and {n - self.cap} more {code} findings")


def check_archive(directory: ZipDirectory, locals_: Mapping[int, LocalHeader], an: Analysis, *,
                  source: ByteSource | None = None) -> None:
    """Add every zip-level anomaly of `directory` (and the given local headers) to `an`.

    `source`: where entries that share a name are read to compare them; without it they are
    never proven identical (ZIP_DUPLICATE_NAME)."""
    an.zip_spans = zip_spans_of(directory, locals_)   # the map of the file (core.filemap)
    out = _Capped(an)
    limits = an.options.limits
    _check_names(directory, out, _Duplicates(source, locals_, limits.max_duplicate_bytes,
                                             limits.max_bytes_read))
    _check_entries(directory, locals_, out)
    _check_layout(directory, locals_, out)
    if directory.cd_overrun:
        out.add(Code.ZIP_BAD_EOCD, f"the end record's directory size runs {directory.cd_overrun} "
                "bytes into the end records: torch (miniz) reads the entries and ignores the "
                "rest, Python's zipfile looks for the directory elsewhere and fails",
                offset=directory.eocd_offset)
    if directory.comment:
        out.add(Code.ZIP_COMMENT, f"archive comment of {len(directory.comment)} bytes",
                offset=directory.archive_end - len(directory.comment))
    out.close()


class _Duplicates:
    """Compares entries that share a name: what each reader picks matters only if their bytes
    differ. Reads follow the duplicates, at most `budget` bytes per scan."""

    def __init__(self, source: ByteSource | None, locals_: Mapping[int, LocalHeader],
                 budget: int, max_nbytes: int) -> None:
        self.source, self.locals_, self.budget, self.max_nbytes = source, locals_, budget, max_nbytes

    def difference(self, group: list[ZipEntry]) -> str | None:
        """Why the entries of `group` may read differently, or None: same method, same bytes."""
        first = group[0]
        if any(e.method != first.method for e in group):
            return "they use different compression methods"
        if first.method not in KNOWN_METHODS or any(e.flags & ENCRYPTION_FLAGS for e in group):
            return "their bytes are not plain (encrypted or an unsupported method): not compared"
        if any(e.uncompressed_size != first.uncompressed_size for e in group):
            return "they hold different numbers of bytes"
        cost = sum(max(e.compressed_size, e.uncompressed_size) for e in group)   # read + inflated
        if self.source is None or cost > self.budget:
            return (f"their {cost} bytes were not compared (Limits.max_duplicate_bytes "
                    f"has {max(self.budget, 0)} left)" if self.source is not None
                    else "their bytes were not compared")
        self.budget -= cost
        try:
            want = read_entry(self.source, first, max_nbytes=self.max_nbytes, locals_=self.locals_)
            if all(read_entry(self.source, e, max_nbytes=self.max_nbytes, locals_=self.locals_)
                   == want for e in group[1:]):
                return None
        except CkptError as exc:
            return f"one cannot be read ({exc.message})"
        return "they hold different bytes"



def _check_names(directory: ZipDirectory, out: _Capped, duplicates: _Duplicates) -> None:
    by_exact: dict[bytes, list[ZipEntry]] = defaultdict(list)
    by_folded: dict[bytes, list[ZipEntry]] = defaultdict(list)
    for e in directory.entries:
        by_exact[e.name_bytes].append(e)
    for raw, group in by_exact.items():
        if len(group) > 1:
            read = directory.by_name[group[0].name]
            why = duplicates.difference(group)
            out.add(Code.ZIP_DUPLICATE_NAME if why else Code.ZIP_DUPLICATE_IDENTICAL,
                    f"{len(group)} entries named {group[0].name!r} (central indexes "
                    f"{[e.index for e in group]}); torch reads index {read.index} at "
                    f"{read.header_offset}; {why or 'they hold the same bytes'}",
                    record=group[0].name, offset=group[0].central_offset)
        by_folded[fold_name(raw)].append(group[0])
    for group in by_folded.values():
        if len(group) > 1:
            # miniz compares names case-insensitively: one of them shadows the others
            read = directory.by_name[group[0].name]
            why = duplicates.difference(group)
            out.add(Code.ZIP_DUPLICATE_NAME if why else Code.ZIP_DUPLICATE_IDENTICAL,
                    f"names {[e.name for e in group]} differ only in case; torch reads "
                    f"{read.name!r} (index {read.index}) for all of them; "
                    f"{why or 'they hold the same bytes'}",
                    record=group[0].name, offset=group[0].central_offset)

    prefix = directory.prefix()
    for e in directory.entries:
        name = e.name
        if not name.startswith(f"{prefix}/") or not prefix:
            out.add(Code.ZIP_NAME_OUTSIDE_PREFIX,
                    f"file in archive is not in a subdirectory {prefix}/: {name}",
                    record=name, offset=e.central_offset)
        problem = _name_problem(e)
        if problem:
            out.add(Code.ZIP_BAD_NAME, f"entry name {name!r} {problem}", record=name,
                    offset=e.central_offset)


def _name_problem(e: ZipEntry) -> str | None:
    raw = e.name_bytes
    if not raw:
        return "is empty"
    if b"\x00" in raw:
        return "contains a NUL byte (C readers truncate it)"
    if raw.startswith((b"/", b"\\")) or (len(raw) > 1 and raw[1:2] == b":"):
        return "is absolute"
    parts = raw.replace(b"\\", b"/").split(b"/")
    if b".." in parts:
        return "has a '..' component"
    if not raw.isascii():
        if not e.flags & FLAG_UTF8:
            return "is not ASCII and lacks the UTF-8 flag (readers decode it differently)"
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError:
            return "is not valid UTF-8"
    return None


def _check_entries(directory: ZipDirectory, locals_: Mapping[int, LocalHeader], out: _Capped) -> None:
    for e in directory.entries:
        refused = False
        if e.flags & ENCRYPTION_FLAGS:
            refused = True
            out.add(Code.ZIP_ENCRYPTED_ENTRY,
                    f"{e.name} is encrypted (flags {e.flags:#06x}): torch fails with "
                    "'unsupported encryption'", record=e.name, offset=e.header_offset)
        if e.flags & FLAG_PATCHED:
            refused = True
            out.add(Code.ZIP_PATCHED_ENTRY,
                    f"{e.name} is flagged as compressed patched data (flags {e.flags:#06x}): "
                    "torch fails with 'unsupported feature'", record=e.name, offset=e.header_offset)
        # the DOS attribute is what only miniz honours (layout.miniz_directory); a name ending
        # in "/" is a directory to every reader, and torch never asks for one
        if e.uncompressed_size and e.external_attr & DOS_DIRECTORY:
            out.add(Code.ZIP_DIRECTORY_WITH_DATA,
                    f"{e.name} holds {e.uncompressed_size} bytes but is a directory to torch's "
                    f"zip reader (external attributes {e.external_attr:#x}): torch reads "
                    "uninitialized memory in their place", record=e.name, offset=e.header_offset)
        if e.method == 8:
            out.add(Code.ZIP_COMPRESSED_ENTRY,
                    f"{e.name} is deflated ({e.compressed_size} -> {e.uncompressed_size} bytes)",
                    record=e.name, offset=e.header_offset)
        elif e.method != 0:
            refused = True
            out.add(Code.ZIP_UNSUPPORTED_METHOD,
                    f"{e.name} uses compression method {e.method}: torch fails with "
                    "'unsupported method'", record=e.name, offset=e.header_offset)
        if refused:   # a flag or a method field does not make the bytes unreadable
            declare_entry(out.an.regions, "refused entry", header_offset=e.header_offset,
                          compressed_size=e.compressed_size, method=e.method, record=e.name)
        local = locals_.get(e.index)
        if local is not None:
            material, cosmetic = _local_differences(e, local)
            if material:
                out.add(Code.ZIP_LOCAL_CENTRAL_MISMATCH,
                        f"local header of {e.name} disagrees with the central directory: "
                        + "; ".join(material + cosmetic), record=e.name, offset=local.offset)
            elif cosmetic:
                out.add(Code.ZIP_LOCAL_CENTRAL_COSMETIC,
                        f"local header of {e.name} differs from the central directory only in "
                        "fields no reader locates or decodes the bytes by: " + "; ".join(cosmetic),
                        record=e.name, offset=local.offset)


def _local_sizes(local: LocalHeader) -> tuple[int, int]:
    """(csize, usize) of a local header, zip64 extra resolved when sentinels are used."""
    csize, usize = local.compressed_size, local.uncompressed_size
    if U32_MAX not in (csize, usize):
        return csize, usize
    pos, extra = 0, local.extra
    while pos + 4 <= len(extra):
        fid = int.from_bytes(extra[pos:pos + 2], "little")
        flen = int.from_bytes(extra[pos + 2:pos + 4], "little")
        if fid == 1 and flen >= 16:
            return (int.from_bytes(extra[pos + 12:pos + 20], "little"),
                    int.from_bytes(extra[pos + 4:pos + 12], "little"))
        pos += 4 + flen
    return csize, usize


def _local_differences(e: ZipEntry, local: LocalHeader) -> tuple[list[str], list[str]]:
    """(material, cosmetic) differences of a local header from its central entry.

    Material: a field some reader locates, decodes or names the bytes by, measured with torch
    2.13, zipfile, Info-ZIP unzip and Java's ZipInputStream (the name: ZipInputStream's entry
    name, zipfile refuses; the method and sizes unless deferred: unzip's output; the UTF-8 flag
    of a non-ASCII name: its decoding). Cosmetic: the CRC and every other flag bit, including
    the data descriptor and encryption bits: every reader reads the same bytes or refuses.
    """
    material: list[str] = []
    cosmetic: list[str] = []
    if local.name_bytes != e.name_bytes:
        material.append(f"name {local.name_bytes!r} vs {e.name_bytes!r}")
    if local.method != e.method:
        material.append(f"method {local.method} vs {e.method}")
    if not local.flags & FLAG_DESCRIPTOR:
        # bit 3 clear: the local header must carry the real CRC and sizes
        csize, usize = _local_sizes(local)
        if (csize, usize) != (e.compressed_size, e.uncompressed_size):
            material.append(f"sizes {csize}/{usize} vs {e.compressed_size}/{e.uncompressed_size}")
        if local.crc32 != e.crc32:
            cosmetic.append(f"crc {local.crc32:#010x} vs {e.crc32:#010x}")
    changed = local.flags ^ e.flags
    if changed:
        renamed = changed & FLAG_UTF8 and not (local.name_bytes.isascii() and e.name_bytes.isascii())
        (material if renamed else cosmetic).append(f"flags {local.flags:#06x} vs {e.flags:#06x}")
    return material, cosmetic


def _record_span(e: ZipEntry, local: LocalHeader | None) -> tuple[int, int, int, bool]:
    """(start, payload end, end incl. descriptor, exact) of an entry's bytes in the file.

    Without its local header the extra length is unknown (torch's FB padding lives only
    there): the span is then a lower bound, good for overlaps but not for gaps.
    """
    data = local.data_offset if local is not None else e.header_offset + LOCAL_SIZE + len(e.name_bytes)
    end = data + e.compressed_size
    desc = descriptor_size(e.header_offset, e.compressed_size) if e.flags & FLAG_DESCRIPTOR else 0
    return e.header_offset, end, end + desc, local is not None


def _same_record(a: ZipEntry, b: ZipEntry) -> bool:
    """Two central entries for one local record, by the same name, method and sizes (a
    duplicate ZIP_DUPLICATE_IDENTICAL notes): whichever a reader takes, it reads the same."""
    return (a.header_offset == b.header_offset and a.name_bytes == b.name_bytes
            and a.method == b.method and a.compressed_size == b.compressed_size
            and a.uncompressed_size == b.uncompressed_size and a.flags == b.flags)


def _check_layout(directory: ZipDirectory, locals_: Mapping[int, LocalHeader], out: _Capped) -> None:
    spans = sorted((*_record_span(e, locals_.get(e.index)), e.index) for e in directory.entries)
    entries = directory.entries
    first = spans[0][0] if spans else directory.cd_offset
    if first > 0:
        shifted = (f"; the directory's offsets do not count them: Python's zipfile adds "
                   f"{directory.shift} to each, torch's miniz does not and fails"
                   if directory.shift else "")
        out.add(Code.ZIP_PREPENDED_DATA,
                f"{first} bytes before the first record: torch.load takes the zip path only if the "
                f"file starts with PK\\x03\\x04 (polyglot / self-extracting layout){shifted}",
                offset=0)
        declare(out.an.regions, "prefix", 0, first)
    # payload_end: bytes that must not overlap; cursor: incl. the expected data descriptor
    # (a writer without the PK\x07\x08 signature uses 12 bytes: tolerated, not flagged)
    cursor = payload_end_max = first
    exact = True                 # is `cursor` known exactly (local header read)?
    owner: ZipEntry | None = None
    for start, payload_end, end, is_exact, index in spans:
        e = entries[index]
        if owner is not None and _same_record(e, owner) and payload_end == payload_end_max:
            continue   # a central entry written twice: one record, read alike by every reader
        if start < payload_end_max:
            out.add(Code.ZIP_OVERLAPPING_ENTRIES,
                    f"{e.name} at {start} overlaps {owner.name if owner else '?'} "
                    f"(which ends at {payload_end_max})", record=e.name, offset=start)
        elif start > cursor and exact:
            out.add(Code.ZIP_UNREFERENCED_DATA,
                    f"{start - cursor} bytes at {cursor} before {e.name} belong to no entry",
                    record=e.name, offset=cursor)
            declare(out.an.regions, "gap", cursor, start - cursor)
        if payload_end > payload_end_max:
            payload_end_max, owner = payload_end, e
        if end >= cursor:
            cursor, exact = end, is_exact
    if payload_end_max > directory.cd_offset:
        out.add(Code.ZIP_OVERLAPPING_ENTRIES,
                f"records reach {payload_end_max}, past the central directory at {directory.cd_offset}",
                offset=directory.cd_offset)
    elif cursor < directory.cd_offset and exact:
        out.add(Code.ZIP_UNREFERENCED_DATA,
                f"{directory.cd_offset - cursor} bytes at {cursor} before the central directory "
                "belong to no entry", offset=cursor)
        declare(out.an.regions, "gap", cursor, directory.cd_offset - cursor)
    cd_end = directory.cd_offset + directory.cd_size
    tail_start = directory.zip64_eocd_offset if directory.zip64_eocd_offset is not None \
        else directory.eocd_offset
    if directory.zip64 and directory.zip64_eocd_offset is not None and \
            directory.zip64_eocd_offset + ZIP64_EOCD_SIZE + ZIP64_LOCATOR_SIZE != directory.eocd_offset:
        out.add(Code.ZIP_UNREFERENCED_DATA,
                f"zip64 end record at {directory.zip64_eocd_offset} is not right before the locator",
                offset=directory.zip64_eocd_offset)
    if tail_start > cd_end:
        out.add(Code.ZIP_UNREFERENCED_DATA,
                f"{tail_start - cd_end} bytes at {cd_end} between the central directory and its end "
                "record belong to no entry", offset=cd_end)
        declare(out.an.regions, "gap", cd_end, tail_start - cd_end)
    if directory.archive_end < directory.size:
        out.add(Code.ZIP_APPENDED_DATA,
                f"{directory.size - directory.archive_end} bytes after the end of the archive "
                f"(at {directory.archive_end}); torch ignores them", offset=directory.archive_end)
        declare(out.an.regions, "appended", directory.archive_end, directory.size - directory.archive_end)


def verify_crcs(source: ByteSource, directory: ZipDirectory, an: Analysis, *,
                max_nbytes: int | None = None) -> None:
    """Read every stored/deflated record and compare its CRC-32 (torch never does).

    Records whose central CRC is 0 are skipped: torch writes 0 under
    `set_crc32_options(False)`.
    """
    cap = max_nbytes if max_nbytes is not None else an.options.limits.max_bytes_read
    out = _Capped(an)
    for e in directory.entries:
        if e.crc32 == 0 or e.method not in KNOWN_METHODS or directory.by_name.get(e.name) is not e:
            continue
        try:
            data = read_record(source, directory, e.name, max_nbytes=cap)
        except CkptError as exc:
            out.add(exc.code, exc.message, record=e.name, offset=exc.offset)
            continue
        crc = zlib.crc32(data)
        if crc != e.crc32:
            out.add(Code.ZIP_CRC_MISMATCH,
                    f"{e.name}: CRC-32 {crc:#010x} of its bytes, central directory says "
                    f"{e.crc32:#010x} (torch does not check)", record=e.name, offset=e.header_offset)
    out.close()


