"""A report split for compact storage, and joined again as a stream of JSON bytes.

Strategy: a report's size is its manifest (`tensors`, `storages`: one row per tensor view,
~250 bytes each, 500,000 rows for a 7 MB checkpoint). The rest of it (verdict, findings,
globals) is the *head*. Stored, the head is one compressed blob; each manifest part is a
series of compressed chunks of `ROWS_PER_CHUNK` rows, one JSON row per line (a line can be
picked without decoding its neighbours), and a few columns per tensor go to their own table
for the tensor endpoint to filter and sort on. `stream` writes the report back chunk by
chunk: the bytes equal `JSONResponse(report)`'s (same separators, same key order), and
memory follows one chunk, never the report. Pure functions: the store and the migration
that moved old rows into this layout (app/migrations/versions/0003_compact.py) share them.
"""

from __future__ import annotations

import json
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import datetime
from itertools import repeat
from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]
from typing import Any, NamedTuple

import sqlalchemy as sa

from ckptguard.core.records import record

# JSONResponse's encoding (starlette.responses.JSONResponse.render): the bytes a client got
# before reports were streamed.
_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))
dumps = _ENCODER.encode
# The same encoding built once for manifest rows: `encode` builds a C encoder per call, a
# third of a row's cost (500,000 rows). No circular check: a report is a tree.
_ROW_ENCODER = c_make_encoder(None, _ENCODER.default, encode_basestring, None, ":", ",",
                              False, False, False) if c_make_encoder is not None else None


def utf8(text: str) -> bytes:
    """JSON text as UTF-8 bytes. A pickle's strings may hold a lone surrogate (BINUNICODE
    decodes with surrogatepass, as pickle does: a tensor named 'w\\udcff'), which UTF-8
    cannot encode: it becomes its JSON escape, `\\udcff`, as an ASCII encoder writes it and
    as a JSON reader reads it back."""
    return text.encode("utf-8", "backslashreplace")


def dumps_rows(rows: list[Any]) -> list[str]:
    """`[dumps(row) for row in rows]`, without the per-call setup."""
    if _ROW_ENCODER is None:
        return list(map(dumps, rows))
    encode = _ROW_ENCODER
    return ["".join(encode(row, 0)) for row in rows]

MANIFEST = ("tensors", "storages")       # the report's parts stored as chunks
ROWS_PER_CHUNK = 256
SEVERITIES = ("critical", "high", "medium", "low", "info")
TOP_FINDINGS = 5
STREAM_PIECE_CHARS = 256 * 1024          # characters joined before a piece is sent
NO_OFFSET = -1                           # data_offset key of a row without one (sorts first)


class Layout(NamedTuple):
    """The tables an analysis is written to (app/tables.py: analyses, manifest_chunks,
    tensor_keys)."""

    analyses: sa.Table | sa.TableClause
    chunks: sa.Table | sa.TableClause
    keys: sa.Table | sa.TableClause


def pack(value: Any) -> bytes:
    """`value` as compressed JSON."""
    return zlib.compress(utf8(dumps(value)), 6)


def unpack(blob: bytes) -> Any:
    return json.loads(zlib.decompress(blob))


def head_of(report: Mapping[str, Any]) -> dict[str, Any]:
    """The report without its manifest; an empty list holds each manifest part's place, so
    the keys keep their order when the report is joined again."""
    return {key: [] if key in MANIFEST and isinstance(value, list) else value
            for key, value in report.items()}


def _rank(finding: Mapping[str, Any]) -> int:
    severity = finding.get("severity")
    return SEVERITIES.index(severity) if severity in SEVERITIES else len(SEVERITIES)


def summary_of(report: Mapping[str, Any]) -> dict[str, Any]:
    """What a list of scans shows: the scanner, counts, the most severe findings (report order
    among equals)."""
    findings = [f for f in report.get("findings") or [] if isinstance(f, Mapping)]
    by_severity: dict[str, int] = {}
    for finding in findings:
        severity = str(finding.get("severity"))
        by_severity[severity] = by_severity.get(severity, 0) + 1
    worst = sorted(findings, key=_rank)[:TOP_FINDINGS]
    return {
        "scanner": report.get("scanner"),
        "counts": {"findings": by_severity, "tensors": len(report.get("tensors") or []),
                   "storages": len(report.get("storages") or []),
                   "globals": len(report.get("globals") or [])},
        "findings": [{"code": f.get("code"), "severity": f.get("severity"),
                      "message": f.get("message")} for f in worst],
    }


