"""Stored reports: save, share, get, stream, list (cursor pagination), tensors, delete, sweep.

Strategy: SQLAlchemy 2 Core on a synchronous engine; the async routes call it through
`asyncio.to_thread`. The schema belongs to Alembic: `Store.open` runs `upgrade head`
on start (a new SQLite file is created on first start), never `create_all`.
The cache key is (sha256, scanner version, policy) where policy includes any extra
allowlisted globals, since they change the verdict.

Layout (app/tables.py): an *analysis* is a report stored compact (app/compact.py: head,
manifest chunks, tensor keys) under its cache key; a *record* (`scans` row) is one request's
id, time and source, referencing an analysis. A cache hit adds a record, never a copy; an
analysis goes when its last record does (DELETE, retention sweep).
"""

from __future__ import annotations

import base64
import binascii
import json
import threading
import uuid
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic import command
from alembic.config import Config

from ckptguard.app import compact
from ckptguard.app.tables import analyses, manifest_chunks, scans, tensor_keys
from ckptguard.core.records import record

MIGRATIONS = Path(__file__).parent / "migrations"
MAX_PAGE = 500


@record(frozen=True, slots=True)
class Record:
    """One request's scan: its own id, time and source, and the analysis it references."""

    id: str
    created_at: datetime
    cached: bool                 # the analysis was made for another request
    source: dict[str, Any]
    analysis_id: int
    verdict: str
    format: str

    def fields(self) -> dict[str, Any]:
        """The service's fields that precede the report in every answer."""
        return {"id": self.id, "created_at": self.created_at.isoformat(), "cached": self.cached}


@record(frozen=True, slots=True)
class Cached:
    """A stored analysis that a request for the same bytes may reuse."""

    analysis_id: int
    record_id: str               # its newest record (the hub points at it)
    source: dict[str, Any]       # that record's source
    verdict: str
    format: str
    codes: list[str]             # finding codes for the log line (the most severe)


@record(frozen=True, slots=True)
class Stored:
    """A record with what serving its report needs; the manifest stays in the database."""

    record: Record
    head: bytes                  # compact.pack of the report without its manifest
    tensor_count: int
    storage_count: int
    dtypes: list[dict[str, Any]]

    def report_head(self) -> dict[str, Any]:
        """The report without its manifest, under this record's own source."""
        head: dict[str, Any] = compact.unpack(self.head)
        if "source" in head:
            head["source"] = self.record.source
        return head


@record(frozen=True, slots=True)
class Page:
    items: list[dict[str, Any]]
    next_cursor: str | None


@record(frozen=True, slots=True)
class TensorPage:
    items: list[dict[str, Any]]
    next_cursor: str | None
    total: int

def policy_key(policy: str, allow: frozenset[str]) -> str:
    """The policy part of the cache key: extra allowed globals change verdicts."""
    return policy if not allow else f"{policy}+allow:{','.join(sorted(allow))}"


