"""The map of a file: which bytes hold what (`Report.regions`, `findings[].length`).

Strategy: format modules record what they already know while they parse: a zip archive's
spans (`ZipSpans`: one row per entry in file order plus the directory and end records), or
a few sections (a pickle, a header, a data buffer) with `add_region`. `finish` turns that
into the report's list, sorted by offset, and gives every finding that names an anomalous
range (prepended, appended, unreferenced or overlapping bytes, an unreferenced record,
trailing bytes) that range's `length`.

Cost follows the metadata: past `Limits.max_map_regions`, the remaining archive records are not
listed one by one but merged into one `records` region per run of adjacent records, and
what could still not be listed is counted in `Report.regions_omitted`.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import islice
from operator import add, attrgetter, eq, ge

from ckptguard.core import records
from ckptguard.core.errors import Code
from ckptguard.core.records import record
from ckptguard.core.report import Finding
from ckptguard.core.typenames import NamedTuple

TYPE_CHECKING = False   # typing stays unimported at run time (core/typenames.py)
if TYPE_CHECKING:
    from typing import Any, Literal, TypeAlias

RegionKind: TypeAlias = """Literal[
    # what a reader expects
    "pickle", "tensor_data", "metadata", "record", "records", "header", "local_header",
    "data_descriptor", "central_directory", "end_records",
    # anomalies: bytes no reader accounts for, or that two entries claim
    "prepended", "appended", "unreferenced_data", "overlap", "unreferenced_record",
    "trailing_data",
]"""
ANOMALOUS: frozenset[str] = frozenset({"prepended", "appended", "unreferenced_data", "overlap",
                                       "unreferenced_record", "trailing_data"})

# The finding whose `offset` (or `record`) names each anomalous region: it gets its length.
FINDING_KIND: dict[Code, str] = {
    Code.ZIP_PREPENDED_DATA: "prepended",
    Code.ZIP_APPENDED_DATA: "appended",
    Code.ZIP_UNREFERENCED_DATA: "unreferenced_data",
    Code.ZIP_OVERLAPPING_ENTRIES: "overlap",
    Code.TORCH_UNREFERENCED_RECORD: "unreferenced_record",
    Code.PICKLE_TRAILING_DATA: "trailing_data",
    Code.NPY_TRAILING_DATA: "trailing_data",
}

# torch's own small records (core.torch.container.KNOWN_RECORDS without data.pkl)
_METADATA = frozenset(("version", ".data/version", "byteorder", ".format_version",
                       ".storage_alignment", ".data/serialization_id"))


_OFFSET = attrgetter("offset")
_LENGTH = attrgetter("length")


class Region(NamedTuple):
    kind: str          # a RegionKind
    name: str          # the record or section (file data, never markup)
    offset: int        # absolute file byte
    length: int

    def to_json(self) -> dict[str, Any]:
        kind, name, offset, length = self
        return {"kind": kind, "name": name, "offset": offset, "length": length}


@record(frozen=True, slots=True)
class ZipSpans:
    """An archive's byte spans, entries sorted by local header offset.

    `data[i]` is where entry i's bytes begin (from its local header; without one, the
    lower bound header + 30 + name length), `end[i]` where they end, data descriptor
    included. The general path (core.zip.directory) and the column lane (core.zip.columns)
    both build one, so both engines draw the same map.
    """

    names: Sequence[str]
    header: Sequence[int]
    data: Sequence[int]
    size: Sequence[int]       # compressed size: the bytes after `data`
    end: Sequence[int]
    cd_offset: int
    cd_end: int
    tail_start: int           # the zip64 end record if any, else the end record
    archive_end: int          # end record + comment
    file_size: int
    prefix: str


def add_region(regions: list[Region], kind: RegionKind, name: str, offset: int | None,
               length: int) -> None:
    """Record one section; an unknown offset or an empty span records nothing."""
    if offset is not None and length > 0:
        regions.append(Region(kind, name, offset, length))


def finish(regions: list[Region], spans: ZipSpans | None, findings: list[Finding], *,
           file_size: int, storage_records: set[str], max_regions: int,
           ) -> tuple[list[Region], int, list[Finding]]:
    """(regions sorted by offset, how many were not listed, findings with lengths)."""
    out = list(regions)
    omitted = 0
    if spans is not None:
        flagged = {f.record for f in findings if f.code is Code.TORCH_UNREFERENCED_RECORD}
        zip_regions, omitted = _zip_regions(spans, storage_records, flagged,
                                            max(0, max_regions - len(out)))
        out.extend(zip_regions)
    out.extend(_trailing(findings, file_size))
    if len(out) > max_regions:
        omitted += len(out) - max_regions
        out = out[:max_regions]
    # by offset, the longer of two regions at one offset first: two stable sorts with C keys
    # (a lambda per region costs more than the sorts)
    out.sort(key=_LENGTH, reverse=True)
    out.sort(key=_OFFSET)
    return out, omitted, _with_lengths(findings, out)


def _trailing(findings: list[Finding], file_size: int) -> list[Region]:
    """Bytes after a pickle's STOP or an array's data, up to the end of the file."""
    return [Region("trailing_data", "bytes after the end", f.offset, file_size - f.offset)
            for f in findings
            if FINDING_KIND.get(f.code) == "trailing_data" and f.record is None
            and f.offset is not None and 0 <= f.offset < file_size]


def _with_lengths(findings: list[Finding], regions: list[Region]) -> list[Finding]:
    by_offset = {(r.kind, r.offset): r.length for r in regions if r.kind in ANOMALOUS}
    # a finding on an unreferenced record points at its local header: header + bytes
    headers = {r.name: r.offset for r in regions if r.kind == "local_header"}
    by_name = {r.name: r.offset + r.length - headers.get(r.name, r.offset) for r in regions
               if r.kind == "unreferenced_record"}
    out: list[Finding] = []
    for f in findings:
        kind = FINDING_KIND.get(f.code)
        length = None
        if kind == "unreferenced_record" and f.record is not None:
            length = by_name.get(f.record)
        elif kind is not None and f.offset is not None:
            length = by_offset.get((kind, f.offset))
        out.append(f if length is None else records.replace(f, length=length))
    return out


def _payload_kind(name: str, prefix: str, storage_records: set[str], flagged: set[str | None],
                  ) -> RegionKind:
    rel = name[len(prefix) + 1:] if prefix and name.startswith(prefix + "/") else name
    if name in storage_records:
        return "tensor_data"
    if name in flagged:
        return "unreferenced_record"
    if rel.endswith(".pkl"):
        return "pickle"
    if rel in _METADATA:
        return "metadata"
    return "record"


def _zip_regions(spans: ZipSpans, storage_records: set[str], flagged: set[str | None],
                 room: int) -> tuple[list[Region], int]:
    """Every record's local header, bytes and descriptor, the directory, the end records,
    and every range no entry accounts for or two entries claim."""
    out: list[Region] = []
    n = len(spans.header)
    first = spans.header[0] if n else spans.cd_offset
    add_region(out, "prepended", "bytes before the first record", 0, first)
    # anomalies between records: one pass, the same walk core.zip.checks makes
    cursor = payload_max = first
    payload_ends = list(map(add, spans.data, spans.size))
    tiled = _tiled(spans, payload_ends)
    if tiled:   # no anomaly between records: the walk's end state, in C passes
        cursor = max(first, spans.end[-1])
        payload_max = max(first, max(payload_ends))
    else:
        for name, start, data, size, end in zip(spans.names, spans.header, spans.data, spans.size,
                                                spans.end, strict=True):
            if start < payload_max:
                add_region(out, "overlap", name, start, min(payload_max, end) - start)
            elif start > cursor:
                add_region(out, "unreferenced_data", f"{start - cursor} bytes before {name}",
                           cursor, start - cursor)
            if data + size > payload_max:   # comparisons, not max(): this runs once per record
                payload_max = data + size
            if end > cursor:
                cursor = end
    if payload_max > spans.cd_offset:
        add_region(out, "overlap", "records reaching into the central directory", spans.cd_offset,
                   payload_max - spans.cd_offset)
    elif cursor < spans.cd_offset:
        add_region(out, "unreferenced_data", "bytes before the central directory", cursor,
                   spans.cd_offset - cursor)
    add_region(out, "central_directory", "central directory", spans.cd_offset,
               spans.cd_end - spans.cd_offset)
    add_region(out, "unreferenced_data", "bytes between the central directory and its end record",
               spans.cd_end, spans.tail_start - spans.cd_end)
    add_region(out, "end_records", "end of central directory", spans.tail_start,
               spans.archive_end - spans.tail_start)
    add_region(out, "appended", "bytes after the end of the archive", spans.archive_end,
               spans.file_size - spans.archive_end)
    omitted = max(0, len(out) - room)
    del out[room:]
    # records, one by one while there is room (three regions each at most), then merged;
    # add_region's rule inline (a region only if it has bytes): this runs once per record
    listed = max(0, room - len(out)) // 3
    append = out.append
    for name, start, data, size, end in zip(spans.names[:listed], spans.header[:listed],
                                            spans.data[:listed], spans.size[:listed],
                                            spans.end[:listed], strict=True):
        if data > start:
            append(Region("local_header", name, start, data - start))
        if size > 0:
            append(Region(_payload_kind(name, spans.prefix, storage_records, flagged), name,
                          data, size))
        if end > data + size:
            append(Region("data_descriptor", name, data + size, end - data - size))
    runs = _merged_runs(spans, listed, tiled)
    room_left = max(0, room - len(out))
    omitted += max(0, len(runs) - room_left)
    out.extend(runs[:room_left])
    return out, omitted


def _tiled(spans: ZipSpans, payload_ends: Sequence[int]) -> bool:
    """Whether each record starts where the one before it ends (`header[i + 1] == end[i]`)
    and holds its own payload (`end >= header`, `end >= data + size`, given as
    `payload_ends`), as in every torch.save archive. The walk over the records then finds no
    overlap and no gap: a few C passes instead of a Python statement per record
    (tests/core/test_regions.py checks the map is the one the walk draws)."""
    header, end = spans.header, spans.end
    return (bool(header) and all(map(eq, islice(header, 1, None), end))
            and all(map(ge, end, header))
            and all(map(ge, end, payload_ends)))


def _merged_runs(spans: ZipSpans, first: int, tiled: bool) -> list[Region]:
    """Records from index `first` on, one region per run of records that touch (all of them,
    if `tiled`)."""
    runs: list[Region] = []
    i, n = first, len(spans.header)
    if i < n and tiled:
        start, end = spans.header[i], spans.end[-1]
        return [Region("records", f"{n - i} records", start, end - start)]
    while i < n:
        start, end, count = spans.header[i], spans.end[i], 1
        i += 1
        while i < n and spans.header[i] == end:
            end = spans.end[i]
            count += 1
            i += 1
        runs.append(Region("records", f"{count} records", start, end - start))
    return runs