def chunks_of(rows: list[Any]) -> Iterator[tuple[int, bytes]]:
    """(chunk number, compressed lines) for each run of ROWS_PER_CHUNK rows."""
    for number, start in enumerate(range(0, len(rows), ROWS_PER_CHUNK)):
        lines = "\n".join(dumps_rows(rows[start:start + ROWS_PER_CHUNK]))
        yield number, zlib.compress(utf8(lines), 6)


def chunk_lines(blob: bytes) -> list[str]:
    """The JSON rows of one stored chunk (JSON text has no raw newline: one row per line)."""
    return zlib.decompress(blob).decode().split("\n")


class KeyColumns(NamedTuple):
    """What the tensor endpoint filters and sorts on, a column per field, one entry per tensor
    row (its index is its place): references to the report's own strings and ints, no copy."""

    names: list[str]
    dtypes: list[str]
    nbytes: list[int]
    data_offsets: list[int]          # NO_OFFSET for a row without one


def _text(value: Any) -> str:
    return value if type(value) is str else str(value or "")


def storable(text: str) -> str:
    """A key column's text: a database stores UTF-8 and PostgreSQL no NUL, so a lone
    surrogate (see `utf8`) and a NUL are kept as their JSON escapes."""
    return utf8(text).decode("utf-8").replace("\0", "\\u0000")


def key_columns(rows: list[Any]) -> KeyColumns:
    """The key columns of the tensor rows. Rows of old reports may miss fields, or not be
    objects: they get neutral keys. Each column is one C-level pass (`map(dict.get, ...)`)
    and one check of its type, not a Python call per row (500,000 rows)."""
    objects = [row if type(row) is dict else dict(row) if isinstance(row, Mapping) else {}
               for row in rows] if any(type(row) is not dict for row in rows) else rows

    def column(field: str) -> list[Any]:
        return list(map(dict.get, objects, repeat(field)))

    return KeyColumns(
        names=[n if type(n) is str and n.isascii() and "\0" not in n else storable(_text(n))
               for n in column("name")],
        dtypes=[d if type(d) is str and d.isascii() and "\0" not in d else storable(_text(d))
                for d in column("dtype")],
        nbytes=[n if type(n) is int else 0 for n in column("nbytes")],
        data_offsets=[o if type(o) is int else NO_OFFSET for o in column("data_offset")])


def dtype_totals(keys: KeyColumns) -> list[dict[str, Any]]:
    """[{dtype, count, nbytes}] over all tensor rows, most bytes first."""
    counts = Counter(keys.dtypes)
    sizes = dict.fromkeys(counts, 0)
    for dtype, nbytes in zip(keys.dtypes, keys.nbytes, strict=True):
        sizes[dtype] += nbytes
    return [{"dtype": d, "count": counts[d], "nbytes": sizes[d]}
            for d in sorted(counts, key=lambda d: (-sizes[d], d))]


def stream(fields: Mapping[str, Any], head: Mapping[str, Any],
           part_rows: Callable[[str], Iterable[str]]) -> Iterator[bytes]:
    """The JSON object `{**fields, **head}` where each manifest part of `head` is replaced by
    the rows `part_rows(part)` yields (pieces of rows already JSON-encoded and joined by
    commas), in pieces of about STREAM_PIECE_CHARS."""
    buffer: list[str] = ["{"]
    size = 1
    first = True
    for key, value in [*fields.items(), *head.items()]:
        buffer.append(("" if first else ",") + dumps(key) + ":")
        first = False
        if key not in MANIFEST or not isinstance(value, list):
            buffer.append(dumps(value))
            size += len(buffer[-1])
            continue
        buffer.append("[")
        empty = True
        for piece in part_rows(key):
            buffer.append(piece if empty else "," + piece)
            empty = False
            size += len(piece)
            if size >= STREAM_PIECE_CHARS:
                yield utf8("".join(buffer))
                buffer, size = [], 0
        buffer.append("]")
    buffer.append("}")
    yield utf8("".join(buffer))