def migrate(engine: sa.Engine) -> None:
    """Bring the schema to Alembic's head on `engine` (idempotent)."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            # API nodes and workers starting together: one migrates, the others wait, then
            # find the schema at head (the lock ends with the transaction)
            conn.execute(sa.text("SELECT pg_advisory_xact_lock(7283364)"))
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    # WAL: readers never block the writer; NORMAL: durable across process crashes,
    # one fsync per checkpoint instead of per commit (sqlite.org/wal.html).
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA busy_timeout=10000")
    cur.close()


class Store:
    """Reports in a SQL database (SQLite by default, any SQLAlchemy URL)."""

    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine
        # SQLite has one writer; its busy handler sleeps up to 100 ms per retry, so
        # concurrent writers queue on this lock instead (bench: p99 at 32 clients).
        sqlite = engine.dialect.name == "sqlite"
        self._write_lock: AbstractContextManager[Any] = threading.Lock() if sqlite else nullcontext()
        self._name_matches = _Recent(NAME_MEMO_ENTRIES)

    @classmethod
    def open(cls, url: str) -> Store:
        """Connect, create the SQLite file's directory if needed, migrate to head."""
        sa_url = sa.make_url(url)
        kwargs: dict[str, Any] = {"pool_pre_ping": True}
        if sa_url.get_backend_name() == "sqlite":
            if sa_url.database and sa_url.database != ":memory:":
                Path(sa_url.database).parent.mkdir(parents=True, exist_ok=True)
            kwargs["connect_args"] = {"check_same_thread": False}
        engine = sa.create_engine(sa_url, **kwargs)
        if sa_url.get_backend_name() == "sqlite":
            sa.event.listen(engine, "connect", _sqlite_pragmas)
        migrate(engine)
        return cls(engine)

    def close(self) -> None:
        self.engine.dispose()

    def ping(self) -> None:
        with self.engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))

    def save(self, report: dict[str, Any], *, policy: str, cacheable: bool,
             record_id: str | None = None) -> Record:
        """Store one fresh report (a `Report.to_json()` dict) as an analysis and this
        request's record of it. Runs in a thread: encoding a 500,000-row manifest takes seconds.

        `record_id`: the id a job gave this report before it ran (a hub file's, an async URL
        scan's). A job runs at least once: when a process died after saving and before its job
        row said so, the retry finds that record and keeps it instead of storing a copy."""
        source = dict(report.get("source") or {})
        ready = compact.prepare(report)              # encoding and compression: before the lock
        now = datetime.now(UTC)
        with self._write_lock, self.engine.connect() as conn, self._save_cache(conn), conn.begin():
            if record_id is not None and (kept := conn.execute(
                    sa.select(scans).where(scans.c.id == record_id)).first()) is not None:
                return _record(kept)
            analysis_id = compact.insert_analysis(conn, LAYOUT, ready, policy=policy,
                                                  cacheable=cacheable, now=now)
            return _insert_record(conn, analysis_id, source, cached=False, now=now,
                                  verdict=str(report.get("verdict", "invalid")),
                                  fmt=str(report.get("format", "unknown")), record_id=record_id)

    @contextmanager
    def _save_cache(self, conn: sa.Connection) -> Iterator[None]:
        """SQLite: a page cache of SAVE_CACHE_KIB while an analysis is written. Its tensor
        keys go to five indexes in an order of their own each; with the default 2 MB cache
        most of those inserts miss (500,000 rows: 28 s under the write lock, 11-14 s with
        128 MB; bench/store_bench.py). The default comes back after the commit, which frees
        the pages."""
        if self.engine.dialect.name != "sqlite":
            yield
            return
        cursor = conn.connection.cursor()      # the driver's: no SQLAlchemy transaction yet
        try:
            default = int(cursor.execute("PRAGMA cache_size").fetchone()[0])
            cursor.execute(f"PRAGMA cache_size=-{SAVE_CACHE_KIB}")
            try:
                yield
            finally:
                cursor.execute(f"PRAGMA cache_size={default}")
        finally:
            cursor.close()

    def share(self, cached: Cached, source: dict[str, Any]) -> Record | None:
        """A new record of a stored analysis for another request: a few hundred bytes. None
        when the analysis was deleted since it was found (its last record went meanwhile)."""
        try:
            with self._write_lock, self.engine.begin() as conn:
                if conn.execute(sa.select(analyses.c.id)
                                .where(analyses.c.id == cached.analysis_id)).first() is None:
                    return None
                return _insert_record(conn, cached.analysis_id, source, cached=True,
                                      now=datetime.now(UTC), verdict=cached.verdict, fmt=cached.format)
        except sa.exc.IntegrityError:      # deleted between the check and the insert (PostgreSQL)
            return None

    def find_cached(self, sha256: str, scanner_version: str, policy: str) -> Cached | None:
        """The newest cacheable analysis for this cache key, if any."""
        a = analyses
        query = (sa.select(a.c.id, a.c.summary, scans.c.id.label("record_id"), scans.c.source,
                           scans.c.verdict, scans.c.format)
                 .join(scans, scans.c.analysis_id == a.c.id)
                 .where(a.c.sha256 == sha256, a.c.scanner_version == scanner_version,
                        a.c.policy == policy, a.c.cacheable.is_(True))
                 .order_by(a.c.id.desc(), scans.c.seq.desc()).limit(1))
        with self.engine.connect() as conn:
            row = conn.execute(query).first()
        if row is None:
            return None
        return Cached(analysis_id=row.id, record_id=row.record_id, source=dict(row.source),
                      verdict=row.verdict, format=row.format,
                      codes=[str(f.get("code")) for f in row.summary.get("findings", [])])

    def get(self, scan_id: str) -> Stored | None:
        a = analyses
        query = (sa.select(*_RECORD_COLUMNS, a.c.head, a.c.tensor_count, a.c.storage_count, a.c.dtypes)
                 .join(a, a.c.id == scans.c.analysis_id).where(scans.c.id == scan_id))
        with self.engine.connect() as conn:
            row = conn.execute(query).first()
        if row is None:
            return None
        return Stored(record=_record(row), head=row.head, tensor_count=row.tensor_count,
                      storage_count=row.storage_count, dtypes=row.dtypes)

    def part_rows(self, analysis_id: int, part: str, rows: int) -> Iterator[str]:
        """The `rows` rows of one manifest part as `compact.stream` wants them, read a few
        chunks per query, each on a connection of its own (a slow reader holds none)."""
        expected = -(-rows // compact.ROWS_PER_CHUNK)
        mc = manifest_chunks
        for first in range(0, expected, CHUNKS_PER_READ):
            query = (sa.select(mc.c.data).where(mc.c.analysis_id == analysis_id, mc.c.part == part,
                                                mc.c.chunk >= first, mc.c.chunk < first + CHUNKS_PER_READ)
                     .order_by(mc.c.chunk))
            with self.engine.connect() as conn:
                blobs = conn.execute(query).scalars().all()
            if len(blobs) != min(CHUNKS_PER_READ, expected - first):
                # deleted while it was being read: end the response broken, not short and valid
                raise LookupError(f"analysis {analysis_id} lost its {part} while it was read")
            for blob in blobs:
                yield ",".join(compact.chunk_lines(blob))

    def tensors(self, stored: Stored, *, limit: int = 100, cursor: str | None = None,
                name: str | None = None, dtype: str | None = None, sort: str = "index") -> TensorPage:
        """One page of the manifest's tensors, filtered and sorted in SQL on tensor_keys, the
        rows read from their chunks. Raise ValueError on a cursor not issued for this sort.

        Plan: when at most FEW_MATCHES rows match (the dtype counts tell; a name filter reads
        at most FEW_MATCHES + 1 of them to find out), their keys are read and sorted here, and
        their number is the total. Otherwise an index in the sort's order (with the dtype
        first when it is filtered) is walked to the page, and a name filter's total is one
        count. A name's matches are then common, so the walk is usually short; it is long
        when they all sort last (the limit of this plan: bench/store_bench.py). What a name
        filter found (its matches' keys, or its count) is remembered for its next pages."""
        column, descending = TENSOR_SORTS[sort]
        tk = tensor_keys
        limit = max(1, min(limit, MAX_TENSOR_PAGE))
        analysis_id = stored.record.analysis_id
        after = decode_tensor_cursor(cursor, sort) if cursor else None
        key = tk.c[column]
        where: list[sa.ColumnElement[bool]] = [tk.c.analysis_id == analysis_id]
        if dtype is not None:   # the key columns' text (compact.storable: no NUL, no surrogate)
            dtype = compact.storable(dtype)
        if name:
            name = compact.storable(name)
            pattern = "%" + name.replace("/", "//").replace("%", "/%").replace("_", "/_") + "%"
            # SQLite's LIKE ignores ASCII case already (lower() would double the scan's cost)
            where.append(tk.c.name.like(pattern, escape="/") if self.engine.dialect.name == "sqlite"
                         else tk.c.name.ilike(pattern, escape="/"))
        with self.engine.connect() as conn:
            few: list[Any] | None = None
            if dtype is not None:
                total = next((d["count"] for d in stored.dtypes if d["dtype"] == dtype), 0)
                if total <= FEW_MATCHES:
                    few = [(h.key, h.idx) for h in conn.execute(
                        sa.select(tk.c.idx, key.label("key")).where(*where, tk.c.dtype == dtype))]
                    total = len(few)
                else:
                    where.append(tk.c.dtype == dtype)
            elif not name:
                total = stored.tensor_count
            if name and few is None:
                # the next pages of a filter reuse what its first page found (one or two
                # scans of the analysis' names: 500,000 rows, 0.1-0.4 s)
                memo = (analysis_id, hash(stored.head), name, dtype, column)
                known = self._name_matches.get(memo)
                if known is None:
                    found = [(h.key, h.idx) for h in conn.execute(
                        sa.select(tk.c.idx, key.label("key")).where(*where).limit(FEW_MATCHES + 1))]
                    known = found if len(found) <= FEW_MATCHES else conn.execute(
                        sa.select(sa.func.count()).where(*where)).scalar_one()
                    self._name_matches.put(memo, known)
                if isinstance(known, list):
                    few, total = known, len(known)
                else:
                    total = known
            if few is not None:
                ordered = sorted(few, reverse=descending)
                if after is not None:
                    ordered = [h for h in ordered if (h < after if descending else h > after)]
                hits = ordered[:limit + 1]
            else:
                if after is not None:
                    position = after[1] if column == "idx" else sa.tuple_(after[0], after[1])
                    current = tk.c.idx if column == "idx" else sa.tuple_(key, tk.c.idx)
                    where.append(current < position if descending else current > position)
                order = [key, tk.c.idx] if column != "idx" else [tk.c.idx]
                hits = [(h.key, h.idx) for h in conn.execute(
                    sa.select(tk.c.idx, key.label("key")).where(*where)
                    .order_by(*(c.desc() if descending else c for c in order)).limit(limit + 1))]
            more = len(hits) > limit
            hits = hits[:limit]
            rows = _tensor_rows(conn, analysis_id, [idx for _key, idx in hits])
        nxt = encode_tensor_cursor(sort, *hits[-1]) if more else None
        return TensorPage(items=[{"index": idx, **rows[idx]} for _key, idx in hits], next_cursor=nxt,
                          total=int(total))

    def list(self, *, sha256: str | None = None, verdict: str | None = None,
             fmt: str | None = None, limit: int = 50, cursor: str | None = None) -> Page:
        """Summaries, newest first; `cursor` is the opaque `next_cursor` of the previous page."""
        limit = max(1, min(limit, MAX_PAGE))
        query = (sa.select(scans.c.seq, *_RECORD_COLUMNS, analyses.c.summary)
                 .join(analyses, analyses.c.id == scans.c.analysis_id))
        if sha256:
            query = query.where(scans.c.sha256 == sha256)
        if verdict:
            query = query.where(scans.c.verdict == verdict)
        if fmt:
            query = query.where(scans.c.format == fmt)
        if cursor:
            query = query.where(scans.c.seq < decode_cursor(cursor))
        query = query.order_by(scans.c.seq.desc()).limit(limit + 1)
        with self.engine.connect() as conn:
            rows = conn.execute(query).all()
        more = len(rows) > limit
        rows = rows[:limit]
        nxt = encode_cursor(rows[-1].seq) if more and rows else None
        return Page(items=[_summary(r) for r in rows], next_cursor=nxt)

    def delete(self, scan_id: str) -> bool:
        """Delete one record, and its analysis when no other record references it."""
        with self._write_lock, self.engine.begin() as conn:
            analysis_id = conn.execute(sa.delete(scans).where(scans.c.id == scan_id)
                                       .returning(scans.c.analysis_id)).scalar()
            if analysis_id is None:
                return False
            _drop_unreferenced(conn, [analysis_id])
        return True

    def sweep(self, older_than: datetime) -> int:
        """Delete the records created before `older_than` (retention) and the analyses no
        record references any more; return how many records went."""
        with self._write_lock, self.engine.begin() as conn:
            gone = conn.execute(sa.delete(scans).where(scans.c.created_at < older_than)
                                .returning(scans.c.analysis_id)).scalars().all()
            _drop_unreferenced(conn, sorted(set(gone)))
        return len(gone)

def encode_cursor(seq: int) -> str:
    return _b64(f"s{seq}")


def decode_cursor(cursor: str) -> int:
    """Raise ValueError on anything that `encode_cursor` did not produce."""
    raw = _unb64(cursor)
    if not raw.startswith("s") or not raw[1:].isdigit() or len(raw) > 20:
        raise ValueError("bad cursor")
    return int(raw[1:])


MAX_TENSOR_PAGE = 1000
FEW_MATCHES = 20_000          # tensors.__doc__: up to this many matches are sorted here
CHUNKS_PER_READ = 32
SAVE_CACHE_KIB = 128 * 1024    # Store._save_cache
NAME_MEMO_ENTRIES = 8          # name filters remembered (each: a count, or <= FEW_MATCHES keys)
LAYOUT = compact.Layout(analyses, manifest_chunks, tensor_keys)
# sort name -> (tensor_keys column, descending); ties go by index in the sort's direction,
# so `-x` is exactly `x` reversed and every order is one index scan
TENSOR_SORTS: dict[str, tuple[str, bool]] = {
    "index": ("idx", False), "nbytes": ("nbytes", False), "-nbytes": ("nbytes", True),
    "data_offset": ("data_offset", False), "-data_offset": ("data_offset", True)}

_RECORD_COLUMNS = (scans.c.id, scans.c.created_at, scans.c.cached, scans.c.source,
                   scans.c.analysis_id, scans.c.verdict, scans.c.format)


class _Recent:
    """The last `size` values put, by key (least recently used out first), for threads."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._values: OrderedDict[Any, Any] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Any) -> Any:
        with self._lock:
            if key in self._values:
                self._values.move_to_end(key)
            return self._values.get(key)

    def put(self, key: Any, value: Any) -> None:
        with self._lock:
            self._values[key] = value
            self._values.move_to_end(key)
            while len(self._values) > self.size:
                self._values.popitem(last=False)


def _aware(created: datetime) -> datetime:
    return created if created.tzinfo is not None else created.replace(tzinfo=UTC)  # SQLite: naive


def _record(row: Any) -> Record:
    return Record(id=row.id, created_at=_aware(row.created_at), cached=bool(row.cached),
                  source=dict(row.source), analysis_id=row.analysis_id, verdict=row.verdict,
                  format=row.format)


def _summary(row: Any) -> dict[str, Any]:
    record = _record(row)
    return {**record.fields(), "source": record.source, "format": record.format,
            "verdict": record.verdict, **row.summary}


def _insert_record(conn: sa.Connection, analysis_id: int, source: dict[str, Any], *,
                   cached: bool, now: datetime, verdict: str, fmt: str,
                   record_id: str | None = None) -> Record:
    record = Record(id=record_id or uuid.uuid4().hex, created_at=now, cached=cached, source=source,
                    analysis_id=analysis_id, verdict=verdict, format=fmt)
    conn.execute(scans.insert().values(
        id=record.id, created_at=now, analysis_id=analysis_id, cached=cached, source=source,
        sha256=str(source.get("sha256") or ""), size=int(source.get("size") or 0),
        source_kind=str(source.get("kind") or ""),
        source_name=(source.get("name") or None) and str(source["name"])[:512],
        format=fmt, verdict=verdict))
    return record


def _drop_unreferenced(conn: sa.Connection, analysis_ids: list[int]) -> None:
    """Delete the analyses among `analysis_ids` that no record references (children first)."""
    if not analysis_ids:
        return
    kept = set(conn.execute(sa.select(scans.c.analysis_id).distinct()
                            .where(scans.c.analysis_id.in_(analysis_ids))).scalars())
    orphans = [a for a in analysis_ids if a not in kept]
    for batch in compact.batches(orphans, 500):
        conn.execute(sa.delete(tensor_keys).where(tensor_keys.c.analysis_id.in_(batch)))
        conn.execute(sa.delete(manifest_chunks).where(manifest_chunks.c.analysis_id.in_(batch)))
        conn.execute(sa.delete(analyses).where(analyses.c.id.in_(batch)))


def _tensor_rows(conn: sa.Connection, analysis_id: int, indices: list[int]) -> dict[int, Any]:
    """The manifest rows at `indices`, decoded from the chunks that hold them."""
    size = compact.ROWS_PER_CHUNK
    wanted = sorted({i // size for i in indices})
    mc = manifest_chunks
    lines: dict[int, list[str]] = {}
    for batch in compact.batches(wanted, 200):
        for number, blob in conn.execute(
                sa.select(mc.c.chunk, mc.c.data).where(mc.c.analysis_id == analysis_id,
                                                       mc.c.part == "tensors", mc.c.chunk.in_(batch))):
            lines[number] = compact.chunk_lines(blob)
    return {i: json.loads(lines[i // size][i % size]) for i in indices}


def _b64(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def _unb64(cursor: str) -> str:
    try:
        return base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode("ascii")
    except (binascii.Error, UnicodeDecodeError) as exc:
        raise ValueError("bad cursor") from exc


def encode_tensor_cursor(sort: str, key: int, index: int) -> str:
    return _b64(f"t{sort}:{key}:{index}")


def decode_tensor_cursor(cursor: str, sort: str) -> tuple[int, int]:
    """(sort key, index) after which the next page starts; ValueError unless `encode_tensor_cursor`
    made it for this sort."""
    prefix = f"t{sort}:"
    raw = _unb64(cursor)
    key, _, index = raw[len(prefix):].partition(":")
    if not raw.startswith(prefix) or len(raw) > 80 or not index.isdigit() \
            or not key.lstrip("-").isdigit():
        raise ValueError("bad cursor")
    return int(key), int(index)
