"""Stored reports: save, get, list (cursor pagination), cache lookup.

Strategy: SQLAlchemy 2 Core on a synchronous engine; the async routes call it through
`asyncio.to_thread`. The schema belongs to Alembic: `Store.open` runs `upgrade head`
on start (a new SQLite file is created on first start), never `create_all`.
The cache key is (sha256, scanner version, policy) where policy includes any extra
allowlisted globals, since they change the verdict.
"""

from __future__ import annotations

import base64
import binascii
import threading
import uuid
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic import command
from alembic.config import Config

from ckptguard.app.tables import scans

MIGRATIONS = Path(__file__).parent / "migrations"
MAX_PAGE = 500


@dataclass(frozen=True, slots=True)
class StoredScan:
    id: str
    created_at: datetime
    report: dict[str, Any]

    def to_json(self, *, cached: bool = False) -> dict[str, Any]:
        """The report plus the service's fields (`id`, `created_at`, `cached`)."""
        return {"id": self.id, "created_at": self.created_at.isoformat(), "cached": cached,
                **self.report}


@dataclass(frozen=True, slots=True)
class Page:
    items: list[StoredScan]
    next_cursor: str | None


def policy_key(policy: str, allow: frozenset[str]) -> str:
    """The policy part of the cache key: extra allowed globals change verdicts."""
    return policy if not allow else f"{policy}+allow:{','.join(sorted(allow))}"


def migrate(engine: sa.Engine) -> None:
    """Bring the schema to Alembic's head on `engine` (idempotent)."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as conn:
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

    def save(self, report: dict[str, Any], *, policy: str, cacheable: bool) -> StoredScan:
        """Store one report (a `Report.to_json()` dict) and return it with its new id."""
        source = report.get("source") or {}
        now = datetime.now(UTC)
        row = {
            "id": uuid.uuid4().hex, "created_at": now,
            "sha256": source.get("sha256") or "", "size": int(source.get("size") or 0),
            "source_kind": str(source.get("kind") or ""),
            "source_name": (source.get("name") or None) and str(source["name"])[:512],
            "format": str(report.get("format", "unknown")),
            "verdict": str(report.get("verdict", "invalid")),
            "scanner_version": str(report.get("scanner", {}).get("version", "")),
            "policy": policy, "cacheable": cacheable, "report": report,
        }
        with self._write_lock, self.engine.begin() as conn:
            conn.execute(scans.insert().values(**row))
        return StoredScan(id=str(row["id"]), created_at=now, report=report)

    def get(self, scan_id: str) -> StoredScan | None:
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(scans.c.id, scans.c.created_at, scans.c.report)
                               .where(scans.c.id == scan_id)).first()
        return None if row is None else _stored(row)

    def find_cached(self, sha256: str, scanner_version: str, policy: str) -> StoredScan | None:
        """The newest cacheable report for this cache key, if any."""
        query = (sa.select(scans.c.id, scans.c.created_at, scans.c.report)
                 .where(scans.c.sha256 == sha256, scans.c.scanner_version == scanner_version,
                        scans.c.policy == policy, scans.c.cacheable.is_(True))
                 .order_by(scans.c.seq.desc()).limit(1))
        with self.engine.connect() as conn:
            row = conn.execute(query).first()
        return None if row is None else _stored(row)

    def list(self, *, sha256: str | None = None, verdict: str | None = None, limit: int = 50,
             cursor: str | None = None) -> Page:
        """Newest first; `cursor` is the opaque `next_cursor` of the previous page."""
        limit = max(1, min(limit, MAX_PAGE))
        query = sa.select(scans.c.seq, scans.c.id, scans.c.created_at, scans.c.report)
        if sha256:
            query = query.where(scans.c.sha256 == sha256)
        if verdict:
            query = query.where(scans.c.verdict == verdict)
        if cursor:
            query = query.where(scans.c.seq < decode_cursor(cursor))
        query = query.order_by(scans.c.seq.desc()).limit(limit + 1)
        with self.engine.connect() as conn:
            rows = conn.execute(query).all()
        more = len(rows) > limit
        rows = rows[:limit]
        nxt = encode_cursor(rows[-1].seq) if more and rows else None
        return Page(items=[_stored(r) for r in rows], next_cursor=nxt)


def encode_cursor(seq: int) -> str:
    return base64.urlsafe_b64encode(f"s{seq}".encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> int:
    """Raise ValueError on anything that `encode_cursor` did not produce."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode("ascii")
    except (binascii.Error, UnicodeDecodeError) as exc:
        raise ValueError("bad cursor") from exc
    if not raw.startswith("s") or not raw[1:].isdigit() or len(raw) > 20:
        raise ValueError("bad cursor")
    return int(raw[1:])


def _stored(row: Any) -> StoredScan:
    created = row.created_at
    if created.tzinfo is None:  # SQLite returns naive datetimes
        created = created.replace(tzinfo=UTC)
    return StoredScan(id=row.id, created_at=created, report=row.report)