def rows_in_pieces(rows: list[Any]) -> Iterator[str]:
    """An in-memory manifest part as `stream` wants it: rows encoded a chunk at a time."""
    for start in range(0, len(rows), ROWS_PER_CHUNK):
        yield ",".join(dumps_rows(rows[start:start + ROWS_PER_CHUNK]))


def batches(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    """`items` in lists of `size` (the last one shorter)."""
    batch: list[Any] = []
    for item in items:
        batch.append(item)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


@record(frozen=True, slots=True)
class Prepared:
    """A report encoded for storage, before a write transaction: the CPU-heavy part (JSON,
    compression, key columns) runs outside the store's write lock; what it holds is
    compressed, or references into the report."""

    report: Mapping[str, Any]
    head: bytes
    chunks: dict[str, list[bytes]]          # part -> compressed chunks, in order
    summary: dict[str, Any]
    keys: KeyColumns
    dtypes: list[dict[str, Any]]

    def rows(self, part: str) -> list[Any]:
        rows = self.report.get(part)
        return rows if isinstance(rows, list) else []


def prepare(report: Mapping[str, Any]) -> Prepared:
    tensors = report.get("tensors")
    keys = key_columns(tensors if isinstance(tensors, list) else [])
    return Prepared(report=report, head=pack(head_of(report)),
                    chunks={part: [blob for _n, blob in chunks_of(rows)]
                            for part in MANIFEST
                            if isinstance(rows := report.get(part), list)},
                    summary=summary_of(report), keys=keys, dtypes=dtype_totals(keys))


def insert_analysis(conn: sa.Connection, tables: Layout, report: Mapping[str, Any] | Prepared, *,
                    policy: str, cacheable: bool, now: datetime) -> int:
    """Write the analysis of `report` (head, chunks, tensor keys); its id. `tables` are the
    store's (app/tables.py), or a migration's own view of them. With a Prepared report
    nothing here runs per row in Python: the write lock is held for the database's work."""
    ready = report if isinstance(report, Prepared) else prepare(report)
    source = ready.report.get("source") or {}
    stored_bytes = len(ready.head) + sum(len(b) for blobs in ready.chunks.values() for b in blobs)
    analysis_id: int = conn.execute(tables.analyses.insert().values(
        created_at=now, sha256=str(source.get("sha256") or ""),
        scanner_version=str((ready.report.get("scanner") or {}).get("version", "")),
        policy=policy, cacheable=cacheable, head=ready.head, summary=ready.summary,
        dtypes=ready.dtypes, tensor_count=len(ready.rows("tensors")),
        storage_count=len(ready.rows("storages")), stored_bytes=stored_bytes)
        .returning(tables.analyses.c.id)).scalar_one()
    chunk_rows = ((analysis_id, part, n, blob)
                  for part, blobs in ready.chunks.items() for n, blob in enumerate(blobs))
    _executemany(conn, tables.chunks.name, ("analysis_id", "part", "chunk", "data"), chunk_rows)
    keys = ready.keys
    _executemany(conn, tables.keys.name,
                 ("analysis_id", "idx", "name", "dtype", "nbytes", "data_offset"),
                 zip(repeat(analysis_id), range(len(keys.names)), keys.names, keys.dtypes,
                     keys.nbytes, keys.data_offsets))
    return analysis_id


def _executemany(conn: sa.Connection, table: str, columns: tuple[str, ...],
                 rows: Iterator[tuple[Any, ...]]) -> None:
    """INSERT `rows` (plain tuples, consumed as the driver goes) with the driver's executemany
    on the connection's transaction: SQLAlchemy's executemany wants a list of dicts, a
    Python object per row (500,000 rows: seconds under the write lock)."""
    mark = "?" if conn.dialect.paramstyle == "qmark" else "%s"
    sql = (f"INSERT INTO {table} ({', '.join(columns)}) "  # noqa: S608 (names are ours)
           f"VALUES ({', '.join([mark] * len(columns))})")
    cursor = conn.connection.cursor()
    try:
        cursor.executemany(sql, rows)  # type: ignore[arg-type]  # drivers take any iterable
    finally:
        cursor.close()
