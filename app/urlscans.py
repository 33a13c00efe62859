"""Asynchronous URL scans (`POST /scan/url?async=true`): the row, and the runner of one.

Strategy: the route checks the URL and headers as the synchronous route does, records a
`queued` row and hands its id to the job queue (app/jobqueue.py); a worker scans it in its
sandboxed pool like the synchronous route and stores the report as a scan record, whose id
the row then gives to whoever polls `GET /scan/url/jobs/{id}`. Headers (credentials for the
upstream) live in the row only until the scan ends.
    queued -> running -> done (report_id) | failed (error)
A run is idempotent: a finished row is left alone; a `running` row is taken again only when
its lease (the scan's wall-clock limit plus a minute) ran out, or by a procrastinate task
(whose lock keeps the job to one worker: the row was left by a worker that died).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa

from ckptguard.app.tables import url_scans
from ckptguard.core.errors import CkptError

log = logging.getLogger("ckptguard.urlscans")


def _now() -> datetime:
    return datetime.now(UTC)


class UrlScanDb:
    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine

    def create(self, url: str, headers: dict[str, str] | None) -> str:
        scan_id = uuid.uuid4().hex
        now = _now()
        with self.engine.begin() as conn:
            conn.execute(url_scans.insert().values(
                id=scan_id, url=url, headers=json.dumps(headers) if headers else None, state="queued",
                created_at=now, updated_at=now))
        return scan_id

    def get(self, scan_id: str) -> Any:
        with self.engine.connect() as conn:
            return conn.execute(sa.select(url_scans).where(url_scans.c.id == scan_id)).first()

    def claim(self, scan_id: str, lease_s: float, *, locked: bool) -> Any:
        """The row to scan, now `running`, or None (finished, or running elsewhere)."""
        now = time.time()
        claimable = url_scans.c.state.in_(("queued", "running")) if locked else sa.or_(
            url_scans.c.state == "queued",
            sa.and_(url_scans.c.state == "running", url_scans.c.lease_until < now))
        with self.engine.begin() as conn:
            done = conn.execute(url_scans.update().where(url_scans.c.id == scan_id, claimable).values(
                state="running", lease_until=now + lease_s, updated_at=_now()))
        return self.get(scan_id) if done.rowcount == 1 else None

    def finish(self, scan_id: str, *, report_id: str | None, error: str | None) -> None:
        with self.engine.begin() as conn:
            conn.execute(url_scans.update().where(url_scans.c.id == scan_id).values(
                state="failed" if error else "done", report_id=report_id, error=error, headers=None,
                lease_until=None, updated_at=_now()))

    def runnable(self) -> list[str]:
        """Queued scans, and running ones whose process died (lease over): the sweeper's."""
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(url_scans.c.id).where(sa.or_(
                url_scans.c.state == "queued",
                sa.and_(url_scans.c.state == "running", url_scans.c.lease_until < time.time())))
                .order_by(url_scans.c.created_at)).all()
        return [r.id for r in rows]


def document(row: Any) -> dict[str, Any]:
    """What `GET /scan/url/jobs/{id}` answers."""
    doc = {"job_id": row.id, "url": row.url, "state": row.state, "report_id": row.report_id,
           "error": row.error, "created_at": row.created_at.isoformat(),
           "updated_at": row.updated_at.isoformat()}
    if row.report_id:
        doc["report"] = f"/scans/{row.report_id}"
    return doc


class UrlScanRunner:
    """Runs one asynchronous URL scan in the process's sandboxed pool and stores its report."""

    def __init__(self, scans: Any, db: UrlScanDb) -> None:
        self.scans = scans     # app.pipeline.ScanService: its pool, settings, store and metrics
        self.db = db

    async def run(self, scan_id: str, *, locked: bool = False) -> None:
        from ckptguard.app.ssrf import guard_from_settings

        settings = self.scans.settings
        lease = settings.scan_timeout_seconds + 60.0
        row = await asyncio.to_thread(self.db.claim, scan_id, lease, locked=locked)
        if row is None:
            return
        headers = json.loads(row.headers) if row.headers else None
        guard = guard_from_settings(settings)
        try:
            report = await self.scans.jobs.scan_url(row.url, headers, guard,
                                                    frozenset(settings.allow_globals))
        except CkptError as exc:   # a refused URL or an upstream that failed: said, not retried
            log.info("async url scan failed: %s: %s", exc.code, exc.message)
            await asyncio.to_thread(self.db.finish, scan_id, report_id=None,
                                    error=f"{exc.code}: the upstream could not be read as a checkpoint")
            return
        answer = await self.scans.keep(report, record_id=scan_id)   # a retry keeps the first
        await asyncio.to_thread(self.db.finish, scan_id, report_id=answer.record.id, error=None)
