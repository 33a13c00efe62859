"""The report's total size cap: past it the lists are cut, counted, and the scan fails closed.

Strategy: a report's JSON is `json.dumps(report.to_json())` (ASCII, default separators: the
largest form the service or the CLI writes without indentation). Its size is bounded
column-wise at C speed (joined strings, counts, the widest integer), never by serializing the
manifest: a 100k-tensor report costs more to serialize than to scan. Only when that bound
passes the budget are rows measured one by one, and the lists keep the rows that fit, in
this order: findings, globals, unsafe globals, tensors, storages, the map's regions (those
cut are counted in `regions_omitted`). One LIMIT_REPORT finding
(effect: suspicious) counts what was left out, so a cut report is never `safe`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from itertools import chain
from json.encoder import encode_basestring_ascii  # type: ignore[attr-defined]
from operator import countOf, itemgetter

from ckptguard.core import records
from ckptguard.core.errors import Code
from ckptguard.core.gcpause import collector_paused
from ckptguard.core.limits import Limits
from ckptguard.core.report import NAME_MARK, Finding, Report, StorageEntry, TensorEntry, json_len

TYPE_CHECKING = False   # typing stays unimported at run time (core/typenames.py)
if TYPE_CHECKING:
    from typing import Any

# JSON of a row whose strings are empty, lists empty, optional fields null, numbers 0: what
# every row costs before its variable parts (field names, quotes, separators, "false")
_TENSOR_FIXED = len(json.dumps(TensorEntry("", [], "", [], [], 0, "", "", False, 0, 0, "",
                                           ()).to_json()))
_STORAGE_FIXED = len(json.dumps(StorageEntry("", "", 0, 0, "", "", 0, False).to_json()))
# a map region (core.filemap.Region: kind, name, offset, length)
_REGION_FIXED = len(json.dumps({"kind": "", "name": "", "offset": 0, "length": 0}))
_RESERVE = 4096   # the LIMIT_REPORT finding itself, with its counts


def report_budget(limits: Limits, pickle_bytes: int, tensors: int, entries: int = 0) -> int:
    """JSON bytes a report may take: a share per pickle byte, per tensor and per zip entry,
    or the floor if that is more (a small file's report has a fixed part), never past
    `Limits.max_report_bytes`."""
    return min(limits.max_report_bytes,
               max(limits.report_floor_bytes,
                   limits.report_bytes_per_pickle_byte * pickle_bytes
                   + limits.report_bytes_per_tensor * tensors
                   + limits.report_bytes_per_entry * entries))


def _text(strings: Iterable[str | None]) -> int:
    """JSON characters of the strings' contents (escapes included, quotes not), summed."""
    return json_len("".join(filter(None, strings)))


def _transposed(rows: Sequence[tuple[Any, ...]]) -> tuple[tuple[Any, ...], ...]:
    """The rows' columns. zip(*rows) holds an iterator per row at once, and with the
    collector on those allocations set off collections that traverse the manifest for
    nothing (about 100 M instructions per call on 40,000 rows, callgrind): the rows are
    tuples of values and no cycle is made here, so it runs with the collector off."""
    with collector_paused():
        return tuple(zip(*rows, strict=True))


# CPython's json (and str) write an int of up to 4,300 digits (sys.int_info's default): a
# row holding a wider one (a pickle's LONG4 as a storage's numel; no tensor torch builds has
# one) cannot be written at all, so it is not listed (_drop_unwritable)
_WRITABLE_BITS = 14_000   # 4,215 digits


class _Unwritable(Exception):
    """An integer past _WRITABLE_BITS in a column."""


def _widest(*columns: Sequence[int]) -> int:
    """At least the characters of the widest integer in `columns`, a sign included (two C
    passes per column: no call per value)."""
    widest = max((max(max(c), -min(c)) for c in columns if c), default=0)
    if widest.bit_length() > _WRITABLE_BITS:
        raise _Unwritable
    return len(str(widest)) + 1


def _writable_row(row: Any) -> bool:
    return all(type(v) is not int or v.bit_length() <= _WRITABLE_BITS
               for field in row for v in (field if type(field) in (list, tuple) else (field,)))


def _drop_unwritable(report: Report) -> str:
    """Drop the tensor and storage rows holding an integer no JSON writer here writes; what
    was dropped (a row at a time: only reports that hold such an integer come here)."""
    dropped = []
    for label in ("tensors", "storages"):
        rows = getattr(report, label)
        kept = [row for row in rows if _writable_row(row)]
        if len(kept) < len(rows):
            dropped.append(f"{len(rows) - len(kept):,} of {len(rows):,} {label}")
            setattr(report, label, kept)
    return ", ".join(dropped)


def tensors_bound(tensors: Sequence[TensorEntry], max_name_chars: int) -> int:
    """An upper bound of the JSON characters of the tensor rows (with their separators), in
    C-speed passes over the columns (the rows transposed once)."""
    n = len(tensors)
    if not n:
        return 0
    (names, paths, dtypes, shapes, strides, offsets, storages, kinds, _, data_offsets, nbytes,
     records, flags) = _transposed(tensors)
    joined = "".join(names)
    # a path's segments hold its name's characters minus the dots, plus per segment two
    # quotes and ", "; a shortened path (NAME_MARK) may hold up to max_name_chars more
    name_text = json_len(joined)
    shortened = joined.count(NAME_MARK)
    segments = sum(map(len, paths))
    dims = list(chain.from_iterable(chain(shapes, strides)))
    dim_width = _widest(dims) + 2
    # the fixed row has 0 for each integer and "" for each text: the rest, and null's extra
    ints = _widest(offsets) + _widest(list(filter(None, data_offsets))) + _widest(nbytes) - 3
    nulls = 2 * (countOf(storages, None) + countOf(records, None)) + 3 * countOf(data_offsets, None)
    # dtype and kind come from small sets: the longest one per row
    closed = sum(max(map(len, map(encode_basestring_ascii, set(c)))) - 2 for c in (dtypes, kinds))
    return (n * (_TENSOR_FIXED + 2 + ints + closed) + nulls
            + 2 * name_text + 4 * segments + shortened * max_name_chars + len(dims) * dim_width
            + _text(storages) + _text(records) + 8 * sum(map(len, flags)))


def storages_bound(storages: Sequence[StorageEntry]) -> int:
    """An upper bound of the JSON characters of the storage rows (with their separators)."""
    n = len(storages)
    if not n:
        return 0
    keys, dtypes, numels, nbytes, locations, records, data_offsets, _ = _transposed(storages)
    ints = sum(_widest(list(filter(None, c))) for c in (numels, nbytes, data_offsets)) - 3
    nulls = 2 * countOf(records, None) + 3 * countOf(data_offsets, None)
    return (n * (_STORAGE_FIXED + 2 + ints) + nulls
            + sum(_text(c) for c in (keys, dtypes, locations, records)))


def regions_bound(regions: Sequence[Any]) -> int:
    """An upper bound of the JSON characters of the map's rows (with their separators)."""
    n = len(regions)
    if not n:
        return 0
    ints = _widest(list(map(itemgetter(2), regions))) + _widest(list(map(itemgetter(3), regions))) - 2
    return n * (_REGION_FIXED + 2 + ints) + _text(map(itemgetter(0), regions)) \
        + _text(map(itemgetter(1), regions))


def _size(value: Any) -> int:
    return len(json.dumps(value))


_CHUNK = 1024


def _fit(items: Sequence[Any], room: int, bound: Any = None) -> tuple[int, int]:
    """(how many leading items fit in `room` JSON characters, the characters they take at
    most). With `bound` (a column bound of a slice), whole chunks that fit by their bound
    are taken without serializing a row; the chunk that may not fit is measured row by row."""
    used = 0
    start = 0
    if bound is not None:
        while start < len(items):
            cost = bound(items[start:start + _CHUNK])
            if used + cost > room:
                break
            used += cost
            start += _CHUNK
    for i in range(start, len(items)):
        item = items[i]
        cost = _size(item.to_json() if hasattr(item, "to_json") else item) + 2
        if used + cost > room:
            return i, used
        used += cost
    return len(items), used


def cap_report(report: Report, budget: int, max_name_chars: int) -> Finding | None:
    """Cut `report`'s lists, in place, to fit `budget` JSON bytes; the LIMIT_REPORT finding
    (already appended to the report) if any was cut, else None."""
    wo = report.weights_only
    hint = wo.safe_globals_hint
    bare = records.replace(report, globals=[], findings=[], tensors=[], storages=[], regions=[],
                           weights_only=records.replace(wo, unsafe_globals=[],
                                                        safe_globals_hint=None))
    fixed = _size(bare.to_json())
    unwritable = ""
    try:
        rows = tensors_bound(report.tensors, max_name_chars) + storages_bound(report.storages)
    except _Unwritable:
        unwritable = _drop_unwritable(report)
        rows = tensors_bound(report.tensors, max_name_chars) + storages_bound(report.storages)
    lists: list[tuple[str, Sequence[Any], Any]] = [
        ("findings", report.findings, None), ("globals", report.globals, None),
        ("unsafe globals", wo.unsafe_globals, None),
        ("tensors", report.tensors, lambda rows: tensors_bound(rows, max_name_chars)),
        ("storages", report.storages, storages_bound),
        ("regions", report.regions, regions_bound)]
    bound = (fixed + _size([f.to_json() for f in report.findings])
             + _size([g.to_json() for g in report.globals]) + _size(wo.unsafe_globals)
             + (_size(hint) if hint else 0) + rows + regions_bound(report.regions))
    if bound <= budget and not unwritable:
        return None
    room = budget - fixed - _RESERVE
    kept: list[tuple[str, int, int]] = []
    for label, items, bound in lists:
        count, used = _fit(items, max(room, 0), bound)
        kept.append((label, count, len(items)))
        room -= used
    if all(count == total for _, count, total in kept) and (not hint or _size(hint) <= room) \
            and not unwritable:
        return None   # the bound was loose: every row fits
    counts = {label: count for label, count, _ in kept}
    report.findings = report.findings[:counts["findings"]]
    report.globals = report.globals[:counts["globals"]]
    report.storages = report.storages[:counts["storages"]]
    report.tensors = report.tensors[:counts["tensors"]]
    report.regions_omitted += len(report.regions) - counts["regions"]
    report.regions = report.regions[:counts["regions"]]
    if counts["unsafe globals"] < len(wo.unsafe_globals) or (hint and _size(hint) > room):
        wo.safe_globals_hint = None
    wo.unsafe_globals = wo.unsafe_globals[:counts["unsafe globals"]]
    left_out = ", ".join(f"{total - count:,} of {total:,} {label}"
                         for label, count, total in kept if count < total) or "the hint"
    if unwritable:
        message = (f"not listed: {unwritable} holding an integer past 4,300 digits (no JSON "
                   "writer here writes one; no tensor torch builds has one)")
        if left_out != "the hint" or (hint and _size(hint) > room):
            message += f"; the rest would pass the report's cap of {budget:,} JSON bytes: " \
                       f"not listed: {left_out}"
    else:
        message = (f"the report would pass its cap of {budget:,} JSON bytes (Limits: per pickle "
                   f"byte, per tensor and per zip entry, at least a floor, at most "
                   f"max_report_bytes): not listed: {left_out}")
    finding = Finding(Code.LIMIT_REPORT, message)
    report.findings.append(finding)
    return finding
